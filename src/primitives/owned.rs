//! Directories kiln reuses between runs (the cache, a bundle's staging)
//! are trusted only if no one but the user kiln runs as could have written
//! them: such a directory must belong to that user and be writable by no
//! group or other user. Kiln makes them `0700`.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use anyhow::{bail, Context};

/// Creates `dir` (and missing parents) `0700`; an existing one is left as
/// it is, for [`check`] to judge.
pub fn create(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Whether `dir` is a directory of the user kiln runs as that no group or
/// other user can write; `follow`: `dir` may be a symlink to one. The
/// error is one line saying what to do (`fix` names the way out).
pub fn check(dir: &Path, follow: bool, fix: &str) -> anyhow::Result<()> {
    let me = rustix::process::geteuid().as_raw();
    let m = if follow {
        std::fs::metadata(dir)
    } else {
        std::fs::symlink_metadata(dir)
    }
    .with_context(|| format!("reading {}", dir.display()))?;
    if !m.is_dir() {
        bail!("{} is not a directory; {fix}", dir.display());
    }
    if m.uid() != me {
        bail!(
            "{} belongs to uid {}, not to uid {me} that kiln runs as: another user could have put any bytes there; {fix}",
            dir.display(),
            m.uid()
        );
    }
    if m.mode() & 0o022 != 0 {
        bail!(
            "{} is writable by others (mode {:o}): anyone who can write it could plant a blob; run chmod go-w on it, or {fix}",
            dir.display(),
            m.mode() & 0o7777
        );
    }
    Ok(())
}

/// Whether a file in such a directory is the user's own (not one planted
/// before the directory was made private).
pub fn is_mine(m: &std::fs::Metadata) -> bool {
    m.uid() == rustix::process::geteuid().as_raw()
}
