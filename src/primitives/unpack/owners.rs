//! The owners the layers' tar headers give, remembered for the paths kiln
//! writes again later (a non-root unpack cannot chown).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The owners a layer stack's tar headers give to some paths (relative to
/// the root), whoever unpacked them: a non-root unpack cannot chown, but
/// what kiln later writes for those paths must carry the intended owners.
#[derive(Debug)]
pub struct Owners {
    map: BTreeMap<PathBuf, (u64, u64)>,
    keep: fn(&Path) -> bool,
}

impl Owners {
    /// Tracks the paths `keep` says yes to.
    pub fn new(keep: fn(&Path) -> bool) -> Self {
        Owners {
            map: BTreeMap::new(),
            keep,
        }
    }

    /// The owner the layers gave `rel`, if they had it.
    pub fn get(&self, rel: &Path) -> Option<(u64, u64)> {
        self.map.get(rel).copied()
    }

    pub(super) fn note(&mut self, rel: &Path, h: &tar::Header) {
        if (self.keep)(rel) {
            let owner = (h.uid().unwrap_or(0), h.gid().unwrap_or(0));
            self.map.insert(rel.to_path_buf(), owner);
        }
    }

    /// `rel` is gone (with everything under it; `keep_self` for an opaque
    /// directory, which stays).
    pub(super) fn forget(&mut self, rel: &Path, keep_self: bool) {
        let gone: Vec<PathBuf> = self
            .map
            .range(rel.to_path_buf()..)
            .take_while(|(p, _)| p.starts_with(rel))
            .map(|(p, _)| p.clone())
            .filter(|p| !(keep_self && p == rel))
            .collect();
        for p in gone {
            self.map.remove(&p);
        }
    }
}
