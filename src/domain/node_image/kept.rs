//! The previous node image's layers this one no longer needs, kept where
//! they were, so the layers after them keep their chain (`order`): when an
//! image of the set drops a large blob, its layer sits mid-chain, and
//! leaving it out changes the ChainID of every layer after it, which
//! Docker's classic store then downloads again and containerd unpacks
//! again (`make bench` (n), (o)).
//!
//! A kept layer is the previous image's blob, byte for byte (fetched and
//! verified by its digest), and is trusted for nothing else: it is read
//! through before it is kept, and kept only if it holds what kiln's own
//! blob layers hold, content blobs under the store's blob directory, each
//! hashing to its name, and their parent directories. The build's own
//! layer, last, whites out each of its blobs the node no longer has and
//! writes its directories again, so the unpacked tree is what it would be
//! without it.
//!
//! What it costs: its bytes, for a first pull. So a layer is kept only
//! while that is less than what it saves (the shared layers after it), the
//! kept bytes stay within a share of kiln's own (`--keep-previous-layers`,
//! [`KEEP_PREVIOUS`] percent unless told), and the layer budget holds; the
//! first one that cannot be kept ends the keeping (the chain breaks there
//! anyway) and that release re-chains the layers after it.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::plan::BLOBS;
use super::LayerBlob;
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor};

/// Kept bytes at most this percentage of kiln's own layers' bytes, unless
/// `--keep-previous-layers` says otherwise. `make bench` (g) drops a
/// 256 MiB layer of about 800 MiB (32 %): a release replacing one large
/// image's layer is the case this is for.
pub const KEEP_PREVIOUS: u8 = 50;

/// What may be kept: the previous image's layers (its whole list), the
/// base's, how many layers the budget leaves ([`super::plan::budget`], the
/// build's own layer counted) and the percentage.
pub struct Keep<'a> {
    pub previous: &'a [Descriptor],
    pub base: &'a [Descriptor],
    pub room: usize,
    pub percent: u8,
}

impl Keep<'_> {
    /// Which of the previous image's layers to keep: those the new layers
    /// (`new`, in any order) no longer have, in order, while each costs
    /// less than the shared layers after it, their bytes stay within the
    /// percentage of `new`'s and the room holds. None when the previous
    /// image was not built on this base (its layers after the base's are
    /// then not kiln's alone, and the chain breaks at the base anyway).
    pub fn choose<'l>(&self, new: impl IntoIterator<Item = &'l LayerBlob>) -> Vec<Descriptor> {
        let (previous, base) = (self.previous, self.base);
        let built_on_base = previous.len() >= base.len()
            && previous.iter().zip(base).all(|(p, b)| p.digest == b.digest);
        if !built_on_base {
            return Vec::new();
        }
        let tail = &previous[base.len()..];
        let (mut new_digests, mut new_bytes) = (HashSet::new(), 0u64);
        for l in new {
            new_digests.insert(&l.digest);
            new_bytes += l.size;
        }
        let shared = |l: &Descriptor| new_digests.contains(&l.digest);
        let cap = new_bytes * u64::from(self.percent) / 100;
        let mut room = self.room.saturating_sub(new_digests.len());
        let (mut bytes, mut out) = (0u64, Vec::new());
        for (i, l) in tail.iter().enumerate() {
            if shared(l) || out.iter().any(|k: &Descriptor| k.digest == l.digest) {
                continue;
            }
            let saves: u64 = tail[i + 1..]
                .iter()
                .filter(|l| shared(l))
                .map(|l| l.size)
                .sum();
            if room == 0 || l.size >= saves || bytes + l.size > cap || media_type(l).is_none() {
                break;
            }
            bytes += l.size;
            room -= 1;
            out.push(l.clone());
        }
        out
    }
}

/// The media type kiln writes for `l`'s (a layer of its own kinds).
fn media_type(l: &Descriptor) -> Option<&'static str> {
    [
        media::OCI_LAYER_GZIP,
        media::OCI_LAYER_ZSTD,
        media::OCI_LAYER,
    ]
    .into_iter()
    .find(|m| *m == l.media_type)
}

/// A layer to keep: the layer, the whiteouts the build's layer adds for
/// its blobs the node no longer has, and its directories.
#[derive(Debug)]
pub struct Kept {
    pub layer: LayerBlob,
    pub whiteouts: Vec<PathBuf>,
    pub dirs: Vec<PathBuf>,
}

/// Reads the previous image's layer `desc` (`blob`, verified) through:
/// its diff ID, and whether it holds only what a kiln blob layer holds
/// (module doc). `Err` says why it cannot be kept.
pub fn check(
    blob: impl Read + 'static,
    desc: &Descriptor,
    root: &crate::primitives::inroot::Root,
    owners: &crate::primitives::unpack::Owners,
) -> anyhow::Result<Kept> {
    let media_type =
        media_type(desc).ok_or_else(|| anyhow::anyhow!("media type {}", desc.media_type))?;
    let tar_hash = Hashed {
        inner: crate::primitives::unpack::decompress(blob)?,
        hash: Sha256::new(),
    };
    let mut tar = tar::Archive::new(tar_hash);
    let (mut whiteouts, mut dirs, mut entries) = (Vec::new(), Vec::new(), 0);
    let blobs = Path::new(BLOBS);
    for e in tar.entries()? {
        let mut e = e?;
        let rel = e.path()?.into_owned();
        let plain = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            anyhow::bail!("entry {} is not a plain relative path", rel.display());
        }
        let h = e.header();
        match h.entry_type() {
            tar::EntryType::Directory if blobs.starts_with(&rel) => dirs.push(rel),
            tar::EntryType::Regular if super::plan::is_blob(&rel) => {
                let (mode, uid, gid) = (h.mode()? & 0o7777, h.uid()?, h.gid()?);
                let hex = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                let got = crate::primitives::digest::hash_read(&mut e, Sha256::new())?;
                if Digest::from_hasher(got).hex() != hex {
                    anyhow::bail!("{} does not hash to its name", rel.display());
                }
                match root.lstat(&rel) {
                    // The node has this blob: the same bytes, and it must
                    // read as the node's own (mode and owner).
                    Some(st) => {
                        let own = owners.get(&rel).unwrap_or((0, 0));
                        if st.st_mode & 0o7777 != mode || own != (uid, gid) {
                            anyhow::bail!(
                                "{} has mode {mode:o} and owner {uid}:{gid}, not the node's",
                                rel.display()
                            );
                        }
                    }
                    None => whiteouts.push(super::snapshot::whiteout(&rel)),
                }
            }
            other => anyhow::bail!("entry {} ({other:?}) is not kiln's", rel.display()),
        }
        entries += 1;
    }
    // The tar's end and any padding count in its diff ID.
    let mut rest = tar.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink())?;
    Ok(Kept {
        layer: LayerBlob {
            media_type,
            digest: desc.digest.clone(),
            size: desc.size,
            diff_id: Digest::from_hasher(rest.hash),
            entries,
            holds: "kiln: kept from the previous node image (blobs no longer used are whited out in the last layer)".into(),
            cached: false,
        },
        whiteouts,
        dirs,
    })
}

/// The previous image's layers to keep in place ([`Keep::choose`]), each
/// fetched from `from` (verified by its digest) and read through
/// ([`check`]). The first that cannot be had or kept ends the
/// keeping: the chain breaks there, which costs the next pull bytes, not
/// the build.
pub(super) async fn keep_previous(
    layout: &crate::sink::layout::OciLayout,
    (source, image): (
        &crate::source::AnySource<'_>,
        &crate::primitives::reference::ImageRef,
    ),
    keep: Keep<'_>,
    layers: &[(super::plan::Part, LayerBlob)],
    root: &crate::primitives::inroot::Root,
    owners: &crate::primitives::unpack::Owners,
    cache: Option<&crate::sink::cache::Cache>,
) -> Vec<Kept> {
    // The copy engine's own blob copy: verified as it streams, through the
    // cache (a rebuild reads it from there), retried as every blob is.
    let engine = crate::engine::copy::Engine::new(
        source,
        layout,
        1,
        crate::primitives::progress::Progress::hidden(),
    );
    let opts = crate::engine::copy::CopyOptions {
        platforms: Vec::new(),
        jobs: 1,
        cache: cache.cloned(),
        gate: None,
    };
    let mut out = Vec::new();
    for d in keep.choose(layers.iter().map(|(_, l)| l)) {
        let got = async {
            engine.copy_layer(image, &d, &opts).await?;
            let blob = layout.open_blob(&d.digest)?;
            crate::primitives::blocking::off_runtime(|| check(blob, &d, root, owners))
        }
        .await;
        match got {
            Ok(k) => out.push(k),
            Err(e) => {
                tracing::warn!(
                    "{image}: its layer {} is not kept in place ({e:#}); the layers after it are fetched again by Docker and unpacked again by containerd",
                    d.digest
                );
                break;
            }
        }
    }
    out
}

/// A reader hashing what it reads (the layer's tar, for its diff ID).
struct Hashed<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(name: &str, size: u64) -> Descriptor {
        Descriptor::new(media::OCI_LAYER_GZIP, Digest::of(name.as_bytes()), size)
    }

    fn blob(name: &str, size: u64) -> LayerBlob {
        LayerBlob {
            media_type: media::OCI_LAYER_GZIP,
            digest: Digest::of(name.as_bytes()),
            size,
            diff_id: Digest::of(name.as_bytes()),
            entries: 1,
            holds: name.into(),
            cached: false,
        }
    }

    fn names(ds: &[Descriptor]) -> Vec<Digest> {
        ds.iter().map(|d| d.digest.clone()).collect()
    }

    /// An image's dropped blob mid-chain is kept; one after the last
    /// shared layer (nothing to save) is not (issue 44, bench (n)).
    #[test]
    fn a_dropped_layer_mid_chain_is_kept_and_one_at_the_end_is_not() {
        let base = [d("base", 100)];
        let previous = [
            d("base", 100),
            d("shared-a", 50),
            d("dropped", 20),
            d("shared-b", 60),
            d("old-docs", 1),
            d("old-node", 1),
        ];
        let new = [
            blob("shared-a", 50),
            blob("shared-b", 60),
            blob("fresh", 30),
            blob("docs", 1),
            blob("node", 1),
        ];
        let keep = |base: &[Descriptor], room: usize, percent: u8| {
            Keep {
                previous: &previous,
                base,
                room,
                percent,
            }
            .choose(&new)
        };
        assert_eq!(names(&keep(&base, 10, 25)), [Digest::of(b"dropped")]);
        // Built on another base: nothing is kept.
        assert!(keep(&[d("other", 100)], 10, 25).is_empty());
        // No room left in the layer budget.
        assert!(keep(&base, new.len(), 25).is_empty());
        // --keep-previous-layers 0.
        assert!(keep(&base, 10, 0).is_empty());
    }

    /// Keeping costs less than it saves, and stays within its share.
    #[test]
    fn keeping_stops_where_it_costs_more_than_it_saves() {
        let base = [d("base", 100)];
        let new = [blob("shared", 60), blob("fresh", 300), blob("node", 1)];
        // Larger than the shared layer after it: re-downloading that is cheaper.
        let previous = [d("base", 100), d("dropped", 61), d("shared", 60)];
        let keep = |previous: &[Descriptor], new: &[LayerBlob], percent: u8| {
            Keep {
                previous,
                base: &base,
                room: 10,
                percent,
            }
            .choose(new)
        };
        assert!(keep(&previous, &new, 100).is_empty());
        // Within a quarter of kiln's 602 bytes (150): the first only.
        let new = [blob("shared", 600), blob("fresh", 1), blob("node", 1)];
        let previous = [
            d("base", 100),
            d("dropped-1", 80),
            d("dropped-2", 80),
            d("shared", 600),
        ];
        assert_eq!(
            names(&keep(&previous, &new, 25)),
            [Digest::of(b"dropped-1")]
        );
        // Within half (301): both.
        assert_eq!(keep(&previous, &new, 50).len(), 2);
    }

    /// A tar.gz of `entries` (path, content; `None`: a directory).
    fn layer_of(dir: &Path, entries: &[(&str, Option<&[u8]>)]) -> (PathBuf, Descriptor, Digest) {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, content) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            match content {
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    tar.append_data(&mut h, path, std::io::empty()).unwrap();
                }
                Some(bytes) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(0o444);
                    h.set_size(bytes.len() as u64);
                    tar.append_data(&mut h, path, *bytes).unwrap();
                }
            }
        }
        let raw = tar.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &raw).unwrap();
        let gz = gz.finish().unwrap();
        let path = dir.join(Digest::of(&gz).hex());
        std::fs::write(&path, &gz).unwrap();
        let desc = Descriptor::new(media::OCI_LAYER_GZIP, Digest::of(&gz), gz.len() as u64);
        (path, desc, Digest::of(&raw))
    }

    /// A kept layer is read through: kiln's shape only, every blob hashing
    /// to its name; the blobs the node lacks get whiteouts.
    #[test]
    fn only_a_layer_of_blobs_that_hash_to_their_names_is_kept() {
        let work = tempfile::tempdir().unwrap();
        let rootfs = work.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join(BLOBS)).unwrap();
        let root = crate::primitives::inroot::Root::open(&rootfs).unwrap();
        let owners = crate::primitives::unpack::Owners::new(|_| false);
        let content = b"an old layer".as_slice();
        let hex = Digest::of(content).hex().to_string();
        let file = format!("{BLOBS}/{hex}");
        let mut dirs: Vec<(String, Option<&'static [u8]>)> = Vec::new();
        let mut a = Path::new(BLOBS);
        loop {
            dirs.insert(0, (a.display().to_string(), None));
            match a.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(p) => a = p,
                None => break,
            }
        }
        let with = |extra: (&str, Option<&'static [u8]>)| -> Vec<(String, Option<&'static [u8]>)> {
            let mut all = dirs.clone();
            all.push((extra.0.to_string(), extra.1));
            all
        };
        let as_refs = |v: &Vec<(String, Option<&'static [u8]>)>| -> (PathBuf, Descriptor, Digest) {
            let r: Vec<(&str, Option<&[u8]>)> = v.iter().map(|(p, c)| (p.as_str(), *c)).collect();
            layer_of(work.path(), &r)
        };
        let (path, desc, diff_id) = as_refs(&with((&file, Some(content))));
        let open = |p: &Path| std::fs::File::open(p).unwrap();
        let kept = check(open(&path), &desc, &root, &owners).unwrap();
        assert_eq!(kept.layer.diff_id, diff_id);
        assert_eq!(kept.layer.digest, desc.digest);
        assert_eq!(
            kept.whiteouts,
            [Path::new(BLOBS).join(format!(".wh.{hex}"))]
        );
        assert_eq!(kept.dirs.len(), dirs.len());
        // The node has that blob: no whiteout.
        std::fs::write(rootfs.join(&file), content).unwrap();
        std::fs::set_permissions(
            rootfs.join(&file),
            std::os::unix::fs::PermissionsExt::from_mode(0o444),
        )
        .unwrap();
        assert!(check(open(&path), &desc, &root, &owners)
            .unwrap()
            .whiteouts
            .is_empty());
        // Anything else is refused: a file outside the blob directory, a
        // blob that does not hash to its name, a whiteout.
        for bad in [
            ("etc/passwd", Some(b"root::0:0::/:/bin/sh\n".as_slice())),
            (file.as_str(), Some(b"other bytes".as_slice())),
            (&*format!("{BLOBS}/.wh.{hex}"), Some(b"".as_slice())),
        ] {
            let (path, desc, _) = as_refs(&with(bad));
            assert!(
                check(open(&path), &desc, &root, &owners).is_err(),
                "{}",
                bad.0
            );
        }
    }
}
