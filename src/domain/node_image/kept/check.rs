//! Whether a layer of the previous node image may be kept: it must be one
//! kiln could have written (`reread`: every byte as kiln's writer writes
//! it, one gzip member or zstd frame and nothing after: `exact`), hold
//! only what kiln's blob layers hold (the store's blob directory and its
//! parents, content blobs that hash to their names), read as the node's
//! own where the node has the same path (mode, owner, kiln's content
//! mtime), and stay within the unpack budget the base's layers spend.
//! So the tree every reader unpacks is the one kiln would have made
//! without it, but for the blobs the node no longer has, which the build's
//! last layer whites out.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use sha2::{Digest as _, Sha256};

use super::super::plan::{is_blob, BLOBS, CONTENT_MTIME};
use super::super::reread::reread_blob;
use super::super::{KeyedEntry, LayerBlob, What};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor};
use crate::primitives::unpack::{Budget, LayerCompression, Owners};

/// A kept layer inflates to at most this many times its compressed size
/// (plus [`INFLATE_SLACK`]): kiln's blob layers store blobs that are
/// compressed already (near 1×), its documents' layers inflate some 5×.
/// More is a bomb or not kiln's, and no more of it is read.
pub const INFLATE_MAX: u64 = 32;
pub const INFLATE_SLACK: u64 = 1 << 20;

/// A layer to keep: the layer, and the whiteouts the build's layer adds
/// for its blobs the node no longer has.
#[derive(Debug, Clone)]
pub struct Kept {
    pub layer: LayerBlob,
    pub whiteouts: Vec<PathBuf>,
}

/// The media type kiln gives a kept layer of `media_type`: the OCI name of
/// the same bytes (a Docker gzip layer is an OCI gzip layer).
pub(super) fn kept_media_type(media_type: &str) -> Option<&'static str> {
    Some(match LayerCompression::of(media_type)? {
        LayerCompression::Gzip => media::OCI_LAYER_GZIP,
        LayerCompression::Zstd => media::OCI_LAYER_ZSTD,
        LayerCompression::None => media::OCI_LAYER,
    })
}

/// One entry of a layer that may be kept, as read or as recorded.
struct Seen<'e> {
    path: &'e Path,
    dir: bool,
    mode: u32,
    owner: (u64, u64),
    mtime: u64,
}

/// The rules every entry of a kept layer meets (module doc), written once
/// for a layer read through and a layer recorded: a blob the node lacks
/// gives its whiteout.
fn judge(
    e: &Seen<'_>,
    root: &crate::primitives::inroot::Root,
    owners: &Owners,
    whiteouts: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let rel = e.path;
    if e.mtime != CONTENT_MTIME {
        bail!(
            "{} has mtime {}, not kiln's {CONTENT_MTIME}",
            rel.display(),
            e.mtime
        );
    }
    let on_node = root.lstat(rel);
    let node_own = |st: &rustix::fs::Stat| (st.st_mode & 0o7777, owners.get(rel).unwrap_or((0, 0)));
    let not_the_nodes = || {
        let node = match &on_node {
            Some(st) => {
                let (mode, (uid, gid)) = node_own(st);
                format!("mode {mode:o} and owner {uid}:{gid}")
            }
            None => "none".to_string(),
        };
        anyhow!(
            "{}{} has mode {:o} and owner {}:{}, not the node's ({node})",
            if e.dir { "directory " } else { "" },
            rel.display(),
            e.mode,
            e.owner.0,
            e.owner.1
        )
    };
    if e.dir {
        // Only the blob directory and its parents, as the node has them.
        if !Path::new(BLOBS).starts_with(rel) {
            bail!(
                "directory {} is not on the store's blob path",
                rel.display()
            );
        }
        return match &on_node {
            Some(st) if node_own(st) == (e.mode, e.owner) => Ok(()),
            _ => Err(not_the_nodes()),
        };
    }
    if !is_blob(rel) {
        bail!("{} is not a content blob of the store", rel.display());
    }
    match &on_node {
        // The node has this blob: the same bytes, and it must read as the
        // node's own (mode and owner).
        Some(st) if node_own(st) != (e.mode, e.owner) => Err(not_the_nodes()),
        Some(_) => Ok(()),
        None => {
            whiteouts.push(super::super::snapshot::whiteout(rel));
            Ok(())
        }
    }
}

/// Reads the previous image's layer `desc` (`blob`, verified by digest as
/// it was fetched) through ([module doc](self)), spending `budget`; `Err`
/// says why it cannot be kept. `holds` is what the report and the config's
/// history say of it.
pub fn check(
    blob: impl Read,
    desc: &Descriptor,
    root: &crate::primitives::inroot::Root,
    owners: &Owners,
    budget: &mut Budget,
    holds: &str,
) -> anyhow::Result<Kept> {
    let media_type = kept_media_type(&desc.media_type)
        .ok_or_else(|| anyhow!("media type {} is not a layer's", desc.media_type))?;
    let how = LayerCompression::of(&desc.media_type).expect("a layer's media type");
    let (mut whiteouts, mut keyed) = (Vec::new(), Vec::new());
    let inflated = desc.size.saturating_mul(INFLATE_MAX) + INFLATE_SLACK;
    let read = reread_blob(blob, how, inflated, |e, data| {
        budget.spend(&e.path, e.size)?;
        let seen = Seen {
            path: &e.path,
            dir: e.dir,
            mode: e.mode,
            owner: e.owner,
            mtime: e.mtime,
        };
        judge(&seen, root, owners, &mut whiteouts)?;
        let what = if e.dir {
            What::Dir { mode: e.mode }
        } else {
            let got = crate::primitives::digest::hash_read(data, Sha256::new())?;
            let hex = e
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let content = Digest::from_hasher(got);
            if content.hex() != hex {
                bail!("{} does not hash to its name", e.path.display());
            }
            What::File {
                mode: e.mode,
                size: e.size,
                content,
            }
        };
        keyed.push(KeyedEntry {
            path: e.path.clone(),
            uid: e.owner.0,
            gid: e.owner.1,
            what,
        });
        Ok(())
    })?;
    Ok(Kept {
        layer: LayerBlob {
            media_type,
            digest: desc.digest.clone(),
            size: desc.size,
            diff_id: read.diff_id,
            entries: read.entries,
            holds: holds.to_string(),
            cached: false,
            reused: false,
            // Its entries are known; its key would be its compressor's.
            key: None,
            keyed,
        },
        whiteouts,
    })
}

/// The previous image's layer as its signed record lists it
/// (`record`): the same rules, judged from the entries kiln recorded when
/// it wrote the layer, without fetching it.
pub fn check_recorded(
    recorded: &crate::domain::node_image::record::RecordedLayer,
    root: &crate::primitives::inroot::Root,
    owners: &Owners,
    holds: &str,
) -> anyhow::Result<Kept> {
    let media_type = kept_media_type(&recorded.media_type)
        .ok_or_else(|| anyhow!("media type {} is not a layer's", recorded.media_type))?;
    if recorded.keyed.is_empty() {
        bail!("its record lists no entries for it (not one of kiln's blob layers)");
    }
    let mut whiteouts = Vec::new();
    for e in &recorded.keyed {
        let (dir, mode) = match &e.what {
            What::Dir { mode } => (true, *mode),
            What::File { mode, content, .. } => {
                if super::super::record::blob_digest(&e.path).as_ref() != Some(content) {
                    bail!(
                        "{} is not a content blob named by its digest",
                        e.path.display()
                    );
                }
                (false, *mode)
            }
            What::Whiteout => bail!("{} is a whiteout", e.path.display()),
        };
        let seen = Seen {
            path: &e.path,
            dir,
            mode,
            owner: (e.uid, e.gid),
            mtime: CONTENT_MTIME,
        };
        judge(&seen, root, owners, &mut whiteouts)?;
    }
    Ok(Kept {
        layer: LayerBlob {
            media_type,
            digest: recorded.digest.clone(),
            size: recorded.size,
            diff_id: recorded.diff_id.clone(),
            entries: recorded.entries,
            holds: holds.to_string(),
            cached: false,
            reused: true,
            // As for a layer read through: the same record either way.
            key: None,
            keyed: recorded.keyed.clone(),
        },
        whiteouts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// One gzip member as kiln writes it (its own header).
    fn gz(raw: &[u8]) -> Vec<u8> {
        let mut gz =
            crate::primitives::gzip::MixedGz::new(Vec::new(), flate2::Compression::fast()).unwrap();
        gz.write_all(raw).unwrap();
        gz.finish().unwrap()
    }

    /// kiln's blob directory and its parents as a kiln layer writes them
    /// (mode 755, owner 0:0, mtime 0), then `extra`.
    fn layer(extra: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut dirs: Vec<&Path> = Path::new(BLOBS).ancestors().collect();
        dirs.pop();
        dirs.reverse();
        for d in dirs {
            let mut h = super::super::super::layer::entry_header(
                tar::EntryType::Directory,
                0o755,
                (0, 0),
                0,
                0,
            );
            b.append_data(&mut h, d, std::io::empty()).unwrap();
        }
        for (path, content) in extra {
            let c = content.unwrap_or_default();
            let mut h = super::super::super::layer::entry_header(
                tar::EntryType::Regular,
                0o444,
                (0, 0),
                0,
                c.len() as u64,
            );
            b.append_data(&mut h, path, c).unwrap();
        }
        b.into_inner().unwrap()
    }

    struct Node {
        _dir: tempfile::TempDir,
        root: crate::primitives::inroot::Root,
        rootfs: PathBuf,
    }

    fn node() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join(BLOBS)).unwrap();
        for d in Path::new(BLOBS).ancestors() {
            if d.as_os_str().is_empty() {
                continue;
            }
            std::fs::set_permissions(
                rootfs.join(d),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
        }
        let root = crate::primitives::inroot::Root::open(&rootfs).unwrap();
        Node {
            _dir: dir,
            root,
            rootfs,
        }
    }

    fn try_keep(n: &Node, gz_bytes: &[u8]) -> anyhow::Result<Kept> {
        let desc = Descriptor::new(
            media::OCI_LAYER_GZIP,
            Digest::of(gz_bytes),
            gz_bytes.len() as u64,
        );
        let owners = Owners::new(|_| false);
        let mut budget = Budget::new(Default::default(), super::super::super::tracked);
        check(gz_bytes, &desc, &n.root, &owners, &mut budget, "kept")
    }

    #[test]
    fn a_layer_of_blobs_that_hash_to_their_names_is_kept() {
        let n = node();
        let content = b"an old layer".as_slice();
        let hex = Digest::of(content).hex().to_string();
        let file = format!("{BLOBS}/{hex}");
        let raw = layer(&[(&file, Some(content))]);
        let kept = try_keep(&n, &gz(&raw)).unwrap();
        assert_eq!(kept.layer.diff_id, Digest::of(&raw));
        assert_eq!(
            kept.whiteouts,
            [Path::new(BLOBS).join(format!(".wh.{hex}"))]
        );
        // The node has that blob, as kiln writes it: no whiteout.
        std::fs::write(n.rootfs.join(&file), content).unwrap();
        std::fs::set_permissions(
            n.rootfs.join(&file),
            std::os::unix::fs::PermissionsExt::from_mode(0o444),
        )
        .unwrap();
        assert!(try_keep(&n, &gz(&raw)).unwrap().whiteouts.is_empty());
        // A Docker gzip layer is the same bytes: kept, as an OCI one.
        let g = gz(&raw);
        let desc = Descriptor::new(media::DOCKER_LAYER_GZIP, Digest::of(&g), g.len() as u64);
        let mut budget = Budget::new(Default::default(), super::super::super::tracked);
        let k = check(
            &g[..],
            &desc,
            &n.root,
            &Owners::new(|_| false),
            &mut budget,
            "k",
        )
        .unwrap();
        assert_eq!(k.layer.media_type, media::OCI_LAYER_GZIP);
    }

    #[test]
    fn anything_else_is_not_kept() {
        let n = node();
        let content = b"an old layer".as_slice();
        let hex = Digest::of(content).hex().to_string();
        let file = format!("{BLOBS}/{hex}");
        for (bad, why) in [
            (
                layer(&[("etc/passwd", Some(b"root::0:0::/:/bin/sh\n"))]),
                "not a content blob",
            ),
            (layer(&[(&file, Some(b"other bytes"))]), "does not hash"),
            (
                layer(&[(&format!("{BLOBS}/.wh.{hex}"), Some(b""))]),
                "not a content blob",
            ),
        ] {
            let e = format!("{:#}", try_keep(&n, &gz(&bad)).unwrap_err());
            assert!(e.contains(why), "{e}");
        }
        // Two gzip members: the second is what Go would read on into.
        let mut two = gz(&layer(&[(&file, Some(content))]));
        two.extend(gz(&layer(&[("etc/passwd", Some(b"x"))])));
        let e = format!("{:#}", try_keep(&n, &two).unwrap_err());
        assert!(e.contains("second gzip member"), "{e}");
        // Bytes after the archive's end.
        let mut raw = layer(&[(&file, Some(content))]);
        raw.extend([0u8; 4096]);
        let e = format!("{:#}", try_keep(&n, &gz(&raw)).unwrap_err());
        assert!(e.contains("after the end"), "{e}");
        // A bomb: a blob of 128 MiB of zeros, some 128 KiB compressed, is
        // given up after 32 times that, not read to its end.
        let mut raw = layer(&[]);
        raw.truncate(raw.len() - 1024);
        let mut h = super::super::super::layer::entry_header(
            tar::EntryType::Regular,
            0o444,
            (0, 0),
            0,
            128 << 20,
        );
        raw.extend(
            super::super::super::layer::header_blocks(&Path::new(BLOBS).join(&hex), &h).unwrap(),
        );
        h.set_size(0);
        let mut enc =
            crate::primitives::gzip::MixedGz::new(Vec::new(), flate2::Compression::fast()).unwrap();
        enc.write_all(&raw).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..128 {
            enc.write_all(&zeros).unwrap();
        }
        enc.write_all(&[0u8; 1024]).unwrap();
        let bomb = enc.finish().unwrap();
        let e = format!("{:#}", try_keep(&n, &bomb).unwrap_err());
        assert!(e.contains("inflates to more than"), "{e}");
        // A directory the node has with another mode.
        std::fs::set_permissions(
            n.rootfs.join(BLOBS),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let e = format!("{:#}", try_keep(&n, &gz(&layer(&[]))).unwrap_err());
        assert!(e.contains("not the node's"), "{e}");
    }
}
