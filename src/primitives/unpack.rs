//! Applies image layers to a directory, as containerd does when it unpacks:
//! OCI whiteouts (`.wh.NAME`, `.wh..wh..opq`), hard and symbolic links,
//! modes, ownership and xattrs where permitted; gzip, zstd or plain tar.
//!
//! Layers are untrusted. Every path goes through the in-root resolver
//! ([`crate::primitives::inroot`]): `..`, absolute paths and symlinks (including ones an
//! earlier entry planted) are resolved inside the root, never followed out;
//! modes, owners and xattrs are set through file descriptors or `*at` calls
//! that do not follow the last component. Nothing in a layer is executed.
//! As non-root, device nodes are skipped and setuid/setgid bits dropped (the
//! files would belong to the builder, not to root).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, Context};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use crate::primitives::inroot::{
    clean, dir_names, is_dir_at, open_dir_at, remove_at, Parents, Root,
};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Opens a layer blob, decompressing by its magic bytes.
pub fn open_layer(path: &Path) -> anyhow::Result<Box<dyn Read>> {
    let mut f = BufReader::new(fs::File::open(path)?);
    let mut magic = [0u8; 4];
    let n = read_full(&mut f, &mut magic)?;
    let head = std::io::Cursor::new(magic[..n].to_vec()).chain(f);
    Ok(match &magic[..n] {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(head)),
        [0x28, 0xb5, 0x2f, 0xfd] => Box::new(
            ruzstd::decoding::StreamingDecoder::new(head).map_err(|e| anyhow!("zstd: {e}"))?,
        ),
        _ => Box::new(head),
    })
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// One layer being applied: the root, who we are, and what this layer has
/// written so far (whiteouts hide only what lower layers had).
struct Apply<'a> {
    root: &'a Root,
    layer: &'a Path,
    is_root: bool,
    written: BTreeSet<PathBuf>,
    /// Directories to give their modes last, so a read-only one does not
    /// block its children.
    dirs: Vec<(PathBuf, u32)>,
    /// Header owners of the paths the caller tracks.
    owners: Option<&'a mut Owners>,
    /// Only these paths (and whiteouts over them) are applied.
    only: Option<fn(&Path) -> bool>,
    /// A device node or FIFO at these paths is refused (elsewhere skipped).
    guarded: Option<fn(&Path) -> bool>,
    /// What the layers may put where the budget counts.
    budget: Option<&'a mut Budget>,
}

/// Bounds on what an untrusted image may put under the paths kiln unpacks
/// and then works through (a node's store, its config, `/kind`): each later
/// phase is linear in what is there, and these keep that finite. A real
/// node's store (blobs, a few snapshots) is far below every default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Entries (files, directories, links), summed over all layers.
    pub entries: u64,
    /// Bytes of regular files, summed over all layers.
    pub bytes: u64,
    /// Path components below the root.
    pub depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            entries: 1_000_000,
            bytes: 64 << 30,
            depth: 128,
        }
    }
}

/// The flags that raise each limit (entries, bytes, depth; `cli::LimitArgs`),
/// so the line that ends a build says what to pass.
pub const LIMIT_FLAGS: [&str; 3] = ["--max-entries", "--max-bytes", "--max-depth"];

/// [`Limits`] being spent across the layers of one image, on the paths
/// `counted` says yes to.
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    counted: fn(&Path) -> bool,
    entries: u64,
    bytes: u64,
}

impl Budget {
    pub fn new(limits: Limits, counted: fn(&Path) -> bool) -> Self {
        Budget {
            limits,
            counted,
            entries: 0,
            bytes: 0,
        }
    }

    fn spend(&mut self, path: &Path, size: u64) -> Result<(), crate::primitives::error::BadInput> {
        if !(self.counted)(path) {
            return Ok(());
        }
        let over = |what: &str, limit: String, flag: &str| {
            crate::primitives::error::BadInput(format!(
                "{}: the image holds more than {limit} under what kiln unpacks ({what}); \
                 raise {flag} if you trust it",
                path.display()
            ))
        };
        let depth = path.components().count();
        if depth > self.limits.depth {
            let limit = format!("{} levels", self.limits.depth);
            return Err(over("path depth", limit, LIMIT_FLAGS[2]));
        }
        self.entries += 1;
        if self.entries > self.limits.entries {
            let limit = format!("{} entries", self.limits.entries);
            return Err(over("entries", limit, LIMIT_FLAGS[0]));
        }
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > self.limits.bytes {
            let limit = format!("{} bytes", self.limits.bytes);
            return Err(over("file bytes", limit, LIMIT_FLAGS[1]));
        }
        Ok(())
    }
}

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

    fn note(&mut self, rel: &Path, h: &tar::Header) {
        if (self.keep)(rel) {
            let owner = (h.uid().unwrap_or(0), h.gid().unwrap_or(0));
            self.map.insert(rel.to_path_buf(), owner);
        }
    }

    /// `rel` is gone (with everything under it; `keep_self` for an opaque
    /// directory, which stays).
    fn forget(&mut self, rel: &Path, keep_self: bool) {
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

/// Applies one layer blob (compressed or not) to `root`, in one pass.
/// Device nodes and FIFOs are never created (skipped).
pub fn apply_layer(root: &Path, layer: &Path) -> anyhow::Result<()> {
    apply(root, layer, None, None, None, None)
}

/// [`apply_layer`], refusing a device node or FIFO at a path `guarded`
/// says yes to (where a node's store and config go) instead of skipping it.
pub fn apply_layer_guarded(
    root: &Path,
    layer: &Path,
    guarded: fn(&Path) -> bool,
    budget: &mut Budget,
) -> anyhow::Result<()> {
    apply(root, layer, None, None, Some(guarded), Some(budget))
}

/// [`apply_layer`] for just the paths `only` says yes to (entries, and
/// whiteouts over them), noting the header owners of the paths `owners`
/// tracks. A node-image build needs a few paths of a base, not all of it.
pub fn apply_layer_part(
    root: &Path,
    layer: &Path,
    owners: &mut Owners,
    only: fn(&Path) -> bool,
    budget: &mut Budget,
) -> anyhow::Result<()> {
    apply(
        root,
        layer,
        Some(owners),
        Some(only),
        Some(only),
        Some(budget),
    )
}

fn apply(
    root: &Path,
    layer: &Path,
    owners: Option<&mut Owners>,
    only: Option<fn(&Path) -> bool>,
    guarded: Option<fn(&Path) -> bool>,
    budget: Option<&mut Budget>,
) -> anyhow::Result<()> {
    let root = Root::open(root).with_context(|| format!("opening {}", root.display()))?;
    let mut a = Apply {
        root: &root,
        layer,
        is_root: rustix::process::geteuid().is_root(),
        written: BTreeSet::new(),
        dirs: Vec::new(),
        owners,
        only,
        guarded,
        budget,
    };
    let mut tar = tar::Archive::new(open_layer(layer)?);
    for entry in tar.entries()? {
        crate::primitives::fault::point("unpack");
        crate::primitives::interrupt::check()?;
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        a.entry(&raw, &mut entry)
            .with_context(|| format!("layer entry {}", raw.display()))?;
    }
    a.finish_dirs()
}

impl Apply<'_> {
    fn entry(&mut self, raw: &Path, entry: &mut tar::Entry<'_, impl Read>) -> anyhow::Result<()> {
        let path = clean(raw);
        let Some(name) = path.file_name().map(OsStr::to_owned) else {
            return Ok(());
        };
        if raw.is_absolute() || raw.components().any(|c| c == Component::ParentDir) {
            tracing::warn!(
                "layer {}: entry {} resolved inside the rootfs",
                self.layer.display(),
                raw.display()
            );
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        if let Some(only) = self.only {
            // An opaque marker or a whiteout acts on its directory or target.
            let acts_on = if name.as_bytes() == OPAQUE.as_bytes() {
                parent.to_path_buf()
            } else if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                parent.join(OsStr::from_bytes(hidden))
            } else {
                path.clone()
            };
            if !only(&acts_on) {
                return Ok(());
            }
        }
        if let Some(b) = self.budget.as_deref_mut() {
            let h = entry.header();
            let size = match h.entry_type() {
                tar::EntryType::Regular
                | tar::EntryType::Continuous
                | tar::EntryType::GNUSparse => h.size().unwrap_or(0),
                _ => 0,
            };
            b.spend(&path, size)?;
        }
        if name.as_bytes() == OPAQUE.as_bytes() {
            if let Some(o) = self.owners.as_deref_mut() {
                o.forget(parent, true);
            }
            return self.opaque(parent);
        }
        if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
            if !hidden.is_empty() && hidden != b"." && hidden != b".." {
                let gone = parent.join(OsStr::from_bytes(hidden));
                if let Some(o) = self.owners.as_deref_mut() {
                    o.forget(&gone, false);
                }
                return self.whiteout(&gone);
            }
            return Ok(());
        }
        let dest = self.root.resolve(&path, Parents::Create, false)?;
        if self.create(&dest, entry)? {
            if let Some(o) = self.owners.as_deref_mut() {
                o.note(&dest.real, entry.header());
            }
            self.written.insert(dest.real);
        }
        Ok(())
    }

    /// Creates the entry at `dest` with its mode, owner and xattrs; false
    /// for kinds that are skipped (devices as non-root, sockets...).
    fn create(
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
    fn file(
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
    fn own(
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
    fn xattrs(
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

    /// `.wh.NAME`: what lower layers had at NAME goes (not this layer's own).
    fn whiteout(&mut self, path: &Path) -> anyhow::Result<()> {
        let Ok(e) = self.root.resolve(path, Parents::Existing, false) else {
            return Ok(());
        };
        if self.written.contains(&e.real) {
            return Ok(());
        }
        self.remove_lower(&e.dir, &e.name, &e.real)
    }

    /// `.wh..wh..opq`: the directory keeps only what this layer put in it.
    fn opaque(&mut self, dir: &Path) -> anyhow::Result<()> {
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

    /// Directory modes, deepest first, each through an fd opened without
    /// following: a directory a later entry replaced with a symlink is skipped.
    fn finish_dirs(self) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn layer(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> tempfile::NamedTempFile {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            {
                let gnu = h.as_gnu_mut().unwrap();
                gnu.name[..name.len()].copy_from_slice(name.as_bytes());
                gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(if *kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            });
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b.into_inner().unwrap()).unwrap();
        f
    }

    use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as S};

    #[test]
    fn whiteouts_opaque_dirs_and_links() {
        let root = tempfile::tempdir().unwrap();
        let l1 = layer(&[
            ("etc/", D, b"", ""),
            ("etc/old", F, b"old", ""),
            ("etc/keep", F, b"keep", ""),
            ("opq/a", F, b"a", ""),
            ("opq/b", F, b"b", ""),
            ("lnk", S, b"", "etc/keep"),
            ("hard", H, b"", "etc/keep"),
        ]);
        let l2 = layer(&[
            ("opq/c", F, b"c", ""),
            ("etc/.wh.old", F, b"", ""),
            ("opq/.wh..wh..opq", F, b"", ""),
        ]);
        apply_layer(root.path(), l1.path()).unwrap();
        apply_layer(root.path(), l2.path()).unwrap();
        let r = root.path();
        assert!(!r.join("etc/old").exists());
        assert_eq!(std::fs::read(r.join("etc/keep")).unwrap(), b"keep");
        let mut opq: Vec<String> = std::fs::read_dir(r.join("opq"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        opq.sort();
        assert_eq!(opq, ["c"], "opaque dir keeps only this layer's entries");
        assert_eq!(
            std::fs::read_link(r.join("lnk")).unwrap(),
            PathBuf::from("etc/keep")
        );
        assert_eq!(std::fs::read(r.join("hard")).unwrap(), b"keep");
    }

    #[test]
    fn a_part_is_extracted_with_its_whiteouts_and_owners() {
        fn only(p: &Path) -> bool {
            Path::new("etc/containerd").starts_with(p) || p.starts_with("etc/containerd")
        }
        let root = tempfile::tempdir().unwrap();
        let l1 = layer(&[
            ("etc/", D, b"", ""),
            ("etc/containerd/", D, b"", ""),
            ("etc/containerd/config.toml", F, b"v=2", ""),
            ("etc/containerd/old", F, b"old", ""),
            ("etc/passwd", F, b"root", ""),
            ("usr/share/doc", F, b"doc", ""),
        ]);
        let l2 = layer(&[
            ("etc/containerd/.wh.old", F, b"", ""),
            ("etc/.wh.passwd", F, b"", ""),
        ]);
        let mut owners = Owners::new(only);
        for l in [&l1, &l2] {
            let mut budget = Budget::new(Limits::default(), only);
            apply_layer_part(root.path(), l.path(), &mut owners, only, &mut budget).unwrap();
        }
        let r = root.path();
        assert_eq!(
            std::fs::read(r.join("etc/containerd/config.toml")).unwrap(),
            b"v=2"
        );
        assert!(!r.join("etc/containerd/old").exists());
        assert!(!r.join("etc/passwd").exists() && !r.join("usr").exists());
        assert_eq!(
            owners.get(Path::new("etc/containerd/config.toml")),
            Some((0, 0))
        );
        assert_eq!(
            owners.get(Path::new("etc/containerd/old")),
            None,
            "whited out"
        );
        assert_eq!(owners.get(Path::new("etc/passwd")), None, "not tracked");
    }

    #[test]
    fn limits_end_an_image_that_holds_too_much_where_kiln_unpacks() {
        fn counted(p: &Path) -> bool {
            p.starts_with("store")
        }
        let deep: String = (0..10).map(|i| format!("d{i}/")).collect();
        let deep = format!("store/{deep}");
        let big = vec![0u8; 3000];
        let l = layer(&[
            ("elsewhere/a", F, b"x", ""),
            ("elsewhere/b", F, b"x", ""),
            ("elsewhere/c", F, b"x", ""),
            ("store/", D, b"", ""),
            ("store/a", F, &big, ""),
            ("store/b", F, b"x", ""),
            (&deep, D, b"", ""),
        ]);
        let run = |limits: Limits| {
            let root = tempfile::tempdir().unwrap();
            let mut budget = Budget::new(limits, counted);
            let r = apply_layer_guarded(root.path(), l.path(), counted, &mut budget);
            r.map_err(|e| {
                assert!(
                    e.chain()
                        .any(|c| c.is::<crate::primitives::error::BadInput>()),
                    "{e:#}"
                );
                format!("{e:#}")
            })
        };
        let plenty = Limits {
            entries: 4,
            bytes: 3001,
            depth: 11,
        };
        run(plenty).expect("entries elsewhere do not count");
        let e = run(Limits {
            entries: 3,
            ..plenty
        })
        .unwrap_err();
        assert!(
            e.contains("more than 3 entries") && e.contains("--max-entries"),
            "{e}"
        );
        let e = run(Limits {
            bytes: 3000,
            ..plenty
        })
        .unwrap_err();
        assert!(e.contains("store/b") && e.contains("--max-bytes"), "{e}");
        let e = run(Limits {
            depth: 10,
            ..plenty
        })
        .unwrap_err();
        assert!(e.contains("10 levels") && e.contains("--max-depth"), "{e}");
    }

    #[test]
    fn hostile_entries_stay_inside() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let o = outside.path().display().to_string();
        let dotdot = format!("../../../../../../../../../..{o}/dotdot");
        let rel = format!("../../../../../../../../..{o}");
        let absolute = format!("{o}/absolute");
        let l1 = layer(&[
            (&dotdot, F, b"x", ""),
            ("escape", S, b"", &o),
            ("rel", S, b"", &rel),
            (&absolute, F, b"x", ""),
        ]);
        let l2 = layer(&[
            ("escape/pwned", F, b"x", ""),
            ("rel/pwned2", F, b"x", ""),
            ("hl", H, b"", "escape/../../../etc/passwd"),
        ]);
        apply_layer(root.path(), l1.path()).unwrap();
        let _ = apply_layer(root.path(), l2.path());
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "something was written outside the rootfs"
        );
        // Clamped inside instead.
        assert!(root
            .path()
            .join(o.trim_start_matches('/'))
            .join("pwned")
            .exists());
        assert!(root
            .path()
            .join(o.trim_start_matches('/'))
            .join("dotdot")
            .exists());
    }
}
