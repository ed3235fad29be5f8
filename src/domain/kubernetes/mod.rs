//! A Kubernetes server release (`kubernetes-server-linux-ARCH.tar.gz`, a URL
//! of one, or a local build's `kubernetes/server/bin/`): its version, the
//! node binaries kiln installs, and the control-plane images it carries as
//! `docker save` archives. A tarball is checked against its SHA-512 while it
//! streams; only the entries kiln uses are extracted, to fixed names in a
//! private directory, so no name inside the tarball decides where anything
//! is written.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

mod checksum;

pub use checksum::expected_sha512;
use checksum::{check_sum, download, is_loopback_url};

use crate::primitives::inroot::Root;
use crate::primitives::platform::Platform;
use crate::primitives::reference::ImageRef;

/// Installed at `/usr/bin/NAME` (kind's kubelet unit runs `/usr/bin/kubelet`).
pub const BINARIES: [&str; 3] = ["kubeadm", "kubelet", "kubectl"];
/// The control-plane images a release ships as `NAME.tar` + `NAME.docker_tag`.
pub const IMAGES: [&str; 4] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
];
/// Where release images are named (release builds add `-ARCH`; kiln drops it).
pub const IMAGE_REGISTRY: &str = "registry.k8s.io";
const BIN: &str = "kubernetes/server/bin";
/// A Kubernetes checkout after `make quick-release-images`, as `kind build
/// node-image --type source` reads it (kind: pkg/build/nodeimage/internal/
/// kube/builder_docker.go): binaries under `_output/dockerized/bin/linux/ARCH/`,
/// image archives under `_output/release-images/ARCH/`. kind runs the
/// checkout's hack/print-workspace-status.sh for the version; kiln runs
/// nothing and reads it from the apiserver archive's tag.
const SOURCE_BIN: &str = "_output/dockerized/bin/linux";
const SOURCE_IMAGES: &str = "_output/release-images";

/// Where a release's parts are.
struct Layout {
    bin: PathBuf,
    bin_name: String,
    images: PathBuf,
    images_name: String,
    version_file: Option<PathBuf>,
}

impl Layout {
    /// A server release (tarball or directory): all under kubernetes/.
    fn release(root: &Path) -> Layout {
        Layout {
            bin: root.join(BIN),
            bin_name: BIN.into(),
            images: root.join(BIN),
            images_name: BIN.into(),
            version_file: Some(root.join("kubernetes/version")),
        }
    }

    /// A source build for `arch`.
    fn source(root: &Path, arch: &str) -> Layout {
        Layout {
            bin: root.join(SOURCE_BIN).join(arch),
            bin_name: format!("{SOURCE_BIN}/{arch}"),
            images: root.join(SOURCE_IMAGES).join(arch),
            images_name: format!("{SOURCE_IMAGES}/{arch}"),
            version_file: None,
        }
    }
}

/// `--kubernetes SRC [--kubernetes-sha512 HEX]`, before `{arch}` is filled in.
#[derive(Debug, Clone)]
pub struct ReleaseSpec {
    pub src: String,
    pub sha512: Option<String>,
    /// Per platform (`os/arch`): the source and SHA-512 a lock holds; the
    /// release must be that source with that sum.
    pub locked: std::collections::BTreeMap<String, (String, String)>,
}

impl ReleaseSpec {
    /// SRC for one platform: `{arch}` replaced by its architecture.
    pub fn for_platform(&self, p: &Platform) -> String {
        self.src.replace("{arch}", &p.architecture)
    }

    /// The SHA-512 `p`'s tarball must have: the lock's (whose source must
    /// be this one), else `--kubernetes-sha512`'s, else `None` (SRC.sha512).
    pub fn sha512_for(&self, p: &Platform) -> Result<Option<String>, String> {
        let src = crate::primitives::text::url_kept(&self.for_platform(p));
        match self.locked.get(&p.to_string()) {
            Some((locked_src, sum)) if *locked_src == src => Ok(Some(sum.clone())),
            Some((locked_src, _)) => Err(format!(
                "--kubernetes {src}: the lock has {locked_src} for {p}; build from the locked release or lock again (kiln lock --lock-file)"
            )),
            None if !self.locked.is_empty() => Err(format!(
                "--kubernetes {src}: the lock has no release for {p}; lock again with this --platform"
            )),
            None => Ok(self.sha512.clone()),
        }
    }

    /// Several platforms need `{arch}` in SRC: one tarball holds one architecture.
    pub fn check_platforms(&self, platforms: &[Platform]) -> Result<(), String> {
        if platforms.len() > 1 && !self.src.contains("{arch}") {
            return Err(format!(
                "--kubernetes {}: {} platforms need one release each; put {{arch}} in SRC (e.g. .../kubernetes-server-linux-{{arch}}.tar.gz)",
                self.src,
                platforms.len()
            ));
        }
        if platforms.len() > 1 && self.sha512.is_some() {
            return Err("--kubernetes-sha512 names one tarball but several platforms were asked for; put SRC.sha512 files beside the tarballs instead".into());
        }
        Ok(())
    }
}

/// A control-plane image from the release.
#[derive(Debug, Clone)]
pub struct ReleaseImage {
    /// `registry.k8s.io/NAME:TAG`, as kubeadm asks for it.
    pub name: ImageRef,
    /// The name its `docker save` archive carries (`...NAME-ARCH:TAG`).
    pub saved_as: ImageRef,
    pub archive: PathBuf,
}

/// A release, opened and checked.
#[derive(Debug)]
pub struct Release {
    /// As in `kubernetes/version`, e.g. `v1.34.1`.
    pub version: String,
    /// What SRC was, for messages and records: scheme, host and path
    /// only (`text::url_kept`).
    pub src: String,
    /// The SHA-512 checked, if SRC was a tarball.
    pub sha512: Option<String>,
    /// Where `kubeadm`, `kubelet`, `kubectl` are, and that as SRC names it.
    bin: PathBuf,
    bin_name: String,
    pub images: Vec<ReleaseImage>,
    _work: Option<tempfile::TempDir>,
}

fn is_url(src: &str) -> bool {
    src.starts_with("https://") || src.starts_with("http://")
}

/// One line for a bad SRC, with what to do.
fn bad(src: &str, what: impl std::fmt::Display) -> anyhow::Error {
    crate::primitives::error::BadInput(format!("--kubernetes {src}: {what}")).into()
}

/// One line for a release the world kept from kiln (network, disk): exit 1.
fn failed(src: &str, what: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("--kubernetes {src}: {what}")
}

impl Release {
    /// Opens SRC: a directory is read in place; a file or URL is checked
    /// against `sha512` (else `SRC.sha512`) and its needed entries extracted.
    pub async fn open(
        src: &str,
        sha512: Option<&str>,
        arch: &str,
        http: &reqwest::Client,
        cache: Option<&crate::sink::cache::Cache>,
    ) -> anyhow::Result<Release> {
        if is_url(src) {
            if src.starts_with("http://") && !is_loopback_url(src) {
                return Err(bad(src, "plain http is refused; use an https:// URL"));
            }
            let want = expected_sha512(src, sha512, http).await?;
            let work = work_dir()?;
            // A tarball cached under the same SHA-512 is the same file.
            // A cached entry, else a download kept in the cache, else one
            // in the work directory (removed when `tmp` drops; the open
            // file reads on).
            let tarball = match cache.and_then(|c| c.get_sha512(&want)) {
                Some(k) => std::fs::File::open(&*k)?,
                None => {
                    let tmp = match cache {
                        Some(c) => c.temp_file()?,
                        None => tempfile::NamedTempFile::new_in(work.path())?,
                    };
                    let got = download(http, src, tmp.path())
                        .await
                        .map_err(|e| failed(src, format!("{e:#}")))?;
                    check_sum(src, &want, &got)?;
                    match cache {
                        Some(c) => std::fs::File::open(&*c.keep_sha512(tmp, &want)?)?,
                        None => tmp.reopen()?,
                    }
                }
            };
            tokio::task::block_in_place(|| extract(tarball, work.path()))
                .map_err(|e| bad(src, format!("{e:#}")))?;
            return Self::from_dir(src, Layout::release(work.path()), Some(want), Some(work));
        }
        let path = Path::new(src);
        let meta = std::fs::metadata(path).map_err(|e| bad(src, format!("{e}; give a kubernetes-server-linux-ARCH.tar.gz, an https:// URL of one, or a directory holding kubernetes/server/bin/")))?;
        if meta.is_dir() {
            if path.join(BIN).is_dir() {
                return Self::from_dir(src, Layout::release(path), None, None);
            }
            if path.join(SOURCE_BIN).is_dir() {
                return Self::from_dir(src, Layout::source(path, arch), None, None);
            }
            return Err(bad(src, format!("a directory, but it has neither {BIN}/ nor {SOURCE_BIN}/; point at the directory that holds kubernetes/ (a release's or a build's _output/release-stage/server/linux-ARCH), or at a Kubernetes checkout after make quick-release-images")));
        }
        let want = expected_sha512(src, sha512, http).await?;
        // Checked before a byte of it is unpacked: a tampered tarball is
        // refused for its sum, not for whatever its tar stream then does.
        let f = std::fs::File::open(path).map_err(|e| bad(src, e))?;
        let got = tokio::task::block_in_place(|| crate::primitives::digest::sha512_hex(f))
            .map_err(|e| bad(src, e))?;
        check_sum(src, &want, &got)?;
        let work = work_dir()?;
        let f = std::fs::File::open(path).map_err(|e| bad(src, e))?;
        tokio::task::block_in_place(|| extract(f, work.path()))
            .map_err(|e| bad(src, format!("{e:#}")))?;
        Self::from_dir(src, Layout::release(work.path()), Some(want), Some(work))
    }

    fn from_dir(
        src: &str,
        layout: Layout,
        sha512: Option<String>,
        work: Option<tempfile::TempDir>,
    ) -> anyhow::Result<Release> {
        let Layout {
            bin,
            bin_name,
            images: image_dir,
            images_name,
            version_file,
        } = layout;
        for b in BINARIES {
            let p = bin.join(b);
            if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
                return Err(bad(src, format!("{bin_name}/{b} is missing; is this a server release (kubernetes-server-linux-ARCH), or a checkout built with make quick-release-images?")));
            }
        }
        let version = match version_file.map(std::fs::read_to_string) {
            Some(Ok(v)) => v.trim().to_string(),
            // Older releases and source builds: the version only as the
            // apiserver's tag (its .docker_tag file, else its archive's tag).
            _ => match std::fs::read_to_string(image_dir.join("kube-apiserver.docker_tag")) {
                Ok(t) => t.trim().replace('_', "+"),
                Err(_) => crate::source::archive::ArchiveSource::open(&[image_dir.join("kube-apiserver.tar")])
                    .ok()
                    .and_then(|a| a.images().into_iter().next())
                    .and_then(|i| i.tag)
                    .map(|t| t.replace('_', "+"))
                    .ok_or_else(|| {
                        bad(
                            src,
                            format!("has no kubernetes/version, and neither {images_name}/kube-apiserver.docker_tag nor a tagged kube-apiserver.tar"),
                        )
                    })?,
            },
        };
        if let Err(why) = crate::domain::kube_version::check(&version) {
            return Err(bad(src, format!("kubernetes/version: {why}")));
        }
        if !version.starts_with('v') {
            return Err(bad(
                src,
                format!("kubernetes/version: {version:?} does not start with v"),
            ));
        }
        let mut images = Vec::new();
        for name in IMAGES {
            let archive = image_dir.join(format!("{name}.tar"));
            if !archive.is_file() {
                return Err(bad(src, format!("{images_name}/{name}.tar is missing; kiln imports the control-plane images from the release")));
            }
            let saved = crate::source::archive::ArchiveSource::open(std::slice::from_ref(&archive))
                .map_err(|e| bad(src, format!("{name}.tar: {e:#}")))?;
            let saved_as = saved
                .images()
                .into_iter()
                .next()
                .ok_or_else(|| bad(src, format!("{name}.tar names no image")))?;
            let tag = match std::fs::read_to_string(image_dir.join(format!("{name}.docker_tag"))) {
                Ok(t) => t.trim().to_string(),
                Err(_) => saved_as.tag.clone().ok_or_else(|| {
                    bad(
                        src,
                        format!("{name}.tar has no tag and there is no {name}.docker_tag"),
                    )
                })?,
            };
            let name = ImageRef::parse(&format!("{IMAGE_REGISTRY}/{name}:{tag}"))
                .map_err(|e| bad(src, format!("{name}.docker_tag: {e}")))?;
            images.push(ReleaseImage {
                name,
                saved_as,
                archive,
            });
        }
        Ok(Release {
            version,
            // As every record and message names it: no query, no userinfo.
            src: crate::primitives::text::url_kept(src),
            sha512,
            bin,
            bin_name,
            images,
            _work: work,
        })
    }

    /// The release's image archives as one source, with the images under
    /// their unsuffixed names.
    pub fn source(&self) -> anyhow::Result<crate::source::renamed::Renamed> {
        let archives: Vec<PathBuf> = self.images.iter().map(|i| i.archive.clone()).collect();
        let src = crate::source::archive::ArchiveSource::open(&archives)?;
        Ok(crate::source::renamed::Renamed::new(
            src,
            self.images
                .iter()
                .map(|i| (i.name.clone(), i.saved_as.clone()))
                .collect(),
        ))
    }

    /// kubelet, kubeadm and kubectl must be ELF executables for `platform`'s
    /// architecture (read from their headers, never run): an amd64 release
    /// in an arm64 node boots a node whose kubelet cannot start.
    pub fn check_architecture(&self, platform: &Platform) -> anyhow::Result<()> {
        for b in BINARIES {
            let mut f = std::fs::File::open(self.bin.join(b))?;
            match crate::primitives::platform::read_architecture(&mut f)? {
                Some(a) if a == platform.architecture => {}
                found => {
                    return Err(crate::primitives::error::BadInput(format!(
                        "--kubernetes {}: {}/{b} is {}, but the node is {platform}; use the release for {} (kubernetes-server-linux-{}...)",
                        self.src,
                        self.bin_name,
                        found.map(|a| format!("built for {a}")).unwrap_or_else(|| "not an ELF executable".into()),
                        platform.architecture,
                        platform.architecture
                    ))
                    .into())
                }
            }
        }
        Ok(())
    }

    /// Installs the node binaries at `usr/bin/` in `root`: byte for byte,
    /// 0755, streamed.
    /// Each binary as installed (`/usr/bin/NAME`) and its SHA-512 (hex).
    pub fn binary_sha512s(&self) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
        let mut out = std::collections::BTreeMap::new();
        for b in BINARIES {
            let f = std::fs::File::open(self.bin.join(b))?;
            out.insert(
                format!("/usr/bin/{b}"),
                crate::primitives::digest::sha512_hex(f)?,
            );
        }
        Ok(out)
    }

    /// Where the release's binary `name` (one of [`BINARIES`]) is.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    pub fn install(&self, root: &Root) -> anyhow::Result<()> {
        for b in BINARIES {
            let f = std::fs::File::open(self.bin.join(b))?;
            root.write_from(&Path::new("usr/bin").join(b), f, 0o755)
                .with_context(|| format!("installing /usr/bin/{b}"))?;
        }
        Ok(())
    }
}

/// The entries kiln takes from a release tarball, as (name in the tarball,
/// name in the work directory).
fn wanted(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("./").unwrap_or(name);
    if rest == "kubernetes/version" {
        return Some(rest);
    }
    let file = rest.strip_prefix("kubernetes/server/bin/")?;
    let ok = BINARIES.contains(&file)
        || IMAGES.iter().any(|i| {
            file.strip_prefix(i)
                .is_some_and(|s| s == ".tar" || s == ".docker_tag")
        });
    ok.then_some(rest)
}

/// Reads a (gzipped) release tarball, already checked, and writes the
/// [`wanted`] regular files under `dest`.
fn extract(f: std::fs::File, dest: &Path) -> anyhow::Result<()> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, f);
    let gzipped = std::io::BufRead::fill_buf(&mut r)?.starts_with(&[0x1f, 0x8b]);
    let stream: Box<dyn Read> = if gzipped {
        Box::new(flate2::read::GzDecoder::new(r))
    } else {
        Box::new(r)
    };
    for entry in tar::Archive::new(stream).entries()? {
        crate::primitives::interrupt::check()?;
        let mut e = entry.context("reading the tarball")?;
        let path = e.path()?.to_string_lossy().into_owned();
        let Some(name) = wanted(&path) else { continue };
        if e.header().entry_type() != tar::EntryType::Regular {
            bail!("{path} is not a regular file");
        }
        let to = dest.join(name);
        std::fs::create_dir_all(to.parent().expect("has a parent"))?;
        let mut w = std::fs::File::create(&to)?;
        std::io::copy(&mut e, &mut w)?;
        w.flush()?;
    }
    Ok(())
}

fn work_dir() -> anyhow::Result<tempfile::TempDir> {
    crate::primitives::owned::work_dir("kiln-kubernetes-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_needed_entries_are_taken() {
        assert_eq!(wanted("kubernetes/version"), Some("kubernetes/version"));
        assert_eq!(
            wanted("./kubernetes/server/bin/kubelet"),
            Some("kubernetes/server/bin/kubelet")
        );
        assert!(wanted("kubernetes/server/bin/kube-proxy.docker_tag").is_some());
        assert!(wanted("kubernetes/server/bin/kube-apiserver").is_none());
        assert!(wanted("kubernetes/server/bin/../../../etc/passwd").is_none());
        assert!(wanted("kubernetes/addons/x").is_none());
    }

    /// A hostile release: a binary that is a symlink is refused; names
    /// that climb out are never taken, so nothing lands outside `dest`.
    #[test]
    fn hostile_entries_are_refused_or_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        let write = |entries: &[(&str, tar::EntryType, &str)]| {
            let mut b = tar::Builder::new(Vec::new());
            for (name, kind, link) in entries {
                let mut h = tar::Header::new_gnu();
                h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
                h.set_entry_type(*kind);
                h.set_size(if *kind == tar::EntryType::Regular {
                    1
                } else {
                    0
                });
                if !link.is_empty() {
                    h.set_link_name(link).unwrap();
                }
                h.set_mode(0o755);
                h.set_cksum();
                let data: &[u8] = if *kind == tar::EntryType::Regular {
                    b"x"
                } else {
                    b""
                };
                b.append(&h, data).unwrap();
            }
            let path = dir.path().join("r.tar");
            std::fs::write(&path, b.into_inner().unwrap()).unwrap();
            std::fs::File::open(path).unwrap()
        };
        let f = write(&[(
            "kubernetes/server/bin/kubelet",
            tar::EntryType::Symlink,
            "/etc/passwd",
        )]);
        let e = extract(f, &dest).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let f = write(&[
            ("../escaped", tar::EntryType::Regular, ""),
            (
                "kubernetes/server/bin/../../../escaped",
                tar::EntryType::Regular,
                "",
            ),
        ]);
        extract(f, &dest).unwrap();
        assert!(!dir.path().join("escaped").exists());
        assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);
    }
}
