//! Image archives on disk: `docker save` tarballs (the legacy layout with
//! `manifest.json` and `<id>/layer.tar`, and Docker 25+'s, which also carries
//! an OCI `index.json`) and OCI image-layout tarballs. The archive is indexed
//! once; blobs then stream straight from their offsets in the tar, verified
//! by the engine like any other source. The rooms: `tarball` (the tar and
//! its spans), `layouts` (OCI and Docker layouts); the source is here.

mod directory;
mod layouts;
mod opened;
mod tarball;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures_util::TryStreamExt;
use tokio::io::AsyncReadExt;

use super::{BlobStream, Resolved, Source};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{Descriptor, Document, ImageIndex, ANNOTATION_REF_NAME};
use crate::primitives::reference::ImageRef;
use opened::{open_regular, reopen};
use tarball::{gunzip_bounded, index_tar, read_span};

use crate::primitives::oci::MAX_DOCUMENT_BYTES as MAX_DOC_BYTES;

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
    /// The tar files (a decompressed copy for gzipped ones) and a layout
    /// directory's blob files, each opened once when listed
    /// ([`open_regular`]) and read only through that descriptor: a file
    /// swapped afterwards for a FIFO or a link is never opened.
    files: Vec<std::sync::Arc<std::fs::File>>,
    labels: Vec<String>,
    images: Vec<ArchiveImage>,
    /// Each blob's copies, in the order of the archives given: a bundle
    /// and the one it was made `--since` may both hold one, and a damaged
    /// copy in either must not decide (issue 44.7).
    blobs: HashMap<Digest, Vec<Span>>,
    /// Documents kiln made (manifests for legacy docker-save images).
    made: HashMap<Digest, Bytes>,
    /// Per archive, its `index.json`'s digest.
    indexes: Vec<Option<Digest>>,
    /// Differential bundles: (label, the bundle they leave layers to).
    since: Vec<(String, String)>,
    /// Per differential bundle (as `since`): its archive and the digest of
    /// its predecessor's `index.json`, as its `kiln/since.json` says.
    since_index: Vec<(usize, Option<Digest>)>,
    _temps: Vec<tempfile::NamedTempFile>,
}

impl ArchiveSource {
    /// Reads and checks every archive; nothing is written anywhere.
    pub fn open(paths: &[PathBuf]) -> anyhow::Result<ArchiveSource> {
        let items: Vec<(PathBuf, Option<String>)> =
            paths.iter().map(|p| (p.clone(), None)).collect();
        Self::open_selected(&items)
    }

    /// [`ArchiveSource::open`] of archives and OCI layout directories, each
    /// narrowed to the image its index names `TAG` when one is given (as
    /// skopeo names them: `oci:DIR:TAG`, `oci-archive:FILE:TAG`).
    pub fn open_selected(items: &[(PathBuf, Option<String>)]) -> anyhow::Result<ArchiveSource> {
        let mut src = ArchiveSource {
            files: Vec::new(),
            labels: Vec::new(),
            images: Vec::new(),
            blobs: HashMap::new(),
            made: HashMap::new(),
            indexes: Vec::new(),
            since: Vec::new(),
            since_index: Vec::new(),
            _temps: Vec::new(),
        };
        for (path, select) in items {
            let what = if path.is_dir() {
                "OCI layout"
            } else {
                "archive"
            };
            src.add(path, select.as_deref())
                .with_context(|| format!("{what} {}", path.display()))?;
        }
        Ok(src)
    }

    /// Every blob the archives hold, by digest.
    pub fn blob_digests(&self) -> impl Iterator<Item = &Digest> {
        self.blobs.keys()
    }

    /// The digest of archive `n`'s `index.json` (an OCI layout's).
    pub fn index_digest(&self, n: usize) -> Option<Digest> {
        self.indexes.get(n).cloned().flatten()
    }

    /// The differential bundles among the archives: (label, what it
    /// leaves to, as `kiln/since.json` says).
    pub fn differential(&self) -> Vec<(String, String)> {
        self.since.clone()
    }

    /// Each differential bundle's predecessor, when given beside it, is the
    /// one it was made against: its `index.json` is the digest the
    /// bundle's `kiln/since.json` names (issue 44.7). Err names the two.
    pub fn check_since(&self) -> Result<(), String> {
        for (at, want) in &self.since_index {
            let Some(want) = want else {
                return Err(format!(
                    "{}: its kiln/since.json names no index digest of the bundle it was made --since; make it again with kiln bundle --since",
                    self.labels[*at]
                ));
            };
            let others: Vec<usize> = (0..self.files.len()).filter(|i| i != at).collect();
            if others.is_empty()
                || others
                    .iter()
                    .any(|i| self.index_digest(*i).as_ref() == Some(want))
            {
                continue;
            }
            let named: Vec<&str> = others.iter().map(|i| self.labels[*i].as_str()).collect();
            return Err(format!(
                "{} was made --since a bundle whose index.json is {want}; none of {} is that bundle (another version, or changed since): pass the bundle it was made against",
                self.labels[*at],
                named.join(", ")
            ));
        }
        Ok(())
    }

    /// The images the archives name, in order.
    pub fn images(&self) -> Vec<ImageRef> {
        self.images.iter().map(|i| i.name.clone()).collect()
    }

    fn add(&mut self, path: &Path, select: Option<&str>) -> anyhow::Result<()> {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            return self.add_dir(path, select);
        }
        // The path the user gave may be their own link; what it opens must
        // be a regular file.
        let mut f = open_regular(path, true)?;
        let mut magic = [0u8; 2];
        let n = f.read(&mut magic)?;
        f.seek(SeekFrom::Start(0))?;
        let tar = if n == 2 && magic == [0x1f, 0x8b] {
            let tmp = gunzip_bounded(f)?;
            let opened = reopen(tmp.as_file())?;
            self._temps.push(tmp);
            opened
        } else {
            f
        };
        let tar = std::sync::Arc::new(tar);
        let archive = self.files.len();
        self.files.push(tar.clone());
        self.labels.push(path.display().to_string());
        let entries = index_tar(reopen(&tar)?, archive)?;
        let read = |name: &str| -> anyhow::Result<Option<Bytes>> {
            match entries.get(name) {
                Some(span) => Ok(Some(
                    read_span(&tar, *span, MAX_DOC_BYTES)
                        .with_context(|| format!("reading {name}"))?,
                )),
                None => Ok(None),
            }
        };
        // Blobs of an OCI layout (and of Docker 25+ saves) are named by digest.
        for (name, span) in &entries {
            if let Some(hex) = name.strip_prefix("blobs/sha256/") {
                if let Ok(d) = Digest::parse(&format!("sha256:{hex}")) {
                    self.add_blob(d, *span);
                }
            }
        }
        let index = read("index.json")?;
        self.indexes.push(index.as_ref().map(|b| Digest::of(b)));
        let index = index.map(|i| layouts::narrowed(&i, select)).transpose()?;
        if let Some(since) = read("kiln/since.json")? {
            let v = serde_json::from_slice::<serde_json::Value>(&since).ok();
            let index = v
                .as_ref()
                .and_then(|v| v["index"].as_str())
                .and_then(|d| Digest::parse(d).ok());
            self.since_index.push((archive, index));
            // Shown in a message: a plain file name, or nothing of it (the
            // archive may be hostile; no control characters, no paths).
            let bundle = v
                .and_then(|v| v["bundle"].as_str().map(str::to_string))
                .filter(|b| {
                    !b.is_empty()
                        && b.len() <= 255
                        && !b.contains('/')
                        && !b.chars().any(char::is_control)
                })
                .unwrap_or_else(|| "the bundle it was made --since".into());
            self.since.push((path.display().to_string(), bundle));
        }
        if let Some(index) = index {
            if self.add_oci(&index, &read)? {
                return Ok(());
            }
        }
        match read("manifest.json")? {
            Some(m) => self.add_docker(&m, &entries, &tar),
            None if entries.contains_key("index.json") => {
                // One image without a full name (skopeo's `oci-archive:F:TAG`
                // sets only a bare tag, or none): it is the archive's image.
                let index = layouts::narrowed(&read("index.json")?.expect("listed"), select)?;
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
                        self.first(&d.digest).ok_or(()).and_then(|s| {
                            read_span(&self.files[s.archive], s, MAX_DOC_BYTES).map_err(|_| ())
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
        let copies = self
            .blobs
            .get(&d.digest)
            .map(Vec::as_slice)
            .unwrap_or_default();
        match copies {
            [] => Err(anyhow!("{what} {} is not in the archive (it holds only some of the image's platforms? pass --platform for one it has)", d.digest)),
            // One copy: the engine verifies it as it streams.
            [one] => Ok(*one),
            // Several (`--from NEW --from OLD`): the first that verifies,
            // so a damaged copy in one archive does not hide a good one.
            several => Ok(several
                .iter()
                .copied()
                .find(|s| self.verifies(*s, d))
                .unwrap_or(several[0])),
        }
    }

    /// Records a copy of blob `d` at `span`.
    fn add_blob(&mut self, d: Digest, span: Span) {
        self.blobs.entry(d).or_default().push(span);
    }

    /// The first copy of `d`.
    fn first(&self, d: &Digest) -> Option<Span> {
        self.blobs.get(d).and_then(|v| v.first()).copied()
    }

    /// Whether the archives name a blob `d` (its bytes unchecked).
    pub fn names_blob(&self, d: &Digest) -> bool {
        self.blobs.contains_key(d)
    }

    /// Whether the archives hold a copy of `desc` whose size and digest are
    /// its own (read and hashed: a name proves nothing).
    pub fn verify_blob(&self, desc: &Descriptor) -> bool {
        self.blobs
            .get(&desc.digest)
            .is_some_and(|v| v.iter().any(|s| self.verifies(*s, desc)))
    }

    /// Whether `span` is `desc`'s bytes: its size, then its hash.
    fn verifies(&self, span: Span, desc: &Descriptor) -> bool {
        if span.size != desc.size {
            return false;
        }
        let read = || -> std::io::Result<Digest> {
            let mut f = reopen(&self.files[span.archive])?;
            f.seek(SeekFrom::Start(span.offset))?;
            let h = crate::primitives::digest::hash_read(
                f.take(span.size),
                <sha2::Sha256 as sha2::Digest>::new(),
            )?;
            Ok(Digest::from_hasher(h))
        };
        crate::primitives::blocking::off_runtime(read).is_ok_and(|d| d == desc.digest)
    }
}

/// Temp files of decompressed archives: `kiln-gunzip-PID-…`, so a run can
/// remove those of killed runs.
const GUNZIP_PREFIX: &str = "kiln-gunzip-";
/// An image archive's tar is at most this many times its gzip (layers are
/// mostly compressed already); more is a decompression bomb.
const MAX_GUNZIP_RATIO: u64 = 64;

impl Source for ArchiveSource {
    async fn resolve(&self, image: &ImageRef) -> anyhow::Result<Resolved> {
        // By digest when it names one the archives hold under that name;
        // else, by digest, a document the archives hold unnamed (a bundle's
        // signature manifests, listed by a referrers index); else by name
        // and tag, and the engine holds a pinned digest to what it gets.
        let by_digest = image.digest.as_ref().and_then(|d| {
            self.images
                .iter()
                .find(|i| i.name.name() == image.name() && i.top.digest == *d)
        });
        if let (None, Some(d)) = (by_digest, &image.digest) {
            if let Some(span) = self.first(d) {
                let bytes = read_span(&self.files[span.archive], span, MAX_DOC_BYTES)?;
                if let Ok((media_type, _)) = Document::parse(&bytes) {
                    return Ok(Resolved {
                        descriptor: Descriptor::new(&media_type, d.clone(), bytes.len() as u64),
                        bytes,
                    });
                }
            }
        }
        let found = by_digest
            .or_else(|| {
                self.images.iter().find(|i| {
                    i.name.name() == image.name()
                        && (image.tag.is_none() || i.name.tag == image.tag)
                })
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
        let mut f = tokio::fs::File::from_std(reopen(&self.files[span.archive])?);
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
    use super::tarball::{clean, resolve_dots};
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

    /// A differential bundle's `kiln/since.json` comes from the archive: a
    /// hostile one's name for its predecessor reaches a message only as a
    /// plain file name.
    #[test]
    fn a_since_name_with_control_characters_or_a_path_is_not_repeated() {
        let m = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:{}\",\"size\":1}},\"layers\":[]}}",
            "0".repeat(64)
        );
        let d = Digest::of(m.as_bytes());
        let index = format!(
            "{{\"schemaVersion\":2,\"manifests\":[{{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"{d}\",\"size\":{},\"annotations\":{{\"io.containerd.image.name\":\"registry.k8s.io/pause:3.10\"}}}}]}}",
            m.len()
        );
        let dir = tempfile::tempdir().unwrap();
        let mut labels = Vec::new();
        for (i, name) in ["v1.tar", r"\u001b[31mv1.tar\n", "../../etc/v1.tar"]
            .iter()
            .enumerate()
        {
            let path = dir.path().join(format!("{i}.tar"));
            let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
            let since = format!("{{\"bundle\":\"{name}\"}}");
            for (entry, bytes) in [
                ("index.json".to_string(), index.clone()),
                (format!("blobs/sha256/{}", d.hex()), m.clone()),
                ("kiln/since.json".to_string(), since),
            ] {
                let mut h = tar::Header::new_ustar();
                h.set_size(bytes.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, entry, bytes.as_bytes()).unwrap();
            }
            b.finish().unwrap();
            drop(b);
            let src = ArchiveSource::open(&[path]).unwrap();
            labels.push(src.differential()[0].1.clone());
        }
        assert_eq!(labels[0], "v1.tar");
        assert_eq!(labels[1], "the bundle it was made --since");
        assert_eq!(labels[2], "the bundle it was made --since");
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
