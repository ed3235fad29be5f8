//! Which layer each path kiln changed goes into, so that the next version
//! of a node image ships only what changed.
//!
//! The rule, and why it is stable:
//! - every content blob (`.../blobs/sha256/<hex>`) of at least
//!   [`LARGE_BLOB`] gets a layer of its own: its bytes are the blob and its
//!   parent directories, nothing else, so the same blob gives the same layer
//!   whatever else the manifest holds; a blob shared by several images is
//!   one file in the store, so it is placed once;
//! - smaller blobs that are not JSON (small image layers) share one layer,
//!   and the JSON ones (manifests, indexes, configs: they change with every
//!   image that changes) another: both small;
//! - the Kubernetes release's binaries (`/usr/bin/kube*`) one layer;
//! - everything else (containerd's `meta.db`, the store's bookkeeping,
//!   containerd's config, `/kind`, kiln's records, every changed directory
//!   and every whiteout) the last layer, the one that changes every build.
//!
//! Content-keyed layers carry [`CONTENT_MTIME`], not the build's time: a
//! blob is named by its digest and nothing reads its mtime (containerd keeps
//! its times in `meta.db`), so two builds at different times, or with a
//! different `SOURCE_DATE_EPOCH`, agree on them. The last layer writes every
//! changed directory again with the build's time, so the unpacked tree's
//! directories are as before.
//!
//! The bound: Docker refuses images deeper than 125 layers (moby
//! `layer/layer_store.go`, `maxLayerDepth = 125`: "the 127 max in some
//! graphdrivers plus the 2 additional layers used to create a rwlayer"), and
//! kind loads node images through Docker. containerd's overlay snapshotter
//! is not the tighter limit: `mount/mount_linux.go` (`compactLowerdirOption`)
//! mounts from the snapshots directory with relative lower paths of a few
//! characters each, so a page of options holds hundreds. kiln adds at most
//! [`MAX_ADDED`] layers and keeps base + kiln within Docker's 125. When there
//! are more large blobs than own-layer slots, the smallest of them go into
//! [`OVERFLOW`] buckets chosen by their own digest (so a blob's bucket never
//! depends on another blob); the largest always keep their own layer.

use std::path::{Path, PathBuf};

/// A blob this large or larger gets a layer of its own.
pub const LARGE_BLOB: u64 = 1 << 20;
/// The mtime of every entry in a content-keyed layer (1970-01-01T00:00:00Z).
pub const CONTENT_MTIME: u64 = 0;
/// Docker's deepest image (moby `layer/layer_store.go`).
pub const DOCKER_MAX_DEPTH: usize = 125;
/// The most layers kiln adds to a base.
pub const MAX_ADDED: usize = 64;
/// Buckets for large blobs beyond the own-layer slots.
pub const OVERFLOW: usize = 8;

/// The content blobs' directory in a rootfs.
const BLOBS: &str = "var/lib/containerd/io.containerd.content.v1.content/blobs/sha256";

/// What a layer holds, which decides its mtime and its name in the history.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// Small image layers (blobs under [`LARGE_BLOB`] that are not JSON).
    SmallBlobs,
    /// Large blobs past the own-layer slots, by their digest's first byte.
    Bucket(usize),
    /// One large blob (its hex digest).
    Blob(String),
    /// The release's binaries.
    Release,
    /// Manifests, indexes and configs.
    Documents,
    /// What changes every build.
    Node,
}

impl Part {
    /// Keyed by content alone (fixed mtime) or by the build.
    pub fn content_keyed(&self) -> bool {
        !matches!(self, Part::Node)
    }

    /// One line for the config's history.
    pub fn describe(&self) -> String {
        match self {
            Part::SmallBlobs => "kiln: small image layers".into(),
            Part::Bucket(i) => format!("kiln: large image layers, bucket {i}"),
            Part::Blob(hex) => format!("kiln: content blob sha256:{hex}"),
            Part::Release => "kiln: Kubernetes binaries".into(),
            Part::Documents => "kiln: image manifests and configs".into(),
            Part::Node => "kiln: containerd records and config, kind's files".into(),
        }
    }
}

/// One planned layer: its part and its entries (path, is a whiteout), sorted.
#[derive(Debug, Clone)]
pub struct Planned {
    pub part: Part,
    pub entries: Vec<(PathBuf, bool)>,
}

/// How many layers kiln may add on a base of `base_layers`.
pub fn budget(base_layers: usize) -> anyhow::Result<usize> {
    let room = DOCKER_MAX_DEPTH.saturating_sub(base_layers).min(MAX_ADDED);
    // Node, release, documents, small blobs and at least one bucket.
    if room < 5 {
        return Err(crate::primitives::error::BadInput(format!(
            "the base has {base_layers} layers: with kiln's it would exceed Docker's {DOCKER_MAX_DEPTH} (\"max depth exceeded\"); use a base with at most {} layers",
            DOCKER_MAX_DEPTH - 5
        ))
        .into());
    }
    Ok(room)
}

/// A changed regular file and what it is.
enum Kind {
    Blob { hex: String, size: u64, json: bool },
    Release,
    Other,
}

/// A content blob's hex digest, from its path.
fn blob_hex(rel: &Path) -> Option<&str> {
    rel.strip_prefix(BLOBS)
        .ok()
        .and_then(|n| n.to_str())
        .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `rel` names a content blob (its name is its digest).
pub fn is_blob(rel: &Path) -> bool {
    blob_hex(rel).is_some()
}

fn kind_of(root: &Path, rel: &Path) -> Kind {
    if super::OWNED_FILES.iter().any(|f| rel == Path::new(f)) {
        return Kind::Release;
    }
    let (Some(hex), Ok(m)) = (blob_hex(rel), std::fs::symlink_metadata(root.join(rel))) else {
        return Kind::Other;
    };
    if !m.is_file() {
        return Kind::Other;
    }
    Kind::Blob {
        hex: hex.to_string(),
        size: m.len(),
        json: m.len() < LARGE_BLOB && starts_with_brace(&root.join(rel)),
    }
}

fn starts_with_brace(path: &Path) -> bool {
    let mut first = [0u8; 1];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut first))
        .is_ok()
        && first[0] == b'{'
}

/// Splits `changes` (sorted, parents included, from `snapshot::changes`)
/// into at most `budget` layers by the rule above; empty parts are left
/// out. The order: the parts least likely to change first.
pub fn plan(root: &Path, changes: Vec<(PathBuf, bool)>, budget: usize) -> Vec<Planned> {
    let mut large: Vec<(u64, String, PathBuf)> = Vec::new();
    let mut groups: std::collections::BTreeMap<Part, Vec<PathBuf>> = Default::default();
    let mut node: Vec<(PathBuf, bool)> = Vec::new();
    for (rel, whiteout) in changes {
        let is_dir =
            !whiteout && std::fs::symlink_metadata(root.join(&rel)).is_ok_and(|m| m.is_dir());
        if whiteout || is_dir {
            node.push((rel, whiteout));
            continue;
        }
        match kind_of(root, &rel) {
            Kind::Blob { hex, size, .. } if size >= LARGE_BLOB => large.push((size, hex, rel)),
            Kind::Blob { json: true, .. } => groups.entry(Part::Documents).or_default().push(rel),
            Kind::Blob { .. } => groups.entry(Part::SmallBlobs).or_default().push(rel),
            Kind::Release => groups.entry(Part::Release).or_default().push(rel),
            Kind::Other => node.push((rel, false)),
        }
    }
    let fixed = 4; // node, release, documents, small blobs
    let slots = budget.saturating_sub(fixed);
    // The largest keep their own layer; ties broken by digest.
    large.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let own = if large.len() <= slots {
        large.len()
    } else {
        slots.saturating_sub(OVERFLOW)
    };
    for (i, (_, hex, rel)) in large.into_iter().enumerate() {
        let part = if i < own {
            Part::Blob(hex)
        } else {
            let first = u8::from_str_radix(&hex[..2], 16).unwrap_or(0);
            Part::Bucket(first as usize % OVERFLOW)
        };
        groups.entry(part).or_default().push(rel);
    }
    let mut out: Vec<Planned> = groups
        .into_iter()
        .map(|(part, files)| Planned {
            part,
            entries: with_parents(files),
        })
        .collect();
    out.push(Planned {
        part: Part::Node,
        entries: node,
    });
    out
}

/// Files with their parent directories, sorted (a tar lists a directory
/// before what is in it; the unpacker then makes it with its mode).
fn with_parents(files: Vec<PathBuf>) -> Vec<(PathBuf, bool)> {
    let mut all = std::collections::BTreeSet::new();
    for f in files {
        let mut a = f.parent();
        while let Some(d) = a.filter(|d| !d.as_os_str().is_empty()) {
            all.insert(d.to_path_buf());
            a = d.parent();
        }
        all.insert(f);
    }
    all.into_iter().map(|p| (p, false)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(root: &Path, hex_seed: u8, bytes: &[u8]) -> PathBuf {
        let hex = format!("{:02x}{}", hex_seed, "0".repeat(62));
        let rel = Path::new(BLOBS).join(hex);
        std::fs::create_dir_all(root.join(BLOBS)).unwrap();
        std::fs::write(root.join(&rel), bytes).unwrap();
        rel
    }

    fn changes_of(files: &[PathBuf]) -> Vec<(PathBuf, bool)> {
        with_parents(files.to_vec())
    }

    #[test]
    fn a_large_blob_keeps_its_layer_whatever_else_changes() {
        let d = tempfile::tempdir().unwrap();
        let big = blob(d.path(), 0xaa, &vec![7u8; LARGE_BLOB as usize]);
        let doc = blob(d.path(), 0x01, b"{}");
        let small = blob(d.path(), 0x02, b"\x1f\x8b small");
        let parts = |files: &[PathBuf]| {
            plan(d.path(), changes_of(files), 64)
                .into_iter()
                .map(|p| (p.part, p.entries))
                .collect::<Vec<_>>()
        };
        let one = parts(std::slice::from_ref(&big));
        let all = parts(&[big.clone(), doc.clone(), small.clone()]);
        let own = |ps: &[(Part, Vec<(PathBuf, bool)>)]| {
            ps.iter()
                .find(|(p, _)| matches!(p, Part::Blob(_)))
                .cloned()
                .unwrap()
        };
        assert_eq!(own(&one), own(&all));
        let names: Vec<Part> = all.iter().map(|(p, _)| p.clone()).collect();
        assert!(matches!(names[0], Part::SmallBlobs), "{names:?}");
        assert!(names.contains(&Part::Documents));
        assert_eq!(names.last(), Some(&Part::Node));
        // Directories are in the node layer too (with the build's mtime).
        let node = &all.last().unwrap().1;
        assert!(node.iter().any(|(p, _)| p == Path::new(BLOBS)));
    }

    #[test]
    fn past_the_budget_the_smallest_large_blobs_share_buckets_by_their_digest() {
        let d = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = (0..20u8)
            .map(|i| blob(d.path(), i * 13, &vec![i; LARGE_BLOB as usize + i as usize]))
            .collect();
        let p = plan(d.path(), changes_of(&files), 16);
        assert!(p.len() <= 16, "{} layers", p.len());
        let own: Vec<&Part> = p
            .iter()
            .map(|l| &l.part)
            .filter(|p| matches!(p, Part::Blob(_)))
            .collect();
        // 16 - 4 fixed - 8 buckets: the four largest keep their layers.
        assert_eq!(own.len(), 4);
        assert!(own.contains(&&Part::Blob(format!("{:02x}{}", 19 * 13, "0".repeat(62)))));
        assert!(budget(125 - 4).is_err());
        assert_eq!(budget(3).unwrap(), MAX_ADDED);
    }
}
