//! Applies image layers to a directory, as containerd does when it unpacks:
//! OCI whiteouts (`.wh.NAME`, `.wh..wh..opq`), hard and symbolic links,
//! modes, ownership and xattrs where permitted; gzip, zstd or plain tar.
//!
//! Layers are untrusted. Every path goes through the in-root resolver
//! ([`crate::primitives::inroot`]): `..`, absolute paths and symlinks (including ones an
//! earlier entry planted) are resolved inside the root, never followed out;
//! modes, owners and xattrs are set through file descriptors or `*at` calls
//! that do not follow the last component. Nothing in a layer is executed.
//! Device nodes and FIFOs are never created (refused where kiln's store,
//! config and kind files go); as non-root, setuid/setgid bits are dropped
//! (the files would belong to the builder, not to root).
//!
//! The rooms: `entries` (creating files, links, modes, owners, xattrs),
//! `whiteouts`, `exact` (a layer's one gzip member or zstd frame, and
//! nothing after it), `limits` (what one image may put where kiln unpacks),
//! `owners` (the owners a non-root unpack could not set); the walk over a
//! layer's entries is here.

mod entries;
mod exact;
mod limits;
mod owners;
mod whiteouts;

pub use exact::{open_exact, Exact, LayerCompression};
pub use limits::{Budget, Limits, LIMIT_FLAGS};
pub use owners::Owners;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, Context};

use crate::primitives::inroot::{clean, Parents, Root};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Opens a layer blob, decompressing by its magic bytes.
pub fn open_layer(path: &Path) -> anyhow::Result<Box<dyn Read>> {
    decompress(fs::File::open(path)?)
}

/// A layer blob's tar, decompressed by its magic bytes.
pub fn decompress(blob: impl Read + 'static) -> anyhow::Result<Box<dyn Read>> {
    let mut f = BufReader::new(blob);
    let mut magic = [0u8; 4];
    let n = read_full(&mut f, &mut magic)?;
    let head = std::io::Cursor::new(magic[..n].to_vec()).chain(f);
    Ok(match &magic[..n] {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(head)),
        // The same zstd (libzstd) that writes kiln's zstd layers reads
        // them: one implementation of the format.
        [0x28, 0xb5, 0x2f, 0xfd] => {
            Box::new(zstd::stream::read::Decoder::new(head).map_err(|e| anyhow!("zstd: {e}"))?)
        }
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
            // What will be written, not the ustar size field: a PAX `size`
            // record overrides the header's, and a GNU sparse entry is
            // written out at its logical size (`Entry::size` is both).
            let size = match entry.header().entry_type() {
                tar::EntryType::Regular
                | tar::EntryType::Continuous
                | tar::EntryType::GNUSparse => entry.size(),
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

    /// Issue 39.1: the budget charges what an entry writes. A PAX `size`
    /// record overrides a ustar size of 0, and a GNU sparse entry is
    /// written at its logical size; both were charged their header's size.
    #[test]
    fn the_budget_charges_pax_and_sparse_sizes_as_written() {
        fn counted(_: &Path) -> bool {
            true
        }
        let limits = Limits {
            bytes: 1000,
            ..Limits::default()
        };
        let pax = kiln_testkit::base::pax_sized_tar("store/pax", &[7u8; 4096]);
        let sparse = kiln_testkit::base::sparse_tar("store/sparse", 1 << 20, &[1u8; 512]);
        for (tar, name) in [(pax, "store/pax"), (sparse, "store/sparse")] {
            let f = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(f.path(), &tar).unwrap();
            let root = tempfile::tempdir().unwrap();
            let mut budget = Budget::new(limits, counted);
            let e = apply_layer_guarded(root.path(), f.path(), counted, &mut budget).unwrap_err();
            let text = format!("{e:#}");
            assert!(
                text.contains(name)
                    && text.contains("more than 1000 bytes")
                    && text.contains("--max-bytes"),
                "{text}"
            );
            assert!(!root.path().join(name).exists(), "{name} was written");
            // Within the limit, the same entries are written at that size.
            let root = tempfile::tempdir().unwrap();
            let mut budget = Budget::new(Limits::default(), counted);
            apply_layer_guarded(root.path(), f.path(), counted, &mut budget).unwrap();
            let len = std::fs::metadata(root.path().join(name)).unwrap().len();
            assert_eq!(len, if name.ends_with("pax") { 4096 } else { 1 << 20 });
        }
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
