//! The directories kiln keeps for itself outside a rootfs (the cache and
//! its subdirectories, a bundle's staging, a layout it builds in, its work
//! directories). kiln is often run as root on a machine other users share,
//! with their environment (`sudo -E`) or in a directory they can write, so
//! a name is checked once and then never trusted again:
//!
//! - **Opened once, used through the handle.** [`OwnedDir::open`] opens the
//!   directory, creating it `0700` one level deep (never recursively, so a
//!   directory that appears meanwhile is judged like any existing one);
//!   the last component is not followed if it is a symlink, unless the
//!   link itself belongs to the user kiln runs as. Every later open,
//!   create, rename and unlink happens relative to that handle: a
//!   subdirectory through `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`,
//!   single names through [`OwnedDir::path`] (`/proc/self/fd/N`, which the
//!   kernel resolves to the handle's own directory, whatever was renamed
//!   since). Whoever can write the parent may swap the name afterwards;
//!   kiln keeps working in the directory it checked.
//! - **Checked through the handle**: a directory of the effective uid that
//!   no group or other user can write; its parent writable by others only
//!   with the sticky bit (a parent others can write without it is a
//!   mistake kiln refuses to build on); nothing is created in a directory
//!   of another user (root's excepted), where it would be that user's
//!   trap. A refusal is one line naming the
//!   directory, what is wrong and what to do.
//! - **Walked, never resolved by name**: a path kiln is handed (`TMPDIR`,
//!   the cache's parents) is opened from `/` one component at a time by fd
//!   (`walk`): every directory on the way belongs to the user or root and
//!   has the sticky bit if others can write it, and a symlink is followed
//!   only if the user or root made it (another user could repoint theirs
//!   at any time).
//! - **Work directories handed to other programs by path** (the private
//!   containerd's root, a node's rootfs, the kubeadm kiln runs) cannot be
//!   used through a handle: [`work_dir`] makes them with a random name in
//!   the directory `TMPDIR` walks to, named by its resolved path, under
//!   which no other user can rename, replace or repoint anything: every
//!   later use by that name reaches the directory kiln made.
//!
//! rustix's `openat2` and the `*at` calls rather than cap-std's `Dir`:
//! rustix is already what kiln uses for its system calls, and cap-std
//! would add a family of crates to do the same `openat2` underneath while
//! hiding the mode a directory is created with.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

mod walk;
pub use walk::{work_dir, work_dir_in};

/// Inside a directory kiln owns: nothing above it, no symlink on the way.
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// A directory kiln owns, open and checked. Dropping it closes the handle.
#[derive(Debug)]
pub struct OwnedDir {
    fd: OwnedFd,
    /// Its parent, as it was opened (to remove the directory by the name
    /// it was opened by, only if that name still leads to it).
    parent: Option<(OwnedFd, std::ffi::OsString)>,
    /// The name it was opened by, for messages only.
    shown: PathBuf,
    /// Whether this open created it.
    created: bool,
}

impl OwnedDir {
    /// Opens `path` as a directory kiln owns, creating it (and only it)
    /// `0700`; missing ancestors are made as `mkdir -p` would. `fix` ends
    /// a refusal with the way out.
    pub fn open(path: &Path, fix: &str) -> anyhow::Result<OwnedDir> {
        OwnedDir::open_as(path, fix, true)
    }

    /// [`OwnedDir::open`] of a directory that exists, creating nothing
    /// (`kiln doctor`'s look).
    pub fn open_existing(path: &Path, fix: &str) -> anyhow::Result<OwnedDir> {
        OwnedDir::open_as(path, fix, false)
    }

    fn open_as(path: &Path, fix: &str, create: bool) -> anyhow::Result<OwnedDir> {
        let path =
            std::path::absolute(path).with_context(|| format!("reading {}", path.display()))?;
        let (parent, name) = match (path.parent(), path.components().next_back()) {
            (Some(p), Some(Component::Normal(n))) => (p, n.to_os_string()),
            _ => bail!("{} cannot be a directory of kiln's; {fix}", path.display()),
        };
        // Every directory on the way judged, by fd, as it is reached: a
        // parent reached through another user's link (`~/.cache ->
        // /srv/anywhere` under `sudo -E`) is refused, not filled.
        let (pfd, _) = walk::walk(parent, create, fix)?;
        // Made, or found; opened. A name that vanishes between the two (one
        // another user renames in and out) is tried again, a few times.
        let mut tries = 0;
        let (fd, created) = loop {
            let exists =
                rustix::fs::statat(&pfd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok();
            if create && !exists {
                let m = std::fs::File::from(rustix::io::dup(&pfd)?).metadata()?;
                not_theirs(&m, parent, &path, fix)?;
            }
            let created = create
                && match rustix::fs::mkdirat(&pfd, name.as_os_str(), Mode::from_raw_mode(0o700)) {
                    Ok(()) => true,
                    Err(Errno::EXIST) => false,
                    Err(e) => bail!("creating {}: {e}", path.display()),
                };
            match rustix::fs::openat(&pfd, name.as_os_str(), dir_flags(), Mode::empty()) {
                Ok(fd) => break (fd, created),
                Err(Errno::NOENT) if create && tries < 8 => tries += 1,
                Err(Errno::NOENT) if create => bail!(
                    "{} keeps appearing and vanishing: someone is renaming a directory in and out of that name; {fix}",
                    path.display()
                ),
                // O_NOFOLLOW | O_DIRECTORY on a symlink: ENOTDIR (or ELOOP).
                Err(Errno::LOOP | Errno::NOTDIR)
                    if rustix::fs::statat(&pfd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| {
                            rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink()
                        }) =>
                {
                    break (follow_own_link(&pfd, &name, &path, fix)?, false)
                }
                Err(Errno::NOTDIR) => bail!("{} is not a directory; {fix}", path.display()),
                Err(e) => bail!("opening {}: {e}", path.display()),
            }
        };
        let dir = OwnedDir {
            fd,
            parent: Some((pfd, name)),
            shown: path,
            created,
        };
        dir.check(fix)?;
        dir.check_proc()?;
        Ok(dir)
    }

    /// Opens (creating `0700`) the subdirectory `name` (one component),
    /// beneath this handle and without following any symlink.
    pub fn sub(&self, name: &str, fix: &str) -> anyhow::Result<OwnedDir> {
        self.sub_as(name, fix, true)
    }

    /// The subdirectory `name` if it exists, checked; nothing is created.
    pub fn sub_existing(&self, name: &str, fix: &str) -> anyhow::Result<Option<OwnedDir>> {
        match self.metadata(name) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            _ => self.sub_as(name, fix, false).map(Some),
        }
    }

    fn sub_as(&self, name: &str, fix: &str, create: bool) -> anyhow::Result<OwnedDir> {
        let shown = self.shown.join(name);
        let created = create
            && match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => bail!("creating {}: {e}", shown.display()),
            };
        let fd = self.open_beneath(name, dir_flags()).map_err(|e| match e {
            Errno::LOOP | Errno::XDEV | Errno::NOTDIR => anyhow::anyhow!(
                "{} is not a plain directory (a symlink or a file); {fix}",
                shown.display()
            ),
            e => anyhow::anyhow!("opening {}: {e}", shown.display()),
        })?;
        let dir = OwnedDir {
            fd,
            parent: None,
            shown,
            created,
        };
        dir.check(fix)?;
        Ok(dir)
    }

    /// Opens `name` beneath this directory, following no symlink.
    pub fn open_beneath(&self, name: impl AsRef<Path>, flags: OFlags) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            &self.fd,
            name.as_ref(),
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            BENEATH,
        )
    }

    /// A file beneath this directory, opened for reading (no symlink followed).
    pub fn open_file(&self, name: impl AsRef<Path>) -> std::io::Result<std::fs::File> {
        Ok(self.open_beneath(name, OFlags::RDONLY)?.into())
    }

    /// `name`'s metadata, without following a symlink at any step.
    pub fn metadata(&self, name: impl AsRef<Path>) -> std::io::Result<std::fs::Metadata> {
        let fd = self.open_beneath(name, OFlags::PATH)?;
        std::fs::File::from(fd).metadata()
    }

    /// Removes the file `name` (one component) from this directory.
    pub fn remove_file(&self, name: impl AsRef<Path>) -> std::io::Result<()> {
        Ok(rustix::fs::unlinkat(
            &self.fd,
            name.as_ref(),
            AtFlags::empty(),
        )?)
    }

    /// The names this directory holds.
    pub fn names(&self) -> std::io::Result<Vec<std::ffi::OsString>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.path())? {
            out.push(e?.file_name());
        }
        Ok(out)
    }

    /// A path the kernel resolves through this handle (`/proc/self/fd/N`):
    /// for code that takes paths (tempfile, std::fs), inside this process,
    /// while this handle is open. Joined only with names kiln made.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The name it was opened by, for messages.
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// Whether this open created it (nothing of an earlier run is there).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Syncs the directory (after a rename into it).
    pub fn sync(&self) -> std::io::Result<()> {
        Ok(rustix::fs::fsync(
            self.open_beneath(".", OFlags::RDONLY | OFlags::DIRECTORY)?,
        )?)
    }

    /// Removes everything in it, through the handle, and then the
    /// directory by the name it was opened by, if that name still leads to
    /// it (someone who can write the parent may have swapped it).
    pub fn remove_all(self) -> std::io::Result<()> {
        empty(&self.fd)?;
        if let Some((pfd, name)) = &self.parent {
            let here = rustix::fs::fstat(&self.fd)?;
            let there = rustix::fs::statat(pfd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino) {
                rustix::fs::unlinkat(pfd, name.as_os_str(), AtFlags::REMOVEDIR)?;
            }
        }
        Ok(())
    }

    /// The user's own, written by no one else (module doc).
    fn check(&self, fix: &str) -> anyhow::Result<()> {
        let st = rustix::fs::fstat(&self.fd)
            .with_context(|| format!("reading {}", self.shown.display()))?;
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me {
            bail!(
                "{} belongs to uid {}, not to uid {me} that kiln runs as: another user could have put any bytes there; {fix}",
                self.shown.display(),
                st.st_uid
            );
        }
        if st.st_mode & 0o022 != 0 {
            bail!(
                "{} is writable by others (mode {:o}): anyone who can write it could plant a file; run chmod go-w on it, or {fix}",
                self.shown.display(),
                st.st_mode & 0o7777
            );
        }
        Ok(())
    }

    /// [`OwnedDir::path`] leads to this handle (`/proc` is mounted and ours).
    fn check_proc(&self) -> anyhow::Result<()> {
        let st = rustix::fs::fstat(&self.fd)?;
        match std::fs::metadata(self.path()) {
            Ok(m) if (m.dev(), m.ino()) == (st.st_dev, st.st_ino) => Ok(()),
            _ => bail!(
                "/proc/self/fd does not lead to {}: kiln needs /proc mounted",
                self.shown.display()
            ),
        }
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// kiln makes nothing in a directory of another user (root's excepted): as
/// root with a user's `HOME` it would leave root-owned directories there
/// that the user's own kiln then refuses (and cannot remove).
fn not_theirs(m: &std::fs::Metadata, dir: &Path, path: &Path, fix: &str) -> anyhow::Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != me && m.uid() != 0 {
        bail!(
            "{} would be made in {}, which belongs to uid {}: kiln, running as uid {me}, makes nothing in another user's directory (run kiln as that user); {fix}",
            path.display(),
            dir.display(),
            m.uid()
        );
    }
    Ok(())
}

/// The last component is a symlink: followed only if the link itself is
/// the user's (their own `~/.cache/kiln -> /data/kiln`), and then its
/// target's parent is judged as any parent is.
fn follow_own_link(pfd: &OwnedFd, name: &OsStr, path: &Path, fix: &str) -> anyhow::Result<OwnedFd> {
    let link = rustix::fs::statat(pfd, name, AtFlags::SYMLINK_NOFOLLOW)
        .with_context(|| format!("reading {}", path.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if link.st_uid != me {
        bail!(
            "{} is a symlink that belongs to uid {}, not to uid {me} that kiln runs as: it could lead anywhere; {fix}",
            path.display(),
            link.st_uid
        );
    }
    let fd = rustix::fs::openat(
        pfd,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("opening {} (a symlink)", path.display()))?;
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .with_context(|| format!("reading where {} leads", path.display()))?;
    if let Some(tp) = target.parent() {
        walk::walk(tp, false, fix)?;
    }
    Ok(fd)
}

/// Removes everything beneath `fd`, never following a symlink.
fn empty(fd: &OwnedFd) -> std::io::Result<()> {
    let dup = rustix::fs::openat(
        fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&dup)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push((e.file_name().to_owned(), e.file_type()));
        }
    }
    for (name, _) in names {
        match rustix::fs::unlinkat(fd, name.as_c_str(), AtFlags::empty()) {
            Ok(()) => {}
            Err(Errno::ISDIR) | Err(Errno::PERM) => {
                let sub =
                    rustix::fs::openat2(fd, name.as_c_str(), dir_flags(), Mode::empty(), BENEATH)?;
                empty(&sub)?;
                rustix::fs::unlinkat(fd, name.as_c_str(), AtFlags::REMOVEDIR)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether a file in such a directory is the user's own (not one planted
/// before the directory was made private).
pub fn is_mine(m: &std::fs::Metadata) -> bool {
    m.uid() == rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const FIX: &str = "use another";

    #[test]
    fn a_new_directory_is_private_and_used_through_its_handle() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("own");
        let d = OwnedDir::open(&p, FIX).unwrap();
        assert!(d.created());
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        // Renamed away and replaced: the handle still works in the first.
        std::fs::rename(&p, t.path().join("moved")).unwrap();
        std::fs::create_dir(&p).unwrap();
        std::fs::write(d.path().join("x"), b"1").unwrap();
        assert!(t.path().join("moved/x").exists());
        assert!(!p.join("x").exists());
        let again = OwnedDir::open(&t.path().join("moved"), FIX).unwrap();
        assert!(!again.created());
        again.remove_all().unwrap();
        assert!(!t.path().join("moved").exists());
    }

    #[test]
    fn remove_all_leaves_a_swapped_name_alone() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("own");
        let d = OwnedDir::open(&p, FIX).unwrap();
        d.sub("blobs", FIX).unwrap();
        std::fs::write(d.path().join("blobs/b"), b"1").unwrap();
        std::fs::rename(&p, t.path().join("moved")).unwrap();
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("theirs"), b"1").unwrap();
        d.remove_all().unwrap();
        assert!(p.join("theirs").exists());
        assert!(std::fs::read_dir(t.path().join("moved"))
            .unwrap()
            .next()
            .is_none());
    }

    #[test]
    fn links_others_own_and_writable_parents_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        // The user's own link is followed.
        std::os::unix::fs::symlink(&real, t.path().join("mine")).unwrap();
        let d = OwnedDir::open(&t.path().join("mine"), FIX).unwrap();
        std::fs::write(d.path().join("f"), b"").unwrap();
        assert!(real.join("f").exists());
        if rustix::process::geteuid().is_root() {
            let other = Some(rustix::fs::Uid::from_raw(4242));
            std::os::unix::fs::symlink(&real, t.path().join("theirs")).unwrap();
            rustix::fs::chownat(
                rustix::fs::CWD,
                t.path().join("theirs"),
                other,
                None,
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .unwrap();
            let e = format!(
                "{:#}",
                OwnedDir::open(&t.path().join("theirs"), FIX).unwrap_err()
            );
            assert!(e.contains("a symlink that belongs to uid 4242"), "{e}");
        }
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = format!("{:#}", OwnedDir::open(&open.join("c"), FIX).unwrap_err());
        assert!(e.contains("lacks the sticky bit"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        OwnedDir::open(&open.join("c"), FIX).unwrap();
        // A symlink where a subdirectory should be is not followed.
        std::os::unix::fs::symlink(&real, d.path().join("sub")).unwrap();
        let e = format!("{:#}", d.sub("sub", FIX).unwrap_err());
        assert!(e.contains("not a plain directory"), "{e}");
    }
}
