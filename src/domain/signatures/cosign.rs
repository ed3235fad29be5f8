//! cosign's signatures as registries hold them, read the way cosign writes
//! them (sigstore/cosign, `pkg/oci/static`, `pkg/cosign/bundle`,
//! `pkg/cosign/verify.go`):
//! - The signatures of an image `repo@sha256:HEX` are an OCI manifest
//!   tagged `repo:sha256-HEX.sig` (the "tag scheme"), one layer per
//!   signature, of media type `application/vnd.dev.cosign.simplesigning.v1+json`;
//!   or, signed with `--registry-referrers-mode=oci-1-1`, a manifest whose
//!   `subject` is the image and whose artifact type is
//!   `application/vnd.dev.cosign.artifact.sig.v1+json`, found as an OCI
//!   1.1 referrer (on a registry without the referrers API, in the index
//!   tagged `sha256-HEX`), with the same layers.
//! - A layer's blob is the signed payload ("simple signing"): JSON whose
//!   `critical.image.docker-manifest-digest` names the signed image and
//!   whose `critical.type` is `cosign container image signature`.
//! - Its annotations: `dev.cosignproject.cosign/signature` (the ASN.1 DER
//!   ECDSA signature over the payload, base64), for keyless signatures
//!   `dev.sigstore.cosign/certificate` (the Fulcio leaf, PEM) and
//!   `dev.sigstore.cosign/chain` (never trusted: the chain comes from the
//!   trust root), and `dev.sigstore.cosign/bundle` (the transparency log's
//!   promise: `SignedEntryTimestamp`, base64 ECDSA over the canonical JSON
//!   of `Payload` = `{body, integratedTime, logID, logIndex}`, keys sorted,
//!   no spaces; `body` is the log entry, base64 JSON of a `hashedrekord`
//!   holding the payload's SHA-256 and the signature).

use anyhow::{anyhow, bail, Context};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::Digest as _;
use x509_cert::der::DecodePem;
use x509_cert::Certificate;

use super::trust::{Hash, PublicKey, TrustedRoot};
use crate::primitives::digest::Digest;

pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The artifact type of a signature manifest cosign files as an OCI 1.1
/// referrer (`--registry-referrers-mode=oci-1-1`): its config's media type.
pub const SIGNATURE_ARTIFACT: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
pub const SIGNATURE: &str = "dev.cosignproject.cosign/signature";
pub const CERTIFICATE: &str = "dev.sigstore.cosign/certificate";
pub const BUNDLE: &str = "dev.sigstore.cosign/bundle";
const PAYLOAD_TYPE: &str = "cosign container image signature";

/// The tag cosign files an image's signatures under: `sha256-HEX.sig`.
pub fn sidecar_tag(image: &Digest) -> String {
    format!("{}.sig", crate::adapters::registry::referrers_tag(image))
}

/// One signature from a `.sig` manifest.
pub struct Signature {
    pub payload: Vec<u8>,
    /// As the annotation holds it (base64), for the log entry's check.
    pub encoded: String,
    pub bytes: Vec<u8>,
    pub certificate: Option<Certificate>,
    pub bundle: Option<String>,
}

impl Signature {
    pub fn new(
        payload: Vec<u8>,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> anyhow::Result<Self> {
        let encoded = annotations
            .get(SIGNATURE)
            .ok_or_else(|| anyhow!("a signature layer without {SIGNATURE}"))?
            .clone();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|e| anyhow!("{SIGNATURE}: bad base64: {e}"))?;
        let certificate = annotations
            .get(CERTIFICATE)
            .filter(|c| !c.trim().is_empty())
            .map(|pem| {
                Certificate::from_pem(pem.as_bytes()).map_err(|e| anyhow!("{CERTIFICATE}: {e}"))
            })
            .transpose()?;
        Ok(Signature {
            payload,
            encoded,
            bytes,
            certificate,
            bundle: annotations.get(BUNDLE).cloned(),
        })
    }

    /// The image digest the payload says was signed.
    pub fn signed_digest(&self) -> anyhow::Result<Digest> {
        #[derive(Deserialize)]
        struct Payload {
            critical: Critical,
        }
        #[derive(Deserialize)]
        struct Critical {
            #[serde(rename = "type")]
            kind: String,
            image: Image,
        }
        #[derive(Deserialize)]
        struct Image {
            #[serde(rename = "docker-manifest-digest")]
            digest: String,
        }
        let p: Payload = serde_json::from_slice(&self.payload)
            .map_err(|e| anyhow!("a payload that is not cosign's simple signing: {e}"))?;
        if p.critical.kind != PAYLOAD_TYPE {
            bail!(
                "a payload of type {:?}, not {PAYLOAD_TYPE:?}",
                p.critical.kind
            );
        }
        Digest::parse(&p.critical.image.digest).map_err(|e| anyhow!("the payload's digest: {e}"))
    }

    /// Whether `key` made this signature.
    pub fn made_by(&self, key: &PublicKey) -> bool {
        let hashes: &[Hash] = match key {
            PublicKey::P256(_) => &[Hash::Sha256],
            PublicKey::P384(_) => &[Hash::Sha384, Hash::Sha256],
        };
        hashes
            .iter()
            .any(|h| key.verify(&self.payload, &self.bytes, *h).is_ok())
    }

    /// Checks the transparency log's promise against the trust root's log
    /// keys and that its entry is this signature of this payload; returns
    /// when the log says it saw it.
    pub fn logged_at(&self, root: &TrustedRoot) -> anyhow::Result<Option<DateTime<Utc>>> {
        let Some(bundle) = &self.bundle else {
            return Ok(None);
        };
        #[derive(Deserialize)]
        struct Bundle {
            #[serde(rename = "SignedEntryTimestamp")]
            set: String,
            #[serde(rename = "Payload")]
            payload: Entry,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Entry {
            body: String,
            integrated_time: i64,
            log_index: i64,
            #[serde(rename = "logID")]
            log_id: String,
        }
        let b: Bundle = serde_json::from_str(bundle).map_err(|e| anyhow!("{BUNDLE}: {e}"))?;
        let e = &b.payload;
        let canonical = format!(
            "{{\"body\":{},\"integratedTime\":{},\"logID\":{},\"logIndex\":{}}}",
            serde_json::to_string(&e.body)?,
            e.integrated_time,
            serde_json::to_string(&e.log_id)?,
            e.log_index
        );
        let id = hex::decode(&e.log_id).map_err(|_| anyhow!("{BUNDLE}: logID is not hex"))?;
        let at = DateTime::<Utc>::from_timestamp(e.integrated_time, 0)
            .ok_or_else(|| anyhow!("{BUNDLE}: integratedTime out of range"))?;
        let log = root.logs.iter().find(|l| l.id == id).ok_or_else(|| {
            anyhow!(
                "logged by a transparency log the trusted root does not hold (logID {})",
                e.log_id
            )
        })?;
        if !log.valid_at(at) {
            bail!("logged at {at} by a transparency log key not valid then");
        }
        let set = base64::engine::general_purpose::STANDARD
            .decode(b.set.trim())
            .map_err(|e| anyhow!("{BUNDLE}: SignedEntryTimestamp: {e}"))?;
        log.key
            .verify(canonical.as_bytes(), &set, Hash::Sha256)
            .map_err(|_| {
                anyhow!("the transparency log's signed entry timestamp does not verify")
            })?;
        self.check_entry(&e.body)
            .context("the transparency log's entry")?;
        Ok(Some(at))
    }

    /// The log entry must be a `hashedrekord` of this payload and signature.
    fn check_entry(&self, body: &str) -> anyhow::Result<()> {
        #[derive(Deserialize)]
        struct Body {
            kind: String,
            spec: Spec,
        }
        #[derive(Deserialize)]
        struct Spec {
            data: Data,
            signature: Sig,
        }
        #[derive(Deserialize)]
        struct Data {
            hash: HashValue,
        }
        #[derive(Deserialize)]
        struct HashValue {
            algorithm: String,
            value: String,
        }
        #[derive(Deserialize)]
        struct Sig {
            content: String,
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(body.trim())
            .map_err(|e| anyhow!("body: {e}"))?;
        let b: Body = serde_json::from_slice(&raw).map_err(|e| anyhow!("body: {e}"))?;
        if b.kind != "hashedrekord" {
            bail!("an entry of kind {:?}; kiln reads hashedrekord", b.kind);
        }
        let want = hex::encode(sha2::Sha256::digest(&self.payload));
        if b.spec.data.hash.algorithm != "sha256" || b.spec.data.hash.value != want {
            bail!("it records another payload");
        }
        if b.spec.signature.content.trim() != self.encoded.trim() {
            bail!("it records another signature");
        }
        Ok(())
    }
}
