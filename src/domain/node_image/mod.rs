//! Node images: a base image's layers, byte for byte, plus kiln's layers
//! with exactly what kiln added or changed (the containerd store, the
//! node's containerd config, the manifest record), split so that a layer's
//! bytes depend only on what it holds (`plan`), a config extended to match,
//! and OCI annotations. Deterministic where kiln decides: sorted entries,
//! fixed owners, mtimes fixed (content-keyed layers) or from
//! SOURCE_DATE_EPOCH (the last one), gzip without timestamps.
//! The rooms: `snapshot` (what changed), `plan` (which layer holds what),
//! `layer` (writing one), `order` (their order, for reuse by chain),
//! `config` (config, manifest, index), `inputs` (what the base and the
//! previous image hold), `kept` (the previous image's layers kept in
//! place: chosen, fetched and read through), `reread` (a layer read back
//! as kiln's writer writes it), `layer_cache` (the planned layers
//! written, or taken from the cache); the build itself is here.

mod config;
mod extract;
mod fill;
mod inputs;
mod kept;
mod layer;
mod layer_cache;
pub mod order;
pub mod plan;
mod platform;
pub mod record;
pub mod reread;
mod snapshot;

pub use config::{
    node_config, node_index, node_manifest, Provenance, BASE_DIGEST, PREVIOUS_DIGEST, PREVIOUS_NAME,
};
use inputs::base_manifests;
pub use inputs::{
    check_base_depth, previous_image, previous_records, previous_trust, PreviousImage,
    PreviousTrust,
};
pub use kept::{KeptReport, KEEP_PREVIOUS};
pub use layer::{key_of, keyed_entries, write_layer, Compression, KeyedEntry, LayerBlob, What};
use platform::build_platform;
pub use snapshot::{extracted, snapshot, tracked, Snapshot};

use std::path::Path;

use anyhow::{anyhow, bail, Context};

use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor, ImageManifest};
use crate::primitives::platform::Platform;

/// What kiln owns in a node rootfs: the layer holds what changed under these.
pub const OWNED: &[&str] = &["var/lib/containerd", "etc/containerd", "kind"];
/// Single files kiln owns: the Kubernetes node binaries it installs.
pub const OWNED_FILES: &[&str] = &["usr/bin/kubeadm", "usr/bin/kubelet", "usr/bin/kubectl"];

/// A built node image in a layout: its top descriptor and per-platform manifests.
#[derive(Debug, Clone)]
pub struct NodeImage {
    pub top: Descriptor,
    pub manifests: Vec<(Platform, Descriptor)>,
    /// kiln's layers, per platform, in manifest order.
    pub layers: Vec<(Platform, Vec<LayerBlob>)>,
    /// Per platform: what kiln wrote of kind's layout.
    pub kind: Vec<crate::domain::kind::KindLayout>,
    /// Per platform: images the base's store held that kiln pinned.
    pub pinned_existing: Vec<Vec<String>>,
    /// Per platform: the base's pins kiln removed, or kept (`--keep-pinned`),
    /// and pins by others it left.
    pub pins: Vec<PinChanges>,
    /// Seconds spent per phase, all platforms together.
    pub phases: Phases,
    /// What went in, for the SBOM (its subject named by the caller).
    pub sbom: crate::domain::sbom::Sbom,
    /// Per platform that follows a previous image: what was kept of it.
    pub kept: Vec<KeptReport>,
    /// Per platform manifest: its build record and the contributions it
    /// names (in `NodeBuild::records`), attached when pushed.
    pub records: Vec<(Descriptor, Descriptor, Vec<Descriptor>)>,
    /// Base layers replayed rather than inflated, all platforms together.
    pub replayed: usize,
    /// Per platform: the base's kubelet image-manager state, whited out.
    pub kubelet_state: Vec<RemovedState>,
}

/// Where a node-image build's time goes (seconds).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Phases {
    /// The base's blobs into the staging layout.
    pub pull_base: f64,
    /// The paths kiln needs, out of the base's layers.
    pub extract: f64,
    /// The images into the store (fetched, recorded, pinned), binaries and kind's layout.
    pub bake: f64,
    /// kiln's layer written and compressed, and the archive or push.
    pub pack: f64,
}

/// One platform's inputs: the manifest to bake (completed by its release's
/// control-plane images, when built from one) and the release.
pub struct PlatformInput {
    pub platform: Platform,
    pub manifest: crate::domain::manifest::NodeManifest,
    pub release: Option<crate::domain::kubernetes::Release>,
}

/// What every platform's build shares.
pub struct NodeBuild<'a> {
    pub inputs: &'a [PlatformInput],
    pub daemon: &'a crate::adapters::rootfs::DaemonChoice,
    pub jobs: usize,
    pub progress: crate::primitives::progress::Progress,
    /// kind's default CNI and storage manifests from this directory, and
    /// how to name where they came from (`--kind-manifests`, `--kind-node`).
    pub kind_manifests: Option<(&'a Path, &'a str)>,
    /// Pin the images the base's store already holds.
    pub pin_existing: bool,
    /// `--keep-pinned`.
    pub keep_pinned: bool,
    pub compression: Compression,
    pub limits: crate::primitives::unpack::Limits,
    pub cache: Option<crate::sink::cache::Cache>,
    /// Asked before each image is stored (`--verify-signatures`); a
    /// release's own images are admitted by the release's checksum.
    pub gate: Option<std::sync::Arc<dyn crate::engine::gate::Gate>>,
    /// The node image this one follows (`--previous`), resolved.
    pub previous: Option<PreviousImage>,
    /// How many of the previous image's bytes may be `kept`, as a
    /// percentage of kiln's own.
    pub keep_previous: u8,
    /// Where the previous node image is read from (for its layers `kept`).
    pub previous_from: Option<&'a crate::source::AnySource<'a>>,
    /// The previous image's build records, by platform, where they may be
    /// used (its manifest named by digest; `record`), their contributions
    /// in `records`.
    pub previous_records: std::collections::HashMap<String, record::Record>,
    /// Where this image's records and contributions go (never into an
    /// archive: only a push attaches them).
    pub records: &'a crate::sink::layout::OciLayout,
}

/// Builds a node image per platform from `base` (already copied into
/// `layout` as `base_ref`) and each platform's manifest, its images from
/// the platform's release first, then `images`.
pub async fn build_node_image<S: crate::source::Source>(
    layout: &crate::sink::layout::OciLayout,
    base_ref: &crate::primitives::reference::ImageRef,
    base_top: &Descriptor,
    images: &S,
    spec: &NodeBuild<'_>,
) -> anyhow::Result<NodeImage> {
    use crate::sink::Sink;
    let (created, mtime) = crate::primitives::epoch::creation_time()?;
    let first = spec
        .inputs
        .first()
        .ok_or_else(|| anyhow!("no platform to build"))?;
    let prov = Provenance {
        created,
        kubernetes_version: first.manifest.kubernetes_version.clone(),
        base_name: base_ref
            .tagged_name()
            .unwrap_or_else(|| base_ref.to_string()),
        base_digest: base_top.digest.clone(),
        images: first.manifest.images.len(),
        previous: spec
            .previous
            .as_ref()
            .map(|p| (p.name.clone(), p.digest.clone())),
        record: None,
    };
    let platforms: Vec<Platform> = spec.inputs.iter().map(|i| i.platform.clone()).collect();
    let mut node = NodeImage {
        top: base_top.clone(),
        manifests: Vec::new(),
        layers: Vec::new(),
        kind: Vec::new(),
        pinned_existing: Vec::new(),
        pins: Vec::new(),
        phases: Phases::default(),
        sbom: crate::domain::sbom::Sbom {
            base: Some((base_ref.to_string(), base_top.digest.clone())),
            ..Default::default()
        },
        kept: Vec::new(),
        records: Vec::new(),
        replayed: 0,
        kubelet_state: Vec::new(),
    };
    let bases = base_manifests(layout, base_ref, base_top, &platforms)?;
    // Content-keyed layers already written, by key: one layer two
    // platforms share is written once.
    let mut written = std::collections::HashMap::new();
    let mut all_same = true;
    for (input, (_, base)) in spec.inputs.iter().zip(bases) {
        let built = build_platform(
            layout,
            images,
            spec,
            input,
            &base,
            &prov,
            mtime,
            &mut written,
        )
        .await?;
        node.manifests
            .push((input.platform.clone(), built.manifest.clone()));
        node.layers.push((input.platform.clone(), built.layers));
        node.kind.push(built.kind);
        node.pinned_existing.push(built.pinned_existing);
        node.pins.push(built.pins);
        if let Some(found) = built.kubelet_state {
            node.kubelet_state.push(RemovedState {
                platform: input.platform.to_string(),
                found,
            });
        }
        node.kept.extend(built.kept);
        node.records
            .push((built.manifest.clone(), built.record.0, built.record.1));
        node.replayed += built.reused;
        all_same &= built.same_as_previous;
        node.phases.extract += built.phases.extract;
        node.phases.bake += built.phases.bake;
        node.phases.pack += built.phases.pack;
        add_to_sbom(&mut node.sbom, built.sbom, &input.platform);
    }
    // What the image as a whole records (its index, its SBOM): for one
    // platform, what its manifest does.
    let recorded = spec.previous.as_ref().and_then(|p| {
        let one = (node.manifests.len() == 1).then(|| &spec.inputs[0].platform);
        p.recorded_by(all_same, one)
    });
    node.sbom.previous = recorded.clone();
    let prov = Provenance {
        previous: recorded,
        ..prov
    };
    node.top = if node.manifests.len() == 1 {
        node.manifests[0].1.clone()
    } else {
        let b = node_index(&node.manifests, &prov)?;
        let d = Descriptor::new(media::OCI_INDEX, Digest::of(&b), b.len() as u64);
        layout.put_bytes(&d, bytes::Bytes::from(b)).await?;
        d
    };
    node.sbom.subject_digest = Some(node.top.digest.clone());
    Ok(node)
}

/// Merges one platform's contents into the node image's SBOM: an image
/// built for several platforms is one package listing them all.
fn add_to_sbom(
    sbom: &mut crate::domain::sbom::Sbom,
    part: crate::domain::sbom::Sbom,
    platform: &Platform,
) {
    for image in part.images {
        match sbom
            .images
            .iter_mut()
            .find(|i| i.reference == image.reference && i.digest == image.digest)
        {
            Some(i) => i.platforms.extend(image.platforms),
            None => sbom.images.push(image),
        }
    }
    if let Some(r) = part.kubernetes {
        match &mut sbom.kubernetes {
            Some(all) => all.binaries.extend(r.binaries),
            None => sbom.kubernetes = Some(r),
        }
    }
    if sbom.containerd.is_none() {
        sbom.containerd = part.containerd;
    } else if part.containerd.is_some() && part.containerd != sbom.containerd {
        let (a, b) = (
            sbom.containerd.take().unwrap_or_default(),
            part.containerd.unwrap_or_default(),
        );
        sbom.containerd = Some(format!("{a}; {b} ({platform})"));
    }
}

pub(super) fn read_blob(
    layout: &crate::sink::layout::OciLayout,
    d: &Digest,
) -> anyhow::Result<Vec<u8>> {
    std::fs::read(layout.blob_path(d)).with_context(|| format!("{d} is not in the layout"))
}

/// The kubelet's image-manager state a platform's base held, whited out.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemovedState {
    pub platform: String,
    #[serde(flatten)]
    pub found: crate::domain::kubelet::state::Found,
}

/// What a platform's build did to pins it did not make for the manifest.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PinChanges {
    pub platform: String,
    pub unpinned: Vec<crate::domain::bake::Unpinned>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_pinned: Vec<crate::domain::bake::Unpinned>,
    pub pinned_by_others: Vec<String>,
}
