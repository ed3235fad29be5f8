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
//! [`MAX_ADDED`] layers and keeps base + kiln within Docker's 125 less
//! [`HEADROOM`] layers left for what users put on top (a `FROM node` with a
//! few `RUN`s; `kind build node-image --base-image` commits one more). A
//! base too deep for that is refused before anything is fetched
//! ([`budget`]).
//!
//! When there are more large blobs than own-layer slots, the smallest of
//! them share overflow buckets, the largest keep their own layer, and one
//! more blob never moves many: the buckets open one at a time as blobs
//! are added (up to [`OVERFLOW`]), each taking one own-layer slot, and a
//! blob's bucket is its digest's jump consistent hash (Lamping and Veach,
//! 2014), so opening bucket k+1 moves only the blobs that land in it.
//! Adding one large blob changes at most the layers of: the new blob, the
//! smallest own blob (now bucketed), and the blobs the new bucket takes.

use std::path::{Path, PathBuf};

/// A blob this large or larger gets a layer of its own.
pub const LARGE_BLOB: u64 = 1 << 20;
/// The mtime of every entry in a content-keyed layer (1970-01-01T00:00:00Z).
pub const CONTENT_MTIME: u64 = 0;
/// Docker's deepest image (moby `layer/layer_store.go`).
pub const DOCKER_MAX_DEPTH: usize = 125;
/// The most layers kiln adds to a base.
pub const MAX_ADDED: usize = 64;
/// Layers left under Docker's bound for what goes on a node image later.
pub const HEADROOM: usize = 5;
/// Node, release, documents and both kinds of small blobs, plus one for
/// large blobs.
const FIXED: usize = 5;
pub const MIN_ADDED: usize = FIXED + 1;
/// Buckets for large blobs beyond the own-layer slots.
pub const OVERFLOW: usize = 8;

/// The content blobs' directory in a rootfs.
pub(super) const BLOBS: &str = "var/lib/containerd/io.containerd.content.v1.content/blobs/sha256";

/// What a layer holds, which decides its mtime and its name in the history.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// Small image layers (blobs under [`LARGE_BLOB`] that are not JSON).
    SmallBlobs,
    /// Small image layers only images tagged with the Kubernetes version
    /// hold (`order::versioned_blobs`): apart, as they change with it.
    SmallVersioned,
    /// Large blobs past the own-layer slots, by their digest's jump hash.
    Bucket(usize),
    /// One large blob (its hex digest).
    Blob(String),
    /// The release's binaries.
    Release,
    /// Manifests, indexes and configs.
    Documents,
    /// A layer of the previous node image kept in place (`kept`).
    Kept,
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
            Part::SmallVersioned => "kiln: small image layers of the Kubernetes version".into(),
            Part::Bucket(i) => format!("kiln: large image layers, bucket {i}"),
            Part::Blob(hex) => format!("kiln: content blob sha256:{hex}"),
            Part::Release => "kiln: Kubernetes binaries".into(),
            Part::Documents => "kiln: image manifests and configs".into(),
            Part::Kept => "kiln: kept from the previous node image".into(),
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

/// How many layers kiln may add on a base of `base_layers`: base + kiln +
/// [`HEADROOM`] within Docker's bound.
pub fn budget(base_layers: usize) -> anyhow::Result<usize> {
    let room = (DOCKER_MAX_DEPTH - HEADROOM)
        .saturating_sub(base_layers)
        .min(MAX_ADDED);
    if room < MIN_ADDED {
        return Err(crate::primitives::error::BadInput(format!(
            "the base has {base_layers} layers: with kiln's {MIN_ADDED} or more and {HEADROOM} left for what goes on top, the node image would pass Docker's {DOCKER_MAX_DEPTH} (\"max depth exceeded\"); use a base of at most {} layers (squash it)",
            DOCKER_MAX_DEPTH - HEADROOM - MIN_ADDED
        ))
        .into());
    }
    Ok(room)
}

/// Where each large blob goes, given `(size, hex digest)` pairs and the
/// slots for large blobs (module doc): `None` for a layer of its own,
/// `Some(i)` for overflow bucket i. Never more than `slots` layers.
pub fn place_large(large: &[(u64, String)], slots: usize) -> Vec<Option<usize>> {
    let mut order: Vec<usize> = (0..large.len()).collect();
    // The largest first; ties broken by digest.
    order.sort_by(|&a, &b| {
        large[b]
            .0
            .cmp(&large[a].0)
            .then_with(|| large[a].1.cmp(&large[b].1))
    });
    let n = large.len();
    let buckets = buckets_for(n, slots);
    let own = slots.min(n) - buckets;
    let mut out = vec![None; n];
    for (rank, &i) in order.iter().enumerate() {
        if rank >= own {
            out[i] = Some(jump_hash(key_of(&large[i].1), buckets));
        }
    }
    out
}

/// How many overflow buckets `n` large blobs open with `slots` slots: one
/// more for each blob past the slots (each taking an own slot), up to
/// [`OVERFLOW`].
fn buckets_for(n: usize, slots: usize) -> usize {
    if n <= slots {
        0
    } else {
        (n - slots + 1).min(OVERFLOW).min(slots)
    }
}

/// A digest's first 8 bytes as a number (digests are uniform already).
fn key_of(hex: &str) -> u64 {
    u64::from_str_radix(hex.get(..16).unwrap_or("0"), 16).unwrap_or(0)
}

/// Jump consistent hash (Lamping and Veach, "A Fast, Minimal Memory,
/// Consistent Hash Algorithm", 2014): a bucket in `0..n` for `key`; going
/// from n to n+1 buckets moves only the keys that land in the new one.
fn jump_hash(mut key: u64, n: usize) -> usize {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < n as i64 {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as usize
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
/// `versioned`: the blobs only images tagged with the Kubernetes version
/// hold (their small ones get a layer apart).
pub fn plan(
    root: &Path,
    changes: Vec<(PathBuf, bool)>,
    budget: usize,
    versioned: &std::collections::HashSet<String>,
) -> Vec<Planned> {
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
            Kind::Blob { hex, .. } if versioned.contains(&hex) => {
                groups.entry(Part::SmallVersioned).or_default().push(rel)
            }
            Kind::Blob { .. } => groups.entry(Part::SmallBlobs).or_default().push(rel),
            Kind::Release => groups.entry(Part::Release).or_default().push(rel),
            Kind::Other => node.push((rel, false)),
        }
    }
    let slots = budget.saturating_sub(FIXED).max(1);
    let keys: Vec<(u64, String)> = large.iter().map(|(s, h, _)| (*s, h.clone())).collect();
    for (place, (_, hex, rel)) in place_large(&keys, slots).into_iter().zip(large) {
        let part = match place {
            None => Part::Blob(hex),
            Some(b) => Part::Bucket(b),
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
            plan(d.path(), changes_of(files), 64, &Default::default())
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
    fn past_the_budget_the_smallest_large_blobs_share_buckets() {
        let d = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = (0..20u8)
            .map(|i| blob(d.path(), i * 13, &vec![i; LARGE_BLOB as usize + i as usize]))
            .collect();
        let p = plan(d.path(), changes_of(&files), 16, &Default::default());
        assert!(p.len() <= 16, "{} layers", p.len());
        let own: Vec<&Part> = p
            .iter()
            .map(|l| &l.part)
            .filter(|p| matches!(p, Part::Blob(_)))
            .collect();
        // 16 - 5 fixed = 11 slots; 20 blobs: 8 buckets, the three largest
        // keep their layers.
        assert_eq!(own.len(), 3);
        assert!(own.contains(&&Part::Blob(format!("{:02x}{}", 19 * 13, "0".repeat(62)))));
        assert!(budget(125 - HEADROOM - 4).is_err());
        assert_eq!(budget(3).unwrap(), MAX_ADDED);
    }

    fn hex_of(i: usize) -> String {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(i.to_le_bytes()))
    }

    /// Issue 44.3, over every base depth and blob count: base + kiln +
    /// headroom never passes Docker's 125 (a base too deep is refused),
    /// and one more large blob moves few of the others.
    #[test]
    fn the_layer_budget_holds_for_every_base_and_blob_count() {
        for base in 0..=DOCKER_MAX_DEPTH + 2 {
            let Ok(b) = budget(base) else {
                assert!(
                    base + MIN_ADDED + HEADROOM > DOCKER_MAX_DEPTH,
                    "{base} refused"
                );
                continue;
            };
            let slots = b - FIXED;
            let mut prev: Option<Vec<Option<usize>>> = None;
            for n in 0..=slots + 3 * OVERFLOW + 40 {
                // Sizes fall with i: a new blob is the smallest so far.
                let large: Vec<(u64, String)> = (0..n)
                    .map(|i| (LARGE_BLOB + (1000 - i as u64), hex_of(i)))
                    .collect();
                let placed = place_large(&large, slots);
                let own = placed.iter().filter(|p| p.is_none()).count();
                let buckets: std::collections::BTreeSet<_> = placed.iter().flatten().collect();
                let layers = FIXED + own + buckets.len();
                assert!(layers <= b, "base {base}, {n} blobs: {layers} > {b}");
                assert!(base + layers + HEADROOM <= DOCKER_MAX_DEPTH);
                // One more blob (the smallest): at most two own blobs go
                // into buckets, and a bucketed blob moves only into the
                // bucket just opened.
                if let Some(prev) = &prev {
                    let (k_prev, k_now) = (buckets_for(n - 1, slots), buckets_for(n, slots));
                    let mut from_own = 0;
                    for (a, b) in prev.iter().zip(&placed).filter(|(a, b)| a != b) {
                        match (a, b) {
                            (None, Some(_)) => from_own += 1,
                            (Some(_), Some(x)) => assert!(
                                k_now > k_prev && *x == k_now - 1,
                                "base {base}, {n} blobs: moved between old buckets"
                            ),
                            _ => {
                                panic!("base {base}, {n} blobs: a bucketed blob got its own layer")
                            }
                        }
                    }
                    assert!(
                        from_own <= 2,
                        "base {base}, {n} blobs: {from_own} left their layers"
                    );
                }
                prev = Some(placed);
            }
        }
    }

    /// The cliff of issue 44.3: 60 → 61 large blobs at the full budget
    /// moved 9 blobs at once; now at most the smallest own blob and what
    /// the newly opened bucket takes.
    #[test]
    fn one_more_large_blob_moves_at_most_a_few() {
        let slots = MAX_ADDED - FIXED;
        let blobs = |n: usize| -> Vec<(u64, String)> {
            (0..n)
                .map(|i| (LARGE_BLOB + (1000 - i as u64), hex_of(i)))
                .collect()
        };
        let a = place_large(&blobs(slots), slots);
        let b = place_large(&blobs(slots + 1), slots);
        let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(moved <= 2, "{moved} moved");
    }
}
