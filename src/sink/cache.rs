//! The content cache shared by builds: verified blobs kept by digest in a
//! directory (`$XDG_CACHE_HOME/kiln` by default) and linked into later
//! stores, so a second build costs only its new bytes.
//!
//! Layout: `blobs/sha256/<hex>` (blobs), `blobs/sha512/<hex>` (Kubernetes
//! release tarballs, by the SHA-512 their release publishes), `tmp/`
//! (entries being written), `lent/<hex>` (entries a rootfs shares an inode
//! with), `layers/<key>` (a node-image layer kiln compressed, by the key of
//! its content and compression: its digest, size and diff ID; the blob is
//! an ordinary entry, re-hashed before reuse), `lock` (the run lock).
//!
//! - **No half-written entry is ever visible.** An entry is written under
//!   `tmp/`, only from the copy engine's verifying stream (which fails at
//!   its end if the bytes are not the digest's), synced, made read-only and
//!   renamed into `blobs/` in one step.
//! - **A cached blob is trusted by a cheap check, not a re-hash.** At its
//!   rename kiln sets an entry's mtime to [`MARK`]; an entry is used only
//!   while it is a regular file of the right size, without write bits, and
//!   with that mtime. Any write to it (through any hard link, a store's
//!   included) sets its mtime to the write's time, so a changed entry is
//!   seen and written again. ctime cannot serve: linking an entry into a
//!   store changes it. A process that rewrites an entry and then sets its
//!   mtime back is one running as the user (or root), which kiln does not
//!   defend against; bit rot is not caught short of a re-hash, which
//!   `kiln cache ls --check` does.
//! - **An entry lent to a rootfs is re-hashed before it is used.** A
//!   user's rootfs may be booted, and its root could write through an
//!   inode it shares with the cache (and set the mtime back). So a rootfs
//!   gets a copy-on-write clone where the filesystem makes one; where it
//!   cannot (ext4), a hard link, and the entry is marked lent
//!   (`lent/<hex>`, in the cache, which the rootfs cannot reach): a lent
//!   entry is used only after its bytes hash to its name, once per run,
//!   and the mark goes once no rootfs shares the inode any more. So a cold
//!   build writes each byte once, and a warm one none; only across
//!   filesystems is a blob copied.
//! - **Only a cache no one else can write is used.** The cheap check
//!   proves an entry unchanged since kiln sealed it, not who sealed it: a
//!   user who can write the directory (a `~/.cache` shared under sudo, a
//!   shared `--cache-dir`) could plant a file with the right size, mode
//!   and mtime. So the cache's directories must belong to the user kiln
//!   runs as and be writable by no group or other user (kiln makes them
//!   0700), and each entry must belong to that user; otherwise the cache
//!   is refused in one line ([`Cache::open`]) or the entry ignored.
//! - **Several kilns share it.** A run holds a shared `flock` on `lock` for
//!   as long as it may link entries; pruning takes it exclusively, so it
//!   never removes an entry a run is about to link. Two runs writing one
//!   digest each write their own temporary file; the second rename puts
//!   identical bytes in place.
//! - **Least recently used goes first.** Using an entry sets its atime
//!   explicitly (mount options such as `relatime` do not hold it back);
//!   pruning removes the oldest atimes first.

use std::fs::{File, FileTimes};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Serialize;

use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::Descriptor;

/// The mtime kiln gives an entry once its bytes are proven: 1 s and
/// 802,071,150 ns after the epoch ("kiln" in ASCII, modulo 10^9 ns). No
/// write can leave it behind.
const MARK: Duration = Duration::new(1, 802_071_150);

/// The cap every run keeps the cache under as it ends ([`Cache::close`]:
/// the least recently used go first), unless another kiln is still using
/// it; `kiln cache prune --max-size` applies another cap once.
pub const DEFAULT_MAX_BYTES: u64 = 20 << 30;

/// The cache directory a run uses when not told: `$XDG_CACHE_HOME/kiln`,
/// else `$HOME/.cache/kiln` (the XDG base-directory rule).
pub fn default_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME").filter(|v| Path::new(v).is_absolute());
    xdg.map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("kiln"))
}

/// An open cache. Clones share one run lock, released when the last drops.
#[derive(Clone)]
pub struct Cache {
    root: PathBuf,
    lock: Arc<File>,
    /// Lent entries re-hashed in this run (module doc).
    checked: Arc<std::sync::Mutex<std::collections::HashSet<Digest>>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cache({})", self.root.display())
    }
}

/// One entry as `kiln cache ls` reports it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub digest: String,
    pub size: u64,
    /// Seconds since the epoch of its last use.
    pub last_used: i64,
    /// Whether it passes the cheap check (and, when asked, the re-hash).
    pub intact: bool,
}

/// What the cache holds.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub dir: PathBuf,
    pub entries: Vec<Entry>,
    pub total_bytes: u64,
}

/// What a prune removed and kept.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pruned {
    pub dir: PathBuf,
    pub max_bytes: u64,
    pub removed: usize,
    pub removed_bytes: u64,
    pub kept: usize,
    pub kept_bytes: u64,
}

impl Cache {
    /// Opens (creating) the cache at `dir` and takes the shared run lock.
    pub fn open(dir: &Path) -> anyhow::Result<Cache> {
        let cache = Cache::open_unlocked(dir)?;
        rustix::fs::flock(&*cache.lock, rustix::fs::FlockOperation::LockShared)
            .with_context(|| format!("locking the cache at {}", dir.display()))?;
        Ok(cache)
    }

    fn open_unlocked(dir: &Path) -> anyhow::Result<Cache> {
        for sub in ["blobs/sha256", "blobs/sha512", "tmp", "lent", "layers"] {
            crate::primitives::owned::create(&dir.join(sub))
                .with_context(|| format!("creating the cache at {}", dir.display()))?;
        }
        check_private(dir)?;
        let lock = File::options()
            .create(true)
            .append(true)
            .open(dir.join("lock"))
            .with_context(|| format!("opening {}", dir.join("lock").display()))?;
        Ok(Cache {
            root: dir.to_path_buf(),
            lock: Arc::new(lock),
            checked: Arc::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.root
    }

    fn entry(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    /// The path of `desc`'s entry if the cache holds it intact (the cheap
    /// check above; a lent entry re-hashed, once per run); marks it used.
    pub fn get(&self, desc: &Descriptor) -> Option<PathBuf> {
        let path = self.entry(&desc.digest);
        let m = std::fs::symlink_metadata(&path).ok()?;
        if !intact(&m, Some(desc.size)) {
            return None;
        }
        let mark = self.root.join("lent").join(desc.digest.hex());
        if mark.exists() && !self.checked.lock().unwrap().contains(&desc.digest) {
            // Up to a layer's worth of reading, called from the engine's
            // async copy: off the runtime, as every long read is.
            let same = crate::primitives::blocking::off_runtime(|| rehash(&path, "sha256"))
                .is_ok_and(|h| h == desc.digest.hex());
            if !same {
                tracing::warn!(blob = %desc.digest, "a cache entry lent to a rootfs was changed there; fetching it again");
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(&mark);
                return None;
            }
            self.checked.lock().unwrap().insert(desc.digest.clone());
            // No rootfs shares it any more: the cheap check holds again.
            if m.nlink() == 1 {
                let _ = std::fs::remove_file(&mark);
            }
        }
        touch(&path);
        Some(path)
    }

    /// A small entry's bytes (a manifest, a config), hashed as read.
    pub fn read(&self, digest: &Digest) -> Option<Bytes> {
        let path = self.entry(digest);
        let m = std::fs::symlink_metadata(&path).ok()?;
        if !intact(&m, None) || m.len() > crate::primitives::oci::MAX_DOCUMENT_BYTES {
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        (Digest::of(&bytes) == *digest).then(|| {
            touch(&path);
            Bytes::from(bytes)
        })
    }

    /// Writes `desc`'s entry from a verifying stream; returns its path. The
    /// entry appears only if the stream ended without error.
    pub async fn put_stream(
        &self,
        desc: &Descriptor,
        mut data: BlobStream,
    ) -> anyhow::Result<PathBuf> {
        let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .with_context(|| format!("writing into the cache at {}", self.root.display()))?;
        // Written by a task of its own, as the store's blobs are.
        let mut f = crate::primitives::write_behind::FileBehind::new(tmp.reopen()?);
        let mut size = 0u64;
        while let Some(chunk) = data.next().await {
            // An error (a failed verification included) drops `tmp`: nothing stays.
            let chunk = chunk?;
            let first = size == 0;
            size += chunk.len() as u64;
            if size > desc.size {
                bail!("{}: more than its {} bytes", desc.digest, desc.size);
            }
            f.write(chunk)
                .await
                .with_context(|| format!("writing into the cache at {}", self.root.display()))?;
            if first {
                crate::primitives::fault::point("mid-blob");
            }
        }
        if size != desc.size {
            bail!("{}: {size} bytes, expected {}", desc.digest, desc.size);
        }
        let f = f.finish().await?;
        let (cache, target) = (self.clone(), self.entry(&desc.digest));
        tokio::task::spawn_blocking(move || cache.seal(tmp, f, &target)).await??;
        Ok(self.entry(&desc.digest))
    }

    /// A release tarball's entry by its SHA-512 (hex), if intact; marks it used.
    pub fn get_sha512(&self, hex: &str) -> Option<PathBuf> {
        let path = self.root.join("blobs/sha512").join(hex);
        let m = std::fs::symlink_metadata(&path).ok()?;
        intact(&m, None).then(|| {
            touch(&path);
            path
        })
    }

    /// A new temporary file to download a release tarball into.
    pub fn temp_file(&self) -> anyhow::Result<tempfile::NamedTempFile> {
        tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .with_context(|| format!("writing into the cache at {}", self.root.display()))
    }

    /// Keeps a downloaded file whose SHA-512 the caller checked; returns
    /// its entry.
    pub fn keep_sha512(&self, tmp: tempfile::NamedTempFile, hex: &str) -> anyhow::Result<PathBuf> {
        let target = self.root.join("blobs/sha512").join(hex);
        let f = tmp.reopen()?;
        self.seal(tmp, f, &target)?;
        Ok(target)
    }

    /// A layer kiln compressed before for the same content key: its blob's
    /// descriptor, what the caller kept with it ([`Cache::keep_layer`]'s
    /// `about`), and its entry, checked intact and re-hashed against the
    /// descriptor (so a changed entry is compressed again).
    pub fn layer(&self, key: &Digest) -> Option<(Descriptor, serde_json::Value, PathBuf)> {
        let rec = self.root.join("layers").join(key.hex());
        let m = std::fs::symlink_metadata(&rec).ok()?;
        if !intact(&m, None) || m.len() > 64 << 10 {
            return None;
        }
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&rec).ok()?).ok()?;
        let desc = Descriptor::new(
            v["mediaType"].as_str()?,
            Digest::parse(v["digest"].as_str()?).ok()?,
            v["size"].as_u64()?,
        );
        let path = self.get(&desc)?;
        let same = rehash(&path, "sha256").is_ok_and(|h| h == desc.digest.hex());
        if !same {
            tracing::warn!(layer = %desc.digest, "a cached layer does not match its digest; compressing it again");
            return None;
        }
        touch(&rec);
        Some((desc, v["about"].take(), path))
    }

    /// Keeps a layer kiln compressed: its bytes from `data` (hashed on the
    /// way in, kept only if they are `desc`'s) and, under `key`, its
    /// descriptor and `about` (what the caller needs back, e.g. its diff ID).
    pub fn keep_layer(
        &self,
        key: &Digest,
        desc: &Descriptor,
        about: serde_json::Value,
        mut data: impl std::io::Read,
    ) -> anyhow::Result<()> {
        if self.get(desc).is_none() {
            let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))?;
            let mut f = tmp.reopen()?;
            let mut h = <sha2::Sha256 as sha2::Digest>::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = data.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                sha2::Digest::update(&mut h, &buf[..n]);
                f.write_all(&buf[..n])?;
            }
            if Digest::from_hasher(h) != desc.digest {
                bail!(
                    "{}: the layer read back is not what was written",
                    desc.digest
                );
            }
            self.seal(tmp, f, &self.entry(&desc.digest))?;
        }
        let record = serde_json::json!({
            "mediaType": desc.media_type,
            "digest": desc.digest,
            "size": desc.size,
            "about": about,
        });
        self.seal_bytes(
            record.to_string().as_bytes(),
            &self.root.join("layers").join(key.hex()),
        )
    }

    /// Writes a small verified blob held in memory (a manifest, a config).
    pub fn put_bytes(&self, desc: &Descriptor, bytes: &[u8]) -> anyhow::Result<()> {
        if self.read(&desc.digest).is_some() {
            return Ok(());
        }
        self.seal_bytes(bytes, &self.entry(&desc.digest))
    }

    /// Writes `bytes` under `tmp/` and seals them at `target`.
    fn seal_bytes(&self, bytes: &[u8], target: &Path) -> anyhow::Result<()> {
        let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))?;
        let mut f = tmp.reopen()?;
        f.write_all(bytes)?;
        self.seal(tmp, f, target)
    }

    /// Syncs a written temporary file, marks it and renames it into place.
    fn seal(&self, tmp: tempfile::NamedTempFile, f: File, target: &Path) -> anyhow::Result<()> {
        f.sync_all()?;
        f.set_permissions(std::fs::Permissions::from_mode(0o444))?;
        let now = SystemTime::now();
        f.set_times(
            FileTimes::new()
                .set_modified(SystemTime::UNIX_EPOCH + MARK)
                .set_accessed(now),
        )?;
        drop(f);
        tmp.persist(target)
            .map_err(|e| anyhow!("storing {} in the cache: {}", target.display(), e.error))?;
        File::open(target.parent().expect("has a parent"))?.sync_all()?;
        Ok(())
    }

    /// Every entry, oldest use first; with `check`, each re-hashed.
    pub fn list(&self, check: bool) -> anyhow::Result<Listing> {
        let mut entries = Vec::new();
        for algo in ["sha256", "sha512"] {
            let dir = self.root.join("blobs").join(algo);
            for e in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                    continue;
                };
                let mut ok = intact(&m, None);
                if ok && check {
                    ok = rehash(&e.path(), algo).is_ok_and(|h| h == name);
                }
                entries.push(Entry {
                    digest: format!("{algo}:{name}"),
                    size: m.len(),
                    last_used: m.atime(),
                    intact: ok,
                });
            }
        }
        entries.sort_by(|a, b| (a.last_used, &a.digest).cmp(&(b.last_used, &b.digest)));
        let total_bytes = entries.iter().map(|e| e.size).sum();
        Ok(Listing {
            dir: self.root.clone(),
            entries,
            total_bytes,
        })
    }

    /// Removes entries that fail the check, then the least recently used
    /// until at most `max_bytes` stay. A cache another kiln is using is
    /// waited for (`wait`), or left as it is (`None`).
    pub fn prune(dir: &Path, max_bytes: u64, wait: bool) -> anyhow::Result<Option<Pruned>> {
        let cache = Cache::open_unlocked(dir)?;
        let op = if wait {
            rustix::fs::FlockOperation::LockExclusive
        } else {
            rustix::fs::FlockOperation::NonBlockingLockExclusive
        };
        match rustix::fs::flock(&*cache.lock, op) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => bail!("locking the cache at {}: {e}", dir.display()),
        }
        let listing = cache.list(false)?;
        // A killed run's temporary files: no run holds the lock now.
        if let Ok(rd) = std::fs::read_dir(dir.join("tmp")) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let mut total = listing.total_bytes;
        let (mut removed, mut removed_bytes) = (0, 0);
        for e in &listing.entries {
            if e.intact && total <= max_bytes {
                continue;
            }
            let (algo, hex) = e.digest.split_once(':').expect("listed as ALGO:HEX");
            let path = dir.join("blobs").join(algo).join(hex);
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            total -= e.size;
            removed += 1;
            removed_bytes += e.size;
        }
        // Marks of entries that are gone.
        if let Ok(rd) = std::fs::read_dir(dir.join("lent")) {
            for m in rd.flatten() {
                if !dir.join("blobs/sha256").join(m.file_name()).exists() {
                    let _ = std::fs::remove_file(m.path());
                }
            }
        }
        Ok(Some(Pruned {
            dir: dir.to_path_buf(),
            max_bytes,
            removed,
            removed_bytes,
            kept: listing.entries.len() - removed,
            kept_bytes: total,
        }))
    }

    /// Keeps the cache under [`DEFAULT_MAX_BYTES`] after a run, if no other
    /// kiln is using it. Consumes the run's hold on the lock.
    pub fn close(self) {
        let Cache { root, lock, .. } = self;
        if Arc::strong_count(&lock) > 1 {
            return;
        }
        drop(lock);
        match Cache::prune(&root, DEFAULT_MAX_BYTES, false) {
            Ok(Some(p)) if p.removed > 0 => tracing::info!(
                dir = %root.display(),
                removed = p.removed,
                "pruned the cache to its {} GiB cap",
                DEFAULT_MAX_BYTES >> 30
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!("pruning the cache at {}: {e:#}", root.display()),
        }
    }
}

/// How a store takes a file from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Share {
    /// A copy-on-write clone where the filesystem makes one, else a hard
    /// link with the entry marked lent (re-hashed before each run uses it:
    /// the store may be booted, and its root could write through the
    /// shared inode), else (another filesystem) a copy: for a user's rootfs.
    #[default]
    Clone,
    /// A hard link (else a clone or a copy): for kiln's own staging, which
    /// is packed and removed, never run.
    Link,
}

/// Puts the proven file `src` (a cache entry) at `tmp` (a new name) as
/// `share` says; a copy is synced and made read-only, as an entry is.
/// Returns whether bytes were written (a copy) rather than shared.
pub fn place(src: &Path, tmp: &Path, share: Share) -> std::io::Result<bool> {
    if share == Share::Link && std::fs::hard_link(src, tmp).is_ok() {
        return Ok(false);
    }
    let from = File::open(src)?;
    let mut to = File::create(tmp)?;
    let mut copied = false;
    if rustix::fs::ioctl_ficlone(&to, &from).is_err() {
        // No clone here (ext4): a rootfs gets a hard link, the entry marked
        // lent first (module doc), so nothing is written twice.
        if share == Share::Clone {
            drop(to);
            std::fs::remove_file(tmp)?;
            if lend(src).is_ok() && std::fs::hard_link(src, tmp).is_ok() {
                return Ok(false);
            }
            to = File::create(tmp)?;
        }
        // `io::copy` between files moves the bytes in the kernel
        // (copy_file_range).
        std::io::copy(&mut &from, &mut &to)?;
        copied = true;
    }
    to.sync_all()?;
    to.set_permissions(std::fs::Permissions::from_mode(0o444))?;
    Ok(copied)
}

/// Marks the entry `entry` (`ROOT/blobs/sha256/<hex>`) lent to a rootfs:
/// `ROOT/lent/<hex>`, made before the link, so no link goes unmarked.
fn lend(entry: &Path) -> std::io::Result<()> {
    let hex = entry
        .file_name()
        .ok_or_else(|| std::io::Error::other("no name"))?;
    let root = entry
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .ok_or_else(|| std::io::Error::other("not a cache entry"))?;
    let mark = File::create(root.join("lent").join(hex))?;
    mark.sync_all()
}

/// The cheap check: a read-only regular file of the expected size with
/// kiln's mark as its mtime.
/// The cache's directories belong to the user kiln runs as, and no group
/// or other user may write them (module doc: who could plant an entry).
/// The top directory may be a symlink to one that passes.
fn check_private(dir: &Path) -> anyhow::Result<()> {
    let fix = "use a --cache-dir of your own";
    for sub in ["", "blobs", "blobs/sha256", "blobs/sha512", "tmp", "lent"] {
        crate::primitives::owned::check(&dir.join(sub), sub.is_empty(), fix)?;
    }
    Ok(())
}

/// The cheap check (module doc), and the entry is the user's own.
fn intact(m: &std::fs::Metadata, size: Option<u64>) -> bool {
    m.is_file()
        && crate::primitives::owned::is_mine(m)
        && m.permissions().mode() & 0o222 == 0
        && size.is_none_or(|s| m.len() == s)
        && m.modified().ok() == Some(SystemTime::UNIX_EPOCH + MARK)
}

/// An entry's hash in hex, by the algorithm its directory names.
fn rehash(path: &Path, algo: &str) -> std::io::Result<String> {
    use sha2::Digest as _;
    let f = File::open(path)?;
    use crate::primitives::digest::hash_read;
    Ok(if algo == "sha512" {
        crate::primitives::digest::sha512_hex(f)?
    } else {
        hex::encode(hash_read(f, sha2::Sha256::new())?.finalize())
    })
}

/// Sets an entry's atime to now (its last use), its mtime left alone.
fn touch(path: &Path) {
    if let Ok(f) = File::open(path) {
        let _ = f.set_times(FileTimes::new().set_accessed(SystemTime::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(bytes: &[u8]) -> Descriptor {
        Descriptor::new(
            "application/octet-stream",
            Digest::of(bytes),
            bytes.len() as u64,
        )
    }

    fn stream(bytes: &'static [u8]) -> BlobStream {
        Box::pin(futures_util::stream::once(async move {
            Ok(Bytes::from_static(bytes))
        }))
    }

    #[tokio::test]
    async fn an_entry_is_used_until_anything_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let d = desc(b"layer bytes");
        assert!(cache.get(&d).is_none());
        let path = cache.put_stream(&d, stream(b"layer bytes")).await.unwrap();
        assert_eq!(cache.get(&d), Some(path.clone()));
        assert_eq!(std::fs::read(&path).unwrap(), b"layer bytes");
        // Someone makes it writable and rewrites it: no longer trusted.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&path, b"layer bytez").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        assert!(cache.get(&d).is_none());
        assert!(!cache.list(false).unwrap().entries[0].intact);
    }

    /// Issue 39.4: a cache another user can write is refused (it could
    /// plant an entry that passes the cheap check), and an entry another
    /// user owns is not used.
    #[tokio::test]
    async fn a_cache_others_can_write_is_refused_and_their_entries_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("c");
        let cache = Cache::open(&c).unwrap();
        for sub in ["", "blobs", "blobs/sha256", "tmp"] {
            let mode = std::fs::metadata(c.join(sub)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{sub}");
        }
        let d = desc(b"planted");
        let path = cache.put_stream(&d, stream(b"planted")).await.unwrap();
        drop(cache);
        for (sub, mode) in [("", 0o777), ("blobs/sha256", 0o770), ("tmp", 0o702)] {
            std::fs::set_permissions(c.join(sub), std::fs::Permissions::from_mode(mode)).unwrap();
            let e = format!("{:#}", Cache::open(&c).unwrap_err());
            assert!(
                e.contains("writable by others") && e.contains("chmod go-w"),
                "{e}"
            );
            std::fs::set_permissions(c.join(sub), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let cache = Cache::open(&c).unwrap();
        assert_eq!(cache.get(&d), Some(path.clone()));
        if rustix::process::geteuid().is_root() {
            // Another user's file, every other mark right: not used.
            let other = Some(rustix::fs::Uid::from_raw(4242));
            rustix::fs::chown(&path, other, None).unwrap();
            assert!(cache.get(&d).is_none());
            rustix::fs::chown(c.join("tmp"), other, None).unwrap();
            let e = format!("{:#}", Cache::open(&c).unwrap_err());
            assert!(e.contains("belongs to uid 4242"), "{e}");
        }
    }

    #[tokio::test]
    async fn a_stream_that_fails_leaves_no_entry() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let d = desc(b"whole");
        let bad: BlobStream = Box::pin(futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"who")),
            Err(anyhow!("digest mismatch")),
        ]));
        assert!(cache.put_stream(&d, bad).await.is_err());
        assert!(cache.get(&d).is_none());
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
    }

    #[tokio::test]
    async fn prune_keeps_the_most_recently_used_and_waits_for_no_run() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let (a, b) = (desc(b"aaaa"), desc(b"bbbb"));
        cache.put_stream(&a, stream(b"aaaa")).await.unwrap();
        cache.put_stream(&b, stream(b"bbbb")).await.unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        File::open(cache.entry(&a.digest))
            .unwrap()
            .set_times(FileTimes::new().set_accessed(old))
            .unwrap();
        // A run holds the cache: a prune that does not wait leaves it.
        assert!(Cache::prune(dir.path(), 4, false).unwrap().is_none());
        drop(cache);
        let p = Cache::prune(dir.path(), 4, false).unwrap().unwrap();
        assert_eq!((p.removed, p.kept, p.kept_bytes), (1, 1, 4));
        let cache = Cache::open(dir.path()).unwrap();
        assert!(cache.get(&a).is_none());
        assert!(cache.get(&b).is_some());
    }
}
