//! Applies image layers to a directory, as containerd does when it unpacks:
//! OCI whiteouts (`.wh.NAME`, `.wh..wh..opq`), hard and symbolic links,
//! modes, ownership and xattrs where permitted; gzip, zstd or plain tar.
//!
//! No entry ever reaches outside the root: every path is resolved inside it
//! the way a chroot would, so `..`, absolute paths and symlinks (including one
//! an earlier layer planted) are clamped to the root rather than followed out.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io::{BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
/// Symlinks followed while resolving one path, as Linux allows (40).
const MAX_LINKS: usize = 40;

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

/// The path inside the archive, as root-relative components; `..` above the
/// root and a leading `/` are clamped away.
fn clean(p: &Path) -> PathBuf {
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

/// Resolves `rel` inside `root` like a chroot would; the last component is
/// not followed (it is what the caller creates or replaces).
pub fn resolve_in(root: &Path, rel: &Path) -> anyhow::Result<PathBuf> {
    let mut cur = PathBuf::new();
    let mut todo: VecDeque<OsString> = clean(rel)
        .components()
        .map(|c| c.as_os_str().to_owned())
        .collect();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&name);
        if todo.is_empty() {
            cur = next;
            break;
        }
        let full = root.join(&next);
        match fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    bail!("too many symlinks resolving {}", rel.display());
                }
                let target = fs::read_link(&full)?;
                if target.is_absolute() {
                    cur = PathBuf::new();
                }
                let mut parts: VecDeque<OsString> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(s) => Some(s.to_owned()),
                        Component::ParentDir => Some(OsString::from("..")),
                        _ => None,
                    })
                    .collect();
                parts.extend(todo.drain(..));
                todo = parts;
            }
            _ => cur = next,
        }
    }
    Ok(root.join(cur))
}

/// Removes whatever is at `p` (file, link or tree), if anything.
fn remove(p: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p),
        Ok(_) => fs::remove_file(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates the parents of `p` (already resolved inside the root).
fn parents(root: &Path, p: &Path) -> anyhow::Result<()> {
    let parent = p.parent().expect("resolved paths are under the root");
    if !parent.exists() {
        let rel = parent.strip_prefix(root).unwrap_or(Path::new(""));
        let mut cur = root.to_path_buf();
        for c in rel.components() {
            cur.push(c);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    remove(&cur)?;
                    fs::create_dir(&cur)?;
                }
                Err(_) => fs::create_dir(&cur)?,
            }
        }
    }
    Ok(())
}

/// Applies one layer blob (compressed or not) to `root`.
pub fn apply_layer(root: &Path, layer: &Path) -> anyhow::Result<()> {
    let root = root.canonicalize()?;
    let is_root = nix::unistd::geteuid().is_root();
    // Whiteouts hide what lower layers had; apply them before this layer's
    // own entries, whatever their order in the tar.
    let mut tar = tar::Archive::new(open_layer(layer)?);
    for entry in tar.entries()? {
        let entry = entry?;
        let path = clean(&entry.path()?);
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let dir = resolve_in(
            &root,
            path.parent().unwrap_or(Path::new("")).join("x").as_path(),
        )?;
        let dir = dir.parent().expect("joined").to_path_buf();
        if name == OPAQUE {
            if let Ok(rd) = fs::read_dir(&dir) {
                for child in rd.flatten() {
                    remove(&child.path())?;
                }
            }
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if !hidden.is_empty() && hidden != "." && hidden != ".." {
                remove(&dir.join(hidden))?;
            }
        }
    }
    let mut tar = tar::Archive::new(open_layer(layer)?);
    let mut dirs = Vec::new();
    for entry in tar.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let path = clean(&raw);
        if path.as_os_str().is_empty() {
            continue;
        }
        if path
            .file_name()
            .is_some_and(|n| n.as_bytes().starts_with(WHITEOUT_PREFIX.as_bytes()))
        {
            continue;
        }
        if raw.is_absolute() || raw.components().any(|c| c == Component::ParentDir) {
            tracing::warn!(
                "layer {}: entry {} clamped inside the rootfs",
                layer.display(),
                raw.display()
            );
        }
        let dest = resolve_in(&root, &path)?;
        parents(&root, &dest)?;
        let h = entry.header().clone();
        let kind = h.entry_type();
        let mode = h.mode().unwrap_or(0o644) & 0o7777;
        match kind {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&dest) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove(&dest)?;
                        fs::create_dir(&dest)?;
                    }
                    Err(_) => fs::create_dir(&dest)?,
                }
                dirs.push((dest.clone(), mode));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove(&dest)?;
                let mut f = fs::File::create(&dest)
                    .with_context(|| format!("creating {}", dest.display()))?;
                std::io::copy(&mut entry, &mut f)?;
                fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
            }
            tar::EntryType::Symlink => {
                let target = h
                    .link_name()?
                    .ok_or_else(|| anyhow!("symlink {} without target", raw.display()))?;
                remove(&dest)?;
                std::os::unix::fs::symlink(&*target, &dest)?;
            }
            tar::EntryType::Link => {
                let target = h
                    .link_name()?
                    .ok_or_else(|| anyhow!("hard link {} without target", raw.display()))?;
                let src = resolve_in(&root, &target)?;
                remove(&dest)?;
                fs::hard_link(&src, &dest).with_context(|| {
                    format!("hard link {} -> {}", raw.display(), target.display())
                })?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                if is_root {
                    use nix::sys::stat::{mknod, Mode, SFlag};
                    let flag = match kind {
                        tar::EntryType::Char => SFlag::S_IFCHR,
                        tar::EntryType::Block => SFlag::S_IFBLK,
                        _ => SFlag::S_IFIFO,
                    };
                    let dev = nix::sys::stat::makedev(
                        h.device_major()?.unwrap_or(0) as u64,
                        h.device_minor()?.unwrap_or(0) as u64,
                    );
                    remove(&dest)?;
                    mknod(&dest, flag, Mode::from_bits_truncate(mode), dev)?;
                }
            }
            _ => continue,
        }
        if is_root {
            // A header without owner fields (some tools write none) means root.
            let (uid, gid) = (h.uid().unwrap_or(0) as u32, h.gid().unwrap_or(0) as u32);
            nix::unistd::fchownat(
                None,
                &dest,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
            if kind == tar::EntryType::Regular && mode & 0o7000 != 0 {
                // chown clears setuid/setgid: set the mode again.
                fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
            }
        }
        if let Some(exts) = entry.pax_extensions()? {
            for ext in exts.flatten() {
                if let Some(name) = ext.key().ok().and_then(|k| k.strip_prefix("SCHILY.xattr.")) {
                    if kind != tar::EntryType::Symlink {
                        // Where not permitted (non-root, some filesystems) xattrs are skipped.
                        let _ = xattr::set(&dest, name, ext.value_bytes());
                    }
                }
            }
        }
    }
    // Directory modes last, so a read-only directory does not block its children.
    for (d, mode) in dirs.into_iter().rev() {
        fs::set_permissions(&d, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
