//! Where each registry's images are fetched from: mirrors in order, then the
//! registry itself, each with its own TLS settings. Sources: `--mirror`
//! flags, a kiln registries file, and containerd's `certs.d/*/hosts.toml`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;

/// One place to fetch from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host[:port]`
    pub host: String,
    pub plain_http: bool,
    /// Extra CA certificates (PEM) to trust for this endpoint.
    pub ca_certs: Vec<PathBuf>,
    /// True for the registry itself (not a mirror).
    pub upstream: bool,
}

impl Endpoint {
    pub fn base_url(&self) -> String {
        format!(
            "{}://{}",
            if self.plain_http { "http" } else { "https" },
            self.host
        )
    }

    /// From `scheme://host[:port]` (no path); no scheme means HTTPS.
    pub fn from_url(url: &str) -> Result<Endpoint, String> {
        let (plain_http, rest) = if let Some(r) = url.strip_prefix("http://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (false, r)
        } else {
            (false, url)
        };
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') {
            return Err(format!("{url:?} must be scheme://host[:port] with no path"));
        }
        Ok(Endpoint {
            host: rest.to_string(),
            plain_http,
            ca_certs: Vec::new(),
            upstream: false,
        })
    }
}

/// Whether `host[:port]` is this machine (HTTP is allowed there):
/// `localhost`, or an IP address in the loopback range, parsed as one
/// (`127.example.com` is a name anyone can register, not a loopback).
pub fn is_loopback(host: &str) -> bool {
    let h = match host.rsplit_once(':') {
        Some((h, p))
            if !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()) && !h.ends_with(':') =>
        {
            h
        }
        _ => host,
    };
    let h = h
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(h);
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[derive(Debug, Clone, Default)]
pub struct Hosts {
    mirrors: HashMap<String, Vec<Endpoint>>,
    upstream_ca: HashMap<String, Vec<PathBuf>>,
    upstream_server: HashMap<String, Endpoint>,
    /// `--ca-cert`: trusted for every endpoint.
    global_ca: Vec<PathBuf>,
}

/// The kiln registries file (`--registry-config`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    registries: HashMap<String, RegistryEntry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RegistryEntry {
    #[serde(default)]
    mirrors: Vec<MirrorEntry>,
    #[serde(default)]
    ca_cert: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MirrorEntry {
    url: String,
    #[serde(default)]
    ca_cert: Option<PathBuf>,
}

use crate::primitives::reference::canonical_registry as canonical_domain;

impl Hosts {
    /// `--mirror HOST=URL`, repeatable; several for one host are tried in order.
    pub fn add_mirror_flags(&mut self, specs: &[String]) -> Result<(), String> {
        for spec in specs {
            let (host, url) = spec
                .split_once('=')
                .ok_or_else(|| format!("invalid --mirror {spec:?}: want HOST=URL, e.g. registry.k8s.io=http://127.0.0.1:5000"))?;
            if host.is_empty() {
                return Err(format!("invalid --mirror {spec:?}: empty HOST"));
            }
            let ep = Endpoint::from_url(url)
                .map_err(|e| format!("invalid --mirror {spec:?}: URL {e}"))?;
            self.mirrors
                .entry(canonical_domain(host).to_string())
                .or_default()
                .push(ep);
        }
        Ok(())
    }

    /// The CAs trusted for every host (`--ca-cert`).
    pub fn global_ca(&self) -> &[PathBuf] {
        &self.global_ca
    }

    pub fn add_ca_certs(&mut self, certs: &[PathBuf]) {
        self.global_ca.extend(certs.iter().cloned());
    }

    /// A kiln registries file:
    /// `registries: {HOST: {mirrors: [{url, caCert}], caCert}}`.
    pub fn add_registry_file(&mut self, path: &Path) -> anyhow::Result<()> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file: RegistryFile =
            serde_yaml_ng::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        for (host, entry) in file.registries {
            let host = canonical_domain(&host).to_string();
            for m in entry.mirrors {
                let mut ep = Endpoint::from_url(&m.url)
                    .map_err(|e| anyhow!("{}: mirror of {host}: {e}", path.display()))?;
                if let Some(ca) = &m.ca_cert {
                    // Read now, not when the first image needs it.
                    check_ca_file(ca).map_err(|e| {
                        anyhow!(
                            "{}: mirror {} of {host}: caCert: {e:#}",
                            path.display(),
                            m.url
                        )
                    })?;
                }
                ep.ca_certs.extend(m.ca_cert);
                self.mirrors.entry(host.clone()).or_default().push(ep);
            }
            if let Some(ca) = entry.ca_cert {
                check_ca_file(&ca)
                    .map_err(|e| anyhow!("{}: {host}: caCert: {e:#}", path.display()))?;
                self.upstream_ca.entry(host).or_default().push(ca);
            }
        }
        Ok(())
    }

    /// containerd's `certs.d` layout: `DIR/HOST/hosts.toml` with `server`
    /// and `[host."URL"]` tables (`capabilities`, `ca`), in file order.
    pub fn add_hosts_dir(&mut self, dir: &Path) -> anyhow::Result<()> {
        let entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let entry = entry?;
            let file = entry.path().join("hosts.toml");
            if !file.is_file() {
                continue;
            }
            let host = entry.file_name().to_string_lossy().into_owned();
            let host = canonical_domain(&host).to_string();
            let text = std::fs::read_to_string(&file)?;
            let doc: toml_edit::DocumentMut = text
                .parse()
                .map_err(|e| anyhow!("{}: {e}", file.display()))?;
            let cas = |item: Option<&toml_edit::Item>| -> anyhow::Result<Vec<PathBuf>> {
                let paths: Vec<PathBuf> = match item {
                    Some(i) if i.is_str() => vec![PathBuf::from(i.as_str().unwrap())],
                    Some(i) => i
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str())
                                .map(PathBuf::from)
                                .collect()
                        })
                        .unwrap_or_default(),
                    None => Vec::new(),
                };
                // Read now, not when the first image needs them.
                for p in &paths {
                    check_ca_file(p).map_err(|e| anyhow!("{}: ca: {e:#}", file.display()))?;
                }
                Ok(paths)
            };
            if let Some(t) = doc.get("host").and_then(|h| h.as_table_like()) {
                for (url, cfg) in t.iter() {
                    let caps: Vec<&str> = cfg
                        .get("capabilities")
                        .and_then(|c| c.as_array())
                        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                        .unwrap_or_else(|| vec!["pull", "resolve"]);
                    if !caps.contains(&"pull") {
                        continue;
                    }
                    let mut ep = Endpoint::from_url(url)
                        .map_err(|e| anyhow!("{}: host {e}", file.display()))?;
                    ep.ca_certs = cas(cfg.get("ca"))?;
                    self.mirrors.entry(host.clone()).or_default().push(ep);
                }
            }
            if let Some(server) = doc.get("server").and_then(|s| s.as_str()) {
                let mut ep = Endpoint::from_url(server)
                    .map_err(|e| anyhow!("{}: server {e}", file.display()))?;
                ep.upstream = true;
                ep.ca_certs = cas(doc.get("ca"))?;
                self.upstream_server.insert(host, ep);
            }
        }
        Ok(())
    }

    /// Mirrors in order, then the registry itself.
    pub fn endpoints(&self, domain: &str) -> Vec<Endpoint> {
        let domain = canonical_domain(domain);
        let mut out: Vec<Endpoint> = self.mirrors.get(domain).cloned().unwrap_or_default();
        let upstream = self
            .upstream_server
            .get(domain)
            .cloned()
            .unwrap_or_else(|| {
                let host = if domain == "docker.io" {
                    "registry-1.docker.io".to_string()
                } else {
                    domain.to_string()
                };
                Endpoint {
                    plain_http: is_loopback(&host),
                    host,
                    ca_certs: Vec::new(),
                    upstream: true,
                }
            });
        let mut upstream = upstream;
        upstream
            .ca_certs
            .extend(self.upstream_ca.get(domain).cloned().unwrap_or_default());
        out.push(upstream);
        for ep in &mut out {
            ep.ca_certs.extend(self.global_ca.iter().cloned());
        }
        out
    }
}

/// Checks a CA file early, so a typo is a clear error before any transfer.
pub fn check_ca_file(path: &Path) -> anyhow::Result<()> {
    let pem = std::fs::read(path)
        .with_context(|| format!("reading CA certificate {}", path.display()))?;
    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
        bail!("{} holds no PEM certificate", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_then_upstream() {
        let mut h = Hosts::default();
        h.add_mirror_flags(&[
            "registry.k8s.io=http://127.0.0.1:5000".into(),
            "registry.k8s.io=https://m2.example".into(),
        ])
        .unwrap();
        let eps = h.endpoints("registry.k8s.io");
        assert_eq!(
            eps.iter().map(|e| e.base_url()).collect::<Vec<_>>(),
            [
                "http://127.0.0.1:5000",
                "https://m2.example",
                "https://registry.k8s.io"
            ]
        );
        assert!(eps[2].upstream && !eps[0].upstream);
        assert_eq!(
            h.endpoints("docker.io")[0].base_url(),
            "https://registry-1.docker.io"
        );
        assert_eq!(
            h.endpoints("localhost:5000")[0].base_url(),
            "http://localhost:5000"
        );
        assert_eq!(
            h.endpoints("127.0.0.1:5000")[0].base_url(),
            "http://127.0.0.1:5000"
        );
        assert!(h.add_mirror_flags(&["nonsense".into()]).is_err());
        assert!(h.add_mirror_flags(&["a=http://h/path".into()]).is_err());
    }

    #[test]
    fn reads_hosts_toml_and_registry_file() {
        let dir = tempfile::tempdir().unwrap();
        // CA files are read when the configuration is: they must exist.
        let pem = |name: &str| {
            let p = dir.path().join(name);
            std::fs::write(
                &p,
                "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
            )
            .unwrap();
            p
        };
        let (a, q, up) = (pem("a.pem"), pem("q.pem"), pem("up.pem"));
        std::fs::create_dir_all(dir.path().join("docker.io")).unwrap();
        std::fs::write(
            dir.path().join("docker.io/hosts.toml"),
            format!("server = \"https://registry-1.docker.io\"\n\n[host.\"https://mirror-a.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n\n[host.\"http://push-only.example\"]\n  capabilities = [\"push\"]\n\n[host.\"http://10.0.0.1:5000\"]\n", a.display()),
        )
        .unwrap();
        let mut h = Hosts::default();
        h.add_hosts_dir(dir.path()).unwrap();
        let eps = h.endpoints("docker.io");
        assert_eq!(
            eps.iter().map(|e| e.base_url()).collect::<Vec<_>>(),
            [
                "https://mirror-a.example",
                "http://10.0.0.1:5000",
                "https://registry-1.docker.io"
            ]
        );
        assert_eq!(eps[0].ca_certs, std::slice::from_ref(&a));

        let f = dir.path().join("registries.yaml");
        std::fs::write(&f, format!("registries:\n  quay.io:\n    mirrors:\n      - url: https://q.example\n        caCert: {}\n    caCert: {}\n", q.display(), up.display())).unwrap();
        h.add_registry_file(&f).unwrap();
        h.add_ca_certs(&[PathBuf::from("/g.pem")]);
        let eps = h.endpoints("quay.io");
        assert_eq!(eps[0].ca_certs, [q.clone(), PathBuf::from("/g.pem")]);
        assert_eq!(eps[1].ca_certs, [up.clone(), PathBuf::from("/g.pem")]);
        std::fs::write(&f, "registries:\n  quay.io:\n    mirorrs: []\n").unwrap();
        assert!(Hosts::default().add_registry_file(&f).is_err());
        // A missing caCert is named at load, not inside a later image's error.
        std::fs::write(&f, "registries:\n  quay.io:\n    caCert: /no/such.pem\n").unwrap();
        let e = format!("{:#}", Hosts::default().add_registry_file(&f).unwrap_err());
        assert!(
            e.contains("quay.io: caCert") && e.contains("/no/such.pem"),
            "{e}"
        );
    }

    /// Issue 39.6d: loopback is an address, not a prefix of a name.
    #[test]
    fn loopback_is_an_address_not_a_prefix() {
        for yes in [
            "127.0.0.1",
            "127.0.0.1:5000",
            "127.1.2.3:80",
            "localhost",
            "localhost:5000",
            "[::1]",
            "[::1]:5000",
            "::1",
        ] {
            assert!(is_loopback(yes), "{yes}");
        }
        for no in [
            "127.example.com",
            "127.example.com:5000",
            "127.0.0.1.nip.io",
            "localhost.evil",
            "10.0.0.1",
            "[::2]:5000",
            "registry.k8s.io",
        ] {
            assert!(!is_loopback(no), "{no}");
        }
    }
}
