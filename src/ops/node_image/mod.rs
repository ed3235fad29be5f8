//! `kiln build --base`: a node image, daemonless. The base into a staging
//! layout, one new layer with the pinned store (see [`crate::domain::node_image`]),
//! then the image out: an OCI archive, a docker archive, or pushed.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use serde::Serialize;
use serde_json::json;

use crate::adapters::registry::RegistryClient;
use crate::adapters::rootfs::DaemonChoice;
use crate::domain::kubernetes::{Release, ReleaseSpec};
use crate::domain::manifest::NodeManifest;
use crate::domain::node_image::{build_node_image, NodeBuild, NodeImage, PlatformInput};
use crate::engine::copy::{CopyOptions, Engine};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{Descriptor, Document};
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::layout::OciLayout;
use crate::sink::registry::{RegistryPush, Tally};
use crate::source::Source;

mod attach;
mod kind_node;
mod kubeadm;
use attach::{attach, attach_records, base_replayed};
mod publish;
pub use kind_node::KindNode;
use kind_node::{kind_node_files, KindNodeFiles};
use kubeadm::{ask_kubeadm, Asked};
pub use publish::{publish, push_signature, Published};

/// Where a node image goes.
#[derive(Debug, Clone)]
pub enum Output {
    Oci(PathBuf),
    Docker(PathBuf),
}

/// Everything a node-image build needs.
pub struct NodeImageOptions<'a> {
    pub manifest: &'a NodeManifest,
    pub platforms: Vec<Platform>,
    pub base: ImageRef,
    pub output: Option<Output>,
    pub push: Option<ImageRef>,
    /// The image's name in an archive (default: `kiln.local/node:VERSION`).
    pub tag: Option<ImageRef>,
    /// Where pushes go (also the registry the base and images may come from).
    pub registry: &'a RegistryClient,
    pub daemon: DaemonChoice,
    /// `--qemu`: the emulator for another platform's binaries (the
    /// release's kubeadm included).
    pub qemu: Option<PathBuf>,
    pub jobs: usize,
    pub progress: Progress,
    /// `--kubernetes`: a release whose binaries and control-plane images go in.
    pub kubernetes: Option<ReleaseSpec>,
    /// `--kind-manifests DIR`.
    pub kind_manifests: Option<PathBuf>,
    /// `--kind-node REF`: a published kindest/node whose `/kind/manifests`
    /// are taken byte for byte and whose addon images are bundled and pinned.
    pub kind_node: Option<KindNode<'a>>,
    /// `--previous REF` (or the `--push` tag's image): the node image this
    /// one follows; its layer order is kept (`domain::node_image::order`).
    pub previous: Option<KindNode<'a>>,
    /// Whether `previous` was named by `--previous` (then an image that
    /// cannot be read is bad input) or is the `--push` tag's (which may
    /// not exist yet: a first push).
    pub previous_named: bool,
    /// `--pin-existing`.
    pub pin_existing: bool,
    /// `--keep-pinned`.
    pub keep_pinned: bool,
    /// `--layer-compression`.
    pub compression: crate::domain::node_image::Compression,
    /// `--keep-previous-layers`: a percentage of kiln's own bytes.
    pub keep_previous: u8,
    /// What the base (and a `--kind-node` image) may put under what kiln
    /// unpacks from it.
    pub limits: crate::primitives::unpack::Limits,
    /// The shared blob cache (`--cache-dir`), `None` with `--no-cache`.
    pub cache: Option<crate::sink::cache::Cache>,
    /// `--verify-signatures`: asked before each bundled image is stored.
    pub gate: Option<std::sync::Arc<dyn crate::engine::gate::Gate>>,
    /// With `--push`: attach the SBOM (`--sbom`) and the provenance
    /// (`--provenance`) to the pushed image as OCI 1.1 referrers.
    pub attach_sbom: bool,
    pub attach_provenance: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageReport {
    pub name: String,
    pub digest: Digest,
    pub media_type: String,
    pub base: String,
    pub platforms: Vec<PlatformManifest>,
    pub kiln_layers: Vec<KilnLayer>,
    /// With `--push`: blobs uploaded, mounted and already there, counted
    /// as they went (manifests not counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pushed: Option<Tally>,
    /// What was written or pushed, for people.
    pub outputs: Vec<String>,
    /// Bytes of each archive written.
    pub archive_size: Option<u64>,
    /// The archive written, if any.
    pub archive: Option<PathBuf>,
    /// The Kubernetes release built in, per platform.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kubernetes: Vec<ReleaseReport>,
    /// kind's layout as written (per platform).
    pub kind: Vec<crate::domain::kind::KindLayout>,
    /// Images the base's store held that kiln pinned (per platform).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pinned_existing: Vec<Vec<String>>,
    /// Per platform: pins removed (exactly the manifest pinned), kept, or
    /// made by others.
    pub pins: Vec<crate::domain::node_image::PinChanges>,
    /// Where the time went (seconds).
    pub phases: crate::domain::node_image::Phases,
    pub layer_compression: crate::domain::node_image::Compression,
    /// What went in (`--sbom` writes it).
    #[serde(skip)]
    pub sbom: crate::domain::sbom::Sbom,
    /// Documents attached to the pushed image as its referrers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attached: Vec<Attached>,
    /// The node image this one follows, `name@sha256:…` (`--previous`, or
    /// the `--push` tag's image); none for a first build.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The tag and signature, once [`publish`] put them up (a push is by
    /// digest until then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<Published>,
    /// The top document's bytes, for the tag ([`publish`]).
    #[serde(skip)]
    pub top_document: bytes::Bytes,
    /// Whether the previous image's build record stood in for bytes, and
    /// why (`domain::node_image::previous_trust`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_trust: Option<crate::domain::node_image::PreviousTrust>,
    /// Per platform: what was kept of it in place.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<crate::domain::node_image::KeptReport>,
    /// Base layers whose part the extract replayed (from the cache or the
    /// previous image's record) rather than inflated, all platforms.
    pub base_layers_replayed: usize,
    /// Build records attached to the pushed manifests (`record`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<Attached>,
    /// Per platform: the base's kubelet image-manager state, whited out
    /// (`domain::kubelet::state`).
    pub removed_kubelet_state: Vec<crate::domain::node_image::RemovedState>,
}

/// A document attached to a pushed node image (an OCI 1.1 referrer).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attached {
    pub artifact_type: String,
    /// The artifact manifest's digest.
    pub digest: Digest,
    /// How registries find it: the referrers API, or the tag schema.
    pub index: crate::adapters::registry::ReferrerIndex,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseReport {
    pub platform: String,
    pub version: String,
    pub source: String,
    pub sha512: Option<String>,
    /// The control-plane images it supplied, as named in the node.
    pub images: Vec<String>,
    pub binaries: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlatformManifest {
    pub platform: String,
    pub manifest: Digest,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KilnLayer {
    pub platform: String,
    pub digest: Digest,
    pub diff_id: Digest,
    pub size: u64,
    pub entries: usize,
    /// What it holds (the config's history says the same).
    pub holds: String,
    /// Taken from the cache, not compressed again.
    pub cached: bool,
    /// Taken by digest from the previous image's record: neither fetched,
    /// written nor compressed.
    pub reused: bool,
}

/// Builds the node image from `base_source`'s base and `images`' component
/// images, then writes and/or pushes it.
pub async fn node_image<B: Source, S: Source>(
    opts: NodeImageOptions<'_>,
    base_source: &B,
    images: &S,
) -> anyhow::Result<NodeImageReport> {
    // A base too deep for kiln's layers is refused from its manifests,
    // before any of its layers is fetched.
    crate::domain::node_image::check_base_depth(base_source, &opts.base, &opts.platforms).await?;
    // The releases first: a bad checksum or a missing kubeadm image stops
    // the build before anything is fetched or written.
    let kind_node = match &opts.kind_node {
        Some(k) => Some(kind_node_files(k, &opts.platforms[0], opts.jobs, opts.limits).await?),
        None => None,
    };
    let inputs = platform_inputs(&opts, kind_node.as_ref()).await?;
    let previous = match &opts.previous {
        Some(p) => {
            crate::domain::node_image::previous_image(
                &p.source,
                &p.image,
                &opts.platforms,
                opts.previous_named,
            )
            .await?
        }
        None => None,
    };
    let tag = match &opts.tag {
        Some(t) => t.clone(),
        None => ImageRef::parse(&format!(
            "kiln.local/node:{}",
            inputs[0]
                .manifest
                .kubernetes_version
                .as_deref()
                .unwrap_or("latest")
                .replace('+', "_")
        ))?,
    };
    let staging = crate::primitives::owned::work_dir("kiln-node-image-")?;
    let layout = OciLayout::open(&staging.path().join("image"))?;
    // The build records and contributions, apart from the image: only a
    // push attaches them, an archive never holds them.
    let records = OciLayout::open(&staging.path().join("records"))?;
    let trust = match (&previous, &opts.previous) {
        (Some(p), Some(from)) => Some(
            crate::domain::node_image::previous_trust(
                &from.source,
                p,
                opts.gate.as_deref(),
                opts.push.as_ref(),
                opts.output.is_some(),
            )
            .await,
        ),
        _ => None,
    };
    let previous_records = match (&previous, &opts.previous, &trust) {
        (Some(p), Some(from), Some(t)) if t.record_used => {
            crate::domain::node_image::previous_records(
                &from.source,
                p,
                &opts.platforms,
                &opts.compression.identity(),
                &records,
                opts.cache.as_ref(),
            )
            .await
        }
        _ => Default::default(),
    };
    if let Some(Output::Oci(p) | Output::Docker(p)) = &opts.output {
        // kiln's layers stream straight into the archive (written once).
        layout.archive_to(p)?;
    }
    let copy_opts = CopyOptions {
        platforms: opts.platforms.clone(),
        jobs: opts.jobs,
        cache: opts.cache.clone(),
        gate: None,
        absent: None,
    };
    // The base, into the staging layout: its documents alone when every
    // platform's record holds what each of its layers gave the extract
    // (its layers are then neither fetched nor inflated; a push finds or
    // mounts them).
    let pulling = std::time::Instant::now();
    let base_opts = CopyOptions {
        absent: base_replayed(&opts, &previous_records),
        ..copy_opts.clone()
    };
    let base_top = Engine::new(base_source, &layout, opts.jobs, Progress::hidden())
        .copy(&opts.base, &base_opts)
        .await?;
    let base_top = Descriptor::new(&base_top.media_type, base_top.digest, 0);
    let pull_base = pulling.elapsed().as_secs_f64();
    let spec = NodeBuild {
        previous: previous.clone(),
        previous_from: opts.previous.as_ref().map(|p| &p.source),
        previous_records,
        records: &records,
        keep_previous: opts.keep_previous,
        inputs: &inputs,
        daemon: &opts.daemon,
        jobs: opts.jobs,
        progress: opts.progress.clone(),
        kind_manifests: match &kind_node {
            Some(k) => Some((k.dir.as_path(), k.label.as_str())),
            None => opts
                .kind_manifests
                .as_deref()
                .map(|d| (d, "--kind-manifests")),
        },
        pin_existing: opts.pin_existing,
        keep_pinned: opts.keep_pinned,
        compression: opts.compression,
        cache: opts.cache.clone(),
        gate: opts.gate.clone(),
        limits: opts.limits,
    };
    let mut node = build_node_image(&layout, &opts.base, &base_top, images, &spec).await?;
    node.phases.pull_base = pull_base;
    let kubernetes = inputs
        .iter()
        .filter_map(|i| {
            i.release.as_ref().map(|r| ReleaseReport {
                platform: i.platform.to_string(),
                version: r.version.clone(),
                source: r.src.clone(),
                sha512: r.sha512.clone(),
                images: r.images.iter().map(|m| m.name.to_string()).collect(),
                binaries: crate::domain::kubernetes::BINARIES
                    .iter()
                    .map(|b| format!("/usr/bin/{b}"))
                    .collect(),
            })
        })
        .collect();
    opts.progress.finish();
    let packing = std::time::Instant::now();
    let (outputs, archive_size, mut pushed) =
        write_outputs(&opts, &tag, &layout, &node, &copy_opts).await?;
    let sbom = crate::domain::sbom::Sbom {
        subject: tag.to_string(),
        ..node.sbom.clone()
    };
    let (attached, attached_records) = match &opts.push {
        Some(target) => {
            let (records, sent) = attach_records(&opts, target, &node, &records).await?;
            if let Some(p) = pushed.as_mut() {
                p.add(&sent);
            }
            (attach(&opts, target, &node, &sbom).await?, records)
        }
        None => (Vec::new(), Vec::new()),
    };
    let top_document = bytes::Bytes::from(
        std::fs::read(layout.blob_path(&node.top.digest))
            .with_context(|| format!("{} is not in the layout", node.top.digest))?,
    );
    let mut phases = node.phases;
    phases.pack += packing.elapsed().as_secs_f64();
    Ok(NodeImageReport {
        name: tag.to_string(),
        digest: node.top.digest.clone(),
        media_type: node.top.media_type.clone(),
        base: opts.base.to_string(),
        platforms: node
            .manifests
            .iter()
            .map(|(p, d)| PlatformManifest {
                platform: p.to_string(),
                manifest: d.digest.clone(),
            })
            .collect(),
        kiln_layers: node
            .layers
            .iter()
            .flat_map(|(p, ls)| {
                ls.iter().map(move |l| KilnLayer {
                    platform: p.to_string(),
                    digest: l.digest.clone(),
                    diff_id: l.diff_id.clone(),
                    size: l.size,
                    entries: l.entries,
                    holds: l.holds.clone(),
                    cached: l.cached,
                    reused: l.reused,
                })
            })
            .collect(),
        outputs,
        archive_size,
        pushed,
        archive: match &opts.output {
            Some(Output::Oci(p)) | Some(Output::Docker(p)) => Some(p.clone()),
            None => None,
        },
        kubernetes,
        kind: node.kind.clone(),
        pins: node.pins.clone(),
        removed_kubelet_state: node.kubelet_state.clone(),
        pinned_existing: if opts.pin_existing {
            node.pinned_existing.clone()
        } else {
            Vec::new()
        },
        phases,
        layer_compression: opts.compression,
        sbom,
        attached,
        previous: previous.as_ref().map(|p| p.reference()),
        previous_trust: trust,
        published: None,
        top_document,
        kept: node.kept.clone(),
        base_layers_replayed: node.replayed,
        records: attached_records,
    })
}

/// Each platform's manifest and release: with `--kubernetes`, the release
/// opened (and checked) for that platform, the manifest completed by its
/// control-plane images, and kubeadm's image set for its version checked.
async fn platform_inputs(
    opts: &NodeImageOptions<'_>,
    kind_node: Option<&KindNodeFiles>,
) -> anyhow::Result<Vec<PlatformInput>> {
    let mut inputs = Vec::new();
    // kind's addon images, bundled and pinned like the manifest's own.
    let base_manifest = match kind_node {
        Some(k) => opts
            .manifest
            .with_images(&k.images, &format!("the images {} runs", k.label))
            .map_err(|e| crate::primitives::error::BadInput(e.to_string()))?,
        None => opts.manifest.clone(),
    };
    for p in &opts.platforms {
        let Some(spec) = &opts.kubernetes else {
            inputs.push(PlatformInput {
                platform: p.clone(),
                manifest: base_manifest.clone(),
                release: None,
            });
            continue;
        };
        let http = opts.registry.http_client()?;
        let sha512 = spec
            .sha512_for(p)
            .map_err(crate::primitives::error::BadInput)?;
        let release = Release::open(
            &spec.for_platform(p),
            sha512.as_deref(),
            &p.architecture,
            &http,
            opts.cache.as_ref(),
        )
        .await?;
        release.check_architecture(p)?;
        let supplied: Vec<_> = release.images.iter().map(|i| i.name.clone()).collect();
        let manifest = base_manifest
            .with_release(&release.version, &supplied)
            .map_err(|e| crate::primitives::error::BadInput(e.to_string()))?;
        let missing = match (
            crate::domain::kubeadm::missing(&release.version, &manifest.images)?,
            ask_kubeadm(&release, p, &opts.daemon, opts.qemu.as_deref())?,
        ) {
            (_, Asked::Listed(want)) => {
                if let Some(diff) = crate::domain::kubeadm::cross_check(&release.version, &want) {
                    tracing::warn!("{diff}");
                }
                Ok(crate::domain::kubeadm::lacking(&want, &manifest.images))
            }
            (table, Asked::Not(why)) => table
                .map_err(|unknown| format!("{unknown}: kubeadm's image set is not checked; {why}")),
        };
        match missing {
            Ok(missing) if missing.is_empty() => {}
            Ok(missing) => {
                let names: Vec<String> = missing.iter().map(|m| m.to_string()).collect();
                return Err(crate::primitives::error::BadInput(format!(
                    "{}: the node would lack {}, which kubeadm {} asks for; add {} to the manifest's images",
                    opts.manifest.path.display(),
                    names.join(", "),
                    release.version,
                    if names.len() == 1 { "it" } else { "them" }
                ))
                .into());
            }
            Err(unchecked) => tracing::warn!("{unchecked}"),
        }
        inputs.push(PlatformInput {
            platform: p.clone(),
            manifest,
            release: Some(release),
        });
    }
    Ok(inputs)
}

/// Writes the archive (`--output`) and pushes (`--push`); says what it did,
/// the archive's size, and how the push's blobs went.
async fn write_outputs(
    opts: &NodeImageOptions<'_>,
    tag: &ImageRef,
    layout: &OciLayout,
    node: &NodeImage,
    copy_opts: &CopyOptions,
) -> anyhow::Result<(Vec<String>, Option<u64>, Option<Tally>)> {
    let mut outputs = Vec::new();
    let mut archive_size = None;
    let mut pushed = None;
    if let Some(out) = &opts.output {
        layout.name_only(tag, &node.top);
        layout.write_index()?;
        let (path, extra, kind) = match out {
            Output::Oci(p) => (p, vec![], "oci-archive"),
            Output::Docker(p) => {
                write_docker_manifest(layout, node, tag)?;
                (p, vec!["manifest.json"], "docker-archive")
            }
        };
        let size = layout
            .pack(path, &extra)
            .with_context(|| format!("writing {}", path.display()))?;
        archive_size = Some(size);
        outputs.push(format!(
            "{kind}:{} ({})",
            path.display(),
            crate::primitives::text::human_bytes(size)
        ));
    }
    if let Some(target) = &opts.push {
        // By digest: the tag goes up last ([`publish`]), after the verify
        // and the signature.
        let by_digest = ImageRef {
            tag: None,
            digest: Some(node.top.digest.clone()),
            ..target.clone()
        };
        layout.name_only(&by_digest, &node.top);
        // The base's layers mount from its repository on the same registry.
        // The base's layers mount from its repository on the same
        // registry, and the previous image's (reused by digest) from its.
        let mut from = vec![&opts.base];
        from.extend(opts.previous.as_ref().map(|p| &p.image));
        let sink = RegistryPush::new(opts.registry.clone(), target.clone()).mount_from(from);
        let engine = Engine::new(layout, &sink, opts.jobs, Progress::hidden());
        // Pushed from the staging layout: nothing of it goes into the cache.
        let push_opts = CopyOptions {
            cache: None,
            gate: None,
            ..copy_opts.clone()
        };
        engine
            .copy(&by_digest, &push_opts)
            .await
            .map_err(|e| anyhow!("pushing {by_digest}: {e:#}"))?;
        let tally = sink.tally();
        outputs.push(format!("pushed {target} ({})", tally.describe()));
        pushed = Some(tally);
    }
    Ok((outputs, archive_size, pushed))
}

/// `manifest.json` as `docker load` reads it (Docker 25 paths into blobs/).
fn write_docker_manifest(
    layout: &OciLayout,
    node: &NodeImage,
    tag: &ImageRef,
) -> anyhow::Result<()> {
    let (_, m) = &node.manifests[0];
    let bytes = std::fs::read(layout.blob_path(&m.digest))?;
    let Ok((_, Document::Manifest(man))) = Document::parse(&bytes) else {
        anyhow::bail!("node manifest unreadable")
    };
    let blob = |d: &Digest| format!("blobs/sha256/{}", d.hex());
    let doc = json!([{"Config": blob(&man.config.digest), "RepoTags": [tag.docker_short_name()], "Layers": man.layers.iter().map(|l| blob(&l.digest)).collect::<Vec<_>>()}]);
    layout.add_file("manifest.json", &serde_json::to_vec(&doc)?)
}
