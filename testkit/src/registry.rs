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
}

impl Registry {
    /// Starts a registry on a free loopback port; retries if the port was taken meanwhile.
    pub fn start() -> anyhow::Result<Registry> {
        let mut last = None;
        for _ in 0..5 {
            match Self::try_start() {
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried"))
    }

    fn try_start() -> anyhow::Result<Registry> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let dir = tempfile::Builder::new()
            .prefix("kiln-registry-")
            .tempdir()?;
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                dir.path().join("data").display()
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("registry.log"))?;
        let child = Command::new(crate::tools::registry())
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry")?;
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        let mut reg = Registry {
            child: Some(child),
            addr,
            dir,
            http,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = reg.child.as_mut().unwrap().try_wait()? {
                reg.child = None;
                bail!(
                    "docker-registry exited ({st}): {}",
                    std::fs::read_to_string(reg.dir.path().join("registry.log"))
                        .unwrap_or_default()
                );
            }
            if reg
                .http
                .get(format!("http://{}/v2/", reg.addr))
                .send()
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(reg);
            }
            if Instant::now() > deadline {
                bail!("docker-registry did not answer on {} within 15s", reg.addr);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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
