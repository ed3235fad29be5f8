//! An OCI image layout on disk (`oci-layout`, `index.json`, `blobs/sha256/`),
//! then packed into one deterministic tarball: kiln's air-gap bundle. Each
//! blob is stored once however many images share it. Names are annotated the
//! way containerd's exporter does, so `ctr images import` and k3s read it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::{Descriptor, ANNOTATION_IMAGE_NAME, ANNOTATION_REF_NAME};
use crate::sink::Sink;

pub struct OciLayout {
    dir: PathBuf,
    /// Image names and the descriptors they point at.
    records: Mutex<BTreeMap<String, Descriptor>>,
}

impl OciLayout {
    /// Opens (or starts) a layout directory; blobs already there are kept.
    pub fn open(dir: &Path) -> anyhow::Result<OciLayout> {
        std::fs::create_dir_all(dir.join("blobs/sha256"))
            .with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        Ok(OciLayout {
            dir: dir.to_path_buf(),
            records: Mutex::new(BTreeMap::new()),
        })
    }

    /// Makes `name` -> `target` the layout's only image (the blobs stay):
    /// what index.json lists, packs and pushes from then on.
    pub fn name_only(&self, name: &crate::primitives::reference::ImageRef, target: &Descriptor) {
        let name = name.tagged_name().unwrap_or_else(|| name.to_string());
        let mut records = self.records.lock().unwrap();
        records.clear();
        records.insert(name, target.clone());
    }

    pub fn blobs_dir(&self) -> PathBuf {
        self.dir.join("blobs/sha256")
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(d.hex())
    }

    /// Writes `index.json`: one entry per tagged record, sorted by name.
    pub fn write_index(&self) -> anyhow::Result<()> {
        let records = self.records.lock().unwrap();
        let mut manifests = Vec::new();
        for (name, target) in records.iter().filter(|(n, _)| !n.contains('@')) {
            let mut d = target.clone();
            // Both the full reference: containerd (`ctr import`, Docker's
            // containerd store) reads its own annotation; skopeo and umoci
            // select an image by ref.name (`oci-archive:F:registry.k8s.io/
            // kube-proxy:v1.31.2`), which a bare tag would make ambiguous in
            // a bundle of several images. The OCI image-layout grammar for
            // ref.name allows `/` and `:`.
            d.annotations
                .insert(ANNOTATION_IMAGE_NAME.to_string(), name.clone());
            d.annotations
                .insert(ANNOTATION_REF_NAME.to_string(), name.clone());
            manifests.push(d);
        }
        std::fs::write(
            self.dir.join("index.json"),
            crate::primitives::oci::write::index(&manifests, &BTreeMap::new(), true)?,
        )?;
        Ok(())
    }

    /// Adds a non-blob file (e.g. the node manifest) to the layout.
    pub fn add_file(&self, rel: &str, bytes: &[u8]) -> anyhow::Result<()> {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("relative path has a parent"))?;
        std::fs::write(p, bytes)?;
        Ok(())
    }

    /// Packs the layout into `out` (sorted entries, zero mtimes, root owner),
    /// via a temporary file so `out` is never half-written. Only blobs that
    /// `index.json` reaches are packed: leftovers of an earlier run stay out.
    pub fn pack(&self, out: &Path, extra: &[&str]) -> anyhow::Result<u64> {
        let keep = self.reachable()?;
        let tmp = out.with_extension("tar.kiln-tmp");
        let packed = self.pack_to(&tmp, out, extra, &keep);
        if packed.is_err() {
            // Interrupted or failed: no half-written file stays behind.
            let _ = std::fs::remove_file(&tmp);
        }
        packed
    }

    fn pack_to(
        &self,
        tmp: &Path,
        out: &Path,
        extra: &[&str],
        keep: &std::collections::BTreeSet<Digest>,
    ) -> anyhow::Result<u64> {
        let file =
            std::fs::File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(1 << 20, file));
        let mut add = |name: &str, path: &Path| -> anyhow::Result<()> {
            crate::primitives::interrupt::check()?;
            let mut f = std::fs::File::open(path)?;
            let len = f.metadata()?.len();
            let mut h = tar::Header::new_ustar();
            h.set_size(len);
            h.set_mode(0o644);
            h.set_mtime(0);
            h.set_uid(0);
            h.set_gid(0);
            h.set_entry_type(tar::EntryType::Regular);
            // The same header the tar crate would write (every name here is
            // at most `blobs/sha256/<64 hex>`, 77 bytes: a plain ustar name),
            // then the bytes file to file: `io::copy` between files is `copy_file_range`,
            // so they move in the kernel (tar's own copy goes through an
            // 8 KiB buffer, a system call pair per 8 KiB).
            h.set_path(name)?;
            h.set_cksum();
            let w = tar.get_mut();
            w.write_all(h.as_bytes())?;
            let copied = std::io::copy(&mut f, w)?;
            if copied != len {
                bail!("{} changed while it was packed", path.display());
            }
            let pad = (512 - len % 512) % 512;
            w.write_all(&[0u8; 512][..pad as usize])?;
            Ok(())
        };
        add("oci-layout", &self.dir.join("oci-layout"))?;
        add("index.json", &self.dir.join("index.json"))?;
        for name in extra {
            add(name, &self.dir.join(name))?;
        }
        for d in keep {
            add(&format!("blobs/sha256/{}", d.hex()), &self.blob_path(d))?;
        }
        let mut w = tar.into_inner()?;
        w.flush()?;
        let f = w.into_inner().map_err(|e| anyhow!("{e}"))?;
        f.sync_all()?;
        let size = f.metadata()?.len();
        std::fs::rename(tmp, out).with_context(|| format!("writing {}", out.display()))?;
        Ok(size)
    }
}

impl OciLayout {
    /// Every blob the records reach and the layout holds (an index's entries
    /// for platforms not bundled are absent by design), sorted.
    fn reachable(&self) -> anyhow::Result<std::collections::BTreeSet<Digest>> {
        let mut out = std::collections::BTreeSet::new();
        let mut todo: Vec<Digest> = self
            .records
            .lock()
            .unwrap()
            .values()
            .map(|t| t.digest.clone())
            .collect();
        while let Some(d) = todo.pop() {
            let path = self.blob_path(&d);
            if !path.exists() || !out.insert(d.clone()) {
                continue;
            }
            if std::fs::metadata(&path)?.len() > 8 << 20 {
                continue; // a layer
            }
            let bytes = std::fs::read(&path)?;
            match crate::primitives::oci::Document::parse(&bytes) {
                Ok((_, crate::primitives::oci::Document::Index(i))) => {
                    todo.extend(i.manifests.into_iter().map(|m| m.digest))
                }
                Ok((_, crate::primitives::oci::Document::Manifest(m))) => {
                    todo.push(m.config.digest);
                    todo.extend(m.layers.into_iter().map(|l| l.digest));
                }
                Err(_) => {}
            }
        }
        Ok(out)
    }
}

/// A layout is also a source: what it records can be copied on (e.g. pushed).
impl crate::source::Source for OciLayout {
    async fn resolve(
        &self,
        image: &crate::primitives::reference::ImageRef,
    ) -> anyhow::Result<crate::primitives::handoff::Resolved> {
        let name = image.tagged_name().unwrap_or_else(|| image.to_string());
        let rec = self
            .records
            .lock()
            .unwrap()
            .get(&name)
            .cloned()
            .ok_or_else(|| anyhow!("{name} is not in the layout"))?;
        let bytes = Bytes::from(std::fs::read(self.blob_path(&rec.digest))?);
        Ok(crate::primitives::handoff::Resolved {
            descriptor: rec,
            bytes,
        })
    }

    async fn manifest(
        &self,
        _image: &crate::primitives::reference::ImageRef,
        desc: &Descriptor,
    ) -> anyhow::Result<Bytes> {
        Ok(Bytes::from(
            std::fs::read(self.blob_path(&desc.digest))
                .with_context(|| format!("{} is not in the layout", desc.digest))?,
        ))
    }

    async fn blob(
        &self,
        _image: &crate::primitives::reference::ImageRef,
        desc: &Descriptor,
    ) -> anyhow::Result<BlobStream> {
        let f = tokio::fs::File::open(self.blob_path(&desc.digest))
            .await
            .with_context(|| format!("{} is not in the layout", desc.digest))?;
        Ok(Box::pin(
            tokio_util::io::ReaderStream::with_capacity(f, 256 << 10).map_err(anyhow::Error::from),
        ))
    }

    fn describe(&self, _image: &crate::primitives::reference::ImageRef) -> String {
        format!("layout {}", self.dir.display())
    }
}

impl Sink for OciLayout {
    async fn has(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        Ok(std::fs::metadata(self.blob_path(&desc.digest)).is_ok_and(|m| m.len() == desc.size))
    }

    async fn put_stream(&self, desc: &Descriptor, mut data: BlobStream) -> anyhow::Result<u64> {
        let dest = self.blob_path(&desc.digest);
        let tmp = tempfile::NamedTempFile::new_in(self.dir.join("blobs/sha256"))?;
        let mut file = tokio::fs::File::from_std(tmp.reopen()?);
        let mut n = 0u64;
        while let Some(chunk) = data.next().await {
            // An error here (including a failed verification) drops `tmp`: nothing stays.
            let chunk = chunk?;
            tokio::io::AsyncWriteExt::write_all(&mut file, &chunk).await?;
            n += chunk.len() as u64;
        }
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        tmp.persist(&dest)
            .map_err(|e| anyhow!("storing {}: {e}", desc.digest))?;
        Ok(n)
    }

    /// A layout is kiln's staging (packed, pushed or read, never run):
    /// cache entries are hard-linked in.
    async fn put_file(&self, desc: &Descriptor, path: &Path) -> anyhow::Result<u64> {
        let dest = self.blob_path(&desc.digest);
        let tmp = tempfile::Builder::new()
            .make_in(self.dir.join("blobs/sha256"), |p| {
                crate::sink::cache::place(path, p, crate::sink::cache::Share::Link).map(|_| ())
            })
            .with_context(|| format!("storing {}", desc.digest))?;
        tmp.persist(&dest)
            .map_err(|e| anyhow!("storing {}: {e}", desc.digest))?;
        Ok(0)
    }

    async fn read(&self, digest: &Digest) -> anyhow::Result<Option<Bytes>> {
        match std::fs::read(self.blob_path(digest)) {
            Ok(b) => Ok(Some(Bytes::from(b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn record(&self, name: &str, target: &Descriptor) -> anyhow::Result<()> {
        self.records
            .lock()
            .unwrap()
            .insert(name.to_string(), target.clone());
        Ok(())
    }
}
