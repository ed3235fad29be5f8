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
//!   and the mark goes once no rootfs shares the inode any more (dropped
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

/// The cache's directories, each open and checked once.
#[derive(Debug)]
struct Dirs {
    top: OwnedDir,
    /// Held open: `sha256` and `sha512` were opened beneath it.
    _blobs: OwnedDir,
    sha256: OwnedDir,
    sha512: OwnedDir,
    tmp: OwnedDir,
    lent: OwnedDir,
    layers: OwnedDir,
}

impl Dirs {
    /// Opens the cache at `dir`: its top checked and tagged first, then
    /// its subdirectories made and checked.
    fn open(dir: &Path) -> anyhow::Result<Dirs> {
        let top = OwnedDir::open(dir, FIX)?;
        adopt(&top)?;
        let blobs = top.sub("blobs", FIX)?;
        Ok(Dirs {
            sha256: blobs.sub("sha256", FIX)?,
            sha512: blobs.sub("sha512", FIX)?,
            tmp: top.sub("tmp", FIX)?,
            lent: top.sub("lent", FIX)?,
            layers: top.sub("layers", FIX)?,
            _blobs: blobs,
            top,
        })
    }

    fn algo(&self, algo: &str) -> &OwnedDir {
        if algo == "sha512" {
            &self.sha512
        } else {
            &self.sha256
        }
    }
}

/// A directory is a kiln cache if it carries kiln's tag; an empty one (or
/// one of kiln's from before the tag) is given it; anything else is refused.
fn adopt(top: &OwnedDir) -> anyhow::Result<()> {
    if !judge(top)? {
        return Ok(());
    }
    let mut tmp = tempfile::NamedTempFile::new_in(top.path())?;
    tmp.write_all(TAG_TEXT.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(top.path().join(TAG))
        .map_err(|e| anyhow!("tagging {}: {}", top.shown().display(), e.error))?;
    Ok(())
}

/// Whether `top` is a kiln cache that lacks only the tag (`Ok(true)`: an
/// empty directory, or one of kiln's from before the tag), is tagged
/// (`Ok(false)`), or is no kiln cache (refused).
fn judge(top: &OwnedDir) -> anyhow::Result<bool> {
    if let Ok(f) = top.open_file(TAG) {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::Read::take(f, 4096), &mut text);
        if text.contains("created by kiln") {
            return Ok(false);
        }
    }
    let names = top
        .names()
        .with_context(|| format!("reading {}", top.shown().display()))?;
    let ours = names.iter().all(|n| OWN_NAMES.iter().any(|o| n == *o));
    let was_kilns = names.iter().any(|n| n == "lock");
    if !(names.is_empty() || ours && was_kilns) {
        bail!(
            "{} is not a kiln cache (it holds files and no CACHEDIR.TAG of kiln's), so kiln will not use or prune it; {FIX} (a new or empty directory)",
            top.shown().display()
        );
    }
    Ok(true)
}

/// Judges the cache at `dir` as [`Cache::open`] would, creating, locking
/// and writing nothing (`kiln doctor`). A cache not made yet passes.
pub fn check(dir: &Path) -> anyhow::Result<()> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    let top = OwnedDir::open_existing(dir, FIX)?;
    judge(&top)?;
    if let Some(blobs) = top.sub_existing("blobs", FIX)? {
        for algo in ["sha256", "sha512"] {
            blobs.sub_existing(algo, FIX)?;
        }
    }
    for sub in ["tmp", "lent", "layers"] {
        top.sub_existing(sub, FIX)?;
    }
    Ok(())
}

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
        if lent && !self.checked.lock().unwrap().contains(&desc.digest) {
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
        self.touch("sha256", hex);
        Some(self.entry(&desc.digest))
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

    /// Every entry, oldest use first; with `check`, each re-hashed.
    pub fn list(&self, check: bool) -> anyhow::Result<Listing> {
        let mut entries = Vec::new();
        for algo in ["sha256", "sha512"] {
            let dir = self.dirs.algo(algo);
            let names = dir
                .names()
                .with_context(|| format!("reading {}", dir.shown().display()))?;
            for name in names {
                let name = name.to_string_lossy().into_owned();
                let Ok(m) = dir.metadata(&name) else {
                    continue;
                };
                let mut ok = intact(&m, None);
                if ok && check {
                    ok = self.rehash(algo, &name).is_ok_and(|h| h == name);
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
            dir: self.dir().to_path_buf(),
            entries,
            total_bytes,
        })
    }

    /// Removes entries that fail the check, then the least recently used
    /// until at most `max_bytes` stay. A cache another kiln is using is
    /// waited for (`wait`), or left as it is (`None`).
    pub fn prune(dir: &Path, max_bytes: u64, wait: bool) -> anyhow::Result<Option<Pruned>> {
        Cache::open_unlocked(dir)?.prune_open(max_bytes, wait)
    }

    /// [`Cache::prune`] through this open cache's handles (its lock, if
    /// shared, becomes exclusive).
    fn prune_open(&self, max_bytes: u64, wait: bool) -> anyhow::Result<Option<Pruned>> {
        let cache = self;
        let op = if wait {
            rustix::fs::FlockOperation::LockExclusive
        } else {
            rustix::fs::FlockOperation::NonBlockingLockExclusive
        };
        match rustix::fs::flock(&*cache.lock, op) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => bail!("locking the cache at {}: {e}", cache.dir().display()),
        }
        let listing = cache.list(false)?;
        let dirs = &cache.dirs;
        // A killed run's temporary files: no run holds the lock now.
        for name in dirs.tmp.names().unwrap_or_default() {
            let _ = dirs.tmp.remove_file(&name);
        }
        let mut total = listing.total_bytes;
        let (mut removed, mut removed_bytes) = (0, 0);
        for e in &listing.entries {
            if e.intact && total <= max_bytes {
                continue;
            }
            let (algo, hex) = e.digest.split_once(':').expect("listed as ALGO:HEX");
            dirs.algo(algo).remove_file(hex).with_context(|| {
                format!("removing {}", dirs.algo(algo).shown().join(hex).display())
            })?;
            total -= e.size;
            removed += 1;
            removed_bytes += e.size;
        }
        // Marks of entries that are gone, or that no rootfs shares any more
        // (no run holds the lock, so none is lending one now).
        for name in dirs.lent.names().unwrap_or_default() {
            let shared = dirs.sha256.metadata(&name).is_ok_and(|m| m.nlink() > 1);
            if !shared {
                let _ = dirs.lent.remove_file(&name);
            }
        }
        Ok(Some(Pruned {
            dir: cache.dir().to_path_buf(),
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
        if Arc::strong_count(&self.lock) > 1 {
            return;
        }
        let root = self.dir().to_path_buf();
        match self.prune_open(DEFAULT_MAX_BYTES, false) {
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

/// Puts the proven entry `src` at `tmp` (a new name) as `share` says; a
/// copy is synced and made read-only, as an entry is. Returns whether
/// bytes were written (a copy) rather than shared.
pub fn place(src: &Kept, tmp: &Path, share: Share) -> std::io::Result<bool> {
    if share == Share::Link && std::fs::hard_link(&src.path, tmp).is_ok() {
        return Ok(false);
    }
    let from = File::open(&src.path)?;
    let mut to = File::create(tmp)?;
    let mut copied = false;
    if rustix::fs::ioctl_ficlone(&to, &from).is_err() {
        // No clone here (ext4): a rootfs gets a hard link, the entry marked
        // lent first (module doc), so nothing is written twice.
        if share == Share::Clone {
            drop(to);
            std::fs::remove_file(tmp)?;
            if lend(src).is_ok() && std::fs::hard_link(&src.path, tmp).is_ok() {
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

/// Marks the entry lent to a rootfs (`lent/<hex>`), made before the link,
/// so no link goes unmarked.
fn lend(entry: &Kept) -> std::io::Result<()> {
    let mark = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(entry.dirs.lent.path().join(&entry.hex))?;
    mark.sync_all()
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
            rustix::fs::chown(&*path, other, None).unwrap();
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

    /// Issue 45.2: a directory that is not a kiln cache (an OCI layout, a
    /// content store) is refused before anything in it is made or pruned;
    /// an empty one is tagged; a cache from before the tag is adopted.
    #[tokio::test]
    async fn a_directory_that_is_not_a_kiln_cache_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
        std::fs::set_permissions(&layout, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(layout.join("blobs/sha256/aa"), b"theirs").unwrap();
        std::fs::write(layout.join("oci-layout"), b"{}").unwrap();
        let e = format!("{:#}", Cache::open(&layout).unwrap_err());
        assert!(e.contains("is not a kiln cache"), "{e}");
        assert!(Cache::prune(&layout, 0, true).is_err());
        assert_eq!(
            std::fs::read(layout.join("blobs/sha256/aa")).unwrap(),
            b"theirs"
        );
        let mut names: Vec<_> = std::fs::read_dir(&layout)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["blobs", "oci-layout"]);
        assert!(check(&layout).is_err());
        // A new directory is tagged; an old untagged cache is adopted.
        let fresh = dir.path().join("fresh");
        drop(Cache::open(&fresh).unwrap());
        assert!(std::fs::read_to_string(fresh.join(TAG))
            .unwrap()
            .starts_with("Signature: 8a477f597d28d172789f06886806bc55"));
        std::fs::remove_file(fresh.join(TAG)).unwrap();
        drop(Cache::open(&fresh).unwrap());
        assert!(fresh.join(TAG).exists());
    }

    /// Issue 45.5 and 45.7: `layers/` is checked as the others are, and
    /// the doctor's look creates nothing.
    #[test]
    fn layers_is_checked_and_the_doctor_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("c");
        check(&c).unwrap();
        assert!(!c.exists());
        drop(Cache::open(&c).unwrap());
        std::fs::set_permissions(c.join("layers"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = format!("{:#}", Cache::open(&c).unwrap_err());
        assert!(e.contains("layers is writable by others"), "{e}");
        assert!(format!("{:#}", check(&c).unwrap_err()).contains("layers"));
        std::fs::set_permissions(c.join("layers"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::remove_dir(c.join("lent")).unwrap();
        std::fs::remove_file(c.join("lock")).unwrap();
        check(&c).unwrap();
        assert!(!c.join("lent").exists() && !c.join("lock").exists());
    }

    /// Issue 45.9: an entry whose mode is not kiln's 0444 is not intact
    /// (a setuid bit would travel into node-image tars).
    #[tokio::test]
    async fn an_entry_with_another_mode_is_not_intact() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let d = desc(b"mode");
        let path = cache.put_stream(&d, stream(b"mode")).await.unwrap();
        assert!(cache.get(&d).is_some());
        for mode in [0o6555, 0o555, 0o440] {
            std::fs::set_permissions(&*path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(cache.get(&d).is_none(), "{mode:o}");
            assert!(!cache.list(false).unwrap().entries[0].intact);
        }
    }

    /// Issue 45.9: a lent mark stays through a run's use (a concurrent run
    /// may be lending the entry) and goes only in a prune, once no rootfs
    /// shares the inode.
    #[tokio::test]
    async fn lent_marks_go_only_in_a_prune() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("c")).unwrap();
        let d = desc(b"lent bytes");
        let kept = cache.put_stream(&d, stream(b"lent bytes")).await.unwrap();
        let rootfs_file = dir.path().join("in-a-rootfs");
        lend(&kept).unwrap();
        std::fs::hard_link(&*kept, &rootfs_file).unwrap();
        let mark = dir.path().join("c/lent").join(d.digest.hex());
        assert!(cache.get(&d).is_some());
        std::fs::remove_file(&rootfs_file).unwrap();
        assert!(cache.get(&d).is_some());
        assert!(mark.exists(), "a run dropped a mark");
        drop((cache, kept));
        Cache::prune(&dir.path().join("c"), u64::MAX, true).unwrap();
        assert!(!mark.exists());
    }

    /// Issue 44.6: a cached layer that fails its re-hash is removed, so the
    /// next keep writes it again (the cheap check passes: only the re-hash
    /// can catch it).
    #[tokio::test]
    async fn a_corrupt_layer_entry_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let bytes = b"compressed layer".to_vec();
        let d = desc(&bytes);
        let key = Digest::of(b"key");
        cache
            .keep_layer(&key, &d, serde_json::json!({"diffId": "x"}), &bytes[..])
            .unwrap();
        assert!(cache.layer(&key).is_some());
        // Same size, mode and mtime mark: only the bytes differ.
        let path = dir.path().join("blobs/sha256").join(d.digest.hex());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&path, b"compressed lazer").unwrap();
        let f = File::options().write(true).open(&path).unwrap();
        f.set_times(FileTimes::new().set_modified(SystemTime::UNIX_EPOCH + MARK))
            .unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(0o444))
            .unwrap();
        drop(f);
        assert!(cache.layer(&key).is_none());
        assert!(!path.exists(), "the corrupt entry stayed");
        cache
            .keep_layer(&key, &d, serde_json::json!({"diffId": "x"}), &bytes[..])
            .unwrap();
        assert!(cache.layer(&key).is_some());
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }
}
