//! A throwaway CA and a server certificate for 127.0.0.1/localhost, made at
//! test time; and an ES256 signer for registry bearer tokens.

use std::path::PathBuf;

use base64::Engine as _;
use p256::ecdsa::signature::Signer;
use p256::pkcs8::EncodePrivateKey;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

pub struct TestCa {
    pub dir: tempfile::TempDir,
    pub ca_pem: PathBuf,
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
}

pub fn make_ca() -> TestCa {
    let dir = tempfile::Builder::new()
        .prefix("kiln-ca-")
        .tempdir()
        .unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kiln test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let ca_pem = dir.path().join("ca.pem");
    let cert_pem = dir.path().join("cert.pem");
    let key_pem = dir.path().join("key.pem");
    std::fs::write(&ca_pem, ca.pem()).unwrap();
    std::fs::write(&cert_pem, cert.pem()).unwrap();
    std::fs::write(&key_pem, key.serialize_pem()).unwrap();
    TestCa {
        dir,
        ca_pem,
        cert_pem,
        key_pem,
    }
}

/// Signs JWTs the way a registry token server does (ES256, x5c header); the
/// registry trusts `cert_pem` as its `rootcertbundle`.
pub struct TokenSigner {
    key: p256::ecdsa::SigningKey,
    cert_der: Vec<u8>,
    pub cert_pem: PathBuf,
    _dir: tempfile::TempDir,
}

impl TokenSigner {
    pub fn new() -> TokenSigner {
        let key = p256::ecdsa::SigningKey::random(&mut rand::rngs::OsRng);
        let pem = key.to_pkcs8_pem(Default::default()).unwrap();
        let kp = KeyPair::from_pem(&pem).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "kiln test token signer");
        let cert = params.self_signed(&kp).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cert_pem = dir.path().join("token-signer.pem");
        std::fs::write(&cert_pem, cert.pem()).unwrap();
        TokenSigner {
            key,
            cert_der: cert.der().to_vec(),
            cert_pem,
            _dir: dir,
        }
    }

    pub fn token(&self, issuer: &str, service: &str, subject: &str, scopes: &[String]) -> String {
        self.token_lived(issuer, service, subject, scopes, 600)
    }

    /// A token the registry accepts for about `lifetime` seconds: its `exp`
    /// is set back by the 60 s of leeway distribution adds to it
    /// (`registry/auth/token/token.go`, `Leeway = 60 * time.Second`).
    pub fn token_lived(
        &self,
        issuer: &str,
        service: &str,
        subject: &str,
        scopes: &[String],
        lifetime: u64,
    ) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [base64::engine::general_purpose::STANDARD.encode(&self.cert_der)]});
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let access: Vec<serde_json::Value> = scopes
            .iter()
            .filter_map(|s| {
                let mut parts = s.splitn(3, ':');
                let (t, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
                Some(serde_json::json!({"type": t, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}))
            })
            .collect();
        let claims = serde_json::json!({
            "iss": issuer, "sub": subject, "aud": service,
            "exp": if lifetime >= 600 { now + lifetime } else { (now + lifetime).saturating_sub(60) },
            "nbf": now - 30, "iat": now,
            "jti": format!("{:x}", rand::random::<u64>()), "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            b64(&serde_json::to_vec(&header).unwrap()),
            b64(&serde_json::to_vec(&claims).unwrap())
        );
        let sig: p256::ecdsa::Signature = self.key.sign(signing_input.as_bytes());
        format!("{signing_input}.{}", b64(&sig.to_bytes()))
    }
}

impl Default for TokenSigner {
    fn default() -> Self {
        Self::new()
    }
}
