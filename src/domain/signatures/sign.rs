//! Signing what kiln pushes, as `cosign sign --key` does: a simple-signing
//! payload naming the image's repository and manifest digest, signed with
//! ECDSA P-256 over SHA-256 (ASN.1 DER, base64 in the layer's
//! `dev.cosignproject.cosign/signature` annotation), in a manifest tagged
//! `sha256-<hex>.sig` beside the image. So `cosign verify --key` accepts
//! it, and so does a kiln build's signature policy (`keys: [kiln.pub]`)
//! when it follows the image as its previous one.
//!
//! The key is a PEM private key (PKCS#8 `PRIVATE KEY` or SEC1 `EC PRIVATE
//! KEY`, P-256): what `openssl genpkey` writes. Why not cosign's own
//! encrypted key file: reading it needs scrypt and NaCl's secretbox for a
//! password kiln would then have to take; a CI's secret store already
//! guards the file. `cosign import-key-pair` turns this key into cosign's.

use anyhow::{anyhow, bail};
use base64::Engine as _;
use p256::pkcs8::DecodePrivateKey;
use serde_json::json;

use super::cosign::{SIGNATURE, SIMPLE_SIGNING};
use crate::primitives::digest::Digest;
use crate::primitives::error::BadInput;
use crate::primitives::oci::{media, Descriptor};

/// A signing key read from `--sign-key`.
pub struct SigningKey {
    key: p256::ecdsa::SigningKey,
    /// The file it came from, as given (for what the report says).
    pub name: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.name)
    }
}

/// A signature ready to push: its manifest and the two blobs it names.
pub struct SignatureImage {
    pub manifest: Vec<u8>,
    pub config: (Descriptor, Vec<u8>),
    pub payload: (Descriptor, Vec<u8>),
}

impl SigningKey {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let bad = |what: String| {
            anyhow::Error::from(BadInput(format!("--sign-key {}: {what}", path.display())))
        };
        let pem = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        if pem.contains("ENCRYPTED") {
            return Err(bad(
                "an encrypted key (cosign's own format?); give kiln an unencrypted PEM P-256 key (openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256), kept in your CI's secret store".into(),
            ));
        }
        // A secret store's value may carry blank lines around the PEM.
        let pem = format!("{}\n", pem.trim());
        let key = p256::ecdsa::SigningKey::from_pkcs8_pem(&pem)
            .or_else(|_| p256::SecretKey::from_sec1_pem(&pem).map(p256::ecdsa::SigningKey::from))
            .map_err(|_| {
                bad(
                    "not a PEM P-256 private key (PKCS#8 PRIVATE KEY or SEC1 EC PRIVATE KEY)"
                        .into(),
                )
            })?;
        Ok(SigningKey {
            key,
            name: path.display().to_string(),
        })
    }

    /// The public key, PEM (what `cosign verify --key` and a policy take).
    pub fn public_pem(&self) -> anyhow::Result<String> {
        use p256::pkcs8::EncodePublicKey;
        self.key
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .map_err(|e| anyhow!("{e}"))
    }

    /// The signature of the image `repository@digest`, as cosign stores it.
    pub fn sign(&self, repository: &str, digest: &Digest) -> anyhow::Result<SignatureImage> {
        use p256::ecdsa::signature::Signer;
        if repository.is_empty() {
            bail!("no repository to sign for");
        }
        let payload = serde_json::to_vec(&json!({
            "critical": {
                "identity": {"docker-reference": repository},
                "image": {"docker-manifest-digest": digest.to_string()},
                "type": "cosign container image signature"
            },
            "optional": null
        }))?;
        let sig: p256::ecdsa::Signature = self.key.sign(&payload);
        let encoded = base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes());
        let payload_desc =
            Descriptor::new(SIMPLE_SIGNING, Digest::of(&payload), payload.len() as u64);
        // The config as cosign writes one: the payload as its only layer.
        let config = serde_json::to_vec(&json!({
            "architecture": "",
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [payload_desc.digest.to_string()]},
            "config": {}
        }))?;
        let config_desc =
            Descriptor::new(media::OCI_CONFIG, Digest::of(&config), config.len() as u64);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": media::OCI_MANIFEST,
            "config": {"mediaType": config_desc.media_type, "digest": config_desc.digest.to_string(), "size": config_desc.size},
            "layers": [{
                "mediaType": SIMPLE_SIGNING,
                "digest": payload_desc.digest.to_string(),
                "size": payload_desc.size,
                "annotations": {SIGNATURE: encoded}
            }]
        }))?;
        Ok(SignatureImage {
            manifest,
            config: (config_desc, config),
            payload: (payload_desc, payload),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What kiln signs, kiln's own verifier accepts (cosign's acceptance
    /// is tests/signatures.rs's, with the real cosign).
    #[test]
    fn a_signature_verifies_with_its_public_key() {
        let dir = tempfile::tempdir().unwrap();
        let secret = p256::SecretKey::from_slice(&[7u8; 32]).unwrap();
        let pem = p256::pkcs8::EncodePrivateKey::to_pkcs8_pem(&secret, Default::default()).unwrap();
        let path = dir.path().join("kiln.key");
        // As a CI secret may hold it: blank lines around.
        std::fs::write(&path, format!("\n{}\n\n", pem.as_str())).unwrap();
        let key = SigningKey::load(&path).unwrap();
        let digest = Digest::of(b"a manifest");
        let s = key.sign("127.0.0.1:5000/kiln/node", &digest).unwrap();
        let m: serde_json::Value = serde_json::from_slice(&s.manifest).unwrap();
        let annotations: std::collections::BTreeMap<String, String> =
            serde_json::from_value(m["layers"][0]["annotations"].clone()).unwrap();
        let sig = super::super::cosign::Signature::new(s.payload.1.clone(), &annotations).unwrap();
        assert_eq!(sig.signed_digest().unwrap(), digest);
        let public = super::super::trust::PublicKey::from_pem(&key.public_pem().unwrap()).unwrap();
        assert!(sig.made_by(&public));
        // Another key's public half does not verify it.
        let other = p256::SecretKey::from_slice(&[8u8; 32]).unwrap();
        let other_pem = p256::pkcs8::EncodePublicKey::to_public_key_pem(
            &other.public_key(),
            Default::default(),
        )
        .unwrap();
        assert!(!sig.made_by(&super::super::trust::PublicKey::from_pem(&other_pem).unwrap()));
        // An encrypted key is refused with the way out.
        std::fs::write(&path, "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n").unwrap();
        assert!(format!("{:#}", SigningKey::load(&path).unwrap_err()).contains("unencrypted"));
    }
}
