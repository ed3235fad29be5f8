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
use crate::primitives::owned::OwnedDir;
use crate::sink::Sink;

pub struct OciLayout {
    /// The layout's directory and its `blobs/sha256`, opened once and used
    /// through their handles (`primitives::owned`).
    dir: OwnedDir,
    blobs: OwnedDir,
    /// Image names and the descriptors they point at.
    records: Mutex<BTreeMap<String, Descriptor>>,
    /// The archive being written, when [`OciLayout::archive_to`] began one.
    draft: Mutex<Option<Draft>>,
}

/// An archive begun before its blobs are all known: a blob written with
/// [`OciLayout::new_blob`] (kiln's own layer) streams straight into it, so
/// its bytes are written once, not into the layout and then again into the
/// archive. [`OciLayout::pack`] appends the rest and renames it into place.
struct Draft {
    /// Where the archive goes.
    out: PathBuf,
    /// The file, a temporary file beside `out` until it is packed
    /// ([`crate::primitives::atomic`]), then `out`.
    at: PathBuf,
    /// The temporary file's name, removed if the draft is dropped unpacked.
    temp: Option<tempfile::TempPath>,
    /// `None` while a blob is being written into it.
    file: Option<std::fs::File>,
    /// Where the next entry starts.
    end: u64,
    /// Blobs already in it: where their bytes start, and their length.
    blobs: BTreeMap<Digest, (u64, u64)>,
    packed: bool,
}

impl Drop for Draft {
    fn drop(&mut self) {
        // Failed or interrupted before it was packed: nothing half-written
        // stays (dropping the temporary path removes it).
        self.temp.take();
    }
}

/// A blob being written by [`OciLayout::new_blob`]; finished by
/// [`OciLayout::commit_blob`].
pub struct BlobOut {
    file: std::fs::File,
    /// In a draft: where its entry's header goes.
    entry: Option<u64>,
    /// Outside a draft: its temporary file in `blobs/`.
    temp: Option<tempfile::TempPath>,
    written: u64,
}

impl Write for BlobOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// An archive entry's header as kiln writes every one (the same bytes the
/// tar crate would write: every name here is at most `blobs/sha256/<64
/// hex>`, 77 bytes, a plain ustar name): mode 0644, mtime 0, owner root.
fn entry_header(name: &str, len: u64) -> anyhow::Result<tar::Header> {
    let mut h = tar::Header::new_ustar();
    h.set_size(len);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_path(name)?;
    h.set_cksum();
    Ok(h)
}

/// Zeros that end an entry of `len` bytes on a 512-byte block.
fn padding(len: u64) -> &'static [u8] {
    &[0u8; 512][..((512 - len % 512) % 512) as usize]
}

fn blob_name(d: &Digest) -> String {
    format!("blobs/sha256/{}", d.hex())
}

impl OciLayout {
    /// Opens a layout directory kept between runs (a bundle's staging),
    /// trusting none of what is there by its name or size: the directory
    /// must be private ([`crate::primitives::owned`]), and each blob is
    /// re-hashed and removed unless it is a regular file of the user's
    /// whose bytes are its name. Returns the layout and how many blobs
    /// were kept.
    pub fn reopen_verified(dir: &Path) -> anyhow::Result<(OciLayout, usize)> {
        let layout = OciLayout::open_with(dir, "remove it, and kiln starts afresh")?;
        if layout.dir.created() {
            return Ok((layout, 0));
        }
        let mut kept = 0;
        for name in layout.blobs.names()? {
            let name = name.to_string_lossy().into_owned();
            let good = layout
                .blobs
                .metadata(&name)
                .is_ok_and(|m| m.is_file() && crate::primitives::owned::is_mine(&m))
                && Digest::parse(&format!("sha256:{name}")).is_ok_and(|d| {
                    layout
                        .blobs
                        .open_file(&name)
                        .and_then(|f| {
                            crate::primitives::digest::hash_read(
                                f,
                                <sha2::Sha256 as sha2::Digest>::new(),
                            )
                        })
                        .is_ok_and(|h| Digest::from_hasher(h) == d)
                });
            if good {
                kept += 1;
            } else {
                let shown = layout.blobs.shown().join(&name);
                tracing::warn!("{}: not what its name says; removed", shown.display());
                layout
                    .blobs
                    .remove_file(&name)
                    .with_context(|| format!("removing {}", shown.display()))?;
            }
        }
        Ok((layout, kept))
    }

    /// Opens (or starts) a layout directory kiln owns; blobs already there
    /// are kept.
    pub fn open(dir: &Path) -> anyhow::Result<OciLayout> {
        OciLayout::open_with(dir, "give kiln a directory of its own")
    }

    fn open_with(dir: &Path, fix: &str) -> anyhow::Result<OciLayout> {
        let dir = OwnedDir::open(dir, fix)?;
        let blobs = dir.sub("blobs", fix)?.sub("sha256", fix)?;
        crate::primitives::atomic::write(
            &dir.path().join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .with_context(|| format!("writing {}", dir.shown().join("oci-layout").display()))?;
        Ok(OciLayout {
            dir,
            blobs,
            records: Mutex::new(BTreeMap::new()),
            draft: Mutex::new(None),
        })
    }

    /// Removes the layout's directory (through its handle; module
    /// `primitives::owned`).
    pub fn remove(self) -> std::io::Result<()> {
        let OciLayout { dir, blobs, .. } = self;
        drop(blobs);
        dir.remove_all()
    }

    /// Begins the archive `out` (`pack(out, ..)` finishes it): blobs
    /// written with [`OciLayout::new_blob`] from here on go straight into it.
    pub fn archive_to(&self, out: &Path) -> anyhow::Result<()> {
        let tmp = crate::primitives::atomic::temp_beside(out)
            .with_context(|| format!("creating a temporary file beside {}", out.display()))?;
        let (file, temp) = tmp.into_parts();
        *self.draft.lock().unwrap() = Some(Draft {
            out: out.to_path_buf(),
            at: temp.to_path_buf(),
            temp: Some(temp),
            file: Some(file),
            end: 0,
            blobs: BTreeMap::new(),
            packed: false,
        });
        Ok(())
    }

    /// A new blob whose digest is known only once it is written (kiln's
    /// own layer): into the archive begun, else into a temporary file here.
    pub fn new_blob(&self) -> anyhow::Result<BlobOut> {
        let mut draft = self.draft.lock().unwrap();
        if let Some(d) = draft.as_mut().filter(|d| !d.packed) {
            let mut file = d
                .file
                .take()
                .ok_or_else(|| anyhow!("a blob is already being written into the archive"))?;
            // Its header is written once its name and size are known.
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(d.end + 512))?;
            return Ok(BlobOut {
                file,
                entry: Some(d.end),
                temp: None,
                written: 0,
            });
        }
        let temp = tempfile::NamedTempFile::new_in(self.blobs_dir())?;
        let (file, temp) = temp.into_parts();
        Ok(BlobOut {
            file,
            entry: None,
            temp: Some(temp),
            written: 0,
        })
    }

    /// Names a blob from [`OciLayout::new_blob`] by its digest, whose bytes
    /// the caller hashed as they were written.
    pub fn commit_blob(&self, mut out: BlobOut, digest: &Digest, size: u64) -> anyhow::Result<()> {
        out.flush()?;
        if out.written != size {
            bail!("{digest}: {} bytes written, {size} expected", out.written);
        }
        if let Some(temp) = out.temp.take() {
            temp.persist(self.blob_path(digest))
                .map_err(|e| anyhow!("storing {digest}: {e}"))?;
            return Ok(());
        }
        let start = out.entry.expect("a blob is in a draft or a temporary file");
        let mut file = out.file;
        let mut draft = self.draft.lock().unwrap();
        let d = draft
            .as_mut()
            .ok_or_else(|| anyhow!("the archive was dropped while {digest} was written"))?;
        if d.blobs.contains_key(digest) {
            // The same bytes again (one layer in two platforms): the copy
            // past the end is overwritten by the next entry or cut by pack.
            d.file = Some(file);
            return Ok(());
        }
        drop(draft);
        file.write_all(padding(size))?;
        std::os::unix::fs::FileExt::write_all_at(
            &file,
            entry_header(&blob_name(digest), size)?.as_bytes(),
            start,
        )?;
        let mut draft = self.draft.lock().unwrap();
        let d = draft
            .as_mut()
            .ok_or_else(|| anyhow!("the archive was dropped while {digest} was written"))?;
        d.blobs.insert(digest.clone(), (start + 512, size));
        d.end = start + 512 + size + padding(size).len() as u64;
        d.file = Some(file);
        Ok(())
    }

    /// Where a blob already in the archive lies: its file, offset, length.
    fn in_archive(&self, d: &Digest) -> Option<(PathBuf, u64, u64)> {
        let draft = self.draft.lock().unwrap();
        let dr = draft.as_ref()?;
        dr.blobs.get(d).map(|(o, n)| (dr.at.clone(), *o, *n))
    }

    /// A committed blob's bytes as a reader, wherever they lie (its file,
    /// or its span of the archive begun).
    pub fn open_blob(&self, d: &Digest) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        use std::io::{Read, Seek};
        match self.in_archive(d) {
            Some((at, offset, len)) => {
                let mut f = std::fs::File::open(at)?;
                f.seek(std::io::SeekFrom::Start(offset))?;
                Ok(Box::new(f.take(len)))
            }
            None => Ok(Box::new(std::fs::File::open(self.blob_path(d))?)),
        }
    }

    /// A document's bytes: a blob over [`crate::primitives::oci::MAX_DOCUMENT_BYTES`]
    /// is refused by its size before it is read (a reused staging
    /// directory is not trusted to hold what its names say).
    fn read_blob(&self, d: &Digest) -> std::io::Result<Vec<u8>> {
        let too_large = |len: u64| {
            crate::primitives::oci::check_document_size(d, len)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.0))
        };
        match self.in_archive(d) {
            Some((at, offset, len)) => {
                too_large(len)?;
                let mut buf = vec![0u8; len as usize];
                std::os::unix::fs::FileExt::read_exact_at(
                    &std::fs::File::open(at)?,
                    &mut buf,
                    offset,
                )?;
                Ok(buf)
            }
            None => {
                let f = std::fs::File::open(self.blob_path(d))?;
                too_large(f.metadata()?.len())?;
                let mut buf = Vec::new();
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(&f, crate::primitives::oci::MAX_DOCUMENT_BYTES + 1),
                    &mut buf,
                )?;
                too_large(buf.len() as u64)?;
                Ok(buf)
            }
        }
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
        self.blobs.path()
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.blobs.path().join(d.hex())
    }

    /// Writes `index.json`: one entry per tagged record, sorted by name.
    pub fn write_index(&self) -> anyhow::Result<()> {
        let records = self.records.lock().unwrap();
        let mut manifests = Vec::new();
        // Every image by its tag; an image asked for by digest alone
        // (`repo@sha256:...`) by that digest name, so it is not lost.
        let repo = |n: &str| match n.split_once('@') {
            Some((repo, _)) => repo.to_string(),
            None => crate::primitives::reference::ImageRef::parse(n)
                .map(|r| r.name())
                .unwrap_or_default(),
        };
        let tagged: std::collections::BTreeSet<(String, &Digest)> = records
            .iter()
            .filter(|(n, _)| !n.contains('@'))
            .map(|(n, t)| (repo(n), &t.digest))
            .collect();
        let listed = records
            .iter()
            .filter(|(n, t)| !n.contains('@') || !tagged.contains(&(repo(n), &t.digest)));
        for (name, target) in listed {
            let mut d = target.clone();
            // Both the full reference: containerd (`ctr import`, Docker's
            // containerd store) reads its own annotation; skopeo and umoci
            // select an image by ref.name (`oci-archive:F:registry.k8s.io/
            // kube-proxy:v1.31.2`), which a bare tag would make ambiguous in
            // a bundle of several images. The grammar of ref.name (image-spec
            // annotations.md: separator ::= [-._:@+] | "--") allows `/`, `:`
            // and the `@` of a digest-only image's name.
            d.annotations
                .insert(ANNOTATION_IMAGE_NAME.to_string(), name.clone());
            d.annotations
                .insert(ANNOTATION_REF_NAME.to_string(), name.clone());
            manifests.push(d);
        }
        crate::primitives::atomic::write(
            &self.dir.path().join("index.json"),
            &crate::primitives::oci::write::index(&manifests, &BTreeMap::new(), true)?,
        )?;
        Ok(())
    }

    /// Adds a non-blob file (e.g. the node manifest) to the layout.
    pub fn add_file(&self, rel: &str, bytes: &[u8]) -> anyhow::Result<()> {
        if Path::new(rel)
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            bail!("{rel}: not a plain relative name");
        }
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("relative path has a parent"))?;
        std::fs::write(p, bytes)?;
        Ok(())
    }

    /// Packs the layout into `out` (sorted entries, zero mtimes, root owner),
    /// via a temporary file so `out` is never half-written. Only blobs that
    /// `index.json` reaches are packed: leftovers of an earlier run stay out.
    ///
    /// If [`OciLayout::archive_to`] began `out`, the blobs already in it
    /// come first and the rest is appended.
    pub fn pack(&self, out: &Path, extra: &[&str]) -> anyhow::Result<u64> {
        let keep = self.reachable()?;
        let mut draft = self.draft.lock().unwrap();
        match draft.as_ref() {
            Some(d) if !d.packed && d.out != out => bail!(
                "{} was begun as the archive, not {}",
                d.out.display(),
                out.display()
            ),
            Some(d) if d.packed && !d.blobs.is_empty() => bail!(
                "{} holds blobs this layout does not: pack it once",
                d.out.display()
            ),
            Some(d) if !d.packed => {}
            _ => {
                // None begun: begin it, with nothing in it yet.
                drop(draft);
                self.archive_to(out)?;
                draft = self.draft.lock().unwrap();
            }
        }
        let d = draft.as_mut().expect("begun above");
        let file = d
            .file
            .take()
            .ok_or_else(|| anyhow!("a blob is still being written into {}", out.display()))?;
        let size = self.pack_into(file, d, extra, &keep)?;
        let temp = d
            .temp
            .take()
            .expect("an unpacked draft has its temporary file");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&temp)?;
        crate::primitives::atomic::persist(tempfile::NamedTempFile::from_parts(file, temp), out)
            .with_context(|| format!("writing {}", out.display()))?;
        d.at = out.to_path_buf();
        d.packed = true;
        Ok(size)
    }

    /// Appends every entry not yet in the draft and syncs it.
    fn pack_into(
        &self,
        mut file: std::fs::File,
        draft: &Draft,
        extra: &[&str],
        keep: &std::collections::BTreeSet<Digest>,
    ) -> anyhow::Result<u64> {
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(draft.end))?;
        file.set_len(draft.end)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        let mut add = |name: &str, path: &Path| -> anyhow::Result<()> {
            crate::primitives::interrupt::check()?;
            let mut f = std::fs::File::open(path)?;
            let len = f.metadata()?.len();
            w.write_all(entry_header(name, len)?.as_bytes())?;
            // File to file, `io::copy` is `copy_file_range`: the bytes move
            // in the kernel (tar's own copy goes through an 8 KiB buffer, a
            // system call pair per 8 KiB).
            let copied = std::io::copy(&mut f, &mut w)?;
            if copied != len {
                bail!("{} changed while it was packed", path.display());
            }
            w.write_all(padding(len))?;
            Ok(())
        };
        let dir = self.dir.path();
        add("oci-layout", &dir.join("oci-layout"))?;
        add("index.json", &dir.join("index.json"))?;
        for name in extra {
            add(name, &dir.join(name))?;
        }
        for d in keep.iter().filter(|d| !draft.blobs.contains_key(d)) {
            add(&blob_name(d), &self.blob_path(d))?;
        }
        // The end of the archive: two zero blocks, as tar writes.
        w.write_all(&[0u8; 1024])?;
        w.flush()?;
        let f = w.into_inner().map_err(|e| anyhow!("{e}"))?;
        f.sync_all()?;
        Ok(f.metadata()?.len())
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
            if self.in_archive(&d).is_some() {
                out.insert(d); // kiln's own layer, already in the archive
                continue;
            }
            let path = self.blob_path(&d);
            if !path.exists() || !out.insert(d.clone()) {
                continue;
            }
            if std::fs::metadata(&path)?.len() > crate::primitives::oci::MAX_DOCUMENT_BYTES {
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
        let bytes = Bytes::from(self.read_blob(&rec.digest)?);
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
        Ok(Bytes::from(self.read_blob(&desc.digest).with_context(
            || format!("{} is not in the layout", desc.digest),
        )?))
    }

    async fn blob(
        &self,
        _image: &crate::primitives::reference::ImageRef,
        desc: &Descriptor,
    ) -> anyhow::Result<BlobStream> {
        let (path, offset, len) = self
            .in_archive(&desc.digest)
            .unwrap_or_else(|| (self.blob_path(&desc.digest), 0, desc.size));
        let mut f = tokio::fs::File::open(&path)
            .await
            .with_context(|| format!("{} is not in the layout", desc.digest))?;
        tokio::io::AsyncSeekExt::seek(&mut f, std::io::SeekFrom::Start(offset)).await?;
        let f = tokio::io::AsyncReadExt::take(f, len);
        Ok(Box::pin(
            tokio_util::io::ReaderStream::with_capacity(f, 256 << 10).map_err(anyhow::Error::from),
        ))
    }

    fn describe(&self, _image: &crate::primitives::reference::ImageRef) -> String {
        format!("layout {}", self.dir.shown().display())
    }
}

impl Sink for OciLayout {
    async fn has(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        if let Some((_, _, len)) = self.in_archive(&desc.digest) {
            return Ok(len == desc.size);
        }
        Ok(std::fs::metadata(self.blob_path(&desc.digest)).is_ok_and(|m| m.len() == desc.size))
    }

    async fn put_stream(&self, desc: &Descriptor, mut data: BlobStream) -> anyhow::Result<u64> {
        let dest = self.blob_path(&desc.digest);
        let tmp = tempfile::NamedTempFile::new_in(self.blobs.path())?;
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
    async fn put_file(
        &self,
        desc: &Descriptor,
        path: &crate::sink::cache::Kept,
    ) -> anyhow::Result<u64> {
        let dest = self.blob_path(&desc.digest);
        let tmp = tempfile::Builder::new()
            .make_in(self.blobs.path(), |p| {
                crate::sink::cache::place(path, p, crate::sink::cache::Share::Link).map(|_| ())
            })
            .with_context(|| format!("storing {}", desc.digest))?;
        tmp.persist(&dest)
            .map_err(|e| anyhow!("storing {}: {e}", desc.digest))?;
        Ok(0)
    }

    async fn read(&self, digest: &Digest) -> anyhow::Result<Option<Bytes>> {
        match self.read_blob(digest) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Sink;

    /// Issue 39.3: a "small" read of a stored blob is refused by its size
    /// before it is read whole (a reused or hostile directory may hold
    /// gigabytes under a digest a document names).
    #[tokio::test]
    async fn a_document_read_refuses_a_blob_over_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let layout = OciLayout::open(dir.path()).unwrap();
        let big = vec![b' '; crate::primitives::oci::MAX_DOCUMENT_BYTES as usize + 1];
        let d = Digest::of(&big);
        std::fs::create_dir_all(layout.blobs_dir()).unwrap();
        std::fs::write(layout.blob_path(&d), &big).unwrap();
        let e = layout.read(&d).await.unwrap_err();
        assert!(
            format!("{e:#}").contains("where a manifest or config was expected"),
            "{e:#}"
        );
        let small = b"{}".to_vec();
        let s = Digest::of(&small);
        std::fs::write(layout.blob_path(&s), &small).unwrap();
        assert_eq!(layout.read(&s).await.unwrap().unwrap(), &small[..]);
    }

    /// Issue 39.4: a staging directory kept from a failed run is reused
    /// only for blobs whose bytes are their names (it was trusted by size).
    #[tokio::test]
    async fn a_reused_staging_keeps_only_blobs_that_hash_to_their_names() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("b.tar.kiln-staging");
        let (layout, kept) = OciLayout::reopen_verified(&staging).unwrap();
        assert_eq!(kept, 0);
        let mode = std::fs::metadata(&staging).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let good = b"good".to_vec();
        let g = Digest::of(&good);
        std::fs::write(layout.blob_path(&g), &good).unwrap();
        // Same size, other bytes, under a name: what `has` trusted.
        let planted = Digest::of(b"real");
        std::fs::write(layout.blob_path(&planted), b"fake").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", layout.blobs_dir().join("x")).unwrap();
        drop(layout);
        let (layout, kept) = OciLayout::reopen_verified(&staging).unwrap();
        assert_eq!(kept, 1);
        let desc = |d: &Digest| Descriptor::new("application/octet-stream", d.clone(), 4);
        assert!(layout.has(&desc(&g)).await.unwrap());
        assert!(!layout.has(&desc(&planted)).await.unwrap());
        assert!(std::fs::symlink_metadata(layout.blobs_dir().join("x")).is_err());
        // A staging others can write is refused in one line.
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o777)).unwrap();
        let Err(e) = OciLayout::reopen_verified(&staging) else {
            panic!("a staging others can write was reused");
        };
        let e = format!("{e:#}");
        assert!(e.contains("writable by others"), "{e}");
    }
}
