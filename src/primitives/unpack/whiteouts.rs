//! OCI whiteouts: `.wh.NAME` removes a lower layer's path, `.wh..wh..opq`
//! clears a directory of what lower layers put there.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::Path;

use super::Apply;
use crate::primitives::inroot::{dir_names, is_dir_at, open_dir_at, remove_at, Parents};

impl Apply<'_> {
    /// `.wh.NAME`: what lower layers had at NAME goes (not this layer's own).
    pub(super) fn whiteout(&mut self, path: &Path) -> anyhow::Result<()> {
        let Ok(e) = self.root.resolve(path, Parents::Existing, false) else {
            return Ok(());
        };
        if self.written.contains(&e.real) {
            return Ok(());
        }
        self.remove_lower(&e.dir, &e.name, &e.real)
    }

    /// `.wh..wh..opq`: the directory keeps only what this layer put in it.
    pub(super) fn opaque(&mut self, dir: &Path) -> anyhow::Result<()> {
        let Ok((fd, real)) = self.root.open_dir(dir, Parents::Existing) else {
            return Ok(());
        };
        self.clear_lower(&fd, &real)
    }

    /// Removes `name` unless this layer wrote it or something below it.
    fn remove_lower(&self, dir: &OwnedFd, name: &OsStr, real: &Path) -> anyhow::Result<()> {
        if self.written.contains(real) {
            return Ok(());
        }
        let has_own = self
            .written
            .range(real.to_path_buf()..)
            .next()
            .is_some_and(|w| w.starts_with(real));
        if !has_own {
            remove_at(dir, name)?;
            return Ok(());
        }
        self.clear_lower(&open_dir_at(dir, name)?, real)
    }

    fn clear_lower(&self, dir: &OwnedFd, real: &Path) -> anyhow::Result<()> {
        for n in dir_names(dir)? {
            let child = real.join(&n);
            if self.written.contains(&child) {
                if is_dir_at(dir, &n) {
                    self.clear_lower(&open_dir_at(dir, &n)?, &child)?;
                }
                continue;
            }
            self.remove_lower(dir, &n, &child)?;
        }
        Ok(())
    }
}
