//! containerd versions, and what each can do with pinned images.

use std::fmt;
use std::path::Path;
use std::process::Command;

use anyhow::{anyhow, Context};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses the first `[v]X.Y.Z` in `containerd --version` output
    /// (`containerd github.com/containerd/containerd 1.7.24~ds1 ...`).
    pub fn parse_output(out: &str) -> Option<Version> {
        out.split_whitespace().find_map(|w| {
            let w = w.trim_start_matches('v');
            let mut it = w.split(|c: char| !c.is_ascii_digit());
            let major = it.next()?.parse().ok()?;
            let minor = it.next()?.parse().ok()?;
            let patch = it.next()?.parse().ok()?;
            w.contains('.').then_some(Version {
                major,
                minor,
                patch,
            })
        })
    }

    pub fn of_binary(binary: &Path) -> anyhow::Result<Version> {
        let out = Command::new(binary)
            .arg("--version")
            .output()
            .with_context(|| format!("running {} --version", binary.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        Version::parse_output(&text).ok_or_else(|| {
            anyhow!(
                "{} --version printed no version: {text:?}",
                binary.display()
            )
        })
    }

    /// Whether CRI reports `pinned` for images labelled pinned at all.
    pub fn honours_pinned_label(&self) -> bool {
        match (self.major, self.minor) {
            (1, 6) => *self >= Version::new(1, 6, 22),
            (1, 7) => *self >= Version::new(1, 7, 3),
            (1, m) => m > 7,
            (m, _) => m >= 2,
        }
    }

    /// Whether label-based pinning is reliable (containerd PRs #9381/#9382).
    pub fn pins_reliably(&self) -> bool {
        match (self.major, self.minor) {
            (1, 6) => *self >= Version::new(1, 6, 25),
            (1, 7) => *self >= Version::new(1, 7, 10),
            (1, m) => m > 7,
            (m, _) => m >= 2,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_judges() {
        let v = Version::parse_output(
            "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6",
        )
        .unwrap();
        assert_eq!(v, Version::new(1, 7, 24));
        assert_eq!(
            Version::parse_output("containerd containerd.io v2.0.2 c507a0257e").unwrap(),
            Version::new(2, 0, 2)
        );
        assert!(!Version::new(1, 6, 20).honours_pinned_label());
        assert!(
            Version::new(1, 6, 22).honours_pinned_label()
                && !Version::new(1, 6, 22).pins_reliably()
        );
        assert!(!Version::new(1, 7, 2).honours_pinned_label());
        assert!(Version::new(1, 7, 10).pins_reliably());
        assert!(Version::new(2, 0, 0).pins_reliably());
    }
}
