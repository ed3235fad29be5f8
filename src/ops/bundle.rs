//! `kiln bundle`: a manifest's images in one OCI image-layout tarball, for
//! air-gapped builds (`kiln build --from`) and `ctr images import`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::adapters::registry::referrers_tag;
use crate::domain::manifest::NodeManifest;
use crate::domain::signatures::cosign::{sidecar_tag, SIGNATURE_ARTIFACT};
use crate::domain::signatures::referred_signatures;
use crate::engine::copy::{CopyOptions, Engine};
use crate::engine::report::Failed;
use crate::engine::report::{CopiedImage, Stats};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, referrer_entry, referrers_index, Descriptor};
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::layout::OciLayout;
use crate::sink::since::SINCE_FILE;
use crate::sink::Sink;
use crate::source::Source;

/// Where the node manifest travels inside a bundle.
pub const MANIFEST_IN_BUNDLE: &str = "kiln/manifest.yaml";

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleReport {
    /// The bundle written; `None` when an image failed (nothing is written then).
    pub output: Option<String>,
    pub size: u64,
    pub images: Vec<CopiedImage>,
    pub failed: Vec<Failed>,
    /// Where fetched blobs wait for the next run after a failure.
    pub staging: Option<String>,
    /// Signature manifests carried (with `--verify-signatures`), so a
    /// `build --from` checks them offline.
    pub signatures: usize,
    pub stats: Stats,
    /// With `--since OLD`: the layers left to OLD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Since>,
}

/// What a differential bundle leaves to the bundle before it.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Since {
    /// The earlier bundle's file name (its directory is the user's business).
    pub bundle: String,
    /// The digest of its `index.json`, which names what it holds.
    pub index: Digest,
    pub layers_left_out: u64,
    pub bytes_left_out: u64,
}

/// An earlier bundle a differential one is made against (`--since`).
pub struct Earlier<'a> {
    pub path: &'a Path,
    pub archive: &'a crate::source::archive::ArchiveSource,
    /// The digest of its `index.json` (an OCI layout's).
    pub index: Digest,
}

/// Copies `manifest`'s images into a staging layout next to `output`, then
/// packs it; after a failure the staging stays, so a rerun reuses its blobs.
/// With `since`, the layers it holds are left out (and not fetched).
pub async fn bundle<S: Source>(
    source: &S,
    manifest: &NodeManifest,
    opts: &CopyOptions,
    output: &Path,
    progress: Progress,
    since: Option<Earlier<'_>>,
) -> anyhow::Result<BundleReport> {
    let staging = PathBuf::from(format!("{}.kiln-staging", output.display()));
    // A failed run's blobs wait here for the next; each is re-hashed
    // before it is reused (its name and size prove nothing).
    let (layout, _) = OciLayout::reopen_verified(&staging)?;
    let sink = crate::sink::since::Leaving::new(&layout, since.as_ref().map(|e| e.archive));
    let engine = Engine::new(source, &sink, opts.jobs, progress);
    let mut results = engine.copy_all(&manifest.images, opts).await;
    let (signatures, uncarried) =
        carry_signatures(source, &engine, &layout, manifest, &results, opts).await?;
    // An image a signature let in travels with that signature, or fails:
    // `build --from` would refuse it offline.
    for (i, why) in uncarried {
        results[i] = Err(anyhow::anyhow!("{}: {why}", manifest.images[i]));
    }
    let stats = engine.stats();
    let (images, failed) = crate::engine::report::split(&manifest.images, results);
    let since = match since {
        Some(e) => {
            let (layers, bytes) = sink.left();
            Some(Since {
                bundle: e
                    .path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                index: e.index,
                layers_left_out: layers,
                bytes_left_out: bytes,
            })
        }
        None => None,
    };
    if !failed.is_empty() {
        return Ok(BundleReport {
            output: None,
            size: 0,
            images,
            failed,
            staging: Some(staging.display().to_string()),
            signatures,
            stats,
            since,
        });
    }
    layout.write_index()?;
    layout.add_file(MANIFEST_IN_BUNDLE, manifest.text.as_bytes())?;
    let mut extra = vec![MANIFEST_IN_BUNDLE];
    if let Some(s) = &since {
        layout.add_file(SINCE_FILE, &serde_json::to_vec_pretty(s)?)?;
        extra.push(SINCE_FILE);
    }
    let size = layout
        .pack(output, &extra)
        .with_context(|| format!("writing {}", output.display()))?;
    drop(engine);
    drop(sink);
    if let Err(e) = layout.remove() {
        tracing::warn!("removing {}: {e}", staging.display());
    }
    Ok(BundleReport {
        output: Some(output.display().to_string()),
        size,
        images,
        failed,
        staging: None,
        signatures,
        stats,
        since,
    })
}

/// With a signature policy, each image's cosign signatures travel with it:
/// under the tag cosign files them by (`sha256-HEX.sig`), and those filed
/// as OCI 1.1 referrers by digest, listed in the referrers tag schema's
/// index (`sha256-<hex>`), which is how a build from the bundle finds
/// them. An image the policy lets in unsigned has none to carry. Returns
/// the signature manifests carried, and the images (by index) whose
/// admitting signature could not be carried, with why.
async fn carry_signatures<S: Source, K: Sink>(
    source: &S,
    engine: &Engine<'_, S, K>,
    layout: &OciLayout,
    manifest: &NodeManifest,
    results: &[anyhow::Result<CopiedImage>],
    opts: &CopyOptions,
) -> anyhow::Result<(usize, Vec<(usize, String)>)> {
    use crate::domain::signatures::{admitted_via, Via};
    if opts.gate.is_none() {
        return Ok((0, Vec::new()));
    }
    let copied: Vec<(usize, &ImageRef, &CopiedImage)> = manifest
        .images
        .iter()
        .zip(results)
        .enumerate()
        .filter_map(|(i, (image, r))| r.as_ref().ok().map(|c| (i, image, c)))
        .collect();
    let plain = CopyOptions {
        platforms: Vec::new(),
        gate: None,
        ..opts.clone()
    };
    // cosign's tags, all in one copy (concurrent, as any images are).
    let sidecars: Vec<ImageRef> = copied
        .iter()
        .map(|(_, image, c)| ImageRef {
            tag: Some(sidecar_tag(&c.digest)),
            digest: None,
            ..(*image).clone()
        })
        .collect();
    let carried = engine.copy_all(&sidecars, &plain).await;
    let mut uncarried = Vec::new();
    let mut n = 0;
    for ((i, image, c), (sidecar, tagged)) in copied.into_iter().zip(sidecars.iter().zip(carried)) {
        let via = c.admitted_by.as_deref().and_then(admitted_via);
        match tagged {
            Ok(_) => n += 1,
            Err(e) if via == Some(Via::Tag) => {
                uncarried.push((i, format!("its signature {sidecar} was verified but could not be carried into the bundle: {e:#}")));
            }
            Err(e) => tracing::debug!("{sidecar}: not carried: {e:#}"),
        }
        let refs = referred_signatures(source, image, &c.digest).await;
        let entries: Vec<serde_json::Value> = if refs.is_empty() {
            Vec::new()
        } else {
            engine
                .copy_all(&refs, &plain)
                .await
                .into_iter()
                .filter_map(|r| {
                    r.map_err(|e| tracing::debug!("{image}: a referrer not carried: {e:#}"))
                        .ok()
                })
                .map(|s| referrer_entry(&s.media_type, &s.digest, s.top.size, SIGNATURE_ARTIFACT))
                .collect()
        };
        if entries.is_empty() {
            if via == Some(Via::Referrer) {
                uncarried.push((i, "its signature was verified as an OCI 1.1 referrer, but no referrer could be carried into the bundle".to_string()));
            }
            continue;
        }
        n += entries.len();
        let index = serde_json::to_vec(&referrers_index(entries))?;
        let desc = Descriptor::new(media::OCI_INDEX, Digest::of(&index), index.len() as u64);
        layout.put_bytes(&desc, index.into()).await?;
        layout
            .record(
                &format!("{}:{}", image.name(), referrers_tag(&c.digest)),
                &desc,
            )
            .await?;
    }
    Ok((n, uncarried))
}
