//! The content cache shared by builds: verified blobs kept by digest in a
//! directory (`$XDG_CACHE_HOME/kiln` by default) and linked into later
//! stores, so a second build costs only its new bytes.
//!
//! Layout: `blobs/sha256/<hex>` (blobs), `blobs/sha512/<hex>` (Kubernetes
//! release tarballs, by the SHA-512 their release publishes), `tmp/`
//! (entries being written), `lent/<hex>` (entries a rootfs shares an inode
//! with), `layers/<key>` (a node-image layer kiln compressed, by the key of
//! its content and compression: its digest, size and diff ID; the blob is
//! an ordinary entry, re-hashed before reuse), `lock` (the run lock),
//! `CACHEDIR.TAG` (kiln's marker, in the Cache Directory Tagging format
//! backup tools skip).
//!
//! - **Opened once, through handles.** The directory and each of its
//!   subdirectories are [`OwnedDir`]s: opened once, checked through the
//!   handle, used through it (`primitives::owned`). A directory that holds
//!   anything but kiln's marker and kiln's own names is not a cache and is
//!   refused, so a mistaken `--cache-dir` (an OCI layout, a content store)
//!   loses nothing to a prune.
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
//!   unless its inode is unchanged (ino, size, ctime) since kiln recorded it
//!   in the mark right after its own last link, rename or use
//!   (`lending::lent_state`; docs/cache.md says why ctime suffices), and
//!   the mark goes once no rootfs shares the inode any more (dropped
//!   only by a prune, under the exclusive lock: a concurrent run may be
//!   lending the same entry). Two rootfses built warm on one filesystem
//!   share those inodes with each other too, not only with the cache. So a cold
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
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
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
use crate::primitives::owned::OwnedDir;

/// The way out of every refusal of a cache directory.
const FIX: &str = "use a --cache-dir of your own";

/// kiln's marker: the tag of the Cache Directory Tagging Specification
/// (its first line fixed by that spec), then a line naming kiln.
const TAG: &str = "CACHEDIR.TAG";
const TAG_TEXT: &str = "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by kiln (https://github.com/kiln).\n";
/// What a cache kiln made holds (an untagged one, from before the tag).
const OWN_NAMES: &[&str] = &["blobs", "tmp", "lent", "layers", "lock", TAG];

mod dirs;
mod lending;
mod prune;
#[cfg(test)]
mod tests;

pub use dirs::check;
use dirs::Dirs;
pub use lending::{place, record_if_lent, Share};
pub use prune::{Entry, Listing, Pruned};

/// A cache entry in use: its path leads through the cache's handle, so
/// it is valid while this lives (it keeps the handle open).
#[derive(Debug, Clone)]
pub struct Kept {
    path: PathBuf,
    algo: &'static str,
    hex: String,
    dirs: Arc<Dirs>,
}

impl std::ops::Deref for Kept {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl PartialEq for Kept {
    fn eq(&self, other: &Kept) -> bool {
        self.shown() == other.shown()
    }
}

impl AsRef<Path> for Kept {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Kept {
    fn new(dirs: &Arc<Dirs>, algo: &'static str, hex: &str) -> Kept {
        Kept {
            path: dirs.algo(algo).path().join(hex),
            algo,
            hex: hex.to_string(),
            dirs: dirs.clone(),
        }
    }

    /// Where the entry is, for messages.
    pub fn shown(&self) -> PathBuf {
        self.dirs.algo(self.algo).shown().join(&self.hex)
    }
}

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
    dirs: Arc<Dirs>,
    lock: Arc<File>,
    /// Lent entries re-hashed in this run (module doc).
    checked: Arc<std::sync::Mutex<std::collections::HashSet<Digest>>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cache({})", self.dir().display())
    }
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
        let dirs = Dirs::open(dir)?;
        let lock = File::options()
            .create(true)
            .append(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(dirs.top.path().join("lock"))
            .with_context(|| format!("opening {}", dirs.top.shown().join("lock").display()))?;
        Ok(Cache {
            dirs: Arc::new(dirs),
            lock: Arc::new(lock),
            checked: Arc::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        self.dirs.top.shown()
    }

    fn entry(&self, d: &Digest) -> Kept {
        Kept::new(&self.dirs, "sha256", d.hex())
    }

    /// The path of `desc`'s entry if the cache holds it intact (the cheap
    /// check above; a lent entry re-hashed, once per run); marks it used.
    pub fn get(&self, desc: &Descriptor) -> Option<Kept> {
        let hex = desc.digest.hex();
        let m = self.dirs.sha256.metadata(hex).ok()?;
        if !intact(&m, Some(desc.size)) {
            return None;
        }
        let lent = self.dirs.lent.metadata(hex).is_ok();
        // A lent entry whose inode has not changed since kiln last linked
        // or verified it needs no re-hash (`lending::lent_state`).
        let unchanged = || {
            self.dirs
                .lent
                .open_file(hex)
                .and_then(std::io::read_to_string)
                .is_ok_and(|s| s == lending::lent_state(&m))
        };
        if lent && !self.checked.lock().unwrap().contains(&desc.digest) && !unchanged() {
            tracing::debug!(blob = %desc.digest, "re-hashing a lent cache entry: its inode changed since kiln linked it");
            // Up to a layer's worth of reading, called from the engine's
            // async copy: off the runtime, as every long read is. The mark
            // stays: only a prune drops marks (module doc).
            let same = crate::primitives::blocking::off_runtime(|| self.rehash("sha256", hex))
                .is_ok_and(|h| h == hex);
            if !same {
                tracing::warn!(blob = %desc.digest, "a cache entry lent to a rootfs was changed there; fetching it again");
                let _ = self.dirs.sha256.remove_file(hex);
                return None;
            }
            self.checked.lock().unwrap().insert(desc.digest.clone());
        }
        // Marking it used sets its atime, which moves its ctime: a lent
        // entry's mark follows (it was verified just above).
        self.touch("sha256", hex);
        let entry = self.entry(&desc.digest);
        if lent {
            lending::record_if_lent(&entry);
        }
        Some(entry)
    }

    /// A small entry's bytes (a manifest, a config), hashed as read.
    pub fn read(&self, digest: &Digest) -> Option<Bytes> {
        let f = self.dirs.sha256.open_file(digest.hex()).ok()?;
        let m = f.metadata().ok()?;
        if !intact(&m, None) || m.len() > crate::primitives::oci::MAX_DOCUMENT_BYTES {
            return None;
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(f, crate::primitives::oci::MAX_DOCUMENT_BYTES),
            &mut bytes,
        )
        .ok()?;
        (Digest::of(&bytes) == *digest).then(|| {
            self.touch("sha256", digest.hex());
            Bytes::from(bytes)
        })
    }

    /// Writes `desc`'s entry from a verifying stream; returns its path. The
    /// entry appears only if the stream ended without error.
    pub async fn put_stream(
        &self,
        desc: &Descriptor,
        mut data: BlobStream,
    ) -> anyhow::Result<Kept> {
        let tmp = self.temp_file()?;
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
                .with_context(|| format!("writing into the cache at {}", self.dir().display()))?;
            if first {
                crate::primitives::fault::point("mid-blob");
            }
        }
        if size != desc.size {
            bail!("{}: {size} bytes, expected {}", desc.digest, desc.size);
        }
        let f = f.finish().await?;
        let (cache, hex) = (self.clone(), desc.digest.hex().to_string());
        tokio::task::spawn_blocking(move || cache.seal(tmp, f, "sha256", &hex)).await??;
        Ok(self.entry(&desc.digest))
    }

    /// A release tarball's entry by its SHA-512 (hex), if intact; marks it used.
    pub fn get_sha512(&self, hex: &str) -> Option<Kept> {
        if !is_hex(hex) {
            return None;
        }
        let m = self.dirs.sha512.metadata(hex).ok()?;
        intact(&m, None).then(|| {
            self.touch("sha512", hex);
            Kept::new(&self.dirs, "sha512", hex)
        })
    }

    /// A new temporary file to download a release tarball into.
    pub fn temp_file(&self) -> anyhow::Result<tempfile::NamedTempFile> {
        tempfile::NamedTempFile::new_in(self.dirs.tmp.path())
            .with_context(|| format!("writing into the cache at {}", self.dir().display()))
    }

    /// Keeps a downloaded file whose SHA-512 the caller checked; returns
    /// its entry.
    pub fn keep_sha512(&self, tmp: tempfile::NamedTempFile, hex: &str) -> anyhow::Result<Kept> {
        if !is_hex(hex) {
            bail!("{hex:?} is not a SHA-512 in hex");
        }
        let f = tmp.reopen()?;
        self.seal(tmp, f, "sha512", hex)?;
        Ok(Kept::new(&self.dirs, "sha512", hex))
    }

    /// A layer kiln compressed before for the same content key: its blob's
    /// descriptor, what the caller kept with it ([`Cache::keep_layer`]'s
    /// `about`), and its entry, checked intact and re-hashed against the
    /// descriptor (so a changed entry is compressed again).
    pub fn layer(&self, key: &Digest) -> Option<(Descriptor, serde_json::Value, Kept)> {
        let rec = self.dirs.layers.open_file(key.hex()).ok()?;
        let m = rec.metadata().ok()?;
        if !intact(&m, None) || m.len() > 64 << 10 {
            return None;
        }
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(rec, 64 << 10), &mut text).ok()?;
        let mut v: serde_json::Value = serde_json::from_slice(&text).ok()?;
        let desc = Descriptor::new(
            v["mediaType"].as_str()?,
            Digest::parse(v["digest"].as_str()?).ok()?,
            v["size"].as_u64()?,
        );
        let kept = self.get(&desc)?;
        let same = self
            .rehash("sha256", desc.digest.hex())
            .is_ok_and(|h| h == desc.digest.hex());
        if !same {
            // Replaced, not kept for every later build to find again.
            tracing::warn!(layer = %desc.digest, "a cached layer does not match its digest; compressing it again");
            let _ = self.dirs.sha256.remove_file(desc.digest.hex());
            return None;
        }
        self.touch("layers", key.hex());
        Some((desc, v["about"].take(), kept))
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
            let tmp = self.temp_file()?;
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
            self.seal(tmp, f, "sha256", desc.digest.hex())?;
        }
        let record = serde_json::json!({
            "mediaType": desc.media_type,
            "digest": desc.digest,
            "size": desc.size,
            "about": about,
        });
        self.seal_bytes(record.to_string().as_bytes(), "layers", key.hex())
    }

    /// Writes a small verified blob held in memory (a manifest, a config).
    pub fn put_bytes(&self, desc: &Descriptor, bytes: &[u8]) -> anyhow::Result<()> {
        if self.read(&desc.digest).is_some() {
            return Ok(());
        }
        self.seal_bytes(bytes, "sha256", desc.digest.hex())
    }

    /// Writes `bytes` under `tmp/` and seals them as `name` in `sub`.
    fn seal_bytes(&self, bytes: &[u8], sub: &str, name: &str) -> anyhow::Result<()> {
        let tmp = self.temp_file()?;
        let mut f = tmp.reopen()?;
        f.write_all(bytes)?;
        self.seal(tmp, f, sub, name)
    }

    /// The directory an entry of `sub` lies in.
    fn sub(&self, sub: &str) -> &OwnedDir {
        match sub {
            "layers" => &self.dirs.layers,
            algo => self.dirs.algo(algo),
        }
    }

    /// Syncs a written temporary file, marks it and renames it into place
    /// as `name` in `sub` (`sha256`, `sha512`, `layers`).
    fn seal(
        &self,
        tmp: tempfile::NamedTempFile,
        f: File,
        sub: &str,
        name: &str,
    ) -> anyhow::Result<()> {
        let dir = self.sub(sub);
        let target = dir.path().join(name);
        f.sync_all()?;
        f.set_permissions(std::fs::Permissions::from_mode(0o444))?;
        let now = SystemTime::now();
        f.set_times(
            FileTimes::new()
                .set_modified(SystemTime::UNIX_EPOCH + MARK)
                .set_accessed(now),
        )?;
        drop(f);
        tmp.persist(&target).map_err(|e| {
            anyhow!(
                "storing {} in the cache: {}",
                dir.shown().join(name).display(),
                e.error
            )
        })?;
        dir.sync()?;
        Ok(())
    }

    /// An entry's hash in hex, by the algorithm its directory names.
    fn rehash(&self, algo: &str, hex: &str) -> std::io::Result<String> {
        use sha2::Digest as _;
        let f = self.dirs.algo(algo).open_file(hex)?;
        use crate::primitives::digest::hash_read;
        Ok(if algo == "sha512" {
            crate::primitives::digest::sha512_hex(f)?
        } else {
            hex::encode(hash_read(f, sha2::Sha256::new())?.finalize())
        })
    }

    /// Sets an entry's atime to now (its last use), its mtime left alone.
    fn touch(&self, sub: &str, name: &str) {
        if let Ok(f) = self.sub(sub).open_file(name) {
            let _ = f.set_times(FileTimes::new().set_accessed(SystemTime::now()));
        }
    }
}

/// The cheap check (module doc): a regular file of the user's, mode 0444
/// exactly (what kiln seals it with: a setuid or executable bit is not
/// kiln's, and a node-image tar would copy it), of the expected size, with
/// kiln's mark as its mtime.
fn intact(m: &std::fs::Metadata, size: Option<u64>) -> bool {
    m.is_file()
        && crate::primitives::owned::is_mine(m)
        && m.permissions().mode() & 0o7777 == 0o444
        && size.is_none_or(|s| m.len() == s)
        && m.modified().ok() == Some(SystemTime::UNIX_EPOCH + MARK)
}

/// A name that can only be an entry's: hex digits, nothing else.
fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}
