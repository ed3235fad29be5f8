//! Entries placed into stores: cloned, hard-linked (and marked lent), or
//! copied (module doc of `sink::cache`).

use super::*;

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
        // The link moved the entry's ctime: a lent one's mark follows.
        record_if_lent(src);
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
                record_if_lent(src);
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
pub(super) fn lend(entry: &Kept) -> std::io::Result<()> {
    let mark = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(entry.dirs.lent.path().join(&entry.hex))?;
    mark.sync_all()
}

/// What a lent mark holds: the entry's inode, size and change time as kiln
/// last linked or verified it. ctime moves on every write, chmod, link and
/// utimes through any of the entry's names, and no system call sets it
/// back, so an entry whose ctime still matches is the one kiln verified:
/// it is used without reading its bytes again (module doc).
pub(super) fn lent_state(m: &std::fs::Metadata) -> String {
    format!("{} {} {} {}\n", m.ino(), m.len(), m.ctime(), m.ctime_nsec())
}

/// Records the entry's state in its lent mark, if it has one. A failure
/// leaves the old mark, which no longer matches: the next run re-hashes.
pub fn record_if_lent(entry: &Kept) {
    let Ok(m) = std::fs::metadata(&entry.path) else {
        return;
    };
    if entry.dirs.lent.metadata(&entry.hex).is_err() {
        return;
    }
    let _ = File::options()
        .write(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(entry.dirs.lent.path().join(&entry.hex))
        .and_then(|mut f| f.write_all(lent_state(&m).as_bytes()));
}
