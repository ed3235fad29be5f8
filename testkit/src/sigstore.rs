//! A Sigstore of the tests' own: certificate authorities issuing
//! Fulcio-style code-signing certificates, a transparency log key that
//! signs entry timestamps, and the `trusted_root.json` naming them. The
//! signatures land in the registry through cosign itself
//! (`cosign attach signature`), so kiln reads what cosign writes.

use std::time::SystemTime;

use base64::Engine as _;
use p256::ecdsa::signature::Signer;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, CustomExtension, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use sha2::Digest as _;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// A root certificate authority (ECDSA P-384, as Fulcio's).
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A signing certificate and its key.
pub struct Leaf {
    pub cert_pem: String,
    key: p256::ecdsa::SigningKey,
}

impl Authority {
    pub fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "kiln tests");
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        Authority {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// A code-signing certificate for `identity` (an email, or a URI when
    /// it has "://"), vouched for by the OIDC `issuer`, valid between the
    /// two times.
    pub fn leaf(&self, identity: &str, issuer: &str, from: SystemTime, to: SystemTime) -> Leaf {
        let key = p256::ecdsa::SigningKey::random(&mut rand::rngs::OsRng);
        let pem = key.to_pkcs8_pem(Default::default()).unwrap();
        let kp = KeyPair::from_pem(&pem).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![if identity.contains("://") {
            SanType::URI(identity.try_into().unwrap())
        } else {
            SanType::Rfc822Name(identity.try_into().unwrap())
        }];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        params.not_before = from.into();
        params.not_after = to.into();
        // Fulcio's OIDC issuer extensions, both as Fulcio writes them: v1
        // (1.1, the raw string; what cosign 2's legacy path reads) and v2
        // (1.8, a DER UTF8String).
        let mut utf8 = vec![0x0c, issuer.len() as u8];
        utf8.extend_from_slice(issuer.as_bytes());
        params.custom_extensions = vec![
            CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 4, 1, 57264, 1, 1],
                issuer.as_bytes().to_vec(),
            ),
            CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 57264, 1, 8], utf8),
        ];
        let cert = params.signed_by(&kp, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key,
        }
    }
}

impl Leaf {
    /// The base64 ASN.1 DER ECDSA signature over `payload`, as cosign
    /// writes it into its signature annotation.
    pub fn sign(&self, payload: &[u8]) -> String {
        let sig: p256::ecdsa::Signature = self.key.sign(payload);
        b64(sig.to_der().as_bytes())
    }
}

/// A transparency log's signing key.
pub struct Log {
    key: p256::ecdsa::SigningKey,
}

impl Default for Log {
    fn default() -> Self {
        Self::new()
    }
}

impl Log {
    pub fn new() -> Log {
        Log {
            key: p256::ecdsa::SigningKey::random(&mut rand::rngs::OsRng),
        }
    }

    fn der(&self) -> Vec<u8> {
        self.key
            .verifying_key()
            .to_public_key_der()
            .unwrap()
            .as_bytes()
            .to_vec()
    }

    /// The public key, PEM.
    pub fn pem(&self) -> String {
        self.key
            .verifying_key()
            .to_public_key_pem(Default::default())
            .unwrap()
    }

    fn id(&self) -> Vec<u8> {
        sha2::Sha256::digest(self.der()).to_vec()
    }

    /// What cosign attaches with `--rekor-response`: this log's signed
    /// entry timestamp over a `hashedrekord` entry of `payload` signed
    /// `signature` (base64) with `cert_pem`, integrated at `at` (Unix s).
    pub fn bundle(&self, payload: &[u8], signature: &str, cert_pem: &str, at: i64) -> String {
        let body = serde_json::json!({
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": hex::encode(sha2::Sha256::digest(payload))}},
                "signature": {"content": signature, "publicKey": {"content": b64(cert_pem.as_bytes())}}
            }
        });
        let body = b64(body.to_string().as_bytes());
        let log_id = hex::encode(self.id());
        // The canonical form the timestamp signs: keys sorted, no spaces.
        let canonical = format!(
            "{{\"body\":\"{body}\",\"integratedTime\":{at},\"logID\":\"{log_id}\",\"logIndex\":7}}"
        );
        let set: p256::ecdsa::Signature = self.key.sign(canonical.as_bytes());
        // cosign's LocalSignedPayload (pkg/cosign/fetch.go), the file
        // `cosign sign-blob --bundle` writes and `attach --rekor-response` reads.
        serde_json::json!({
            "base64Signature": signature,
            "rekorBundle": {
                "SignedEntryTimestamp": b64(set.to_der().as_bytes()),
                "Payload": {"body": body, "integratedTime": at, "logIndex": 7, "logID": log_id}
            }
        })
        .to_string()
    }
}

/// A `trusted_root.json` (Sigstore protobuf-specs `TrustedRoot`) holding
/// these authorities and logs.
pub fn trusted_root(cas: &[&Authority], logs: &[&Log]) -> String {
    let cas: Vec<serde_json::Value> = cas
        .iter()
        .map(|ca| {
            serde_json::json!({
                "subject": {"organization": "kiln tests", "commonName": "kiln test CA"},
                "uri": "https://fulcio.invalid",
                "certChain": {"certificates": [{"rawBytes": b64(&ca.der())}]},
                "validFor": {"start": "2020-01-01T00:00:00Z"}
            })
        })
        .collect();
    let logs: Vec<serde_json::Value> = logs
        .iter()
        .map(|l| {
            serde_json::json!({
                "baseUrl": "https://rekor.invalid",
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": b64(&l.der()),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": {"start": "2020-01-01T00:00:00Z"}
                },
                "logId": {"keyId": b64(&l.id())}
            })
        })
        .collect();
    serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": logs,
        "certificateAuthorities": cas,
        "ctlogs": [],
        "timestampAuthorities": []
    })
    .to_string()
}

/// A signing key pair for `kiln build --sign-key`, written into `dir`:
/// `kiln.key` (PKCS#8 PEM, as `openssl genpkey` writes it) and `kiln.pub`
/// (what `cosign verify --key` and a signature policy take); and a
/// signature policy `policy.yaml` whose rule for `repository` takes that
/// key and lets every other image in unsigned.
pub fn node_signing(dir: &std::path::Path, repository: &str) -> NodeSigning {
    std::fs::create_dir_all(dir).unwrap();
    let secret = p256::SecretKey::random(&mut rand::rngs::OsRng);
    let key = dir.join("kiln.key");
    let public = dir.join("kiln.pub");
    std::fs::write(
        &key,
        secret.to_pkcs8_pem(Default::default()).unwrap().as_bytes(),
    )
    .unwrap();
    std::fs::write(
        &public,
        secret
            .public_key()
            .to_public_key_pem(Default::default())
            .unwrap(),
    )
    .unwrap();
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: kiln/v1\nkind: SignaturePolicy\nimages:\n- match: {repository}\n  keys: [kiln.pub]\n- match: \"*\"\n  unsigned: true\n"
        ),
    )
    .unwrap();
    NodeSigning {
        key,
        public,
        policy,
    }
}

pub struct NodeSigning {
    pub key: std::path::PathBuf,
    pub public: std::path::PathBuf,
    pub policy: std::path::PathBuf,
}
