//! Image references, normalised the way Docker and containerd do it, so that the
//! names kiln records are the names kubelet and `crictl` will ask for.

use std::fmt;

use crate::primitives::digest::Digest;

/// A fully qualified image reference: `domain/path[:tag][@digest]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    pub domain: String,
    pub path: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid image reference {input:?}: {reason}")]
pub struct RefError {
    pub input: String,
    pub reason: String,
}

const DOCKER_HUB: &str = "docker.io";
/// Every name Docker Hub goes by; [`canonical_registry`] folds them.
pub const DOCKER_HUB_ALIASES: &[&str] = &["index.docker.io", "docker.io", "registry-1.docker.io"];

/// A registry host as references name it: Docker Hub's aliases are `docker.io`.
pub fn canonical_registry(host: &str) -> &str {
    if DOCKER_HUB_ALIASES.contains(&host) {
        DOCKER_HUB
    } else {
        host
    }
}

impl ImageRef {
    pub fn parse(input: &str) -> Result<Self, RefError> {
        let err = |reason: &str| RefError {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty reference"));
        }
        if s.contains("://") {
            return Err(err("a reference has no scheme; drop the http(s):// prefix"));
        }
        // The distribution grammar (oci-spec's), before kiln's Docker-style
        // normalisation: spaces, upper case in a repository, empty path parts...
        if let Err(e) = oci_spec::distribution::Reference::try_from(s) {
            // The grammar's own words ("invalid reference format") do not
            // say the usual cause: upper case in the repository.
            let before_digest = s.split('@').next().unwrap_or(s);
            let last_slash = before_digest.rfind('/').map(|i| i + 1).unwrap_or(0);
            let name = match before_digest[last_slash..].rfind(':') {
                Some(i) => &before_digest[..last_slash + i],
                None => before_digest,
            };
            let path = match name.split_once('/') {
                Some((first, rest))
                    if first.contains('.') || first.contains(':') || first == "localhost" =>
                {
                    rest
                }
                _ => name,
            };
            if path.chars().any(|c| c.is_ascii_uppercase()) {
                return Err(err(&format!(
                    "the repository {path:?} must be lowercase ({:?})",
                    path.to_ascii_lowercase()
                )));
            }
            return Err(err(&format!("not a valid image reference: {e}")));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(Digest::parse(d).map_err(|e| err(&e.to_string()))?)),
            None => (s, None),
        };
        // A ':' after the last '/' separates the tag; one before it belongs to a port.
        let last_slash = rest.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(err(&format!(
                    "tag {t:?} must be 1-128 of [A-Za-z0-9_.-] and not start with '.' or '-'"
                )));
            }
        }
        let (domain, path) = match name.split_once('/') {
            Some((first, remainder))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), remainder.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let domain = canonical_registry(&domain).to_string();
        let path = if domain == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path
        };
        if path.is_empty() {
            return Err(err("missing repository name"));
        }
        for component in path.split('/') {
            if !valid_component(component) {
                return Err(err(&format!(
                    "repository component {component:?} must be lowercase letters, digits and single separators (. _ __ -)"
                )));
            }
        }
        // Docker counts the name as normalised (`docker.io/library/...`):
        // one that only fits before would print as a name nothing parses.
        if domain.len() + 1 + path.len() > 255 {
            return Err(err(&format!(
                "the repository name {domain}/{path} is longer than 255 characters"
            )));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_string()),
        };
        Ok(ImageRef {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// `domain/path`, the name part containerd records.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// `domain/path:tag`, when the reference has a tag.
    pub fn tagged_name(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// The name as Docker prints it: `docker.io/library/` and `docker.io/`
    /// dropped (`nginx:1.27`, `bitnami/redis:7`), with the tag if any.
    pub fn docker_short_name(&self) -> String {
        let name = self.tagged_name().unwrap_or_else(|| self.to_string());
        name.strip_prefix("docker.io/library/")
            .or_else(|| name.strip_prefix("docker.io/"))
            .map(str::to_string)
            .unwrap_or(name)
    }

    /// `domain/path@digest` for a given (resolved) digest.
    pub fn digest_name(&self, digest: &Digest) -> String {
        format!("{}@{digest}", self.name())
    }

    /// Whether an image record called `record` is one of this image's: its
    /// tag, or a digest of its repository (copying writes both).
    pub fn owns_record(&self, record: &str) -> bool {
        self.tagged_name().as_deref() == Some(record)
            || record
                .strip_prefix(&self.name())
                .is_some_and(|rest| rest.starts_with('@'))
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ImageRef {
    type Err = RefError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ImageRef::parse(s)
    }
}

fn valid_tag(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && !t.starts_with(['.', '-'])
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, the distribution grammar for a path component.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !is_alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.chars().all(|ch| ch == '-');
        if !ok {
            return false;
        }
    }
    true
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        ImageRef::parse(s).unwrap().to_string()
    }

    #[test]
    fn the_distribution_grammar_is_enforced() {
        for bad in [
            "ex ample.com/x",
            "registry.k8s.io/Pause:3.10",
            "a//b",
            "x:",
            "UPPER/case",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad} parsed");
        }
        assert!(ImageRef::parse("registry.k8s.io/pause:3.10").is_ok());
    }

    #[test]
    fn normalises_like_docker() {
        assert_eq!(norm("nginx"), "docker.io/library/nginx:latest");
        assert_eq!(norm("nginx:1.27"), "docker.io/library/nginx:1.27");
        assert_eq!(norm("bitnami/redis"), "docker.io/bitnami/redis:latest");
        assert_eq!(
            norm("index.docker.io/library/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            norm("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause:3.10"
        );
        assert_eq!(norm("localhost/app"), "localhost/app:latest");
        assert_eq!(
            norm("127.0.0.1:5000/coredns/coredns:v1.11.3"),
            "127.0.0.1:5000/coredns/coredns:v1.11.3"
        );
        let d = "sha256:".to_string() + &"a".repeat(64);
        assert_eq!(
            norm(&format!("registry.k8s.io/pause@{d}")),
            format!("registry.k8s.io/pause@{d}")
        );
        assert_eq!(
            norm(&format!("registry.k8s.io/pause:3.10@{d}")),
            format!("registry.k8s.io/pause:3.10@{d}")
        );
    }

    #[test]
    fn names_for_records() {
        let r = ImageRef::parse("myapp:dev").unwrap();
        assert_eq!(r.name(), "docker.io/library/myapp");
        assert_eq!(r.tagged_name().unwrap(), "docker.io/library/myapp:dev");
        assert!(r.owns_record("docker.io/library/myapp:dev"));
        assert!(r.owns_record("docker.io/library/myapp@sha256:abc"));
        assert!(!r.owns_record("docker.io/library/myapp:other"));
        assert!(!r.owns_record("docker.io/library/myapp-two@sha256:abc"));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "Nginx",
            "registry.k8s.io/pause:",
            "registry.k8s.io/pause:-x",
            "registry.k8s.io/pau--_se",
            "registry.k8s.io//pause",
            "registry.k8s.io/pause@sha256:abc",
            "registry.k8s.io/pause@md5:0123",
            "http://registry.k8s.io/pause",
            "a b",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
