//! Registry credentials the way Docker keeps them: `$DOCKER_CONFIG/config.json`
//! (default `~/.docker/config.json`) with `auths`, `credHelpers` and
//! `credsStore`. Secrets never reach a log line: `Credential`'s Debug hides them.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context};
use base64::Engine as _;
use serde::Deserialize;

#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    Basic {
        username: String,
        password: String,
    },
    /// An OAuth2 refresh token (`docker login` to some registries stores one).
    IdentityToken(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credential::IdentityToken(_) => write!(f, "IdentityToken(<redacted>)"),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
    #[serde(default)]
    cred_helpers: HashMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

impl std::fmt::Debug for AuthEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthEntry(<redacted>)")
    }
}

#[derive(Debug, Default)]
pub struct Credentials {
    path: Option<PathBuf>,
    config: DockerConfig,
}

impl Credentials {
    /// Reads the Docker config; none at all is fine, a broken one is an error.
    pub fn load() -> anyhow::Result<Credentials> {
        let dir = std::env::var_os("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")));
        let Some(path) = dir.map(|d| d.join("config.json")) else {
            return Ok(Credentials::default());
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credentials::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let config = serde_json::from_str(&text)
            .map_err(|e| anyhow!("{}: not a Docker config: {e}", path.display()))?;
        Ok(Credentials {
            path: Some(path),
            config,
        })
    }

    /// Credentials for a registry host (`host[:port]`), if any are configured.
    pub fn get(&self, host: &str) -> anyhow::Result<Option<Credential>> {
        let keys = candidate_keys(host);
        for k in &keys {
            if let Some(helper) = self.config.cred_helpers.get(k) {
                return run_helper(helper, k);
            }
        }
        if let Some(store) = &self.config.creds_store {
            // The store knows hosts by the key `docker login` used.
            let key = self
                .config
                .auths
                .keys()
                .find(|a| keys.contains(&normalise_key(a)))
                .cloned()
                .unwrap_or_else(|| keys[0].clone());
            if let Some(c) = run_helper(store, &key)? {
                return Ok(Some(c));
            }
        }
        for (k, entry) in &self.config.auths {
            if !keys.contains(&normalise_key(k)) {
                continue;
            }
            if let Some(t) = entry.identitytoken.as_ref().filter(|t| !t.is_empty()) {
                return Ok(Some(Credential::IdentityToken(t.clone())));
            }
            if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
                return Ok(Some(Credential::Basic {
                    username: u.clone(),
                    password: p.clone(),
                }));
            }
            if let Some(a) = entry.auth.as_ref().filter(|a| !a.is_empty()) {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .map_err(|_| {
                        anyhow!("{}: auths[{k:?}].auth is not base64", self.path_display())
                    })?;
                let decoded = String::from_utf8(decoded).map_err(|_| {
                    anyhow!("{}: auths[{k:?}].auth is not UTF-8", self.path_display())
                })?;
                let (u, p) = decoded.split_once(':').ok_or_else(|| {
                    anyhow!(
                        "{}: auths[{k:?}].auth is not user:password",
                        self.path_display()
                    )
                })?;
                return Ok(Some(Credential::Basic {
                    username: u.to_string(),
                    password: p.to_string(),
                }));
            }
        }
        Ok(None)
    }

    fn path_display(&self) -> String {
        self.path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "docker config".into())
    }
}

/// `https://index.docker.io/v1/` -> `index.docker.io`.
fn normalise_key(k: &str) -> String {
    let k = k
        .strip_prefix("https://")
        .or_else(|| k.strip_prefix("http://"))
        .unwrap_or(k);
    k.split('/').next().unwrap_or(k).to_string()
}

fn candidate_keys(host: &str) -> Vec<String> {
    if crate::primitives::reference::DOCKER_HUB_ALIASES.contains(&host) {
        crate::primitives::reference::DOCKER_HUB_ALIASES
            .iter()
            .map(|h| h.to_string())
            .collect()
    } else {
        vec![host.to_string()]
    }
}

/// `docker-credential-NAME get`, the Docker credential-helper protocol.
fn run_helper(name: &str, server: &str) -> anyhow::Result<Option<Credential>> {
    let bin = format!("docker-credential-{name}");
    let server = if server == "index.docker.io" {
        "https://index.docker.io/v1/"
    } else {
        server
    };
    let mut child = Command::new(&bin)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running credential helper {bin} (from your Docker config)"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(server.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        if msg.to_lowercase().contains("not found") {
            return Ok(None);
        }
        bail!(
            "credential helper {bin} failed for {server}: {}",
            msg.trim()
        );
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Reply {
        username: String,
        secret: String,
    }
    let r: Reply = serde_json::from_slice(&out.stdout)
        .map_err(|_| anyhow!("credential helper {bin} printed no credentials for {server}"))?;
    Ok(Some(if r.username == "<token>" {
        Credential::IdentityToken(r.secret)
    } else {
        Credential::Basic {
            username: r.username,
            password: r.secret,
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_auths_in_every_form_and_hides_secrets() {
        let cfg: DockerConfig = serde_json::from_str(
            r#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "dXNlcjpzM2NyZXQ="},
                "r.example:5000": {"username": "u", "password": "p"},
                "t.example": {"identitytoken": "refresh-me"}
            }}"#,
        )
        .unwrap();
        let c = Credentials {
            path: None,
            config: cfg,
        };
        assert_eq!(
            c.get("docker.io").unwrap(),
            Some(Credential::Basic {
                username: "user".into(),
                password: "s3cret".into()
            })
        );
        assert_eq!(
            c.get("r.example:5000").unwrap(),
            Some(Credential::Basic {
                username: "u".into(),
                password: "p".into()
            })
        );
        let t = c.get("t.example").unwrap().unwrap();
        assert_eq!(format!("{t:?}"), "IdentityToken(<redacted>)");
        assert_eq!(c.get("other.example").unwrap(), None);
        assert!(!format!("{:?}", c.get("docker.io").unwrap()).contains("s3cret"));
    }
}
