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
mod inputs;
mod kept;
mod layer;
mod layer_cache;
pub mod order;
pub mod plan;
mod reread;
mod snapshot;

pub use config::{
    node_config, node_index, node_manifest, Provenance, BASE_DIGEST, PREVIOUS_DIGEST, PREVIOUS_NAME,
};
use inputs::base_manifests;
pub use inputs::{check_base_depth, previous_image, PreviousImage};
pub use kept::{KeptReport, KEEP_PREVIOUS};
pub use layer::{content_key, write_layer, Compression, LayerBlob};
use layer_cache::write_layers;
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
            .push((input.platform.clone(), built.manifest));
        node.layers.push((input.platform.clone(), built.layers));
        node.kind.push(built.kind);
        node.pinned_existing.push(built.pinned_existing);
        node.pins.push(built.pins);
        node.kept.extend(built.kept);
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

fn read_blob(layout: &crate::sink::layout::OciLayout, d: &Digest) -> anyhow::Result<Vec<u8>> {
    std::fs::read(layout.blob_path(d)).with_context(|| format!("{d} is not in the layout"))
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

/// One platform's result.
struct BuiltPlatform {
    manifest: Descriptor,
    /// This platform's part of the SBOM.
    sbom: crate::domain::sbom::Sbom,
    layers: Vec<LayerBlob>,
    kind: crate::domain::kind::KindLayout,
    pinned_existing: Vec<String>,
    pins: PinChanges,
    phases: Phases,
    kept: Option<KeptReport>,
    /// Its layers are the previous image's (a rebuild).
    same_as_previous: bool,
}

/// A kindest/base (kind's entrypoint) with no `/kind/version` and no
/// release to build in makes an image kind cannot start ("failed to get
/// kubernetes version"): refused before any work. A kindest/node base
/// carries `/kind/version` and is fine.
fn refuse_kind_base_without_kubernetes(
    rootfs: &Path,
    input: &PlatformInput,
    base: &str,
) -> anyhow::Result<()> {
    let root = crate::primitives::inroot::Root::open(rootfs)?;
    if input.release.is_none()
        && crate::domain::kind::is_kind_base(&root)
        && root
            .read(Path::new(crate::domain::kind::VERSION_FILE))?
            .is_none()
    {
        return Err(crate::primitives::error::BadInput(format!(
            "base {base} is a kind base (it has /{}) without Kubernetes (no /{}): kind cannot start the node image; add --kubernetes SRC (a kubernetes-server-linux-ARCH release), or build from a kindest/node base",
            crate::domain::kind::ENTRYPOINT,
            crate::domain::kind::VERSION_FILE
        ))
        .into());
    }
    Ok(())
}

/// One platform: the base unpacked, the store baked, the release's binaries
/// and kind's layout written, kiln's layers, the config and the manifest.
#[allow(clippy::too_many_arguments)]
async fn build_platform<S: crate::source::Source>(
    layout: &crate::sink::layout::OciLayout,
    images: &S,
    spec: &NodeBuild<'_>,
    input: &PlatformInput,
    base: &ImageManifest,
    prov: &Provenance,
    mtime: u64,
    written: &mut std::collections::HashMap<Digest, LayerBlob>,
) -> anyhow::Result<BuiltPlatform> {
    use crate::sink::Sink;
    let platform = &input.platform;
    let work = crate::primitives::owned::work_dir("kiln-node-")?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs)?;
    let mut phases = Phases::default();
    let started = std::time::Instant::now();
    let mut owners = crate::primitives::unpack::Owners::new(tracked);
    let mut unpack_budget = crate::primitives::unpack::Budget::new(spec.limits, tracked);
    let before = crate::primitives::blocking::off_runtime(|| -> anyhow::Result<_> {
        for l in &base.layers {
            crate::primitives::unpack::apply_layer_part(
                &rootfs,
                &layout.blob_path(&l.digest),
                &mut owners,
                extracted,
                &mut unpack_budget,
            )
            .with_context(|| format!("unpacking base layer {}", l.digest))?;
        }
        refuse_kind_base_without_kubernetes(&rootfs, input, &prov.base_name)?;
        snapshot(&rootfs)
    })?;
    phases.extract = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let renamed = input.release.as_ref().map(|r| r.source()).transpose()?;
    let source = crate::source::renamed::Overlay {
        first: renamed.as_ref(),
        rest: images,
    };
    let built = crate::domain::bake::build_rootfs(
        &rootfs,
        &source,
        crate::domain::bake::BuildSpec {
            choice: spec.daemon,
            manifest: &input.manifest,
            platforms: vec![platform.clone()],
            jobs: spec.jobs,
            progress: spec.progress.clone(),
            pin_existing: spec.pin_existing,
            keep_pinned: spec.keep_pinned,
            from_base: true,
            cache: spec.cache.clone(),
            gate: spec.gate.clone().map(|inner| {
                let images = renamed.iter().flat_map(|r| r.names().cloned()).collect();
                std::sync::Arc::new(crate::engine::gate::Except { inner, images })
                    as std::sync::Arc<dyn crate::engine::gate::Gate>
            }),
        },
    )
    .await?;
    if !built.failed.is_empty() {
        let failed: Vec<&str> = built.failed.iter().map(|f| f.error.as_str()).collect();
        bail!(
            "{platform}: {} of {} images failed: {}",
            failed.len(),
            input.manifest.images.len(),
            failed.join("; ")
        );
    }
    let root = crate::primitives::inroot::Root::open(&rootfs)?;
    let mut sbom = crate::domain::sbom::Sbom {
        images: built.sbom_images(&input.manifest),
        containerd: Some(built.containerd.clone()),
        ..Default::default()
    };
    if let Some(r) = &input.release {
        r.install(&root)?;
        let mut binaries = Vec::new();
        for b in crate::domain::kubernetes::BINARIES {
            let path = Path::new("usr/bin").join(b);
            let f = root.open_file(&path)?;
            let sha =
                crate::primitives::digest::hash_read(f, <sha2::Sha256 as sha2::Digest>::new())?;
            binaries.push((
                format!("/{}", path.display()),
                Digest::from_hasher(sha),
                platform.to_string(),
            ));
        }
        sbom.kubernetes = Some(crate::domain::sbom::Release {
            version: r.version.clone(),
            source: r.src.clone(),
            sha512: r.sha512.clone(),
            binaries,
        });
    }
    let kind = crate::domain::kind::write_layout(
        &root,
        &input.manifest,
        input.release.as_ref().map(|r| r.version.as_str()),
        spec.kind_manifests,
    )?;
    phases.bake = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let budget = plan::budget(base.layers.len())?;
    // The release's binaries by the digests the SBOM took of them.
    let known: std::collections::HashMap<std::path::PathBuf, Digest> = sbom
        .kubernetes
        .iter()
        .flat_map(|k| &k.binaries)
        .map(|(path, d, _)| {
            (
                Path::new(path.trim_start_matches('/')).to_path_buf(),
                d.clone(),
            )
        })
        .collect();
    let versioned = order::versioned_blobs(
        &root,
        &built.images,
        input.manifest.kubernetes_version.as_deref(),
    );
    let mut planned = crate::primitives::blocking::off_runtime(|| -> anyhow::Result<_> {
        Ok(plan::plan(
            &rootfs,
            snapshot::changes(&rootfs, &before)?,
            budget,
            &versioned,
        ))
    })?;
    // The build's own layer last: it whites out what kept layers hold
    // that the node no longer has.
    let mut node_part = planned
        .pop()
        .filter(|p| p.part == plan::Part::Node)
        .ok_or_else(|| anyhow!("the plan has no node layer"))?;
    let mut write = |planned: Vec<plan::Planned>| {
        crate::primitives::blocking::off_runtime(|| {
            write_layers(
                layout,
                &rootfs,
                planned,
                &owners,
                mtime,
                spec.compression,
                written,
                &known,
                spec.cache.as_ref(),
            )
        })
    };
    let mut layers = write(planned)?;
    let previous = spec
        .previous
        .as_ref()
        .and_then(|p| Some((p, p.layers.get(&platform.to_string())?)));
    // One layer is left for the node's own.
    let room = budget.saturating_sub(1);
    let kept = match (previous, spec.previous_from) {
        (Some((p, previous)), Some(from)) => {
            let keep = kept::Keep {
                previous,
                base: &base.layers,
                room,
                percent: spec.keep_previous,
            };
            // Not naming the image: the config would then differ with the
            // previous image's digest alone (the annotations name it).
            let holds = "kiln: kept from the previous node image (blobs no longer used are whited out in the last layer)";
            kept::keep_previous(
                layout,
                (from, &p.pinned),
                keep,
                &layers,
                &root,
                &owners,
                &mut unpack_budget,
                spec.cache.as_ref(),
                holds,
            )
            .await?
        }
        _ => kept::Outcome::default(),
    };
    let kept_report = previous.map(|(p, _)| kept::KeptReport::new(platform, p, &kept));
    let mut node_entries: std::collections::BTreeMap<std::path::PathBuf, bool> =
        node_part.entries.into_iter().collect();
    for k in &kept.kept {
        node_entries.extend(k.whiteouts.iter().map(|w| (w.clone(), true)));
    }
    node_part.entries = node_entries.into_iter().collect();
    layers.extend(kept.kept.into_iter().map(|k| (plan::Part::Kept, k.layer)));
    layers.extend(write(vec![node_part])?);
    let layers = order::arrange(layers, previous.map(|(_, l)| l.as_slice()), &versioned);
    // A rebuild of the image it follows (the same layers) records what
    // that one recorded: the same image, however often it is pushed.
    let same = previous.is_some_and(|(_, prev)| {
        prev.iter().map(|d| &d.digest).eq(base
            .layers
            .iter()
            .map(|d| &d.digest)
            .chain(layers.iter().map(|l| &l.digest)))
    });
    let prov = &Provenance {
        previous: spec
            .previous
            .as_ref()
            .and_then(|p| p.recorded_by(same, Some(platform))),
        ..prov.clone()
    };
    let config_bytes = node_config(
        &read_blob(layout, &base.config.digest)?,
        &layers,
        prov,
        kind.kind_base,
    )?;
    let config = Descriptor::new(
        media::OCI_CONFIG,
        Digest::of(&config_bytes),
        config_bytes.len() as u64,
    );
    layout
        .put_bytes(&config, bytes::Bytes::from(config_bytes))
        .await?;
    let m_bytes = node_manifest(base, &config, &layers, prov)?;
    let m_desc = Descriptor::new(
        media::OCI_MANIFEST,
        Digest::of(&m_bytes),
        m_bytes.len() as u64,
    );
    layout
        .put_bytes(&m_desc, bytes::Bytes::from(m_bytes))
        .await?;
    phases.pack = started.elapsed().as_secs_f64();
    Ok(BuiltPlatform {
        manifest: m_desc,
        sbom,
        layers,
        kind,
        pinned_existing: built.pinned_existing,
        pins: PinChanges {
            platform: platform.to_string(),
            unpinned: built.unpinned,
            kept_pinned: built.kept_pinned,
            pinned_by_others: built.pinned_by_others,
        },
        phases,
        kept: kept_report,
        same_as_previous: same,
    })
}
