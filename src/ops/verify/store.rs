//! The store's own view: every bundled image present, complete for the
//! platform and labelled as the manifest says; exactly the manifest pinned
//! by kiln; and every blob file re-hashed against its name (a store kiln did
//! not write is trusted by its bytes, never by its records).

use std::path::Path;

use serde::Serialize;

use super::Check;
use crate::domain::manifest::NodeManifest;
use crate::engine::closure::{self, Select};
use crate::primitives::oci::{Descriptor, Document};
use crate::primitives::platform::Platform;
use crate::sink::containerd::{ContainerdStore, LABEL_MANAGED, LABEL_PINNED};
use crate::sink::Sink;

/// The node holds what `lock` holds: the manifest it recorded has the
/// locked bytes, each locked image is recorded at its locked digest,
/// pinned unless the manifest says otherwise, a node image names the
/// locked base, and the binaries of `platform`'s locked release are the
/// node's (SHA-512).
pub(super) async fn holds_the_lock(
    store: &ContainerdStore,
    node: &super::Node,
    lock: &crate::domain::lockfile::Lock,
    platform: &crate::primitives::platform::Platform,
) -> anyhow::Result<Check> {
    let manifest = &node.manifest;
    let mut details = Vec::new();
    if let (Some(locked), Some(base)) = (&lock.base, &node.base) {
        if *base != locked.digest {
            details.push(format!(
                "the base: the node image was built on {base}, the lock holds {} ({})",
                locked.digest, locked.reference
            ));
        }
    }
    if let Some(release) = lock
        .kubernetes
        .iter()
        .find(|r| r.platform == platform.to_string())
    {
        let root = crate::primitives::inroot::Root::open(&node.files)?;
        for (path, want) in &release.binaries {
            let rel = std::path::Path::new(path.trim_start_matches('/'));
            let have = match root.open_file(rel) {
                Ok(f) => tokio::task::block_in_place(|| crate::primitives::digest::sha512_hex(f))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    details.push(format!("{path}: not in the node (locked at sha512:{want})"));
                    continue;
                }
                Err(e) => return Err(anyhow::anyhow!("reading {path}: {e}")),
            };
            if have != *want {
                details.push(format!(
                    "{path}: the node has sha512:{have}, the lock holds sha512:{want}"
                ));
            }
        }
    }
    let sha = manifest.source_sha256();
    if lock.manifest.sha256 != sha {
        details.push(format!(
            "the node was built from a manifest with sha256:{sha}; the lock holds sha256:{}",
            lock.manifest.sha256
        ));
    }
    for l in &lock.images {
        let image = crate::primitives::reference::ImageRef::parse(&l.reference)
            .map_err(|e| anyhow::anyhow!("the lock's image {}: {e}", l.reference))?;
        let name = image
            .tagged_name()
            .unwrap_or_else(|| image.digest_name(&l.digest));
        match store.image_record(&name).await? {
            None => details.push(format!("{name}: not in the node (locked at {})", l.digest)),
            Some(rec) if rec.target.digest != l.digest => details.push(format!(
                "{name}: the node has {}, the lock holds {}",
                rec.target.digest, l.digest
            )),
            Some(rec) => {
                let pinned = rec.labels.get(LABEL_PINNED).is_some_and(|v| v == "pinned");
                if manifest.is_pinned(&image) && !pinned {
                    details.push(format!("{name}: at its locked digest but not pinned"));
                }
            }
        }
    }
    Ok(Check::new(
        "the node holds what the lock holds: the manifest's bytes, each image at its locked digest, the base, the release's binaries",
        details,
    ))
}

/// Exactly the manifest pinned: no pin of kiln's (`io.kiln.pinned`) on a
/// record the manifest's images do not own; pins by others are returned.
pub(super) async fn exactly_the_manifest(
    store: &ContainerdStore,
    manifest: &NodeManifest,
) -> anyhow::Result<(Check, Vec<String>)> {
    let mut owned = Vec::new();
    for image in &manifest.images {
        if let Some(n) = image.tagged_name() {
            if let Some(rec) = store.image_record(&n).await? {
                owned.push(image.digest_name(&rec.target.digest));
            }
            owned.push(n);
        }
        if let Some(d) = &image.digest {
            owned.push(image.digest_name(d));
        }
    }
    let (stale, others) = store.stale_pins(|n| owned.iter().any(|o| o == n)).await?;
    let details: Vec<String> = stale
        .iter()
        .map(|r| {
            format!(
                "{}: pinned by kiln but not in the manifest (a stale pin; rebuild to unpin it)",
                r.name
            )
        })
        .collect();
    Ok((
        Check {
            ran: true,
            name: "nothing but the manifest is pinned by kiln".into(),
            ok: details.is_empty(),
            details,
        },
        others,
    ))
}

/// What re-hashing the store's blob files found.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rehashed {
    pub blobs: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// One line per file whose bytes do not hash to its name.
    pub mismatched: Vec<String>,
}

/// Hashes every file under `blobs/sha256/` of the store against its name:
/// a store is trusted by its bytes, never by its records.
pub(super) fn rehash_store(store_dir: &Path) -> anyhow::Result<Rehashed> {
    let started = std::time::Instant::now();
    let mut r = Rehashed::default();
    let dir = store_dir
        .join(crate::domain::store::CONTENT_DIR)
        .join("blobs/sha256");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(r),
        Err(e) => return Err(e.into()),
    };
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        r.bytes += e.metadata()?.len();
        let got = crate::sink::blobdir::hash_file(&e.path())?;
        r.blobs += 1;
        if got.hex() != name {
            r.mismatched.push(format!(
                "blob sha256:{name} ({}) holds bytes that hash to {got}",
                e.path().display()
            ));
        }
    }
    r.seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

/// Check 1: every image present, complete for the platform, managed and pinned.
pub(super) async fn stored(
    store: &ContainerdStore,
    manifest: &NodeManifest,
    platform: &Platform,
) -> anyhow::Result<Check> {
    let mut details = Vec::new();
    for (image, pin) in manifest.images.iter().zip(&manifest.pinned) {
        let name = image.tagged_name().unwrap_or_else(|| image.to_string());
        let Some(rec) = store.image_record(&name).await? else {
            details.push(format!("{image}: no image record {name}"));
            continue;
        };
        let label = |l: &str| rec.labels.get(l).map(String::as_str);
        if label(LABEL_MANAGED) != Some("managed") {
            details.push(format!("{image}: recorded without {LABEL_MANAGED}=managed"));
        }
        match (pin, label(LABEL_PINNED)) {
            (true, Some("pinned")) | (false, None) => {}
            (true, _) => details.push(format!("{image}: recorded without {LABEL_PINNED}=pinned")),
            (false, Some(v)) => details.push(format!(
                "{image}: recorded with {LABEL_PINNED}={v}, but the manifest preloads it reclaimable (pinned: false)"
            )),
        }
        if let Some(pin) = &image.digest {
            if *pin != rec.target.digest {
                details.push(format!(
                    "{image}: recorded at {}, the manifest pins {pin}",
                    rec.target.digest
                ));
            }
        }
        let chosen = match platform_manifest(store, &rec.target, platform).await? {
            Ok(d) => d,
            Err(why) => {
                details.push(format!("{image}: {why}"));
                continue;
            }
        };
        let walk = closure::walk(store, &rec.target, Select::Only(&[chosen])).await?;
        details.extend(walk.holes.iter().map(|h| format!("{image}: {h}")));
    }
    Ok(Check::new(
        "every bundled image is present, complete and pinned (preloaded ones unpinned)",
        details,
    ))
}

/// The manifest `top` has for `platform` (itself for a single manifest).
async fn platform_manifest(
    store: &ContainerdStore,
    top: &Descriptor,
    platform: &Platform,
) -> anyhow::Result<Result<crate::primitives::digest::Digest, String>> {
    let Some(bytes) = store.read(&top.digest).await? else {
        return Ok(Err(format!(
            "its top-level document {} is missing",
            top.digest
        )));
    };
    Ok(match Document::parse(&bytes) {
        Ok((_, Document::Index(idx))) => {
            match crate::primitives::oci::select_platform(&idx.manifests, platform) {
                Some(i) => Ok(idx.manifests[i].digest.clone()),
                None => Err(format!("no {platform} manifest in its index")),
            }
        }
        Ok((_, Document::Manifest(_))) => Ok(top.digest.clone()),
        Err(e) => Err(format!("unreadable top-level document: {e}")),
    })
}
