//! One platform of a node image: the base's paths extracted (`extract`),
//! the store baked, the release's binaries and kind's layout written,
//! kiln's layers (planned, written or taken from the cache, the previous
//! image's kept in place, ordered), the config and the manifest.

use super::*;
use layer_cache::write_layers;

/// One platform's result.
pub(super) struct BuiltPlatform {
    pub(super) manifest: Descriptor,
    /// This platform's part of the SBOM.
    pub(super) sbom: crate::domain::sbom::Sbom,
    pub(super) layers: Vec<LayerBlob>,
    pub(super) kind: crate::domain::kind::KindLayout,
    pub(super) pinned_existing: Vec<String>,
    pub(super) pins: PinChanges,
    pub(super) phases: Phases,
    pub(super) kept: Option<KeptReport>,
    /// Its layers are the previous image's (a rebuild).
    pub(super) same_as_previous: bool,
    /// Its build record (in `NodeBuild::records`) and the contributions it
    /// names, to attach to the manifest when pushed.
    pub(super) record: (Descriptor, Vec<Descriptor>),
    /// Base layers whose contribution was replayed, not inflated.
    pub(super) reused: usize,
    /// The base's kubelet image-manager state, whited out.
    pub(super) kubelet_state: Option<crate::domain::kubelet::state::Found>,
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
pub(super) async fn build_platform<S: crate::source::Source>(
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
    // The previous image's record, if it may be used for this platform.
    let record = spec
        .previous_records
        .get(&platform.to_string())
        .filter(|r| {
            let on = r.built_on(&base.layers);
            if !on {
                tracing::warn!(
                    "{platform}: the previous image was built on another base; nothing of it is reused without its bytes"
                );
            }
            on
        });
    let recorded = record.map(|r| r.contributions()).unwrap_or_default();
    let (extracted, before) = crate::primitives::blocking::off_runtime(|| -> anyhow::Result<_> {
        let sources = extract::Sources {
            cache: spec.cache.as_ref(),
            recorded: &recorded,
            whole: spec.daemon.trust_node_binaries,
            given: spec.records,
        };
        let e = extract::extract(
            &rootfs,
            &base.layers,
            layout,
            &sources,
            &mut owners,
            &mut unpack_budget,
        )?;
        refuse_kind_base_without_kubernetes(&rootfs, input, &prov.base_name)?;
        Ok((e, snapshot(&rootfs)?))
    })?;
    phases.extract = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let renamed = input.release.as_ref().map(|r| r.source()).transpose()?;
    let source = crate::source::renamed::Overlay {
        first: renamed.as_ref(),
        rest: images,
    };
    // What the record's layers hold is recorded without its bytes, until
    // a layer to be written needs them (fetched below).
    let absent = record.map(|r| std::sync::Arc::new(r.blobs()));
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
            node: extracted.node.clone(),
            absent: absent.clone(),
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
    let keyed = layer_cache::keyed(&rootfs, planned, &owners, spec.compression, &known);
    let reuse = record.map(|r| r.by_key()).unwrap_or_default();
    if !built.absent.is_empty() {
        // The layers to be written need their blobs' bytes.
        let absent: std::collections::HashSet<Digest> = built.absent.iter().cloned().collect();
        let absent = &absent;
        let need: std::collections::BTreeSet<Digest> = keyed
            .iter()
            .filter(|k| {
                k.key
                    .as_ref()
                    .is_none_or(|(key, _)| !reuse.contains_key(key) && !written.contains_key(key))
            })
            .flat_map(|k| record::needed(&k.planned.entries, absent))
            .collect();
        fill::fill(&rootfs, &need, &built.images, &source, spec, work.path()).await?;
    }
    let mut write = |planned: Vec<layer_cache::Keyed>| {
        crate::primitives::blocking::off_runtime(|| {
            write_layers(
                layout,
                &rootfs,
                planned,
                &owners,
                mtime,
                spec.compression,
                written,
                &reuse,
                spec.cache.as_ref(),
            )
        })
    };
    let mut layers = write(keyed)?;
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
                record,
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
    // The base's kubelet state, removed from the extract, is removed from
    // the node by the build's own layer (`domain::kubelet::state`).
    if built.removed_kubelet_state.is_some() {
        node_entries.insert(
            snapshot::whiteout(Path::new(crate::domain::kubelet::state::DIR)),
            true,
        );
    }
    node_part.entries = node_entries.into_iter().collect();
    layers.extend(kept.kept.into_iter().map(|k| (plan::Part::Kept, k.layer)));
    layers.extend(write(vec![layer_cache::Keyed {
        planned: node_part,
        key: None,
    }])?);
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
    // This image's record, named in its manifest (`record`).
    let rec = record::Record::new(
        &platform.to_string(),
        &spec.compression.identity(),
        &base.layers,
        &extracted.contributions,
        &layers,
    )
    .to_bytes();
    let rec = {
        let d = Descriptor::new(record::MEDIA_TYPE, Digest::of(&rec), rec.len() as u64);
        let mut out = spec.records.new_blob()?;
        std::io::Write::write_all(&mut out, &rec)?;
        spec.records.commit_blob(out, &d.digest, d.size)?;
        d
    };
    let prov = &Provenance {
        previous: spec
            .previous
            .as_ref()
            .and_then(|p| p.recorded_by(same, Some(platform))),
        record: Some(rec.clone()),
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
        record: (
            rec,
            extracted
                .contributions
                .iter()
                .filter_map(|(_, c)| c.clone())
                .collect(),
        ),
        reused: extracted.replayed,
        kubelet_state: built.removed_kubelet_state,
    })
}
