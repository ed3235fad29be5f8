//! The one in-root resolver. Every path kiln touches inside a rootfs goes
//! through [`Root`]: a path is walked one component at a time from a
//! directory fd, each step opened with `O_NOFOLLOW`; a symlink met on the way
//! is read and resolved again *inside* the root (absolute targets restart at
//! the root, `..` stops at it), the way `openat2(RESOLVE_IN_ROOT)` or a chroot
//! would. Nothing is ever followed out. Changes (modes, owners, xattrs) are
//! made through file descriptors or `*at` calls that do not follow the last
//! component, never through host paths.
//!
//! Why not `openat2` itself: it is missing on older kernels and refused by
//! some container seccomp profiles that CI runners use; this walk needs only
//! `openat`, and `rustix` keeps it free of hand-written FFI.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

/// Symlinks followed while resolving one path, as Linux allows (40).
const MAX_LINKS: usize = 40;

/// A rootfs directory, opened once; every operation is relative to its fd.
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

/// What to do with missing or non-directory parents while resolving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parents {
    /// They must exist as directories (through in-root symlinks).
    Existing,
    /// Create missing ones (0755); replace a non-directory, as tar
    /// extraction does.
    Create,
}

/// A resolved entry: its parent directory, open, and its name there.
pub struct Entry {
    pub dir: OwnedFd,
    pub name: OsString,
    /// The entry's path inside the root, with every symlink resolved.
    pub real: PathBuf,
}

/// The archive path as root-relative components; `..` above the root and a
/// leading `/` are clamped away.
pub fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// A path's names and `..`s, in order (`/` and `.` dropped).
fn components(p: &Path) -> impl Iterator<Item = OsString> + '_ {
    p.components().filter_map(|c| match c {
        Component::Normal(s) => Some(s.to_owned()),
        Component::ParentDir => Some(OsString::from("..")),
        _ => None,
    })
}

fn nofollow_path() -> OFlags {
    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

impl Root {
    /// Opens `path` (the user's choice, so it may itself be a symlink) as the root.
    pub fn open(path: &Path) -> io::Result<Root> {
        let fd = rfs::openat(
            rfs::CWD,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn dup_root(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Resolves `rel` inside the root. The last component is not followed
    /// (it is what the caller creates, replaces or inspects) unless
    /// `follow_last`; an empty path or one ending in `..` names a directory
    /// and is returned as its parent plus its own name (the root: ".").
    pub fn resolve(&self, rel: &Path, parents: Parents, follow_last: bool) -> io::Result<Entry> {
        let mut stack: Vec<(OsString, OwnedFd)> = Vec::new();
        let mut todo: VecDeque<OsString> = components(rel).collect();
        let mut links = 0;
        let mut last: Option<OsString> = None;
        while let Some(name) = todo.pop_front() {
            if name == ".." {
                stack.pop();
                continue;
            }
            let cur = match stack.last() {
                Some((_, fd)) => fd.try_clone()?,
                None => self.dup_root()?,
            };
            let is_last = todo.is_empty();
            match rfs::statat(&cur, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                    if is_last && !follow_last {
                        last = Some(name);
                        break;
                    }
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(io::Error::other(format!(
                            "too many symlinks resolving {}",
                            rel.display()
                        )));
                    }
                    let target = rfs::readlinkat(&cur, name.as_os_str(), Vec::new())?;
                    let target = Path::new(OsStr::from_bytes(target.as_bytes()));
                    if target.is_absolute() {
                        stack.clear();
                    }
                    todo = components(target).chain(todo.drain(..)).collect();
                }
                Ok(_) if is_last => {
                    last = Some(name);
                    break;
                }
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    let fd = rfs::openat(
                        &cur,
                        name.as_os_str(),
                        nofollow_path() | OFlags::DIRECTORY,
                        Mode::empty(),
                    )?;
                    stack.push((name, fd));
                }
                Ok(_) if parents == Parents::Create => {
                    rfs::unlinkat(&cur, name.as_os_str(), AtFlags::empty())?;
                    let fd = mkdir_open(&cur, &name)?;
                    stack.push((name, fd));
                }
                Ok(_) => return Err(io::Error::from(io::ErrorKind::NotADirectory)),
                Err(e) if e == rustix::io::Errno::NOENT && is_last => {
                    last = Some(name);
                    break;
                }
                Err(e) if e == rustix::io::Errno::NOENT && parents == Parents::Create => {
                    let fd = mkdir_open(&cur, &name)?;
                    stack.push((name, fd));
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.entry(stack, last)
    }

    /// The entry a finished walk arrived at: `last` in the innermost
    /// directory, or (no `last`) that directory itself as its parent's entry.
    fn entry(
        &self,
        mut stack: Vec<(OsString, OwnedFd)>,
        last: Option<OsString>,
    ) -> io::Result<Entry> {
        let real_parent: PathBuf = stack.iter().map(|(n, _)| n.as_os_str()).collect();
        match last {
            Some(name) => {
                let dir = match stack.pop() {
                    Some((_, fd)) => fd,
                    None => self.dup_root()?,
                };
                Ok(Entry {
                    real: real_parent.join(&name),
                    dir,
                    name,
                })
            }
            // The path names a directory already walked into (or the root).
            None => match stack.pop() {
                Some((name, _)) => {
                    let parent = match stack.last() {
                        Some((_, fd)) => fd.try_clone()?,
                        None => self.dup_root()?,
                    };
                    Ok(Entry {
                        dir: parent,
                        name,
                        real: real_parent,
                    })
                }
                None => Ok(Entry {
                    dir: self.dup_root()?,
                    name: OsString::from("."),
                    real: PathBuf::new(),
                }),
            },
        }
    }

    /// Opens the directory `rel` names (following in-root links), creating it
    /// and its parents if asked.
    pub fn open_dir(&self, rel: &Path, parents: Parents) -> io::Result<(OwnedFd, PathBuf)> {
        let e = self.resolve(rel, parents, true)?;
        let fd = match rfs::openat(
            &e.dir,
            e.name.as_os_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Err(rustix::io::Errno::NOENT) if parents == Parents::Create => {
                mkdir_open(&e.dir, &e.name)?;
                rfs::openat(
                    &e.dir,
                    e.name.as_os_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?
            }
            r => r?,
        };
        Ok((fd, e.real))
    }

    /// `rel`'s status, its last component not followed; `None` if it
    /// cannot be reached.
    pub fn lstat(&self, rel: &Path) -> Option<rfs::Stat> {
        let e = self.resolve(rel, Parents::Existing, false).ok()?;
        rfs::statat(&e.dir, e.name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW).ok()
    }

    /// Reads a (small) file, following in-root links; `None` if absent.
    pub fn read(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        match self.open_file(rel) {
            Ok(mut f) => {
                let mut v = Vec::new();
                io::Read::read_to_end(&mut f, &mut v)?;
                Ok(Some(v))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens a regular file for reading, following in-root links only.
    pub fn open_file(&self, rel: &Path) -> io::Result<std::fs::File> {
        let e = self.resolve(rel, Parents::Existing, true)?;
        let fd = rfs::openat(
            &e.dir,
            e.name.as_os_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        let st = rfs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::other(format!(
                "{} is not a regular file",
                rel.display()
            )));
        }
        Ok(std::fs::File::from(fd))
    }

    /// Writes a file atomically (a temporary name, then rename in the same
    /// directory fd): a symlink planted at `rel` is replaced, never followed.
    pub fn write(&self, rel: &Path, bytes: &[u8], mode: u32) -> io::Result<PathBuf> {
        self.write_from(rel, bytes, mode)
    }

    /// [`Root::write`] from a reader, streamed (a release's kubelet is ~100 MB).
    pub fn write_from(
        &self,
        rel: &Path,
        mut from: impl io::Read,
        mode: u32,
    ) -> io::Result<PathBuf> {
        let e = self.resolve(rel, Parents::Create, false)?;
        let mut tmp = e.name.clone();
        tmp.push(format!(".kiln-{}.tmp", std::process::id()));
        let _ = rfs::unlinkat(&e.dir, tmp.as_os_str(), AtFlags::empty());
        let fd = rfs::openat(
            &e.dir,
            tmp.as_os_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        let mut f = std::fs::File::from(fd);
        io::copy(&mut from, &mut f)?;
        rfs::fchmod(&f, Mode::from_raw_mode(mode))?;
        f.sync_all()?;
        rfs::renameat(&e.dir, tmp.as_os_str(), &e.dir, e.name.as_os_str())?;
        Ok(e.real)
    }

    /// A directory kiln owns (e.g. `var/lib/containerd`): it and every parent
    /// must be real directories, created if missing. A symlink anywhere on
    /// the way is refused, so the host path returned can be handed to another
    /// program (containerd) without anything in it being followed.
    pub fn owned_dir(&self, rel: &Path) -> anyhow::Result<PathBuf> {
        self.owned(rel, true)
    }

    /// As [`Root::owned_dir`], but creates nothing: a missing path is fine.
    pub fn check_owned(&self, rel: &Path) -> anyhow::Result<()> {
        self.owned(rel, false).map(|_| ())
    }

    fn owned(&self, rel: &Path, create: bool) -> anyhow::Result<PathBuf> {
        let mut cur = self.dup_root()?;
        let mut walked = PathBuf::new();
        for c in clean(rel).components() {
            let name = c.as_os_str();
            walked.push(name);
            match rfs::statat(&cur, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory => {}
                    FileType::Symlink => {
                        let target = rfs::readlinkat(&cur, name, Vec::new())
                            .map(|t| t.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        anyhow::bail!(
                            "the rootfs's /{} is a symlink (to {target}); kiln writes there and never through a link: make it a directory in the base image",
                            walked.display()
                        );
                    }
                    _ => anyhow::bail!(
                        "the rootfs's /{} is not a directory; kiln needs it to be one",
                        walked.display()
                    ),
                },
                Err(rustix::io::Errno::NOENT) if create => {
                    rfs::mkdirat(&cur, name, Mode::from_raw_mode(0o755))?;
                }
                Err(rustix::io::Errno::NOENT) => return Ok(self.path.join(rel)),
                Err(e) => return Err(e.into()),
            }
            cur = rfs::openat(
                &cur,
                name,
                nofollow_path() | OFlags::DIRECTORY,
                Mode::empty(),
            )?;
        }
        Ok(self.path.join(walked))
    }
}

fn mkdir_open(dir: &impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    match rfs::mkdirat(dir, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(rfs::openat(
        dir,
        name,
        nofollow_path() | OFlags::DIRECTORY,
        Mode::empty(),
    )?)
}

/// Removes whatever `name` is in `dir` (file, link, or a whole tree, walked
/// by fd without following links), if anything.
pub fn remove_at(dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            clear_dir(&open_dir_at(dir, name)?)?;
            rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
            Ok(())
        }
        Ok(_) => Ok(rfs::unlinkat(dir, name, AtFlags::empty())?),
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes every entry of an open directory.
pub fn clear_dir(dir: &OwnedFd) -> io::Result<()> {
    for n in dir_names(dir)? {
        remove_at(dir, &n)?;
    }
    Ok(())
}

/// The names in an open directory (`.` and `..` left out).
pub fn dir_names(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    let mut d = rfs::Dir::read_from(dir)?;
    while let Some(e) = d.read() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(OsStr::from_bytes(n).to_owned());
        }
    }
    Ok(names)
}

/// Whether `name` in `dir` is a directory itself (not a link to one).
pub fn is_dir_at(dir: &impl AsFd, name: &OsStr) -> bool {
    matches!(rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory)
}

/// Opens directory `name` in `dir` for reading, never through a link.
pub fn open_dir_at(dir: &impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}
