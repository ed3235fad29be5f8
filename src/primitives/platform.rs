//! Platforms (`os/arch[/variant]`) and how kiln picks an index entry for one.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    pub fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let bad = || format!("invalid platform {s:?}: want OS/ARCH[/VARIANT], e.g. linux/amd64");
        if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
            return Err(bad());
        }
        if parts
            .iter()
            .any(|p| !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            return Err(bad());
        }
        let architecture = normalise_arch(&parts[1].to_lowercase());
        Ok(Platform {
            os: parts[0].to_lowercase(),
            architecture,
            variant: parts.get(2).map(|v| v.to_lowercase()),
        })
    }

    /// `linux/<this machine's architecture>`.
    pub fn host() -> Self {
        Platform {
            os: "linux".into(),
            architecture: normalise_arch(std::env::consts::ARCH),
            variant: None,
        }
    }

    /// Whether this machine runs the platform's binaries natively (its
    /// containerd's CRI lists that platform's images).
    pub fn runs_on_host(&self) -> bool {
        let host = Platform::host();
        self.os == host.os && normalise_arch(&self.architecture) == host.architecture
    }

    /// The name QEMU's user-mode emulator has for the architecture
    /// (`qemu-<name>`), if it has one.
    pub fn qemu_name(&self) -> Option<&'static str> {
        Some(match normalise_arch(&self.architecture).as_str() {
            "amd64" => "x86_64",
            "arm64" => "aarch64",
            "arm" => "arm",
            "386" => "i386",
            "ppc64le" => "ppc64le",
            "s390x" => "s390x",
            "riscv64" => "riscv64",
            "loong64" => "loongarch64",
            _ => return None,
        })
    }

    /// Whether an image for `other` serves a request for `self`.
    pub fn matches(&self, other: &Platform) -> bool {
        self.rank(other).is_some()
    }

    /// How well an image for `have` serves a request for `self`: 0 is an
    /// exact match, higher is a fallback (an arm/v7 request takes v6, then
    /// v5, as containerd's `platforms.Only` does); `None` does not serve.
    /// Variants are normalised first (arm64 means v8, arm means v7, amd64's
    /// v1 is no variant); a request without a variant takes the default one.
    pub fn rank(&self, have: &Platform) -> Option<u32> {
        if self.os != have.os || self.architecture != normalise_arch(&have.architecture) {
            return None;
        }
        let want = self.norm_variant();
        let got = have.norm_variant_for(&self.architecture);
        if want == got {
            return Some(0);
        }
        if self.variant.is_none() && self.architecture != "arm" {
            // No variant asked for, and none to prefer: any serves.
            return Some(1);
        }
        let arm_level = |v: &Option<String>| {
            v.as_deref()
                .and_then(|v| v.strip_prefix('v'))
                .and_then(|n| n.parse::<u32>().ok())
        };
        match (
            self.architecture.as_str(),
            arm_level(&want),
            arm_level(&got),
        ) {
            ("arm", Some(w), Some(g)) if g < w && g >= 5 => Some(w - g),
            _ => None,
        }
    }

    fn norm_variant(&self) -> Option<String> {
        Platform::variant_of(&self.architecture, self.variant.as_deref())
    }

    fn norm_variant_for(&self, arch: &str) -> Option<String> {
        Platform::variant_of(arch, self.variant.as_deref())
    }

    fn variant_of(arch: &str, variant: Option<&str>) -> Option<String> {
        match (arch, variant.map(str::to_lowercase).as_deref()) {
            ("arm64", None | Some("8") | Some("v8")) => Some("v8".into()),
            ("arm", None | Some("7") | Some("v7")) => Some("v7".into()),
            ("arm", Some("6")) => Some("v6".into()),
            ("arm", Some("5")) => Some("v5".into()),
            ("amd64", None | Some("v1")) => None,
            (_, v) => v.map(str::to_string),
        }
    }
}

fn normalise_arch(a: &str) -> String {
    match a {
        "x86_64" | "x86-64" => "amd64".into(),
        "aarch64" => "arm64".into(),
        "i386" | "i686" => "386".into(),
        other => other.into(),
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Platform {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Platform::parse(s)
    }
}

/// The OCI architecture an ELF header (its first 20 bytes) is built for;
/// `None` for anything else. Read by hand: only `e_machine` (and the byte
/// order, which splits ppc64 from ppc64le) matters, and a release's binary
/// is never loaded to learn it.
/// [`elf_architecture`] of what `r` starts with: only its header is read.
pub fn read_architecture(r: &mut impl std::io::Read) -> std::io::Result<Option<String>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(20);
    r.take(20).read_to_end(&mut head)?;
    Ok(elf_architecture(&head))
}

pub fn elf_architecture(head: &[u8]) -> Option<String> {
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return None;
    }
    let (class64, little) = (head[4] == 2, head[5] == 1);
    let machine = if little {
        u16::from_le_bytes([head[18], head[19]])
    } else {
        u16::from_be_bytes([head[18], head[19]])
    };
    Some(
        match (machine, class64, little) {
            (62, true, _) => "amd64",
            (3, false, _) => "386",
            (183, true, _) => "arm64",
            (40, false, _) => "arm",
            (22, true, _) => "s390x",
            (21, true, true) => "ppc64le",
            (21, true, false) => "ppc64",
            (243, true, _) => "riscv64",
            (258, true, _) => "loong64",
            _ => return None,
        }
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let amd = Platform::parse("linux/amd64").unwrap();
        assert!(amd.matches(&Platform::parse("linux/x86_64").unwrap()));
        assert!(!amd.matches(&Platform::parse("linux/arm64").unwrap()));
        let v8 = Platform::parse("linux/arm64/v8").unwrap();
        assert!(v8.matches(&Platform::parse("linux/arm64").unwrap()));
        let p = |s: &str| Platform::parse(s).unwrap();
        // arm/v7 falls back to v6 and v5, never up; arm means v7.
        assert_eq!(p("linux/arm/v7").rank(&p("linux/arm/v7")), Some(0));
        assert_eq!(p("linux/arm/v7").rank(&p("linux/arm/v6")), Some(1));
        assert_eq!(p("linux/arm/v7").rank(&p("linux/arm/v5")), Some(2));
        assert_eq!(p("linux/arm/v6").rank(&p("linux/arm/v7")), None);
        assert_eq!(p("linux/arm").rank(&p("linux/arm/v7")), Some(0));
        assert_eq!(p("linux/arm64").rank(&p("linux/arm64/v8")), Some(0));
        assert_eq!(p("linux/amd64").rank(&p("linux/amd64/v1")), Some(0));
        assert!(p("linux/amd64").matches(&p("linux/amd64/v3")));
        assert!(!p("linux/amd64/v3").matches(&p("linux/amd64")));
        assert!(Platform::parse("linux").is_err());
        assert!(Platform::parse("linux/amd64/v1/x").is_err());
        assert_eq!(Platform::host().os, "linux");
    }

    #[test]
    fn elf_headers_name_their_architecture() {
        let mut h = [0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[18..20].copy_from_slice(&183u16.to_le_bytes());
        assert_eq!(elf_architecture(&h).as_deref(), Some("arm64"));
        h[18..20].copy_from_slice(&62u16.to_le_bytes());
        assert_eq!(elf_architecture(&h).as_deref(), Some("amd64"));
        assert_eq!(elf_architecture(b"#!/bin/sh\necho hi\n"), None);
        assert_eq!(elf_architecture(&h[..10]), None);
    }
}
