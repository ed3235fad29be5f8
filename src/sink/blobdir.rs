//! The backing directory of a local containerd content store
//! (`io.containerd.content.v1.content`), written directly: a verified blob
//! is streamed to a temporary file beside `blobs/`, synced, and renamed to
//! `blobs/sha256/<hex>` read-only, as containerd leaves its blobs. Its
//! record is then committed through containerd without the bytes (the
//! shared content policy finds the blob present), so data crosses no socket
//! and is hashed once. Only for a store whose daemon kiln runs with GC on
//! request ([`crate::adapters::daemon`]): nothing collects a blob between its rename
//! and its record.
//!
//! Why a fsync per blob: it runs on a blocking thread while other blobs
//! still stream, so the writeback overlaps the transfers. One `syncfs` of
//! the store's filesystem before each image record was tried and measured
//! slower (`make bench` (a): 1.46 s with per-blob fsync, 1.80 s with it).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};

use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::Descriptor;

/// kiln's temporary files, inside the content root (same filesystem as
/// `blobs/`, so the rename is atomic); removed when the store closes.
const INGEST: &str = ".kiln-ingest";

/// A blob file's identity as the kernel gave it: device, inode, size and
/// change time. Unpacking or copying a file sets a new ctime, and no image
/// can choose one, so a stamp kiln recorded after hashing a file proves its
/// bytes until the file changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
        }
    }
}

/// digest -> the stamp of its file when kiln last proved its bytes.
pub type Proven = std::collections::BTreeMap<String, Stamp>;

#[derive(Debug, Clone)]
pub struct BlobDir {
    root: PathBuf,
    proven: std::sync::Arc<std::sync::Mutex<Proven>>,
    share: super::cache::Share,
    /// Blobs put here without their bytes ([`BlobDir::put_absent`]), by
    /// the stamp of their stand-in: never hashed, never taken as present
    /// once the file changes.
    absent: std::sync::Arc<std::sync::Mutex<Proven>>,
}

impl BlobDir {
    pub fn new(content_root: &Path) -> Self {
        BlobDir {
            root: content_root.to_path_buf(),
            proven: Default::default(),
            share: Default::default(),
            absent: Default::default(),
        }
    }

    /// How blobs from the cache are taken (see [`super::cache::Share`]).
    pub fn with_share(mut self, share: super::cache::Share) -> Self {
        self.share = share;
        self
    }

    /// Starts from stamps an earlier run recorded.
    pub fn with_proven(self, proven: Proven) -> Self {
        *self.proven.lock().expect("not poisoned") = proven;
        self
    }

    /// The stamps of every blob proven so far (to record for the next run).
    pub fn proven(&self) -> Proven {
        self.proven.lock().expect("not poisoned").clone()
    }

    fn note(&self, d: &Digest, m: &std::fs::Metadata) {
        self.proven
            .lock()
            .expect("not poisoned")
            .insert(d.to_string(), Stamp::of(m));
    }

    /// Whether `desc`'s file holds exactly its bytes: a store kiln did not
    /// just write is trusted by its bytes, never by its records. Proven by
    /// the stamp kiln recorded when it last hashed the file, else hashed
    /// now (and stamped). A regular file only.
    pub async fn holds(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        let target = self.blob(&desc.digest);
        let Ok(m) = std::fs::symlink_metadata(&target) else {
            return Ok(false);
        };
        let stand_in = self
            .absent
            .lock()
            .expect("not poisoned")
            .get(&desc.digest.to_string())
            .copied();
        if stand_in.is_some() {
            return Ok(stand_in == Some(Stamp::of(&m)));
        }
        let same = self.proves(desc, &target, &m).await?;
        if !same && m.is_file() && m.len() == desc.size {
            tracing::warn!(blob = %desc.digest, file = %target.display(), "the store records this blob, but its file's bytes do not hash to its name; fetching it again");
        }
        Ok(same)
    }

    /// Whether `target` (with metadata `m`) is a regular file holding
    /// exactly `desc`'s bytes: its recorded stamp, else a hash (then stamped).
    async fn proves(
        &self,
        desc: &Descriptor,
        target: &Path,
        m: &std::fs::Metadata,
    ) -> anyhow::Result<bool> {
        if !m.is_file() || m.len() != desc.size {
            return Ok(false);
        }
        let known = self
            .proven
            .lock()
            .expect("not poisoned")
            .get(&desc.digest.to_string())
            .copied();
        if known == Some(Stamp::of(m)) {
            return Ok(true);
        }
        let (t, d) = (target.to_path_buf(), desc.digest.clone());
        let same = tokio::task::spawn_blocking(move || hash_file(&t))
            .await?
            .is_ok_and(|h| h == d);
        if same {
            self.note(&desc.digest, m);
        }
        Ok(same)
    }

    fn blob(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    /// Removes kiln's temporary files (a killed run's too).
    pub fn clear(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(self.root.join(INGEST)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Puts the cache entry `src` (proven `desc`'s bytes) at its place in
    /// `blobs/`, shared as the store allows; returns the bytes written.
    pub async fn put_file(
        &self,
        desc: &Descriptor,
        src: &super::cache::Kept,
    ) -> anyhow::Result<u64> {
        let target = self.blob(&desc.digest);
        if let Ok(m) = std::fs::symlink_metadata(&target) {
            if self.proves(desc, &target, &m).await? {
                return Ok(0);
            }
        }
        let tmp = self.ingest_path(desc)?;
        let (src, t, renamed, share) = (src.clone(), tmp.clone(), target.clone(), self.share);
        let placed = tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
            let copied = super::cache::place(&src, &t, share)?;
            std::fs::rename(&t, &renamed)?;
            // The rename moved a shared inode's ctime: a lent entry's mark follows.
            super::cache::record_if_lent(&src);
            std::fs::File::open(renamed.parent().expect("has a parent"))?.sync_all()?;
            Ok(copied)
        })
        .await?;
        let copied = match placed {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e.context(format!("writing {} into the store", desc.digest)));
            }
        };
        self.note(&desc.digest, &std::fs::symlink_metadata(&target)?);
        Ok(if copied { desc.size } else { 0 })
    }

    /// Puts a stand-in for `desc` at its place in `blobs/`: a sparse file of
    /// its size and a blob's mode, so containerd records it (its shared
    /// content policy finds a file of the right size) and a layer's key
    /// (`domain::node_image::layer::content_key`: names, sizes, modes) is
    /// what the real bytes give. For a node image whose layer holding the
    /// real bytes is reused by digest: the stand-in is never read into a
    /// layer (a layer to be written gets the real bytes first).
    pub fn put_absent(&self, desc: &Descriptor) -> anyhow::Result<()> {
        let target = self.blob(&desc.digest);
        let tmp = self.ingest_path(desc)?;
        let f = std::fs::File::create(&tmp)?;
        f.set_len(desc.size)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o444))?;
        drop(f);
        std::fs::rename(&tmp, &target)?;
        self.absent.lock().expect("not poisoned").insert(
            desc.digest.to_string(),
            Stamp::of(&std::fs::symlink_metadata(&target)?),
        );
        Ok(())
    }

    /// The blobs put without their bytes.
    pub fn absent(&self) -> Vec<Digest> {
        self.absent
            .lock()
            .expect("not poisoned")
            .keys()
            .filter_map(|d| Digest::parse(d).ok())
            .collect()
    }

    /// A new temporary name for `desc` beside `blobs/`.
    fn ingest_path(&self, desc: &Descriptor) -> anyhow::Result<PathBuf> {
        let dir = self.root.join(INGEST);
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(self.blob(&desc.digest).parent().expect("has a parent"))?;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(dir.join(format!("{}-{n}-{}", std::process::id(), desc.digest.hex())))
    }

    /// Puts `desc`'s bytes at their place in `blobs/`. A file already there
    /// (a killed run's, or one a base image planted) is kept only if its
    /// bytes hash to its name; otherwise it is replaced. Returns the bytes
    /// written.
    pub async fn put(&self, desc: &Descriptor, mut data: BlobStream) -> anyhow::Result<u64> {
        let target = self.blob(&desc.digest);
        if let Ok(m) = std::fs::symlink_metadata(&target) {
            if self.proves(desc, &target, &m).await? {
                return Ok(0);
            }
            tracing::warn!(blob = %desc.digest, "replacing a stored blob whose bytes do not match its name");
        }
        let tmp = self.ingest_path(desc)?;
        let written = async {
            // Written by a task of its own: a slow disk stalls this blob,
            // not every transfer the runtime polls.
            let mut f =
                crate::primitives::write_behind::FileBehind::new(std::fs::File::create(&tmp)?);
            let mut size: u64 = 0;
            let mut first = true;
            // The stream ends with an error if the bytes are not `desc`'s.
            while let Some(chunk) = data.next().await {
                let chunk = chunk?;
                size += chunk.len() as u64;
                if size > desc.size {
                    bail!("{}: more than its {} bytes", desc.digest, desc.size);
                }
                f.write(chunk).await?;
                if first {
                    first = false;
                    crate::primitives::fault::point("mid-blob");
                }
            }
            if size != desc.size {
                bail!("{}: {size} bytes, expected {}", desc.digest, desc.size);
            }
            let f = f.finish().await?;
            let (tmp, renamed) = (tmp.clone(), target.clone());
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                let target = renamed;
                f.sync_all()?;
                f.set_permissions(std::fs::Permissions::from_mode(0o444))?;
                drop(f);
                std::fs::rename(&tmp, &target)?;
                std::fs::File::open(target.parent().expect("has a parent"))?.sync_all()?;
                Ok(())
            })
            .await??;
            // Hashed while it streamed: its stamp now proves it.
            self.note(&desc.digest, &std::fs::symlink_metadata(&target)?);
            Ok(size)
        }
        .await;
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.with_context(|| format!("writing {} into the store", desc.digest))
    }
}

/// A file's sha256, streamed.
pub fn hash_file(path: &Path) -> std::io::Result<Digest> {
    let f = std::fs::File::open(path)?;
    Ok(Digest::from_hasher(crate::primitives::digest::hash_read(
        f,
        Sha256::new(),
    )?))
}
