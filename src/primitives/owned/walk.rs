//! A path kiln is handed (`TMPDIR`, the cache's parents), opened from `/`
//! one component at a time by fd: each directory judged as it is reached,
//! each symlink followed only if the user kiln runs as or root made it.
//! Resolving the name first and checking the result (`canonicalize`) is
//! not enough: a link another user owns passes the check and is repointed
//! after it (issue 56.1, 56.3).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Links followed on one walk, at most (the kernel's own limit).
const MAX_LINKS: usize = 40;

fn path_flags() -> OFlags {
    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Opens the directory `path` names, walked from `/` (module doc); with
/// `create`, missing directories are made as `mkdir -p` would (never in
/// another user's directory: none is walked through). Returns the handle
/// and the directory's resolved path.
pub(super) fn walk(path: &Path, create: bool, fix: &str) -> anyhow::Result<(OwnedFd, PathBuf)> {
    let abs = std::path::absolute(path).with_context(|| format!("reading {}", path.display()))?;
    let root = || rustix::fs::open("/", path_flags(), Mode::empty());
    let mut fd = root().context("opening /")?;
    let mut at = PathBuf::from("/");
    judge(&fd, &at, fix)?;
    let mut todo: VecDeque<OsString> = names(&abs);
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            fd = rustix::fs::openat(&fd, "..", path_flags(), Mode::empty())?;
            at.pop();
            judge(&fd, &at, fix)?;
            continue;
        }
        let shown = at.join(&name);
        let st = match rustix::fs::statat(&fd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&fd, name.as_os_str(), Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => bail!("creating {}: {e}", shown.display()),
                }
                todo.push_front(name);
                continue;
            }
            Err(e) => bail!("reading {}: {e}", shown.display()),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let me = rustix::process::geteuid().as_raw();
                if st.st_uid != me && st.st_uid != 0 {
                    bail!(
                        "{} is a symlink that belongs to uid {}, who could repoint it at any time; {fix}",
                        shown.display(),
                        st.st_uid
                    );
                }
                links += 1;
                if links > MAX_LINKS {
                    bail!("{}: too many symlinks on the way", path.display());
                }
                let target = rustix::fs::readlinkat(&fd, name.as_os_str(), Vec::new())
                    .with_context(|| format!("reading {}", shown.display()))?;
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    fd = root()?;
                    at = PathBuf::from("/");
                }
                for n in names(&target).into_iter().rev() {
                    todo.push_front(n);
                }
            }
            FileType::Directory => {
                let next = rustix::fs::openat(&fd, name.as_os_str(), path_flags(), Mode::empty())
                    .with_context(|| format!("opening {}", shown.display()))?;
                judge(&next, &shown, fix)?;
                fd = next;
                at = shown;
            }
            _ => bail!("{} is not a directory; {fix}", shown.display()),
        }
    }
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .with_context(|| format!("reading where {} leads (kiln needs /proc)", path.display()))?;
    Ok((fd, real))
}

/// A path's names, in order (`/` and `.` left out; `..` kept).
fn names(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// A directory on the way: the user's or root's, and sticky if others can
/// write it; anyone else could rename or replace what kiln makes under it.
fn judge(fd: &OwnedFd, shown: &Path, fix: &str) -> anyhow::Result<()> {
    let st = rustix::fs::fstat(fd).with_context(|| format!("reading {}", shown.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me && st.st_uid != 0 {
        bail!(
            "{} belongs to uid {}, who could rename or replace what kiln makes under it (kiln runs as uid {me}); {fix}",
            shown.display(),
            st.st_uid
        );
    }
    if st.st_mode & 0o022 != 0 && st.st_mode & 0o1000 == 0 {
        bail!(
            "{} is writable by others (mode {:o}) and lacks the sticky bit: another user could swap what is in it; run chmod +t or go-w on it, or {fix}",
            shown.display(),
            st.st_mode & 0o7777
        );
    }
    Ok(())
}

/// A new work directory under `TMPDIR` (random name, `0700`), removed when
/// dropped. Used by path (other programs are handed it), so it is made
/// only where no other user can rename it (module doc of `owned`).
pub fn work_dir(prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    work_dir_in(&std::env::temp_dir(), prefix)
}

/// [`work_dir`] in `tmp` rather than `TMPDIR`: `tmp` walked (module doc),
/// the directory made in what the walk reached, named by its resolved
/// path, so every later use by that name reaches it.
pub fn work_dir_in(tmp: &Path, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    let fix = "set TMPDIR to a directory only you (or root) can write";
    // Every directory on `real` was judged by the walk, which reached the
    // last one through each of them.
    let (fd, real) = walk(tmp, false, fix)?;
    let same = |p: &Path, fd: &OwnedFd| {
        let (m, st) = (std::fs::symlink_metadata(p), rustix::fs::fstat(fd));
        matches!((m, st), (Ok(m), Ok(st)) if (m.dev(), m.ino()) == (st.st_dev, st.st_ino))
    };
    if !same(&real, &fd) {
        bail!("{} changed while kiln walked it; {fix}", tmp.display());
    }
    // 0700 explicitly: tempfile's default is 0777 less the umask.
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(&real)
        .with_context(|| format!("creating a work directory in {}", real.display()))?;
    let m = std::fs::symlink_metadata(dir.path())?;
    let name = dir.path().file_name().expect("a name");
    let inside = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| (st.st_dev, st.st_ino) == (m.dev(), m.ino()));
    if !inside
        || !m.is_dir()
        || m.uid() != rustix::process::geteuid().as_raw()
        || m.mode() & 0o077 != 0
    {
        bail!(
            "{}: not the private directory kiln just made",
            dir.path().display()
        );
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_walked_through_own_links_to_its_real_directory() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("a/b");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink("a/b", t.path().join("rel")).unwrap();
        std::os::unix::fs::symlink(&real, t.path().join("abs")).unwrap();
        let canon = std::fs::canonicalize(&real).unwrap();
        for p in ["rel", "abs", "a/b/../b"] {
            let (_, r) = walk(&t.path().join(p), false, "fix").unwrap();
            assert_eq!(r, canon, "{p}");
        }
        let (_, r) = walk(&t.path().join("abs/c/d"), true, "fix").unwrap();
        assert_eq!(r, canon.join("c/d"));
        let e = format!(
            "{:#}",
            walk(&t.path().join("none"), false, "fix").unwrap_err()
        );
        assert!(e.contains("none"), "{e}");
        let w = work_dir_in(&t.path().join("rel"), "kiln-test-").unwrap();
        assert!(w.path().starts_with(&canon), "{}", w.path().display());
    }
}
