//! A real CNCF distribution registry (`docker-registry`) on 127.0.0.1, and a
//! small push client for the distribution API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::image::{build, Blob, BuiltImage, ImageSet};

pub struct Registry {
    child: Option<Child>,
    /// `127.0.0.1:PORT`
    pub addr: String,
    dir: tempfile::TempDir,
    http: reqwest::blocking::Client,
    tls: bool,
}

/// Token auth, as a registry's `auth.token` config section.
#[derive(Debug, Clone)]
pub struct TokenAuth {
    pub realm: String,
    pub service: String,
    pub issuer: String,
    pub rootcertbundle: PathBuf,
}

/// How the registry serves: plain, or TLS, Basic (htpasswd) or token auth.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// (certificate, key, CA that signed it)
    pub tls: Option<(PathBuf, PathBuf, PathBuf)>,
    pub htpasswd: Option<(String, String)>,
    pub token: Option<TokenAuth>,
}

impl Registry {
    /// Starts a plain-HTTP registry on a free loopback port; retries if the port was taken meanwhile.
    pub fn start() -> anyhow::Result<Registry> {
        let mut last = None;
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let dir = tempfile::Builder::new()
                .prefix("kiln-registry-")
                .tempdir()?;
            let mut reg = Registry {
                child: None,
                addr: format!("127.0.0.1:{port}"),
                dir,
                http: reqwest::blocking::Client::new(),
                tls: false,
            };
            match reg.serve(&RegistryOptions::default()) {
                Ok(()) => return Ok(reg),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried"))
    }

    /// Restarts on the same port and storage with other options (seed first, then lock it down).
    pub fn restart_with(&mut self, opts: &RegistryOptions) -> anyhow::Result<()> {
        self.stop();
        self.serve(opts)
    }

    fn serve(&mut self, opts: &RegistryOptions) -> anyhow::Result<()> {
        let config = self.dir.path().join("config.yml");
        let mut text = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {}\n",
            self.dir.path().join("data").display(),
            self.addr
        );
        let mut http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60));
        if let Some((cert, key, ca)) = &opts.tls {
            text.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ));
            http = http.add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca)?)?);
        }
        if let Some((user, pass)) = &opts.htpasswd {
            let file = self.dir.path().join("htpasswd");
            std::fs::write(&file, format!("{user}:{}\n", bcrypt::hash(pass, 5)?))?;
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: kiln-test\n    path: {}\n",
                file.display()
            ));
        } else if let Some(t) = &opts.token {
            text.push_str(&format!(
                "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                t.realm,
                t.service,
                t.issuer,
                t.rootcertbundle.display()
            ));
        }
        std::fs::write(&config, text)?;
        self.tls = opts.tls.is_some();
        self.http = http.build()?;
        let log = std::fs::File::create(self.dir.path().join("registry.log"))?;
        let mut cmd = Command::new(crate::tools::registry());
        // The registry dies with the test process, even when that is killed.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait()? {
                self.child = None;
                bail!(
                    "docker-registry exited ({st}): {}",
                    std::fs::read_to_string(self.dir.path().join("registry.log"))
                        .unwrap_or_default()
                );
            }
            let up = self.http.get(format!("{}/v2/", self.url())).send();
            if up.is_ok_and(|r| r.status().is_success() || r.status().as_u16() == 401) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("docker-registry did not answer on {} within 15s", self.addr);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Where the registry keeps what it was given (blobs, manifests).
    pub fn storage(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn url(&self) -> String {
        format!(
            "{}://{}",
            if self.tls { "https" } else { "http" },
            self.addr
        )
    }

    /// Where the registry keeps a blob's bytes (for tests that corrupt one).
    pub fn blob_data_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    pub fn push_blob(&self, repo: &str, blob: &Blob) -> anyhow::Result<()> {
        let head = self
            .http
            .head(format!("{}/v2/{repo}/blobs/{}", self.url(), blob.digest))
            .send()?;
        if head.status().is_success() {
            return Ok(());
        }
        let r = self
            .http
            .post(format!("{}/v2/{repo}/blobs/uploads/", self.url()))
            .header("Content-Length", "0")
            .send()?;
        if r.status().as_u16() != 202 {
            bail!("starting upload to {repo}: {}", r.status());
        }
        let loc = r
            .headers()
            .get("Location")
            .context("upload without Location")?
            .to_str()?
            .to_string();
        let loc = if loc.starts_with("http") {
            loc
        } else {
            format!("{}{loc}", self.url())
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        let r = self
            .http
            .put(format!("{loc}{sep}digest={}", blob.digest))
            .header("Content-Type", "application/octet-stream")
            .body(blob.bytes.clone())
            .send()?;
        if r.status().as_u16() != 201 {
            bail!(
                "uploading {} to {repo}: {} {}",
                blob.digest,
                r.status(),
                r.text().unwrap_or_default()
            );
        }
        Ok(())
    }

    pub fn push_manifest(&self, repo: &str, reference: &str, blob: &Blob) -> anyhow::Result<()> {
        let r = self
            .http
            .put(format!("{}/v2/{repo}/manifests/{reference}", self.url()))
            .header("Content-Type", &blob.media_type)
            .body(blob.bytes.clone())
            .send()?;
        if r.status().as_u16() != 201 {
            bail!(
                "pushing manifest {repo}:{reference}: {} {}",
                r.status(),
                r.text().unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Pushes a built image: blobs, child manifests, then the top-level tag.
    pub fn push(&self, img: &BuiltImage) -> anyhow::Result<()> {
        for b in img.blobs() {
            self.push_blob(&img.repo, b)?;
        }
        let is_index = img.top.media_type.contains("index") || img.top.media_type.contains("list");
        if is_index {
            for p in &img.platforms {
                self.push_manifest(&img.repo, &p.manifest.digest, &p.manifest)?;
            }
            for m in img
                .extra
                .iter()
                .filter(|b| b.media_type.contains("manifest"))
            {
                self.push_manifest(&img.repo, &m.digest, m)?;
            }
        }
        self.push_manifest(&img.repo, &img.tag, &img.top)
    }

    /// Builds and pushes every image of a set.
    pub fn seed(&self, set: &ImageSet) -> anyhow::Result<Vec<BuiltImage>> {
        let mut out = Vec::new();
        for def in &set.images {
            let img = build(def, &set.layers)?;
            self.push(&img)
                .with_context(|| format!("seeding {}:{}", def.repo, def.tag))?;
            out.push(img);
        }
        Ok(out)
    }

    /// GET a path from the registry: for checking what it serves.
    pub fn get(&self, path: &str, accept: &str) -> anyhow::Result<reqwest::blocking::Response> {
        Ok(self
            .http
            .get(format!("{}{path}", self.url()))
            .header("Accept", accept)
            .send()?)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
