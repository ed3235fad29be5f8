//! The base's paths kiln needs (`snapshot::extracted`), out of its layers,
//! one layer at a time: what a layer gave the extract (its contribution,
//! `primitives::unpack::Contribution`) replayed from the cache, or from the
//! record of the previous image (`record`), else the layer inflated and
//! its contribution kept, in the cache and for this image's record. A
//! contribution leaves out the node's containerd binary (tens of MiB,
//! wanted only for its version, which it notes); with
//! `--trust-node-binaries` the binary must be there, so every layer is
//! inflated.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use crate::adapters::rootfs::{NodeContainerd, OWN_BINARIES};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor};
use crate::primitives::unpack::{Budget, Contribution, Elide, Owners};

/// What decides a contribution's bytes, besides its layer: the paths the
/// extract takes (`snapshot::extracted`), what is left out of them, the
/// contribution's format. Bumped when any of those changes.
pub const EXTRACT_RULE: &str = "kiln extract 2";

/// A contribution larger than this (a base whose store is full of blobs)
/// is neither cached nor recorded: replaying it would save nothing.
pub const CONTRIBUTION_MAX: u64 = 16 << 20;

/// The cache key of `layer`'s contribution.
pub fn key(layer: &Digest) -> Digest {
    Digest::of(format!("{EXTRACT_RULE} {layer}").as_bytes())
}

/// The node's containerd binaries are left out, their versions noted.
const ELIDE: Elide = Elide {
    paths: |p| OWN_BINARIES.iter().any(|b| Path::new(b) == p),
    note: |f| match crate::adapters::version::Version::of_elf(f) {
        Ok(v) => format!("containerd {v}"),
        Err(e) => format!("unreadable {e:#}"),
    },
};

/// Where the contributions may come from.
pub(super) struct Sources<'a> {
    pub cache: Option<&'a crate::sink::cache::Cache>,
    /// The previous image's recorded contributions, by base layer, already
    /// in `given` (fetched and verified by the caller).
    pub recorded: &'a HashMap<Digest, Descriptor>,
    /// `--trust-node-binaries`: the node's binaries must be whole.
    pub whole: bool,
    /// Where contributions are kept for this image's record.
    pub given: &'a crate::sink::layout::OciLayout,
}

/// What the extract did.
#[derive(Debug, Default)]
pub(super) struct Extracted {
    /// Per base layer, its contribution (in [`Sources::given`]), when
    /// small enough to record.
    pub contributions: Vec<(Digest, Option<Descriptor>)>,
    /// The node's containerd, when its binary was left out.
    pub node: Option<NodeContainerd>,
    /// Layers replayed rather than inflated.
    pub replayed: usize,
}

/// Extracts `layers` (the base's, in `layout` unless replayed) into
/// `rootfs`, as [`crate::primitives::unpack::apply_layer_part`] with
/// `snapshot::extracted` would, replaying what it can (module doc).
pub(super) fn extract(
    rootfs: &Path,
    layers: &[Descriptor],
    layout: &crate::sink::layout::OciLayout,
    sources: &Sources<'_>,
    owners: &mut Owners,
    budget: &mut Budget,
) -> anyhow::Result<Extracted> {
    let mut out = Extracted::default();
    let mut notes: HashMap<std::path::PathBuf, String> = HashMap::new();
    for l in layers {
        let cached = sources
            .cache
            .filter(|_| !sources.whole)
            .and_then(|c| c.layer(&key(&l.digest)));
        let recorded = sources
            .recorded
            .get(&l.digest)
            .filter(|_| !sources.whole && cached.is_none());
        let replay = match (&cached, recorded) {
            (Some((desc, _, kept)), _) => Some((desc.clone(), kept.to_path_buf())),
            (None, Some(desc)) => Some((desc.clone(), sources.given.blob_path(&desc.digest))),
            (None, None) => None,
        };
        let given = match replay {
            Some((desc, path)) => {
                let elided = crate::primitives::unpack::apply_contribution(
                    rootfs,
                    &path,
                    owners,
                    super::extracted,
                    budget,
                )
                .with_context(|| format!("replaying what base layer {} gave", l.digest))?;
                notes.extend(elided);
                out.replayed += 1;
                if cached.is_some() {
                    keep(sources.given, &desc, &path)?;
                } else if let Some(c) = sources.cache {
                    keep_in_cache(c, &l.digest, &desc, &path);
                }
                Some(desc)
            }
            None => {
                let tmp = tempfile::tempfile()?;
                let mut noted = Contribution::new(tmp, Some(ELIDE));
                crate::primitives::unpack::apply_layer_part(
                    rootfs,
                    &layout.blob_path(&l.digest),
                    owners,
                    super::extracted,
                    budget,
                    Some(&mut noted),
                )
                .with_context(|| format!("unpacking base layer {}", l.digest))?;
                let mut f = noted.finish()?;
                given(sources, &l.digest, &mut f)?
            }
        };
        out.contributions.push((l.digest.clone(), given));
    }
    let root = crate::primitives::inroot::Root::open(rootfs)?;
    out.node = crate::adapters::rootfs::node_containerd(&root).and_then(|n| {
        let real = n.path.strip_prefix(rootfs).ok()?.to_path_buf();
        let note = notes.get(&real)?;
        let empty = std::fs::metadata(&n.path).is_ok_and(|m| m.len() == 0);
        empty.then(|| NodeContainerd {
            version: note
                .strip_prefix("containerd ")
                .and_then(crate::adapters::version::Version::parse_output)
                .ok_or_else(|| note.clone()),
            path: n.path,
        })
    });
    Ok(out)
}

/// A contribution just written (`f`, rewound here): kept for the record
/// and in the cache when small enough.
fn given(
    sources: &Sources<'_>,
    layer: &Digest,
    f: &mut std::fs::File,
) -> anyhow::Result<Option<Descriptor>> {
    use std::io::Seek;
    let size = f.metadata()?.len();
    if size > CONTRIBUTION_MAX {
        return Ok(None);
    }
    f.rewind()?;
    let digest = Digest::from_hasher(crate::primitives::digest::hash_read(
        &mut *f,
        <sha2::Sha256 as sha2::Digest>::new(),
    )?);
    f.rewind()?;
    let desc = Descriptor::new(media::OCI_LAYER, digest, size);
    let mut out = sources.given.new_blob()?;
    std::io::copy(f, &mut out)?;
    sources.given.commit_blob(out, &desc.digest, size)?;
    if let Some(c) = sources.cache {
        keep_in_cache(c, layer, &desc, &sources.given.blob_path(&desc.digest));
    }
    Ok(Some(desc))
}

/// Puts a cached contribution where this image's record takes it from.
fn keep(
    given: &crate::sink::layout::OciLayout,
    desc: &Descriptor,
    from: &Path,
) -> anyhow::Result<()> {
    if given.blob_path(&desc.digest).exists() {
        return Ok(());
    }
    let mut out = given.new_blob()?;
    std::io::copy(&mut std::fs::File::open(from)?, &mut out)?;
    given.commit_blob(out, &desc.digest, desc.size)
}

/// The cache's copy costs only a later inflate when it fails: a warning.
fn keep_in_cache(
    cache: &crate::sink::cache::Cache,
    layer: &Digest,
    desc: &Descriptor,
    path: &Path,
) {
    let kept = std::fs::File::open(path)
        .map_err(anyhow::Error::from)
        .and_then(|f| cache.keep_layer(&key(layer), desc, serde_json::json!({}), f));
    if let Err(e) = kept {
        tracing::warn!("keeping what base layer {layer} gave the extract in the cache: {e:#}");
    }
}
