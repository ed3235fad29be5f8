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
//! `whiteouts`, `contribution` (what a layer gave a partial unpack, as a
//! tar to replay), `exact` (a layer's one gzip member or zstd frame, and
//! nothing after it), `limits` (what one image may put where kiln unpacks),
//! `owners` (the owners a non-root unpack could not set); the walk over a
//! layer's entries is here.

mod contribution;
mod entries;
mod exact;
mod limits;
mod owners;
mod whiteouts;

pub use contribution::{Contribution, Elide, ELIDED};
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

/// What a contribution noted of a file it elided ([`ELIDED`]), if it did.
fn elided_note(entry: &mut tar::Entry<'_, impl Read>) -> anyhow::Result<Option<String>> {
    let Some(exts) = entry.pax_extensions()? else {
        return Ok(None);
    };
    for ext in exts.flatten() {
        if ext.key().ok() == Some(ELIDED) {
            return Ok(Some(
                String::from_utf8_lossy(ext.value_bytes()).into_owned(),
            ));
        }
    }
    Ok(None)
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
    /// Each entry acted on, noted as this layer's contribution.
    noted: Option<&'a mut Contribution<std::fs::File>>,
    /// Files a contribution elided, where they were put (empty) and what
    /// it noted of them.
    elided: Vec<(PathBuf, String)>,
}

/// Applies one layer blob (compressed or not) to `root`, in one pass.
/// Device nodes and FIFOs are never created (skipped).
pub fn apply_layer(root: &Path, layer: &Path) -> anyhow::Result<()> {
    apply(root, layer, None, None, None, None, None).map(|_| ())
}

/// [`apply_layer`], refusing a device node or FIFO at a path `guarded`
/// says yes to (where a node's store and config go) instead of skipping it.
pub fn apply_layer_guarded(
    root: &Path,
    layer: &Path,
    guarded: fn(&Path) -> bool,
    budget: &mut Budget,
) -> anyhow::Result<()> {
    apply(root, layer, None, None, Some(guarded), Some(budget), None).map(|_| ())
}

/// [`apply_layer`] for just the paths `only` says yes to (entries, and
/// whiteouts over them), noting the header owners of the paths `owners`
/// tracks, and, given `noted`, every entry it acts on: what this layer
/// gave the part ([`Contribution`]). A node-image build needs a few paths
/// of a base, not all of it.
pub fn apply_layer_part(
    root: &Path,
    layer: &Path,
    owners: &mut Owners,
    only: fn(&Path) -> bool,
    budget: &mut Budget,
    noted: Option<&mut Contribution<std::fs::File>>,
) -> anyhow::Result<()> {
    apply(
        root,
        layer,
        Some(owners),
        Some(only),
        Some(only),
        Some(budget),
        noted,
    )
    .map(|_| ())
}

/// Applies a layer's [`Contribution`] in the layer's place: every entry in
/// it (it holds only what the part took), its owners noted, devices and
/// FIFOs refused where `guarded` says (a contribution holds none). Returns
/// the files it elided (each left empty) and what it noted of each.
pub fn apply_contribution(
    root: &Path,
    contribution: &Path,
    owners: &mut Owners,
    guarded: fn(&Path) -> bool,
    budget: &mut Budget,
) -> anyhow::Result<Vec<(PathBuf, String)>> {
    apply(
        root,
        contribution,
        Some(owners),
        None,
        Some(guarded),
        Some(budget),
        None,
    )
}

fn apply(
    root: &Path,
    layer: &Path,
    owners: Option<&mut Owners>,
    only: Option<fn(&Path) -> bool>,
    guarded: Option<fn(&Path) -> bool>,
    budget: Option<&mut Budget>,
    noted: Option<&mut Contribution<std::fs::File>>,
) -> anyhow::Result<Vec<(PathBuf, String)>> {
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
        noted,
        elided: Vec::new(),
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
    let elided = std::mem::take(&mut a.elided);
    a.finish_dirs()?;
    Ok(elided)
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
            self.opaque(parent)?;
            return self.note(&path, entry, None);
        }
        if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
            if !hidden.is_empty() && hidden != b"." && hidden != b".." {
                let gone = parent.join(OsStr::from_bytes(hidden));
                if let Some(o) = self.owners.as_deref_mut() {
                    o.forget(&gone, false);
                }
                self.whiteout(&gone)?;
                return self.note(&path, entry, None);
            }
            return Ok(());
        }
        let dest = self.root.resolve(&path, Parents::Create, false)?;
        if let Some(note) = elided_note(entry)? {
            self.elided.push((dest.real.clone(), note));
        }
        if self.create(&dest, entry)? {
            if let Some(o) = self.owners.as_deref_mut() {
                o.note(&dest.real, entry.header());
            }
            if self.noted.is_some() {
                // Where it was written (links resolved), read back from there.
                let data = match entry.header().entry_type() {
                    tar::EntryType::Regular
                    | tar::EntryType::Continuous
                    | tar::EntryType::GNUSparse => Some(std::fs::File::from(rustix::fs::openat(
                        &dest.dir,
                        dest.name.as_os_str(),
                        rustix::fs::OFlags::RDONLY
                            | rustix::fs::OFlags::NOFOLLOW
                            | rustix::fs::OFlags::CLOEXEC,
                        rustix::fs::Mode::empty(),
                    )?)),
                    _ => None,
                };
                self.note(&dest.real, entry, data)?;
            }
            self.written.insert(dest.real);
        }
        Ok(())
    }

    /// Notes the entry just acted on in the contribution, if one is kept.
    fn note(
        &mut self,
        at: &Path,
        entry: &mut tar::Entry<'_, impl Read>,
        data: Option<std::fs::File>,
    ) -> anyhow::Result<()> {
        let Some(noted) = self.noted.as_deref_mut() else {
            return Ok(());
        };
        let mut xattrs = Vec::new();
        if let Some(exts) = entry.pax_extensions()? {
            for ext in exts.flatten() {
                if let Ok(k) = ext.key() {
                    if k.starts_with("SCHILY.xattr.") {
                        xattrs.push((k.to_string(), ext.value_bytes().to_vec()));
                    }
                }
            }
        }
        noted.note(at, entry.header(), data, &xattrs)
    }
}

#[cfg(test)]
mod tests;
