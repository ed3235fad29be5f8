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

mod ends;
mod pack;
use pack::{entry_header, padding};
#[cfg(test)]
mod tests;

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
}
