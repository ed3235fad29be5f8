//! `--verify-signatures POLICY`: which signer each image must have, checked
//! before anything of the image is stored (an [`crate::engine::gate::Gate`]).
//! Rooms: `trust` (keys, certificates, the Sigstore trust root), `cosign`
//! (signatures as cosign stores them in registries).
//!
//! The policy, Kubernetes-style YAML, paths relative to its own file:
//! ```yaml
//! apiVersion: kiln/v1
//! kind: SignaturePolicy
//! trustedRoot: trusted_root.json      # for keyless rules
//! images:
//! - match: registry.k8s.io            # a registry, or a repository prefix
//!   keyless:
//!   - identity: krel-trust@k8s-releng-prod.iam.gserviceaccount.com
//!     issuer: https://accounts.google.com
//! - match: 127.0.0.1:5000/team
//!   keys: [cosign.pub]
//! - match: "*"                         # anything else
//!   unsigned: true
//! ```
//! The longest `match` naming an image decides; an image no rule names is
//! refused. kiln's own choice (cosign's pattern flags differ): identities
//! and issuers match exactly.

/// How a report says an image was let in by a verified signature
/// (`admittedBy`): this, who signed, and [`VIA_REFERRER`] when the
/// signature was an OCI 1.1 referrer rather than cosign's tag.
const ADMITTED: &str = "cosign signature verified: ";
const VIA_REFERRER: &str = " (an OCI 1.1 referrer)";

/// Where the signature that admitted an image was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// cosign's `sha256-<hex>.sig` tag.
    Tag,
    /// An OCI 1.1 referrer.
    Referrer,
}

/// From an `admittedBy` note: where its signature was, or `None` when no
/// signature admitted the image (a rule's `unsigned: true`, a release's
/// SHA-512).
pub fn admitted_via(note: &str) -> Option<Via> {
    note.starts_with(ADMITTED).then(|| {
        if note.ends_with(VIA_REFERRER) {
            Via::Referrer
        } else {
            Via::Tag
        }
    })
}

pub mod cosign;
pub mod sign;
pub mod trust;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde::Deserialize;

use crate::engine::gate::{Fetch, Gate};
use crate::primitives::error::BadInput;
use crate::primitives::oci::{Descriptor, Document};
use crate::primitives::reference::ImageRef;
use cosign::{sidecar_tag, Signature, SIMPLE_SIGNING};
use trust::{PublicKey, TrustedRoot};

/// A `.sig` manifest or payload larger than this is not cosign's.
const MAX_PAYLOAD: u64 = 1 << 20;
const MAX_SIGNATURES: usize = 64;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyFile {
    api_version: String,
    kind: String,
    #[serde(default)]
    trusted_root: Option<PathBuf>,
    images: Vec<RuleFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    keys: Vec<PathBuf>,
    #[serde(default)]
    keyless: Vec<Identity>,
    #[serde(default)]
    unsigned: bool,
}

/// A keyless signer: the certificate's subject alternative name (an email
/// or URI) and the OIDC issuer that vouched for it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub identity: String,
    pub issuer: String,
}

#[derive(Debug)]
struct Rule {
    pattern: String,
    keys: Vec<(String, PublicKey)>,
    keyless: Vec<Identity>,
    unsigned: bool,
}

impl Rule {
    /// How specifically the rule names `image`, if it does.
    fn names(&self, image: &ImageRef) -> Option<usize> {
        if self.pattern == "*" {
            return Some(0);
        }
        let name = image.name();
        let p = self.pattern.trim_end_matches('/');
        (name == p || name.starts_with(&format!("{p}/"))).then_some(p.len() + 1)
    }
}

/// A signature policy, its keys and trust root read and checked.
#[derive(Debug)]
pub struct SignaturePolicy {
    path: PathBuf,
    rules: Vec<Rule>,
    root: Option<TrustedRoot>,
}

impl SignaturePolicy {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let bad =
            |what: String| anyhow::Error::from(BadInput(format!("{}: {what}", path.display())));
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad(format!("cannot read the signature policy: {e}")))?;
        let file: PolicyFile = serde_yaml_ng::from_str(&text)
            .map_err(|e| bad(format!("not a signature policy: {e}")))?;
        if file.api_version != "kiln/v1" || file.kind != "SignaturePolicy" {
            return Err(bad(format!(
                "apiVersion {:?}, kind {:?}: expected kiln/v1, SignaturePolicy",
                file.api_version, file.kind
            )));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let root = file
            .trusted_root
            .as_ref()
            .map(|r| {
                TrustedRoot::load(&dir.join(r)).map_err(|e| bad(format!("trustedRoot: {e:#}")))
            })
            .transpose()?;
        let mut rules = Vec::new();
        for (i, r) in file.images.into_iter().enumerate() {
            let at = format!("images[{i}] ({})", r.pattern);
            let signed = !r.keys.is_empty() || !r.keyless.is_empty();
            if signed == r.unsigned {
                return Err(bad(format!(
                    "{at}: give keys or keyless signers, or unsigned: true (one of them)"
                )));
            }
            if !r.keyless.is_empty() && root.is_none() {
                return Err(bad(format!(
                    "{at}: keyless signers need trustedRoot (a Sigstore trusted_root.json)"
                )));
            }
            let mut keys = Vec::new();
            for k in &r.keys {
                let file = dir.join(k);
                let pem = std::fs::read_to_string(&file)
                    .map_err(|e| bad(format!("{at}: key {}: {e}", file.display())))?;
                let key = PublicKey::from_pem(&pem)
                    .map_err(|e| bad(format!("{at}: key {}: {e:#}", file.display())))?;
                keys.push((k.display().to_string(), key));
            }
            rules.push(Rule {
                pattern: r.pattern,
                keys,
                keyless: r.keyless,
                unsigned: r.unsigned,
            });
        }
        Ok(SignaturePolicy {
            path: path.to_path_buf(),
            rules,
            root,
        })
    }

    fn rule_for(&self, image: &ImageRef) -> Option<&Rule> {
        self.rules
            .iter()
            .filter_map(|r| r.names(image).map(|n| (n, r)))
            .max_by_key(|(n, _)| *n)
            .map(|(_, r)| r)
    }

    async fn check(
        &self,
        source: &dyn Fetch,
        image: &ImageRef,
        top: &Descriptor,
    ) -> anyhow::Result<Option<String>> {
        let Some(rule) = self.rule_for(image) else {
            bail!(
                "no rule of the signature policy {} names it; add one (keys, keyless, or unsigned: true)",
                self.path.display()
            );
        };
        if rule.unsigned {
            return Ok(None);
        }
        // Where cosign files signatures: its own tag first, then OCI 1.1
        // referrers (cosign --registry-referrers-mode=oci-1-1).
        let mut reasons = Vec::new();
        let mut seen = 0;
        let tagged = ImageRef {
            tag: Some(sidecar_tag(&top.digest)),
            digest: None,
            ..image.clone()
        };
        let admitted = |by: String, how: &str| {
            tracing::info!("{image}: signature verified ({by}{how})");
            Ok(Some(format!("{ADMITTED}{by}{how}")))
        };
        match self
            .judge_at(source, rule, &tagged, top, &mut reasons)
            .await
        {
            Ok(Some(by)) => return admitted(by, ""),
            Ok(None) => seen += 1,
            Err(e) => reasons.push(format!("{e:#}")),
        }
        for r in referred_signatures(source, image, &top.digest).await {
            seen += 1;
            match self.judge_at(source, rule, &r, top, &mut reasons).await {
                Ok(Some(by)) => return admitted(by, VIA_REFERRER),
                Ok(None) => {}
                Err(e) => reasons.push(format!("{e:#}")),
            }
        }
        if seen == 0 {
            tracing::debug!("{image}: no signature found: {}", reasons.join("; "));
            bail!(
                "not signed: no cosign signature for {} in {} (no tag {}, no referrer); sign it, or let it in with unsigned: true in {}",
                top.digest,
                image.name(),
                sidecar_tag(&top.digest),
                self.path.display()
            );
        }
        reasons.dedup();
        bail!(
            "signature refused by {}: {}",
            self.path.display(),
            reasons.join("; ")
        )
    }

    /// Judges each signature of the signature manifest at `holder`: who
    /// signed, when one satisfies the rule, else the reasons are added to
    /// `reasons`; an error when there is no signature manifest there.
    async fn judge_at(
        &self,
        source: &dyn Fetch,
        rule: &Rule,
        holder: &ImageRef,
        top: &Descriptor,
        reasons: &mut Vec<String>,
    ) -> anyhow::Result<Option<String>> {
        let manifest = signature_manifest(source, holder).await?;
        let layers = manifest
            .layers
            .iter()
            .filter(|l| l.media_type == SIMPLE_SIGNING)
            .take(MAX_SIGNATURES);
        let mut any = false;
        for layer in layers {
            any = true;
            let verdict = async {
                let payload = source
                    .small_blob(holder, layer, MAX_PAYLOAD)
                    .await
                    .context("its payload")?;
                let sig = Signature::new(payload.to_vec(), &layer.annotations)?;
                self.judge(rule, &sig, top)
            }
            .await;
            match verdict {
                Ok(by) => return Ok(Some(by)),
                Err(e) => reasons.push(format!("{e:#}")),
            }
        }
        if !any {
            reasons.push(format!("{holder} holds no cosign signature"));
        }
        Ok(None)
    }

    /// Whether one signature satisfies `rule` for `top`; says who signed.
    fn judge(&self, rule: &Rule, sig: &Signature, top: &Descriptor) -> anyhow::Result<String> {
        let signed = sig.signed_digest()?;
        if signed != top.digest {
            bail!(
                "a signature for another image ({signed}), not {}",
                top.digest
            );
        }
        if let Some((name, _)) = rule.keys.iter().find(|(_, k)| sig.made_by(k)) {
            return Ok(format!("key {name}"));
        }
        let mut why = Vec::new();
        if !rule.keys.is_empty() {
            let names: Vec<&str> = rule.keys.iter().map(|(n, _)| n.as_str()).collect();
            why.push(format!("not signed by {}", names.join(" or ")));
        }
        if !rule.keyless.is_empty() {
            match self.keyless(rule, sig) {
                Ok(by) => return Ok(by),
                Err(e) => why.push(format!("{e:#}")),
            }
        }
        bail!("{}", why.join("; "))
    }

    fn keyless(&self, rule: &Rule, sig: &Signature) -> anyhow::Result<String> {
        let root = self.root.as_ref().expect("checked at load");
        let Some(cert) = &sig.certificate else {
            bail!("no certificate (a key-pair signature; the rule wants a keyless signer)");
        };
        let signer = trust::signer_of(cert)?;
        if !sig.made_by(&signer.key) {
            bail!("the signature was not made with its certificate's key");
        }
        let at = match sig.logged_at(root)? {
            Some(t) => t,
            None => chrono::Utc::now(),
        };
        root.check_chain(cert, at)?;
        let issuer = signer.issuer.as_deref().unwrap_or("");
        if let Some(id) = rule
            .keyless
            .iter()
            .find(|id| id.issuer == issuer && signer.identities.contains(&id.identity))
        {
            return Ok(format!("{} from {}", id.identity, id.issuer));
        }
        let wanted: Vec<String> = rule
            .keyless
            .iter()
            .map(|i| format!("{} from {}", i.identity, i.issuer))
            .collect();
        bail!(
            "signed by {} from {}, the policy wants {}",
            if signer.identities.is_empty() {
                "no identity".to_string()
            } else {
                signer.identities.join(", ")
            },
            if issuer.is_empty() {
                "no issuer"
            } else {
                issuer
            },
            wanted.join(" or ")
        )
    }
}

/// A signature manifest (cosign's: simple-signing layers) at `at`.
async fn signature_manifest(
    source: &dyn Fetch,
    at: &ImageRef,
) -> anyhow::Result<crate::primitives::oci::ImageManifest> {
    let resolved = source
        .document(at)
        .await
        .map_err(|e| anyhow!("{at}: {e:#}"))?;
    match Document::parse(&resolved.bytes) {
        Ok((_, Document::Manifest(m))) => Ok(m),
        Ok(_) => bail!("{at} is an index, not a signature manifest"),
        Err(e) => bail!("{at}: {e}"),
    }
}

/// The signature manifests OCI 1.1 referrers name for `subject`: from the
/// referrers API where the source serves it, else from the referrers tag
/// schema (the index tagged `sha256-<hex>`), by digest.
pub async fn referred_signatures(
    source: &dyn Fetch,
    image: &ImageRef,
    subject: &crate::primitives::digest::Digest,
) -> Vec<ImageRef> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Index {
        #[serde(default)]
        manifests: Vec<Entry>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Entry {
        digest: crate::primitives::digest::Digest,
        #[serde(default)]
        artifact_type: String,
    }
    let bytes = match source.referrers(image, subject).await {
        Some(b) => b,
        None => {
            let tag = ImageRef {
                tag: Some(crate::adapters::registry::referrers_tag(subject)),
                digest: None,
                ..image.clone()
            };
            match source.document(&tag).await {
                Ok(r) => r.bytes,
                Err(_) => return Vec::new(),
            }
        }
    };
    let Ok(index) = serde_json::from_slice::<Index>(&bytes) else {
        return Vec::new();
    };
    index
        .manifests
        .into_iter()
        .filter(|m| m.artifact_type == cosign::SIGNATURE_ARTIFACT)
        .take(MAX_SIGNATURES)
        .map(|m| ImageRef {
            tag: None,
            digest: Some(m.digest),
            ..image.clone()
        })
        .collect()
}

impl Gate for SignaturePolicy {
    fn admit<'a>(
        &'a self,
        source: &'a dyn Fetch,
        image: &'a ImageRef,
        top: &'a Descriptor,
    ) -> BoxFuture<'a, anyhow::Result<Option<String>>> {
        self.check(source, image, top).boxed()
    }
}
