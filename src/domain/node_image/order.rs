//! The order of kiln's layers in a node image: what changes least first,
//! so the next version reuses the longest prefix where consumers reuse
//! layers by chain, not by digest.
//!
//! - Docker's classic store (moby `distribution/xfer/download.go`,
//!   `LayerDownloadManager.Download`) looks each layer up by the ChainID of
//!   every diff ID up to it; from the first one it lacks (`missingLayer`)
//!   every later layer is downloaded and registered again, even one whose
//!   blob it holds under another chain.
//! - containerd's unpacker (`core/unpack/unpacker.go`, `doUnpackFn`), and
//!   so Docker's containerd image store and every kind node, fetches
//!   content by digest but stats the snapshot by the same ChainID: a layer
//!   after a changed one is extracted again.
//!
//! So a layer placed after one that changed costs its bytes again. The
//! rule: with the previous node image known (`--previous`), the layers
//! both share keep its order (with its layers no longer needed kept in
//! their places, within bounds: `kept`) and the new ones follow; without
//! it, a fixed
//! order by how likely a patch release is to change each part: large
//! blobs some image not tagged with the Kubernetes version holds (etcd's,
//! a base shared with it; by digest), their small layers, overflow
//! buckets, large blobs only images tagged with it hold (kube-apiserver
//! and the like), their small layers, the release's binaries, the
//! documents, and the build's own layer last.

use std::collections::{HashMap, HashSet};

use super::plan::Part;
use super::LayerBlob;
use crate::primitives::digest::Digest;
use crate::primitives::oci::Descriptor;

/// The layer blobs (hex digests) only images tagged with the Kubernetes
/// `version` hold (kube-apiserver:v1.31.2 and the like; not a base layer
/// an untagged image shares): what a patch release changes. Read from the
/// store kiln just wrote, through the in-root resolver.
pub fn versioned_blobs(
    root: &crate::primitives::inroot::Root,
    images: &[crate::engine::report::CopiedImage],
    version: Option<&str>,
) -> HashSet<String> {
    let (mut tagged_blobs, mut others) = (HashSet::new(), HashSet::new());
    let Some(v) = version else {
        return tagged_blobs;
    };
    for image in images {
        let tagged = crate::primitives::reference::ImageRef::parse(&image.reference)
            .ok()
            .and_then(|r| r.tag)
            .is_some_and(|t| t.contains(v));
        let out = if tagged {
            &mut tagged_blobs
        } else {
            &mut others
        };
        for m in &image.manifests {
            let rel = std::path::Path::new(super::plan::BLOBS).join(m.hex());
            let Ok(Some(bytes)) = root.read(&rel) else {
                continue;
            };
            if let Ok((_, crate::primitives::oci::Document::Manifest(m))) =
                crate::primitives::oci::Document::parse(&bytes)
            {
                out.extend(m.layers.iter().map(|l| l.digest.hex().to_string()));
            }
        }
    }
    tagged_blobs.retain(|b| !others.contains(b));
    tagged_blobs
}

/// How early a part goes without a previous image (lower first).
fn rank(part: &Part, versioned: &HashSet<String>) -> u8 {
    match part {
        Part::Blob(hex) if !versioned.contains(hex) => 0,
        Part::SmallBlobs => 1,
        Part::Bucket(_) => 2,
        Part::Blob(_) => 3,
        Part::SmallVersioned => 4,
        Part::Release => 5,
        Part::Documents => 6,
        // Only ever taken from the previous image, so placed by it.
        Part::Kept => 7,
        Part::Node => 8,
    }
}

/// kiln's layers in the order they go into the manifest: `previous`'s
/// layer digests (its whole list, the base's included) decide the order of
/// those both share; the rest follow by [`rank`], then by part. The
/// build's own layer stays last whatever `previous` says: it carries the
/// directories' final times and the whiteouts.
pub fn arrange(
    layers: Vec<(Part, LayerBlob)>,
    previous: Option<&[Descriptor]>,
    versioned: &HashSet<String>,
) -> Vec<LayerBlob> {
    let at: HashMap<&Digest, usize> = previous
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, d)| (&d.digest, i))
        .collect();
    let mut keyed: Vec<((usize, u8, Part), LayerBlob)> = layers
        .into_iter()
        .map(|(part, l)| {
            let shared = match part {
                Part::Node => None,
                _ => at.get(&l.digest).copied(),
            };
            // Shared layers first, in the previous image's order; then the
            // rest by rank.
            let key = match shared {
                Some(i) => (i, 0, part),
                None => (usize::MAX, rank(&part, versioned), part),
            };
            (key, l)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    // One layer twice (two parts with identical bytes) is written once.
    let mut seen = HashSet::new();
    keyed
        .into_iter()
        .map(|(_, l)| l)
        .filter(|l| seen.insert(l.digest.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str) -> LayerBlob {
        LayerBlob::named(name, 1)
    }

    fn names(ls: &[LayerBlob]) -> Vec<&str> {
        ls.iter().map(|l| l.holds.as_str()).collect()
    }

    #[test]
    fn what_a_patch_release_changes_goes_last() {
        let versioned: HashSet<String> = ["bb".to_string()].into();
        let layers = vec![
            (Part::SmallBlobs, layer("small")),
            (Part::Blob("bb".into()), layer("apiserver")),
            (Part::Blob("aa".into()), layer("etcd")),
            (Part::Release, layer("release")),
            (Part::Documents, layer("docs")),
            (Part::Node, layer("node")),
            (Part::Bucket(0), layer("bucket")),
            (Part::SmallVersioned, layer("small-versioned")),
        ];
        let out = arrange(layers, None, &versioned);
        assert_eq!(
            names(&out),
            [
                "etcd",
                "small",
                "bucket",
                "apiserver",
                "small-versioned",
                "release",
                "docs",
                "node"
            ]
        );
    }

    /// With the previous image, the shared layers keep its order and the
    /// new ones follow: its layers are a prefix of the new ones up to the
    /// first that changed (issue 44.1).
    #[test]
    fn the_previous_images_order_is_kept_and_new_layers_follow() {
        let prev = [
            b"base".as_slice(),
            b"small",
            b"etcd",
            b"old-apiserver",
            b"node-1",
        ]
        .map(|n| {
            Descriptor::new(
                crate::primitives::oci::media::OCI_LAYER_GZIP,
                Digest::of(n),
                1,
            )
        });
        let layers = vec![
            (Part::Blob("aa".into()), layer("etcd")),
            (Part::Blob("cc".into()), layer("coredns")),
            (Part::Blob("bb".into()), layer("apiserver")),
            (Part::SmallBlobs, layer("small")),
            (Part::Node, layer("node")),
        ];
        let out = arrange(layers, Some(&prev), &["bb".to_string()].into());
        assert_eq!(
            names(&out),
            ["small", "etcd", "coredns", "apiserver", "node"]
        );
    }
}
