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

    /// Whether an image entry for `other` serves a request for `self`.
    /// arm64's implicit variant is v8; a request without a variant takes any.
    pub fn matches(&self, other: &Platform) -> bool {
        if self.os != other.os || self.architecture != normalise_arch(&other.architecture) {
            return false;
        }
        match (&self.variant, &other.variant) {
            (None, _) => true,
            (Some(want), Some(have)) => want == have,
            (Some(want), None) => self.architecture == "arm64" && want == "v8",
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
        assert!(!Platform::parse("linux/arm/v7")
            .unwrap()
            .matches(&Platform::parse("linux/arm/v6").unwrap()));
        assert!(Platform::parse("linux").is_err());
        assert!(Platform::parse("linux/amd64/v1/x").is_err());
        assert_eq!(Platform::host().os, "linux");
    }
}
