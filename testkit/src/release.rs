//! A stand-in Kubernetes server release in the real layout: `kubernetes/version`,
//! `kubernetes/server/bin/{kubelet,kubeadm,kubectl}`, and the control-plane
//! images as legacy `docker save` archives tagged `registry.k8s.io/NAME-ARCH:TAG`
//! with `NAME.docker_tag` files; gzipped, with a `.sha512` beside it. Plus a
//! loopback HTTPS file server to fetch it from.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::json;
use sha2::{Digest, Sha512};

use crate::image::{gzip, sha256, tar_of};

/// What a server release carries, as kiln reads it.
pub use kiln::domain::kubernetes::{BINARIES, IMAGES};

/// An ELF64 file header (little-endian) for `arch`, as `readelf -h` and
/// kiln read it: what makes a stand-in binary "built for" that arch.
pub fn elf_header(arch: &str) -> Vec<u8> {
    let machine: u16 = match arch {
        "amd64" => 62,
        "arm64" => 183,
        "s390x" => 22,
        "ppc64le" => 21,
        "riscv64" => 243,
        other => panic!("no ELF machine for {other}"),
    };
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2; // ELFCLASS64
    h[5] = if arch == "s390x" { 2 } else { 1 }; // byte order
    h[6] = 1; // EV_CURRENT
    let put16 = |h: &mut Vec<u8>, at: usize, v: u16| {
        let b = if arch == "s390x" {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        h[at..at + 2].copy_from_slice(&b);
    };
    put16(&mut h, 16, 2); // ET_EXEC
    put16(&mut h, 18, machine);
    h[20] = if arch == "s390x" { 0 } else { 1 }; // e_version (low byte)
    if arch == "s390x" {
        h[23] = 1;
    }
    put16(&mut h, 52, 64); // e_ehsize
    h
}

/// The bytes of a stand-in binary: an ELF header for `arch`, then bytes
/// distinct per name, arch and version.
pub fn binary(name: &str, arch: &str, version: &str) -> Vec<u8> {
    let mut b = elf_header(arch);
    b.extend(format!("{name} {version} {arch}\n").into_bytes());
    b.extend(
        (0..20_000u32).map(|i| (i.wrapping_mul(31) ^ name.len() as u32 ^ arch.len() as u32) as u8),
    );
    b
}

/// A legacy `docker save` archive of a one-layer image.
fn docker_save(name: &str, arch: &str, tag: &str, program: Vec<u8>) -> Vec<u8> {
    let layer = tar_of(&BTreeMap::from([(
        format!("usr/local/bin/{name}"),
        program,
    )]));
    let layer_hex = sha256(&layer).trim_start_matches("sha256:").to_string();
    let config = serde_json::to_vec(&json!({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": [format!("/usr/local/bin/{name}")]},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
    }))
    .unwrap();
    let config_hex = sha256(&config).trim_start_matches("sha256:").to_string();
    let manifest = serde_json::to_vec(&json!([{
        "Config": format!("{config_hex}.json"),
        "RepoTags": [format!("registry.k8s.io/{name}-{arch}:{tag}")],
        "Layers": [format!("{layer_hex}/layer.tar")],
    }]))
    .unwrap();
    tar_of(&BTreeMap::from([
        (format!("{config_hex}.json"), config),
        (format!("{layer_hex}/layer.tar"), layer),
        ("manifest.json".to_string(), manifest),
    ]))
}

/// The files of a release for `arch`, by path inside the tarball.
pub fn release_files(version: &str, arch: &str) -> BTreeMap<String, Vec<u8>> {
    let tag = version.replace('+', "_");
    let mut files = BTreeMap::new();
    files.insert(
        "kubernetes/version".to_string(),
        format!("{version}\n").into_bytes(),
    );
    files.insert(
        "kubernetes/README.md".to_string(),
        b"stand-in release\n".to_vec(),
    );
    let bin = "kubernetes/server/bin";
    for b in BINARIES {
        files.insert(format!("{bin}/{b}"), binary(b, arch, version));
    }
    for i in IMAGES {
        files.insert(
            format!("{bin}/{i}.tar"),
            docker_save(i, arch, &tag, binary(i, arch, version)),
        );
        files.insert(
            format!("{bin}/{i}.docker_tag"),
            format!("{tag}\n").into_bytes(),
        );
        // The server binary itself, which kiln does not install.
        files.insert(format!("{bin}/{i}"), binary(i, arch, version));
    }
    files
}

/// [`release_files`] that, on this machine's architecture, runs: its
/// control-plane images run the stand-in daemon (`testkit/csrc/standin.c`),
/// so a node built from it starts offline (`kiln verify --start`), and its
/// kubeadm answers `config images list` (`testkit/csrc/kubeadm.c`): the demo's.
pub fn runnable_release_files(version: &str, arch: &str) -> BTreeMap<String, Vec<u8>> {
    let mut files = release_files(version, arch);
    if crate::image::host_platform() == format!("linux/{arch}") {
        let tag = version.replace('+', "_");
        let daemon = std::fs::read(crate::tools::standin()).unwrap();
        files.insert(
            "kubernetes/server/bin/kubeadm".into(),
            std::fs::read(crate::tools::kubeadm_standin()).unwrap(),
        );
        for i in IMAGES {
            files.insert(
                format!("kubernetes/server/bin/{i}.tar"),
                docker_save(i, arch, &tag, daemon.clone()),
            );
        }
    }
    files
}

/// Writes `kubernetes-server-linux-ARCH.tar.gz` and its `.sha512` into `dir`.
pub fn release_tarball(dir: &Path, version: &str, arch: &str) -> PathBuf {
    release_tarball_of(dir, arch, &release_files(version, arch))
}

/// [`release_tarball`] of these files.
pub fn release_tarball_of(dir: &Path, arch: &str, files: &BTreeMap<String, Vec<u8>>) -> PathBuf {
    let gz = gzip(&tar_of(files));
    let path = dir.join(format!("kubernetes-server-linux-{arch}.tar.gz"));
    std::fs::write(&path, &gz).unwrap();
    let sum = hex::encode(Sha512::digest(&gz));
    std::fs::write(
        dir.join(format!("kubernetes-server-linux-{arch}.tar.gz.sha512")),
        format!("{sum}  kubernetes-server-linux-{arch}.tar.gz\n"),
    )
    .unwrap();
    path
}

/// Files under a directory over HTTPS on 127.0.0.1 (GET only, one request
/// per connection); stops when dropped.
pub struct HttpsFiles {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpsFiles {
    pub fn start(root: &Path, cert_pem: &Path, key_pem: &Path) -> HttpsFiles {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_pem)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(key_pem).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let root = root.to_path_buf();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((tcp, _)) => {
                        let (config, root) = (config.clone(), root.clone());
                        std::thread::spawn(move || {
                            let _ = serve(tcp, config, &root);
                        });
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        });
        HttpsFiles {
            port,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!(
            "https://127.0.0.1:{}/{}",
            self.port,
            path.trim_start_matches('/')
        )
    }
}

fn serve(
    tcp: std::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    root: &Path,
) -> std::io::Result<()> {
    tcp.set_nonblocking(false)?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 << 10 {
        if tls.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    // A pre-signed URL's query names no file.
    let path = path.split('?').next().unwrap_or(path);
    let rel = path.trim_start_matches('/');
    let body = if rel.split('/').any(|p| p == "..") {
        None
    } else {
        std::fs::read(root.join(rel)).ok()
    };
    match body {
        Some(b) => {
            write!(
                tls,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b.len()
            )?;
            tls.write_all(&b)?;
        }
        None => {
            tls.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )?;
        }
    }
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

impl Drop for HttpsFiles {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
