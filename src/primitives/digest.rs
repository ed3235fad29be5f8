//! Content digests, and the streaming check that every byte kiln records was
//! the byte its descriptor promised.

use std::fmt;

use sha2::{Digest as _, Sha256};

#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("unsupported digest algorithm in {0:?} (kiln verifies sha256 only)")]
    Algorithm(String),
    #[error("malformed digest {0:?}: want sha256: followed by 64 lowercase hex digits")]
    Malformed(String),
}

/// Feeds everything `r` yields to `hash`, 1 MiB at a time (a file's
/// SHA-256 or SHA-512), stopping at Ctrl-C / SIGTERM.
pub fn hash_read<H: sha2::Digest>(mut r: impl std::io::Read, mut hash: H) -> std::io::Result<H> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        crate::primitives::interrupt::check().map_err(std::io::Error::other)?;
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(hash);
        }
        hash.update(&buf[..n]);
    }
}

/// What `r` yields, its SHA-512 in hex (a release tarball's, a binary's).
pub fn sha512_hex(r: impl std::io::Read) -> std::io::Result<String> {
    Ok(hex::encode(hash_read(r, sha2::Sha512::new())?.finalize()))
}

impl Digest {
    /// The digest a finished SHA-256 hasher computed.
    pub fn from_hasher(h: sha2::Sha256) -> Digest {
        use sha2::Digest as _;
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
    }

    pub fn parse(s: &str) -> Result<Self, DigestError> {
        let Some((algo, hex)) = s.split_once(':') else {
            return Err(DigestError::Malformed(s.to_string()));
        };
        if algo != "sha256" {
            return Err(DigestError::Algorithm(s.to_string()));
        }
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(DigestError::Malformed(s.to_string()));
        }
        Ok(Digest(s.to_string()))
    }

    pub fn of(bytes: &[u8]) -> Self {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hex part, as used in blob paths.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    /// Shortened form for human output.
    pub fn short(&self) -> &str {
        &self.0[7..19]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Digest::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// What went wrong when content did not match its descriptor.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("content is larger than the {expected} bytes its descriptor declares")]
    TooLong { expected: u64 },
    #[error("content is {actual} bytes, its descriptor declares {expected}")]
    Size { expected: u64, actual: u64 },
    #[error("digest mismatch: expected {expected}, got {actual}")]
    Digest { expected: Digest, actual: Digest },
}

/// Hashes and counts content as it streams past; `finish` says whether it was
/// exactly what the descriptor promised.
pub struct Verifier {
    expected: Digest,
    size: u64,
    seen: u64,
    hasher: Sha256,
}

impl Verifier {
    pub fn new(expected: Digest, size: u64) -> Self {
        Verifier {
            expected,
            size,
            seen: 0,
            hasher: Sha256::new(),
        }
    }

    pub fn update(&mut self, chunk: &[u8]) -> Result<(), VerifyError> {
        self.seen += chunk.len() as u64;
        if self.seen > self.size {
            return Err(VerifyError::TooLong {
                expected: self.size,
            });
        }
        self.hasher.update(chunk);
        Ok(())
    }

    pub fn finish(self) -> Result<(), VerifyError> {
        if self.seen != self.size {
            return Err(VerifyError::Size {
                expected: self.size,
                actual: self.seen,
            });
        }
        let actual = Digest::from_hasher(self.hasher);
        if actual != self.expected {
            return Err(VerifyError::Digest {
                expected: self.expected,
                actual,
            });
        }
        Ok(())
    }
}

/// Checks a whole in-memory blob (manifests, configs) against its descriptor.
pub fn verify_bytes(expected: &Digest, size: u64, bytes: &[u8]) -> Result<(), VerifyError> {
    let mut v = Verifier::new(expected.clone(), size);
    v.update(bytes)?;
    v.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_streamed_content() {
        let d = Digest::of(b"hello world");
        let mut v = Verifier::new(d.clone(), 11);
        v.update(b"hello ").unwrap();
        v.update(b"world").unwrap();
        v.finish().unwrap();

        let mut v = Verifier::new(d.clone(), 11);
        v.update(b"hello").unwrap();
        assert!(matches!(v.finish(), Err(VerifyError::Size { .. })));

        let mut v = Verifier::new(d.clone(), 11);
        assert!(matches!(
            v.update(b"hello world!"),
            Err(VerifyError::TooLong { .. })
        ));

        assert!(matches!(
            verify_bytes(&d, 11, b"hello worlD"),
            Err(VerifyError::Digest { .. })
        ));
    }

    #[test]
    fn parses_only_sha256() {
        assert!(Digest::parse(&format!("sha256:{}", "0".repeat(64))).is_ok());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
        assert!(matches!(
            Digest::parse("sha512:00"),
            Err(DigestError::Algorithm(_))
        ));
    }
}
