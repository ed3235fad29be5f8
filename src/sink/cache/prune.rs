//! What the cache holds (`kiln cache ls`) and keeping it under its cap:
//! least recently used first, under the exclusive lock.

use super::*;

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
