//! Creating one entry in the root: directories, regular files, hard and
//! symbolic links (never a device node or a FIFO); then its mode, owner and
//! xattrs, through file descriptors, never following the last component.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::fd::OwnedFd;

use anyhow::{anyhow, Context};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use super::Apply;
use crate::primitives::inroot::{clean, is_dir_at, open_dir_at, remove_at, Parents};

impl Apply<'_> {
    /// Creates the entry at `dest` with its mode, owner and xattrs; false
    /// for kinds that are skipped (devices as non-root, sockets...).
    pub(super) fn create(
        &mut self,
        dest: &crate::primitives::inroot::Entry,
        entry: &mut tar::Entry<'_, impl Read>,
    ) -> anyhow::Result<bool> {
        let h = entry.header().clone();
        let kind = h.entry_type();
        let mut mode = h.mode().unwrap_or(0o644) & 0o7777;
        if !self.is_root {
            mode &= !0o6000;
        }
        let (dir, name) = (&dest.dir, dest.name.as_os_str());
        match kind {
            tar::EntryType::Directory => {
                if !is_dir_at(dir, name) {
                    remove_at(dir, name)?;
                    rfs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?;
                }
                self.dirs.push((dest.real.clone(), mode));
                self.own(dir, name, &h, None)?;
                self.xattrs(entry, Some(open_dir_at(dir, name)?))?;
            }
            // GNU sparse files (bolt's meta.db is one, when tar finds its
            // holes) read back whole through the entry.
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                self.file(dir, name, entry, &h, mode)?
            }
            tar::EntryType::Symlink => {
                let target = h
                    .link_name()?
                    .ok_or_else(|| anyhow!("symlink without target"))?;
                remove_at(dir, name)?;
                rfs::symlinkat(&*target, dir, name)?;
                self.own(dir, name, &h, None)?;
            }
            tar::EntryType::Link => {
                let target = h
                    .link_name()?
                    .ok_or_else(|| anyhow!("hard link without target"))?;
                let src = self
                    .root
                    .resolve(&clean(&target), Parents::Existing, false)?;
                remove_at(dir, name)?;
                // Not AT_SYMLINK_FOLLOW: a link to a symlink links the symlink.
                rfs::linkat(&src.dir, src.name.as_os_str(), dir, name, AtFlags::empty())
                    .with_context(|| format!("hard link to {}", target.display()))?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                // kiln never creates a device node or a FIFO: a private
                // containerd (root) that opened one in a store would write
                // to whatever disk its numbers name. Nothing kiln reads
                // needs them. What kiln owns may not hold them at all.
                let what = match kind {
                    tar::EntryType::Char => "a character device",
                    tar::EntryType::Block => "a block device",
                    _ => "a FIFO",
                };
                let numbers = match (
                    h.device_major().ok().flatten(),
                    h.device_minor().ok().flatten(),
                ) {
                    (Some(ma), Some(mi)) if kind != tar::EntryType::Fifo => format!(" ({ma}:{mi})"),
                    _ => String::new(),
                };
                if self.guarded.is_some_and(|g| g(&dest.real)) {
                    return Err(crate::primitives::error::BadInput(format!(
                        "/{} is {what}{numbers}; kiln takes only directories, regular files and links where a node's store, config and kind files go: remove it from the base image",
                        dest.real.display()
                    ))
                    .into());
                }
                tracing::debug!(
                    "layer {}: not creating {what}{numbers} at {}",
                    self.layer.display(),
                    dest.real.display()
                );
                return Ok(false);
            }
            other => {
                tracing::warn!(
                    "layer {}: skipping {} (tar entry type {other:?})",
                    self.layer.display(),
                    dest.real.display()
                );
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A regular file, created fresh (never through what was there), its
    /// owner set before its mode (chown clears setuid), through its fd.
    pub(super) fn file(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        entry: &mut tar::Entry<'_, impl Read>,
        h: &tar::Header,
        mode: u32,
    ) -> anyhow::Result<()> {
        remove_at(dir, name)?;
        let fd = rfs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut f = fs::File::from(fd);
        std::io::copy(entry, &mut f)?;
        self.own(dir, name, h, Some(&f))?;
        rfs::fchmod(&f, Mode::from_raw_mode(mode))?;
        self.xattrs(entry, Some(f.into()))
    }

    /// Owner from the header (none means root), as root only; through the
    /// open file, or `fchownat` without following the last component.
    pub(super) fn own(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        h: &tar::Header,
        file: Option<&fs::File>,
    ) -> anyhow::Result<()> {
        if !self.is_root {
            return Ok(());
        }
        let uid = Some(rfs::Uid::from_raw(h.uid().unwrap_or(0) as u32));
        let gid = Some(rfs::Gid::from_raw(h.gid().unwrap_or(0) as u32));
        match file {
            Some(f) => rfs::fchown(f, uid, gid)?,
            None => rfs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?,
        }
        Ok(())
    }

    /// PAX `SCHILY.xattr.*` through the entry's own fd; skipped where not
    /// permitted (non-root, some filesystems) and on links and devices.
    pub(super) fn xattrs(
        &self,
        entry: &mut tar::Entry<'_, impl Read>,
        fd: Option<OwnedFd>,
    ) -> anyhow::Result<()> {
        let (Some(fd), Some(exts)) = (fd, entry.pax_extensions()?) else {
            return Ok(());
        };
        for ext in exts.flatten() {
            if let Some(name) = ext.key().ok().and_then(|k| k.strip_prefix("SCHILY.xattr.")) {
                let _ = rfs::fsetxattr(&fd, name, ext.value_bytes(), rfs::XattrFlags::empty());
            }
        }
        Ok(())
    }

    /// Directory modes, deepest first, each through an fd opened without
    /// following: a directory a later entry replaced with a symlink is skipped.
    pub(super) fn finish_dirs(self) -> anyhow::Result<()> {
        for (real, mode) in self.dirs.into_iter().rev() {
            let Ok(e) = self.root.resolve(&real, Parents::Existing, false) else {
                continue;
            };
            let Ok(fd) = open_dir_at(&e.dir, &e.name) else {
                continue;
            };
            rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
        }
        Ok(())
    }
}
