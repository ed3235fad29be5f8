//! Keys, certificates and the Sigstore trust root: what a signature is
//! checked against. The cryptography is RustCrypto's (`p256`, `p384`,
//! `x509-cert`); this file only decides which key checks which bytes.
//!
//! Formats, from Sigstore's protobuf-specs (`TrustedRoot`, JSON with
//! camelCase names) and Fulcio's certificate profile:
//! - `trusted_root.json`: `certificateAuthorities[].certChain.certificates[]`
//!   (`rawBytes`, base64 DER, the issuing certificate first, the root
//!   last) with `validFor.start`/`end` (RFC 3339); `tlogs[]` with
//!   `publicKey.rawBytes` (base64 PKIX DER), `publicKey.validFor` and
//!   `logId.keyId` (base64 of the SHA-256 of that DER).
//! - A Fulcio certificate names the signer in its subject alternative
//!   name (an email or a URI) and the OIDC issuer that vouched for it in
//!   extension 1.3.6.1.4.1.57264.1.8 (a DER UTF8String) or, in older
//!   certificates, 1.3.6.1.4.1.57264.1.1 (the raw string); its extended
//!   key usage holds code signing.

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::Digest as _;
use x509_cert::der::{Decode, Encode};
use x509_cert::Certificate;

const OID_ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
const OID_ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
const OID_SAN: &str = "2.5.29.17";
const OID_EKU: &str = "2.5.29.37";
const OID_CODE_SIGNING: &str = "1.3.6.1.5.5.7.3.3";
const OID_ECDSA_SHA256: &str = "1.2.840.10045.4.3.2";
const OID_ECDSA_SHA384: &str = "1.2.840.10045.4.3.3";

/// A public key kiln can check signatures with: ECDSA on P-256 or P-384
/// (cosign's key pairs, Fulcio's and Rekor's keys).
#[derive(Debug, Clone)]
pub enum PublicKey {
    P256(p256::ecdsa::VerifyingKey),
    P384(p384::ecdsa::VerifyingKey),
}

/// Which hash a signature was made over.
#[derive(Debug, Clone, Copy)]
pub enum Hash {
    Sha256,
    Sha384,
}

impl Hash {
    fn digest(self, msg: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => sha2::Sha256::digest(msg).to_vec(),
            Hash::Sha384 => sha2::Sha384::digest(msg).to_vec(),
        }
    }
}

impl PublicKey {
    /// A PKIX (SubjectPublicKeyInfo) key in DER.
    pub fn from_der(der: &[u8]) -> anyhow::Result<Self> {
        use p256::pkcs8::DecodePublicKey;
        if let Ok(k) = p256::ecdsa::VerifyingKey::from_public_key_der(der) {
            return Ok(PublicKey::P256(k));
        }
        if let Ok(k) = p384::ecdsa::VerifyingKey::from_public_key_der(der) {
            return Ok(PublicKey::P384(k));
        }
        bail!("not an ECDSA P-256 or P-384 public key (the kinds kiln checks)")
    }

    /// A `-----BEGIN PUBLIC KEY-----` file, as `cosign generate-key-pair`
    /// writes `cosign.pub`.
    pub fn from_pem(pem: &str) -> anyhow::Result<Self> {
        use p256::pkcs8::DecodePublicKey;
        if let Ok(k) = p256::ecdsa::VerifyingKey::from_public_key_pem(pem) {
            return Ok(PublicKey::P256(k));
        }
        if let Ok(k) = p384::ecdsa::VerifyingKey::from_public_key_pem(pem) {
            return Ok(PublicKey::P384(k));
        }
        bail!("not a PEM ECDSA P-256 or P-384 public key (the kinds kiln checks)")
    }

    /// Checks an ASN.1 DER ECDSA signature over `msg` hashed with `hash`.
    pub fn verify(&self, msg: &[u8], signature: &[u8], hash: Hash) -> anyhow::Result<()> {
        use p256::ecdsa::signature::hazmat::PrehashVerifier;
        let prehash = hash.digest(msg);
        let ok = match self {
            PublicKey::P256(k) => p256::ecdsa::Signature::from_der(signature)
                .ok()
                .is_some_and(|s| k.verify_prehash(&prehash, &s).is_ok()),
            PublicKey::P384(k) => p384::ecdsa::Signature::from_der(signature)
                .ok()
                .is_some_and(|s| k.verify_prehash(&prehash, &s).is_ok()),
        };
        if ok {
            Ok(())
        } else {
            bail!("the signature does not verify")
        }
    }
}

/// A `validFor` window; no end means still valid.
#[derive(Debug, Clone, Deserialize)]
struct Window {
    start: DateTime<Utc>,
    #[serde(default)]
    end: Option<DateTime<Utc>>,
}

impl Window {
    fn holds(&self, t: DateTime<Utc>) -> bool {
        self.start <= t && self.end.is_none_or(|e| t <= e)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRoot {
    #[serde(default)]
    tlogs: Vec<RawLog>,
    #[serde(default)]
    certificate_authorities: Vec<RawCa>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLog {
    public_key: RawKey,
    log_id: RawLogId,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawKey {
    raw_bytes: String,
    valid_for: Option<Window>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLogId {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCa {
    cert_chain: RawChain,
    valid_for: Window,
}

#[derive(Deserialize)]
struct RawChain {
    certificates: Vec<RawCert>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCert {
    raw_bytes: String,
}

/// A transparency log's key and when it may have signed.
#[derive(Debug)]
pub struct Log {
    /// SHA-256 of the key's DER: the `logID` entries name.
    pub id: Vec<u8>,
    pub key: PublicKey,
    valid_for: Option<Window>,
}

impl Log {
    pub fn valid_at(&self, t: DateTime<Utc>) -> bool {
        self.valid_for.as_ref().is_none_or(|w| w.holds(t))
    }
}

/// A certificate authority: its chain, issuing certificate first.
#[derive(Debug)]
struct Ca {
    chain: Vec<Certificate>,
    valid_for: Window,
}

/// The Sigstore trust root a keyless signature is checked against, read
/// from a file so the check needs no network.
#[derive(Debug)]
pub struct TrustedRoot {
    cas: Vec<Ca>,
    pub logs: Vec<Log>,
}

fn b64(s: &str) -> anyhow::Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| anyhow!("bad base64: {e}"))
}

impl TrustedRoot {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let raw: RawRoot = serde_json::from_slice(&text).with_context(|| {
            format!(
                "{}: not a Sigstore trusted root (trusted_root.json)",
                path.display()
            )
        })?;
        let mut cas = Vec::new();
        for (i, ca) in raw.certificate_authorities.iter().enumerate() {
            let chain = ca
                .cert_chain
                .certificates
                .iter()
                .map(|c| Certificate::from_der(&b64(&c.raw_bytes)?).map_err(|e| anyhow!("{e}")))
                .collect::<anyhow::Result<Vec<_>>>()
                .with_context(|| format!("{}: certificateAuthorities[{i}]", path.display()))?;
            if chain.is_empty() {
                bail!(
                    "{}: certificateAuthorities[{i}] has no certificate",
                    path.display()
                );
            }
            cas.push(Ca {
                chain,
                valid_for: ca.valid_for.clone(),
            });
        }
        let mut logs = Vec::new();
        for (i, log) in raw.tlogs.iter().enumerate() {
            let der = b64(&log.public_key.raw_bytes)
                .with_context(|| format!("{}: tlogs[{i}]", path.display()))?;
            let key = PublicKey::from_der(&der)
                .with_context(|| format!("{}: tlogs[{i}]", path.display()))?;
            logs.push(Log {
                id: b64(&log.log_id.key_id)
                    .with_context(|| format!("{}: tlogs[{i}].logId", path.display()))?,
                key,
                valid_for: log.public_key.valid_for.clone(),
            });
        }
        if cas.is_empty() {
            bail!(
                "{}: no certificateAuthorities, so no keyless signature could be trusted",
                path.display()
            );
        }
        Ok(TrustedRoot { cas, logs })
    }

    /// Checks that `leaf` was issued, valid at `at`, by one of the root's
    /// authorities (the chain the root holds, never one the signature brings).
    pub fn check_chain(&self, leaf: &Certificate, at: DateTime<Utc>) -> anyhow::Result<()> {
        check_validity(leaf, at).context("the signing certificate")?;
        let mut reasons = Vec::new();
        for ca in &self.cas {
            match check_ca(ca, leaf, at) {
                Ok(()) => return Ok(()),
                Err(e) => reasons.push(format!("{e:#}")),
            }
        }
        bail!(
            "the signing certificate was not issued by an authority of the trusted root ({})",
            reasons.join("; ")
        )
    }
}

fn check_ca(ca: &Ca, leaf: &Certificate, at: DateTime<Utc>) -> anyhow::Result<()> {
    if !ca.valid_for.holds(at) {
        bail!("an authority not valid at {at}");
    }
    let mut child = leaf;
    for parent in &ca.chain {
        check_signed_by(child, parent)?;
        check_validity(parent, at)?;
        child = parent;
    }
    Ok(())
}

fn check_validity(cert: &Certificate, at: DateTime<Utc>) -> anyhow::Result<()> {
    let v = &cert.tbs_certificate.validity;
    let from = DateTime::<Utc>::from(v.not_before.to_system_time());
    let to = DateTime::<Utc>::from(v.not_after.to_system_time());
    if at < from || at > to {
        bail!(
            "valid from {} to {}, not at {}",
            from.to_rfc3339(),
            to.to_rfc3339(),
            at.to_rfc3339()
        );
    }
    Ok(())
}

fn check_signed_by(child: &Certificate, parent: &Certificate) -> anyhow::Result<()> {
    if child.tbs_certificate.issuer != parent.tbs_certificate.subject {
        bail!(
            "issued by {}, not {}",
            child.tbs_certificate.issuer,
            parent.tbs_certificate.subject
        );
    }
    let hash = match child.signature_algorithm.oid.to_string().as_str() {
        OID_ECDSA_SHA256 => Hash::Sha256,
        OID_ECDSA_SHA384 => Hash::Sha384,
        other => bail!(
            "signature algorithm {other} is not one kiln checks (ECDSA with SHA-256 or SHA-384)"
        ),
    };
    let key = PublicKey::from_der(&parent.tbs_certificate.subject_public_key_info.to_der()?)?;
    let tbs = child.tbs_certificate.to_der()?;
    let sig = child
        .signature
        .as_bytes()
        .ok_or_else(|| anyhow!("a certificate signature with unused bits"))?;
    key.verify(&tbs, sig, hash)
        .map_err(|_| anyhow!("not signed by {}", parent.tbs_certificate.subject))
}

/// Who a Fulcio certificate says signed: the subject alternative names
/// (emails and URIs) and the OIDC issuer.
#[derive(Debug)]
pub struct Signer {
    pub identities: Vec<String>,
    pub issuer: Option<String>,
    pub key: PublicKey,
}

/// Reads a leaf certificate: its signer, and that it is for code signing.
pub fn signer_of(cert: &Certificate) -> anyhow::Result<Signer> {
    use x509_cert::ext::pkix::name::GeneralName;
    let mut identities = Vec::new();
    let mut issuer = None;
    let mut code_signing = false;
    for ext in cert.tbs_certificate.extensions.iter().flatten() {
        let value = ext.extn_value.as_bytes();
        match ext.extn_id.to_string().as_str() {
            OID_SAN => {
                let san = x509_cert::ext::pkix::SubjectAltName::from_der(value)
                    .map_err(|e| anyhow!("subject alternative name: {e}"))?;
                for name in san.0 {
                    match name {
                        GeneralName::Rfc822Name(s) => identities.push(s.to_string()),
                        GeneralName::UniformResourceIdentifier(s) => identities.push(s.to_string()),
                        _ => {}
                    }
                }
            }
            OID_ISSUER_V2 => {
                let s = x509_cert::der::asn1::Utf8StringRef::from_der(value)
                    .map_err(|e| anyhow!("OIDC issuer extension: {e}"))?;
                issuer = Some(s.as_str().to_string());
            }
            OID_ISSUER_V1 if issuer.is_none() => {
                issuer = Some(String::from_utf8_lossy(value).into_owned());
            }
            OID_EKU => {
                let eku = x509_cert::ext::pkix::ExtendedKeyUsage::from_der(value)
                    .map_err(|e| anyhow!("extended key usage: {e}"))?;
                code_signing = eku.0.iter().any(|o| o.to_string() == OID_CODE_SIGNING);
            }
            _ => {}
        }
    }
    if !code_signing {
        bail!(
            "the signing certificate is not for code signing (no extended key usage codeSigning)"
        );
    }
    let key = PublicKey::from_der(&cert.tbs_certificate.subject_public_key_info.to_der()?)
        .context("the signing certificate's key")?;
    Ok(Signer {
        identities,
        issuer,
        key,
    })
}
