//! Image archives on disk: `docker save` tarballs (the legacy layout with
//! `manifest.json` and `<id>/layer.tar`, and Docker 25+'s, which also carries
//! an OCI `index.json`) and OCI image-layout tarballs. The archive is indexed
//! once; blobs then stream straight from their offsets in the tar, verified
//! by the engine like any other source.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures_util::TryStreamExt;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncReadExt;

use super::{BlobStream, Resolved, Source};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{
    media, Descriptor, Document, ImageConfigPlatform, ImageIndex, ImageManifest,
};
use crate::primitives::reference::ImageRef;

const MAX_DOC_BYTES: u64 = 8 << 20;
const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Where a file's bytes sit inside an archive.
#[derive(Debug, Clone, Copy)]
struct Span {
    archive: usize,
    offset: u64,
    size: u64,
}

#[derive(Debug, Clone)]
struct ArchiveImage {
    name: ImageRef,
    top: Descriptor,
    bytes: Bytes,
}

pub struct ArchiveSource {
    /// The tar files (a decompressed copy for gzipped ones).
    files: Vec<PathBuf>,
    labels: Vec<String>,
    images: Vec<ArchiveImage>,
    blobs: HashMap<Digest, Span>,
    /// Documents kiln made (manifests for legacy docker-save images).
    made: HashMap<Digest, Bytes>,
    _temps: Vec<tempfile::NamedTempFile>,
}

impl ArchiveSource {
    /// Reads and checks every archive; nothing is written anywhere.
    pub fn open(paths: &[PathBuf]) -> anyhow::Result<ArchiveSource> {
        let mut src = ArchiveSource {
            files: Vec::new(),
            labels: Vec::new(),
            images: Vec::new(),
            blobs: HashMap::new(),
            made: HashMap::new(),
            _temps: Vec::new(),
        };
        for path in paths {
            src.add(path)
                .with_context(|| format!("archive {}", path.display()))?;
        }
        Ok(src)
    }

    /// The images the archives name, in order.
    pub fn images(&self) -> Vec<ImageRef> {
        self.images.iter().map(|i| i.name.clone()).collect()
    }

    fn add(&mut self, path: &Path) -> anyhow::Result<()> {
        let mut f = std::fs::File::open(path).context("cannot open")?;
        let mut magic = [0u8; 2];
        let n = f.read(&mut magic)?;
        f.seek(SeekFrom::Start(0))?;
        let tar_path = if n == 2 && magic == [0x1f, 0x8b] {
            let tmp = gunzip_bounded(f)?;
            let p = tmp.path().to_path_buf();
            self._temps.push(tmp);
            p
        } else {
            path.to_path_buf()
        };
        let archive = self.files.len();
        self.files.push(tar_path.clone());
        self.labels.push(path.display().to_string());
        let entries = index_tar(&tar_path, archive)?;
        let read = |name: &str| -> anyhow::Result<Option<Bytes>> {
            match entries.get(name) {
                Some(span) => Ok(Some(
                    read_span(&tar_path, *span, MAX_DOC_BYTES)
                        .with_context(|| format!("reading {name}"))?,
                )),
                None => Ok(None),
            }
        };
        // Blobs of an OCI layout (and of Docker 25+ saves) are named by digest.
        for (name, span) in &entries {
            if let Some(hex) = name.strip_prefix("blobs/sha256/") {
                if let Ok(d) = Digest::parse(&format!("sha256:{hex}")) {
                    self.blobs.insert(d, *span);
                }
            }
        }
        if let Some(index) = read("index.json")? {
            if self.add_oci(&index, &read)? {
                return Ok(());
            }
        }
        match read("manifest.json")? {
            Some(m) => self.add_docker(&m, &entries, &tar_path),
            None if entries.contains_key("index.json") => {
                // One image without a full name (skopeo's `oci-archive:F:TAG`
                // sets only a bare tag, or none): it is the archive's image.
                let index = read("index.json")?.expect("listed");
                if self.add_single_unnamed(&index, &read, path)? {
                    return Ok(());
                }
                let listed: Vec<String> = serde_json::from_slice::<ImageIndex>(&index)
                    .map(|i| {
                        i.manifests
                            .iter()
                            .map(|d| {
                                let tag = d.annotations.get(ANNOTATION_REF_NAME);
                                let platform = d.platform.as_ref().map(|p| p.to_string());
                                format!(
                                    "{}{}{}",
                                    d.digest,
                                    tag.map(|t| format!(" tag {t}")).unwrap_or_default(),
                                    platform.map(|p| format!(" {p}")).unwrap_or_default()
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                bail!("index.json lists {} images without full names ({}) and there is no manifest.json; save them with full names (skopeo copy ... oci-archive:FILE:REGISTRY/REPO:TAG), or one image per archive", listed.len(), listed.join("; "))
            }
            None => bail!("holds neither index.json (OCI layout) nor manifest.json (docker save); is it an image archive?"),
        }
    }

    /// Images named in an OCI `index.json`; false if it names none.
    fn add_oci(
        &mut self,
        index: &[u8],
        read: &dyn Fn(&str) -> anyhow::Result<Option<Bytes>>,
    ) -> anyhow::Result<bool> {
        let index: ImageIndex = serde_json::from_slice(index)
            .map_err(|e| anyhow!("index.json is not an OCI index: {e}"))?;
        let mut found = false;
        for d in &index.manifests {
            let name = d.annotations.get(ANNOTATION_CONTAINERD_NAME).or_else(|| {
                d.annotations
                    .get(ANNOTATION_REF_NAME)
                    .filter(|n| n.contains('/') || n.contains(':'))
            });
            let Some(name) = name else { continue };
            let name = ImageRef::parse(name).map_err(|e| anyhow!("index.json: {e}"))?;
            let bytes = read(&format!("blobs/sha256/{}", d.digest.hex()))?.ok_or_else(|| {
                anyhow!(
                    "index.json lists {} for {name} but the archive lacks blobs/sha256/{}",
                    d.digest,
                    d.digest.hex()
                )
            })?;
            let (media_type, _) = Document::parse(&bytes).map_err(|e| anyhow!("{name}: {e}"))?;
            let top = Descriptor::new(&media_type, d.digest.clone(), d.size);
            self.images.push(ArchiveImage { name, top, bytes });
            found = true;
        }
        Ok(found)
    }

    /// The one image of an index that names none, called
    /// `kiln.local/<archive file name>:<its bare ref.name tag, else latest>`.
    fn add_single_unnamed(
        &mut self,
        index: &[u8],
        read: &dyn Fn(&str) -> anyhow::Result<Option<Bytes>>,
        path: &Path,
    ) -> anyhow::Result<bool> {
        let index: ImageIndex = serde_json::from_slice(index)
            .map_err(|e| anyhow!("index.json is not an OCI index: {e}"))?;
        let [d] = index.manifests.as_slice() else {
            return Ok(false);
        };
        let stem = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = stem
            .trim_end_matches(".gz")
            .trim_end_matches(".tar")
            .to_ascii_lowercase();
        let repo: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let repo = repo
            .trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string();
        let repo = if repo.is_empty() {
            "archive".to_string()
        } else {
            repo
        };
        let tag = d
            .annotations
            .get(ANNOTATION_REF_NAME)
            .filter(|t| ImageRef::parse(&format!("kiln.local/x:{t}")).is_ok())
            .cloned()
            .unwrap_or_else(|| "latest".into());
        let name = ImageRef::parse(&format!("kiln.local/{repo}:{tag}"))
            .map_err(|e| anyhow!("naming the archive's image: {e}"))?;
        let bytes = read(&format!("blobs/sha256/{}", d.digest.hex()))?.ok_or_else(|| {
            anyhow!(
                "index.json lists {} but the archive lacks blobs/sha256/{}",
                d.digest,
                d.digest.hex()
            )
        })?;
        let (media_type, _) = Document::parse(&bytes).map_err(|e| anyhow!("{name}: {e}"))?;
        let top = Descriptor::new(&media_type, d.digest.clone(), d.size);
        tracing::debug!("{}: its one image, unnamed, is {name}", path.display());
        self.images.push(ArchiveImage { name, top, bytes });
        Ok(true)
    }

    /// Images of a `docker save` `manifest.json`, with a schema2 manifest
    /// made for each (docker save carries none for the legacy layout).
    fn add_docker(
        &mut self,
        manifest: &[u8],
        entries: &HashMap<String, Span>,
        tar_path: &Path,
    ) -> anyhow::Result<()> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        #[derive(Deserialize)]
        struct RootFs {
            #[serde(default)]
            diff_ids: Vec<String>,
        }
        #[derive(Deserialize)]
        struct Config {
            rootfs: RootFs,
        }
        let list: Vec<Entry> = serde_json::from_slice(manifest)
            .map_err(|e| anyhow!("manifest.json is not a docker save manifest: {e}"))?;
        if list.is_empty() {
            bail!("manifest.json lists no images");
        }
        for e in list {
            let tags = e.repo_tags.unwrap_or_default();
            if tags.is_empty() {
                bail!(
                    "image {} has no name (RepoTags is empty); tag it before docker save",
                    e.config
                );
            }
            let cspan = *entries.get(clean(&e.config)?.as_str()).ok_or_else(|| {
                anyhow!(
                    "manifest.json lists config {} but the archive lacks it",
                    e.config
                )
            })?;
            let cbytes = read_span(&self.files[cspan.archive], cspan, MAX_DOC_BYTES)?;
            let cdigest = Digest::of(&cbytes);
            let claimed = e
                .config
                .trim_start_matches("blobs/sha256/")
                .trim_end_matches(".json");
            if claimed.len() == 64 && claimed != cdigest.hex() {
                bail!(
                    "config {} does not match its name: its digest is {cdigest}",
                    e.config
                );
            }
            let cfg: Config = serde_json::from_slice(&cbytes)
                .map_err(|err| anyhow!("config {} is not an image config: {err}", e.config))?;
            serde_json::from_slice::<ImageConfigPlatform>(&cbytes)
                .map_err(|err| anyhow!("config {}: {err}", e.config))?;
            let layers = self.docker_layers(&e.layers, &cfg.rootfs.diff_ids, entries, tar_path)?;
            self.blobs.insert(cdigest.clone(), cspan);
            let m = ImageManifest {
                schema_version: 2,
                media_type: Some(media::DOCKER_MANIFEST.to_string()),
                config: Descriptor::new(media::DOCKER_CONFIG, cdigest, cbytes.len() as u64),
                layers,
                annotations: Default::default(),
            };
            let bytes = Bytes::from(serde_json::to_vec(&m)?);
            let top = Descriptor::new(
                media::DOCKER_MANIFEST,
                Digest::of(&bytes),
                bytes.len() as u64,
            );
            self.made.insert(top.digest.clone(), bytes.clone());
            for t in tags {
                let name = ImageRef::parse(&t).map_err(|err| anyhow!("manifest.json: {err}"))?;
                self.images.push(ArchiveImage {
                    name,
                    top: top.clone(),
                    bytes: bytes.clone(),
                });
            }
        }
        Ok(())
    }

    /// A docker-save image's layers, each checked against its name and (when
    /// uncompressed, as the legacy layout stores them) its config's diff_id.
    fn docker_layers(
        &mut self,
        names: &[String],
        diff_ids: &[String],
        entries: &HashMap<String, Span>,
        tar_path: &Path,
    ) -> anyhow::Result<Vec<Descriptor>> {
        let mut layers = Vec::new();
        for (i, l) in names.iter().enumerate() {
            let span = *entries
                .get(clean(l)?.as_str())
                .ok_or_else(|| anyhow!("manifest.json lists layer {l} but the archive lacks it"))?;
            let (digest, gzip) = hash_span(tar_path, span)?;
            let named = l
                .strip_prefix("blobs/sha256/")
                .map(|h| format!("sha256:{h}"));
            if let Some(n) = named.filter(|n| *n != digest.as_str()) {
                bail!("layer {l} does not match its name: its digest is {digest} (expected {n})");
            }
            if !gzip {
                match diff_ids.get(i) {
                    Some(want) if *want == digest.as_str() => {}
                    Some(want) => bail!("layer {l} does not match the config: digest {digest}, expected diff_id {want}"),
                    None => bail!("layer {l} has no diff_id in the config"),
                }
            }
            let mt = if gzip {
                media::DOCKER_LAYER_GZIP
            } else {
                media::DOCKER_LAYER
            };
            self.blobs.insert(digest.clone(), span);
            layers.push(Descriptor::new(mt, digest, span.size));
        }
        Ok(layers)
    }

    /// Whether the archives hold everything `images` need for `platforms`:
    /// every document and blob, with each pin matching. Lists all that is
    /// missing, so a bundle is judged before anything is written.
    pub fn check(
        &self,
        images: &[ImageRef],
        platforms: &[crate::primitives::platform::Platform],
    ) -> Result<(), String> {
        let mut missing = Vec::new();
        for image in images {
            let Some(found) = self.images.iter().find(|i| {
                i.name.name() == image.name() && (image.tag.is_none() || i.name.tag == image.tag)
            }) else {
                missing.push(format!("{image} (not in the bundle)"));
                continue;
            };
            if let Some(pin) = &image.digest {
                if *pin != found.top.digest {
                    missing.push(format!("{image} (the bundle has {})", found.top.digest));
                    continue;
                }
            }
            let manifests: Vec<(String, Descriptor)> = match Document::parse(&found.bytes) {
                Ok((_, Document::Index(idx))) => platforms
                    .iter()
                    .map(|p| {
                        let d = crate::primitives::oci::select_platform(&idx.manifests, p)
                            .map(|i| &idx.manifests[i]);
                        (
                            p.to_string(),
                            d.cloned().unwrap_or_else(|| {
                                Descriptor::new("", found.top.digest.clone(), 0)
                            }),
                        )
                    })
                    .collect(),
                Ok((_, Document::Manifest(_))) => vec![(
                    platforms
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    found.top.clone(),
                )],
                Err(e) => {
                    missing.push(format!("{image} ({e})"));
                    continue;
                }
            };
            for (platform, d) in manifests {
                if d.size == 0 {
                    missing.push(format!("{image} {platform} (not in its index)"));
                    continue;
                }
                let bytes = match self
                    .made
                    .get(&d.digest)
                    .cloned()
                    .map(Ok)
                    .unwrap_or_else(|| {
                        self.blobs.get(&d.digest).ok_or(()).and_then(|s| {
                            read_span(&self.files[s.archive], *s, MAX_DOC_BYTES).map_err(|_| ())
                        })
                    }) {
                    Ok(b) => b,
                    Err(()) => {
                        missing.push(format!("{image} {platform} (manifest {})", d.digest));
                        continue;
                    }
                };
                let Ok((_, Document::Manifest(m))) = Document::parse(&bytes) else {
                    missing.push(format!(
                        "{image} {platform} (manifest {} unreadable)",
                        d.digest
                    ));
                    continue;
                };
                for b in std::iter::once(&m.config).chain(&m.layers) {
                    if !self.blobs.contains_key(&b.digest) {
                        missing.push(format!("{image} {platform} (blob {})", b.digest));
                    }
                }
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("the bundle lacks {}", missing.join(", ")))
        }
    }

    fn span(&self, d: &Descriptor, what: &str) -> anyhow::Result<Span> {
        self.blobs.get(&d.digest).copied().ok_or_else(|| {
            anyhow!("{what} {} is not in the archive (it holds only some of the image's platforms? pass --platform for one it has)", d.digest)
        })
    }
}

/// Archive entry names as written (`./x` and `x` alike), refusing any that
/// could escape when unpacked.
fn clean(name: &str) -> anyhow::Result<String> {
    let p = Path::new(name);
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                bail!("entry {name:?} points outside the archive; refusing it")
            }
        }
    }
    Ok(parts.join("/"))
}

/// Every regular file's span; symlinks (docker save links shared layers)
/// resolve to their target's span.
fn index_tar(path: &Path, archive: usize) -> anyhow::Result<HashMap<String, Span>> {
    let f = std::fs::File::open(path)?;
    let mut tar = tar::Archive::new(f);
    let mut files = HashMap::new();
    let mut links = Vec::new();
    let entries = tar
        .entries()
        .map_err(|e| anyhow!("is not a tar archive: {e}"))?;
    for entry in entries {
        let entry = entry.map_err(|e| anyhow!("is not a tar archive (or is truncated): {e}"))?;
        let raw = entry
            .path()
            .map_err(|e| anyhow!("bad entry name: {e}"))?
            .to_string_lossy()
            .into_owned();
        let name = clean(&raw)?;
        let kind = entry.header().entry_type();
        if kind.is_file() {
            files.insert(
                name,
                Span {
                    archive,
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                },
            );
        } else if kind.is_symlink() || kind.is_hard_link() {
            let target = entry
                .link_name()
                .ok()
                .flatten()
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            let base = if kind.is_symlink() {
                Path::new(&name)
                    .parent()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            let joined = if base.is_empty() {
                target.clone()
            } else {
                format!("{base}/{target}")
            };
            links.push((
                name,
                resolve_dots(&joined).ok_or_else(|| {
                    anyhow!("link {raw:?} -> {target:?} points outside the archive; refusing it")
                })?,
            ));
        }
    }
    if files.is_empty() {
        bail!("is not a tar archive, or is empty");
    }
    for (name, target) in links {
        if let Some(span) = files.get(&target).copied() {
            files.insert(name, span);
        }
    }
    Ok(files)
}

/// `a/b/../c` -> `a/c`; None if `..` climbs above the root.
fn resolve_dots(p: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            s => out.push(s),
        }
    }
    Some(out.join("/"))
}

fn read_span(path: &Path, span: Span, limit: u64) -> anyhow::Result<Bytes> {
    if span.size > limit {
        bail!(
            "{} bytes is over the {limit}-byte limit for a document",
            span.size
        );
    }
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(span.offset))?;
    let mut buf = vec![0; span.size as usize];
    f.read_exact(&mut buf)?;
    Ok(Bytes::from(buf))
}

/// Temp files of decompressed archives: `kiln-gunzip-PID-…`, so a run can
/// remove those of killed runs.
const GUNZIP_PREFIX: &str = "kiln-gunzip-";
/// An image archive's tar is at most this many times its gzip (layers are
/// mostly compressed already); more is a decompression bomb.
const MAX_GUNZIP_RATIO: u64 = 64;

/// Decompresses a gzipped archive to a temp file, bounded by
/// [`MAX_GUNZIP_RATIO`] × its size and by the free space of the temp
/// directory; removed on drop, and by the next run if this one is killed.
fn gunzip_bounded(f: std::fs::File) -> anyhow::Result<tempfile::NamedTempFile> {
    let tmpdir = std::env::temp_dir();
    sweep_dead_gunzips(&tmpdir);
    let packed = f.metadata()?.len();
    let by_ratio = packed
        .saturating_mul(MAX_GUNZIP_RATIO)
        .saturating_add(64 << 20);
    let free = rustix::fs::statvfs(&tmpdir)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .unwrap_or(u64::MAX)
        .saturating_sub(64 << 20);
    let bound = by_ratio.min(free);
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!("{GUNZIP_PREFIX}{}-", std::process::id()))
        .tempfile_in(&tmpdir)?;
    let mut gz = Read::take(flate2::read::GzDecoder::new(f), bound + 1);
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        crate::primitives::fault::point("gunzip");
        crate::primitives::interrupt::check()?;
        let k = gz.read(&mut buf).context("is not a valid gzip file")?;
        if k == 0 {
            break;
        }
        std::io::Write::write_all(&mut tmp, &buf[..k])?;
        n += k as u64;
    }
    if n > bound {
        bail!(
            "decompresses to more than {bound} bytes ({}); if it is genuine, gunzip it yourself and pass the .tar",
            if bound == by_ratio {
                format!("{MAX_GUNZIP_RATIO}x its size")
            } else {
                format!("the free space in {}", tmpdir.display())
            }
        );
    }
    Ok(tmp)
}

fn sweep_dead_gunzips(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(GUNZIP_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(crate::adapters::daemon::process_gone) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The digest of a file in the archive, and whether it is gzip-compressed.
fn hash_span(path: &Path, span: Span) -> anyhow::Result<(Digest, bool)> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(span.offset))?;
    let mut r = f.take(span.size);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut first = true;
    let mut gzip = false;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if first {
            gzip = n >= 2 && buf[0] == 0x1f && buf[1] == 0x8b;
            first = false;
        }
        h.update(&buf[..n]);
    }
    Ok((Digest::from_hasher(h), gzip))
}

impl Source for ArchiveSource {
    async fn resolve(&self, image: &ImageRef) -> anyhow::Result<Resolved> {
        let found = self
            .images
            .iter()
            .find(|i| {
                i.name.name() == image.name() && (image.tag.is_none() || i.name.tag == image.tag)
            })
            .ok_or_else(|| anyhow!("{image} is not in the archives"))?;
        Ok(Resolved {
            descriptor: found.top.clone(),
            bytes: found.bytes.clone(),
        })
    }

    async fn manifest(&self, _image: &ImageRef, desc: &Descriptor) -> anyhow::Result<Bytes> {
        if let Some(b) = self.made.get(&desc.digest) {
            return Ok(b.clone());
        }
        let span = self.span(desc, "manifest")?;
        read_span(&self.files[span.archive], span, MAX_DOC_BYTES)
    }

    async fn blob(&self, _image: &ImageRef, desc: &Descriptor) -> anyhow::Result<BlobStream> {
        let span = self.span(desc, "blob")?;
        let mut f = tokio::fs::File::open(&self.files[span.archive]).await?;
        tokio::io::AsyncSeekExt::seek(&mut f, SeekFrom::Start(span.offset)).await?;
        let reader = f.take(span.size);
        let stream = tokio_util::io::ReaderStream::with_capacity(reader, 256 << 10);
        Ok(Box::pin(stream.map_err(anyhow::Error::from)))
    }

    fn describe(&self, image: &ImageRef) -> String {
        let _ = image;
        format!("archive {}", self.labels.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_escape() {
        assert_eq!(clean("./blobs/sha256/ab").unwrap(), "blobs/sha256/ab");
        assert!(clean("../etc/passwd").is_err());
        assert!(clean("/etc/passwd").is_err());
        assert!(clean("a/../../b").is_err());
        assert_eq!(resolve_dots("a/b/../c").as_deref(), Some("a/c"));
        assert_eq!(resolve_dots("a/../../c"), None);
    }

    /// Several images and no full names: the error lists them and says
    /// how to save them named.
    #[test]
    fn several_unnamed_images_are_listed() {
        let doc = |n: u8| {
            let bytes = format!(
                "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:{}\",\"size\":{n}}},\"layers\":[]}}",
                "0".repeat(64)
            );
            (Digest::of(bytes.as_bytes()), bytes)
        };
        let (d1, m1) = doc(1);
        let (d2, m2) = doc(2);
        let index = format!(
            "{{\"schemaVersion\":2,\"manifests\":[{{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"{d1}\",\"size\":{},\"annotations\":{{\"org.opencontainers.image.ref.name\":\"v1\"}}}},{{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"{d2}\",\"size\":{}}}]}}",
            m1.len(),
            m2.len()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("two.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
        for (name, bytes) in [
            ("index.json".to_string(), index),
            (format!("blobs/sha256/{}", d1.hex()), m1),
            (format!("blobs/sha256/{}", d2.hex()), m2),
        ] {
            let mut h = tar::Header::new_ustar();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, bytes.as_bytes()).unwrap();
        }
        b.finish().unwrap();
        drop(b);
        let e = format!("{:#}", ArchiveSource::open(&[path]).err().expect("refused"));
        assert!(e.contains("lists 2 images without full names"), "{e}");
        assert!(
            e.contains(&format!("{d1} tag v1")) && e.contains(d2.as_str()),
            "{e}"
        );
        assert!(e.contains("oci-archive:FILE:REGISTRY/REPO:TAG"), "{e}");
    }
}
