//! What the kubelet itself keeps and reads about the images on a node,
//! as its own source says (kubernetes/kubernetes, read for this module):
//! the image-manager state a node image must not carry (`state`), the
//! credential-verification policies that decide whether a bundled image
//! runs offline (`policy`), and the configuration that turns image GC on
//! safely beside kiln's pins (`config`).

pub mod config;
pub mod policy;
pub mod state;

/// A kubelet minor version (`1.35` of `v1.35.2`): what decides which
/// fields and feature gates a kubelet knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Minor(pub u32, pub u32);

impl Minor {
    /// `v1.35.2`, `1.35.0-rc.1`, `1.35`.
    pub fn parse(v: &str) -> Result<Minor, String> {
        let bad = || {
            format!(
                "{:?} is not a Kubernetes version like v1.35.0",
                crate::primitives::text::one_line(v)
            )
        };
        let rest = v.trim().strip_prefix('v').unwrap_or(v.trim());
        let mut parts = rest.split(['.', '-', '+']);
        let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let minor = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        Ok(Minor(major, minor))
    }
}

impl std::fmt::Display for Minor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}", self.0, self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_as_kubernetes_writes_them() {
        assert_eq!(Minor::parse("v1.35.2"), Ok(Minor(1, 35)));
        assert_eq!(Minor::parse("1.33.0-rc.1"), Ok(Minor(1, 33)));
        assert_eq!(Minor::parse("v1.29"), Ok(Minor(1, 29)));
        assert!(Minor::parse("latest").is_err());
        assert!(Minor(1, 35) > Minor(1, 9));
    }
}
