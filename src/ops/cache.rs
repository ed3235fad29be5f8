//! `kiln cache`: what the shared blob cache holds, and keeping it small.

use std::path::Path;

use crate::sink::cache::{Cache, Listing, Pruned};

/// Lists the cache at `dir`, oldest use first; `check` re-hashes each entry.
pub fn list(dir: &Path, check: bool) -> anyhow::Result<Listing> {
    Cache::open(dir)?.list(check)
}

/// Removes damaged entries, then the least recently used, until at most
/// `max_bytes` stay; waits for kilns using the cache to finish.
pub fn prune(dir: &Path, max_bytes: u64) -> anyhow::Result<Pruned> {
    Ok(Cache::prune(dir, max_bytes, true)?.expect("a waiting prune always runs"))
}
