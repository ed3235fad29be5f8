//! Baking a manifest into a rootfs's store: its images copied in, exactly
//! the manifest pinned (kiln's stale pins removed), the manifest recorded,
//! and CRI's sandbox image in the node's config. `kiln build --rootfs` is
//! this once; node-image builds run it per platform.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::adapters::rootfs::{self, DaemonChoice};
use crate::domain::manifest::NodeManifest;
use crate::domain::store::{copy_into_store, NodeStore};
use crate::engine::copy::CopyOptions;
use crate::engine::report::Failed;
use crate::engine::report::{CopiedImage, Stats};
use crate::primitives::inroot::Root;
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::sink::containerd::PinPolicy;
use crate::source::Source;

/// What a rootfs build did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildReport {
    pub rootfs: String,
    pub images: Vec<CopiedImage>,
    pub failed: Vec<Failed>,
    pub stats: Stats,
    /// Images the store already held that kiln pinned (`--pin-existing`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pinned_existing: Vec<String>,
    /// kiln's pins the manifest does not name, removed (exactly the
    /// manifest stays pinned); nothing is deleted.
    pub unpinned: Vec<Unpinned>,
    /// The same, kept because of `--keep-pinned`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_pinned: Vec<Unpinned>,
    /// Pins someone other than kiln made, left as they are.
    pub pinned_by_others: Vec<String>,
    /// The containerd version the store was written for: the node's own,
    /// else the writer's.
    pub containerd: String,
    /// Layer blobs recorded without their bytes (`BuildSpec::absent`):
    /// stand-ins in the store.
    #[serde(skip)]
    pub absent: Vec<crate::primitives::digest::Digest>,
    /// The kubelet's image-manager state the rootfs held, removed
    /// (`domain::kubelet::state`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed_kubelet_state: Option<crate::domain::kubelet::state::Found>,
}

impl BuildReport {
    /// The bundled images as an SBOM lists them: digest, platforms, and
    /// whether `manifest` pins them.
    pub fn sbom_images(&self, manifest: &NodeManifest) -> Vec<crate::domain::sbom::Image> {
        self.images
            .iter()
            .map(|c| crate::domain::sbom::Image {
                reference: c.reference.clone(),
                digest: c.digest.clone(),
                platforms: c.platforms.clone(),
                pinned: manifest
                    .images
                    .iter()
                    .position(|i| i.to_string() == c.reference)
                    .is_none_or(|i| manifest.pinned[i]),
                admitted_by: c.admitted_by.clone(),
            })
            .collect()
    }
}

/// What to build into a rootfs.
pub struct BuildSpec<'a> {
    pub choice: &'a DaemonChoice,
    pub manifest: &'a NodeManifest,
    pub platforms: Vec<Platform>,
    pub jobs: usize,
    pub progress: Progress,
    /// Pin every image already in the store too (a kindest/node base).
    pub pin_existing: bool,
    /// Keep kiln's pins the manifest no longer names (`--keep-pinned`).
    pub keep_pinned: bool,
    /// The store came with a base image (a node-image build): what kiln
    /// pinned before this build, the base's builder pinned.
    pub from_base: bool,
    /// The shared blob cache; in a node-image build's staging rootfs its
    /// entries are hard-linked, in a user's rootfs cloned or copied.
    pub cache: Option<crate::sink::cache::Cache>,
    /// Asked before each image is stored (`--verify-signatures`).
    pub gate: Option<std::sync::Arc<dyn crate::engine::gate::Gate>>,
    /// The node's containerd as a node-image extract knew it (its binary
    /// left out), instead of reading it from the rootfs.
    pub node: Option<crate::adapters::rootfs::NodeContainerd>,
    /// Layer blobs recorded without their bytes (`CopyOptions::absent`).
    pub absent:
        Option<std::sync::Arc<std::collections::HashSet<crate::primitives::digest::Digest>>>,
}

/// A pin kiln removed (or, with `--keep-pinned`, kept), and why.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unpinned {
    pub name: String,
    pub reason: String,
}

/// Copies the manifest's images for the platforms into `rootfs`'s store,
/// pinned, and points CRI's sandbox image at the manifest's when that image
/// made it.
pub async fn build_rootfs<S: Source>(
    rootfs: &Path,
    source: &S,
    spec: BuildSpec<'_>,
) -> anyhow::Result<BuildReport> {
    let BuildSpec {
        choice,
        manifest,
        platforms,
        jobs,
        progress,
        pin_existing,
        keep_pinned,
        from_base,
        cache,
        gate,
        node: known,
        absent,
    } = spec;
    crate::primitives::umask::create_dir_all_as_caller(rootfs)
        .with_context(|| format!("creating {}", rootfs.display()))?;
    // Pull records a kubelet left would make the bundled images "pulled,
    // credentials unknown" to the next one (`domain::kubelet::state`).
    let removed_kubelet_state = crate::domain::kubelet::state::remove(&Root::open(rootfs)?)
        .with_context(|| {
            format!(
                "removing the kubelet's image-manager state from {}",
                rootfs.display()
            )
        })?;
    if let Some(f) = &removed_kubelet_state {
        tracing::info!(
            "removed the kubelet's image-manager state ({})",
            f.summary()
        );
    }
    let mut node = NodeStore::open_as(rootfs, choice, known).await?;
    node.store = node.store.clone().with_policy(PinPolicy::Pin);
    if let Some(w) = rootfs::pinning_warning(node.node.as_ref()) {
        tracing::warn!("{w}");
    }
    let share = if from_base {
        crate::sink::cache::Share::Link
    } else {
        crate::sink::cache::Share::Clone
    };
    node.store = node.store.clone().with_share(share);
    let opts = CopyOptions {
        platforms,
        jobs,
        cache,
        gate,
        absent,
    };
    // Pinned entries, then preloaded ones (`pinned: false`); results back
    // in the manifest's order. We own this daemon: whatever a killed run
    // left is ours to clear.
    let (pin, preload): (Vec<usize>, Vec<usize>) =
        (0..manifest.images.len()).partition(|&i| manifest.pinned[i]);
    let mut results: Vec<Option<anyhow::Result<crate::engine::report::CopiedImage>>> =
        (0..manifest.images.len()).map(|_| None).collect();
    let mut stats = crate::engine::report::Stats::default();
    for (which, policy) in [(pin, PinPolicy::Pin), (preload, PinPolicy::Preload)] {
        if which.is_empty() {
            continue;
        }
        let images: Vec<crate::primitives::reference::ImageRef> =
            which.iter().map(|&i| manifest.images[i].clone()).collect();
        node.store = node.store.clone().with_policy(policy);
        let (got, s) = copy_into_store(
            &mut node.store,
            true,
            source,
            &images,
            &opts,
            progress.clone(),
        )
        .await?;
        stats.add(&s);
        for (i, r) in which.into_iter().zip(got) {
            results[i] = Some(r);
        }
    }
    node.store = node.store.clone().with_policy(PinPolicy::Pin);
    let results: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("every image was copied once"))
        .collect();
    let pinned_existing = if pin_existing {
        // The manifest's preloaded images stay reclaimable.
        node.store
            .pin_existing(|record| {
                manifest
                    .images
                    .iter()
                    .zip(&manifest.pinned)
                    .any(|(i, pinned)| !pinned && i.owns_record(record))
            })
            .await?
    } else {
        Vec::new()
    };
    // Exactly the manifest pinned: now that its pins are recorded, kiln's
    // other pins go (never one of the manifest's, not even for a moment).
    let (stale, pinned_by_others) = node
        .store
        .stale_pins(|name| keeps(manifest, &results, &pinned_existing, name))
        .await?;
    let mut unpinned = Vec::new();
    for r in &stale {
        let why = Unpinned {
            name: r.name.clone(),
            reason: unpin_reason(manifest, &results, &stale, &r.name, from_base),
        };
        if !keep_pinned {
            node.store.unpin(r).await?;
            crate::primitives::fault::point("mid-unpin");
        }
        unpinned.push(why);
    }
    let (unpinned, kept_pinned) = if keep_pinned {
        (Vec::new(), unpinned)
    } else {
        (unpinned, Vec::new())
    };
    let node_version = node.node.as_ref().and_then(|n| n.version.clone().ok());
    let daemon_version = node.daemon.version;
    let containerd = node_version.unwrap_or(daemon_version).to_string();
    let absent = node.store.absent();
    node.close_written()?;
    let (images, failed) = crate::engine::report::split(&manifest.images, results);
    // The node records what it was built from (`kiln verify` reads it).
    let root = Root::open(rootfs)?;
    let record = Path::new(crate::domain::manifest::MANIFEST_RECORD);
    root.owned_dir(record.parent().expect("has a parent"))?;
    root.write(record, manifest.text.as_bytes(), 0o644)?;
    let sandbox = manifest.sandbox_image.to_string();
    if !failed.iter().any(|f| f.reference == sandbox) {
        let name = manifest
            .sandbox_image
            .tagged_name()
            .unwrap_or_else(|| manifest.sandbox_image.to_string());
        crate::domain::node_config::write_sandbox_image(
            &root,
            &name,
            node_version.or(Some(daemon_version)),
        )?;
    }
    Ok(BuildReport {
        rootfs: rootfs.display().to_string(),
        images,
        failed,
        stats,
        pinned_existing,
        unpinned,
        kept_pinned,
        pinned_by_others,
        containerd,
        absent,
        removed_kubelet_state,
    })
}

/// Whether the record `name` belongs to the manifest's pinned set: a record
/// this build wrote for one of its images, one `--pin-existing` pinned, or
/// any record of an image that failed this time (its old pin stays until it
/// is stored again).
fn keeps(
    manifest: &NodeManifest,
    results: &[anyhow::Result<CopiedImage>],
    pinned_existing: &[String],
    name: &str,
) -> bool {
    if pinned_existing.iter().any(|p| p == name) {
        return true;
    }
    manifest.images.iter().zip(results).any(|(i, r)| match r {
        Ok(c) => c.records.iter().any(|rec| rec == name),
        Err(_) => i.owns_record(name),
    })
}

/// Why a pin of kiln's is stale, for the report.
fn unpin_reason(
    manifest: &NodeManifest,
    results: &[anyhow::Result<CopiedImage>],
    stale: &[crate::sink::containerd::ImageRecord],
    name: &str,
    from_base: bool,
) -> String {
    if from_base {
        return "pinned by the base".into();
    }
    if let Some((repo, _)) = name.split_once('@') {
        // Its tag's record is stale too: the tag left the manifest.
        if stale
            .iter()
            .any(|r| r.name.starts_with(&format!("{repo}:")))
        {
            return "no longer in the manifest".into();
        }
        let moved = manifest
            .images
            .iter()
            .zip(results)
            .find_map(|(i, r)| match r {
                Ok(c) if i.name() == repo && i.digest.is_none() => Some(c.digest.clone()),
                _ => None,
            });
        if let Some(now) = moved {
            return format!("tag moved to {now}");
        }
    }
    "no longer in the manifest".into()
}
