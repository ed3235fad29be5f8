//! The cache directory itself: opened once through handles, tagged as
//! kiln's (CACHEDIR.TAG), refused when it holds anything not kiln's.

use std::path::Path;

use super::*;

/// The cache's directories, each open and checked once.
#[derive(Debug)]
pub(super) struct Dirs {
    pub(super) top: OwnedDir,
    /// Held open: `sha256` and `sha512` were opened beneath it.
    _blobs: OwnedDir,
    pub(super) sha256: OwnedDir,
    pub(super) sha512: OwnedDir,
    pub(super) tmp: OwnedDir,
    pub(super) lent: OwnedDir,
    pub(super) layers: OwnedDir,
}

impl Dirs {
    /// Opens the cache at `dir`: its top checked and tagged first, then
    /// its subdirectories made and checked.
    pub(super) fn open(dir: &Path) -> anyhow::Result<Dirs> {
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

    pub(super) fn algo(&self, algo: &str) -> &OwnedDir {
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
    // Under a name `judge` knows: another kiln opening the same new cache
    // meanwhile must not take this file for someone else's.
    let mut tmp = tempfile::Builder::new()
        .prefix(TAG_TMP)
        .tempfile_in(top.path())?;
    tmp.write_all(TAG_TEXT.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(top.path().join(TAG))
        .map_err(|e| anyhow!("tagging {}: {}", top.shown().display(), e.error))?;
    Ok(())
}

/// The tag's name while it is written, before its rename into place.
const TAG_TMP: &str = ".CACHEDIR.TAG.";

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
    let mut names = top
        .names()
        .with_context(|| format!("reading {}", top.shown().display()))?;
    // A tag another kiln is writing right now (or one cut short): the
    // directory is still as empty as it was.
    names.retain(|n| !n.to_string_lossy().starts_with(TAG_TMP));
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
