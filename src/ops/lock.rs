//! `kiln lock`: every manifest entry pinned to the digest its tag resolves
//! to now, the manifest's text, comments and order kept; and, with a lock
//! file, every other input of a node image too ([`lock_inputs`]).

use serde::Serialize;

use crate::adapters::registry::RegistryClient;
use crate::domain::manifest::NodeManifest;
use crate::primitives::digest::Digest;
use crate::primitives::reference::ImageRef;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockReport {
    pub images: Vec<Locked>,
    /// The manifest with the digests written in.
    #[serde(skip)]
    pub text: String,
    /// The lock of every input, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<crate::domain::lockfile::Lock>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Locked {
    pub reference: String,
    /// `None` for digest-only entries, which stay as they are.
    pub digest: Option<Digest>,
    /// The digest the manifest had, when the tag has moved since.
    pub moved_from: Option<Digest>,
}

/// Resolves every tagged entry; fails naming each that cannot be resolved.
pub async fn lock(
    registry: &RegistryClient,
    manifest: &NodeManifest,
) -> anyhow::Result<LockReport> {
    let mut images = Vec::new();
    let mut errors = Vec::new();
    for image in &manifest.images {
        let mut locked = Locked {
            reference: image.to_string(),
            digest: None,
            moved_from: None,
        };
        // Entries with only a digest stay as they are; tags are resolved afresh.
        if image.tag.is_some() {
            let by_tag = ImageRef {
                digest: None,
                ..image.clone()
            };
            match registry.resolve(&by_tag).await {
                Ok(r) => {
                    locked.moved_from = image.digest.clone().filter(|d| *d != r.descriptor.digest);
                    locked.digest = Some(r.descriptor.digest);
                }
                Err(e) => errors.push(format!(
                    "{by_tag}: {}",
                    crate::primitives::text::one_line(&format!("{e:#}"))
                )),
            }
        }
        images.push(locked);
    }
    if !errors.is_empty() {
        anyhow::bail!("cannot resolve {}", errors.join("; "));
    }
    let pins: Vec<Option<Digest>> = images.iter().map(|l| l.digest.clone()).collect();
    Ok(LockReport {
        text: manifest.with_digests(&pins),
        images,
        lock: None,
    })
}

/// A node image's inputs besides its manifest, to lock.
pub struct Inputs<'a> {
    pub base: Option<ImageRef>,
    pub kind_node: Option<ImageRef>,
    pub previous: Option<ImageRef>,
    pub kubernetes: Option<crate::domain::kubernetes::ReleaseSpec>,
    pub platforms: &'a [crate::primitives::platform::Platform],
    /// Where a release opened for its binaries' sums is kept for the build.
    pub cache: Option<&'a crate::sink::cache::Cache>,
}

/// The lock of every input: `manifest` (as it is on disk now), its images
/// at the digests `report` resolved, the base and kindest/node at the
/// digests their references resolve to now, and each platform's release
/// with the SHA-512 it must have (given, or published beside it).
pub async fn lock_inputs(
    registry: &RegistryClient,
    manifest: &NodeManifest,
    report: &LockReport,
    inputs: &Inputs<'_>,
) -> anyhow::Result<crate::domain::lockfile::Lock> {
    use crate::domain::lockfile::{key, Lock, LockedImage, LockedRelease};
    let mut lock = Lock::new(manifest);
    for (image, l) in manifest.images.iter().zip(&report.images) {
        let digest = l
            .digest
            .clone()
            .or_else(|| image.digest.clone())
            .expect("each entry was resolved or has a digest");
        lock.images.push(LockedImage {
            reference: key(image),
            digest,
        });
    }
    for (slot, image, flag) in [
        (&mut lock.base, &inputs.base, "--base"),
        (&mut lock.kind_node, &inputs.kind_node, "--kind-node"),
        (&mut lock.previous, &inputs.previous, "--previous"),
    ] {
        if let Some(image) = image {
            let r = registry.resolve(image).await.map_err(|e| {
                anyhow::anyhow!(
                    "{flag} {image}: {}",
                    crate::primitives::text::one_line(&format!("{e:#}"))
                )
            })?;
            if let Some(d) = &image.digest {
                if *d != r.descriptor.digest {
                    anyhow::bail!(
                        "{flag} {image}: the registry serves {}",
                        r.descriptor.digest
                    );
                }
            }
            *slot = Some(LockedImage {
                reference: key(image),
                digest: r.descriptor.digest,
            });
        }
    }
    if let Some(spec) = &inputs.kubernetes {
        let http = registry.http_client()?;
        for p in inputs.platforms {
            let source = spec.for_platform(p);
            let sha512 =
                crate::domain::kubernetes::expected_sha512(&source, spec.sha512.as_deref(), &http)
                    .await?;
            // Opened (checked against that SHA-512) for its binaries'
            // sums; kept in the cache for the build that follows.
            let release = crate::domain::kubernetes::Release::open(
                &source,
                Some(&sha512),
                &p.architecture,
                &http,
                inputs.cache,
            )
            .await?;
            lock.kubernetes.push(LockedRelease {
                platform: p.to_string(),
                source: release.src.clone(),
                sha512,
                binaries: release.binary_sha512s()?,
            });
        }
    }
    Ok(lock)
}
