//! `kiln index`: one multi-platform node image from single-platform ones
//! pushed by separate CI jobs. Each member is read from its registry, its
//! platform taken from its config (or its index entry), copied into the
//! target repository when it lives elsewhere, and an OCI index over all of
//! them is pushed under the target tag. Platforms must be distinct.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context};
use futures_util::TryStreamExt;
use serde::Serialize;

use crate::adapters::registry::RegistryClient;
use crate::engine::copy::{CopyOptions, Engine};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor, Document};
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::registry::RegistryPush;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexReport {
    pub name: String,
    pub digest: Digest,
    pub members: Vec<IndexMember>,
    /// Blobs of members from other repositories: mounted (same
    /// registry), uploaded, or already there.
    pub pushed: crate::sink::registry::Tally,
    /// Where its signature is (`--sign-key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexMember {
    pub from: String,
    pub platform: String,
    pub manifest: Digest,
    /// Whether its content had to be copied into the target repository.
    pub copied: bool,
}

/// A configs's platform (configs are small; 1 MiB is plenty).
async fn config_platform(
    registry: &RegistryClient,
    image: &ImageRef,
    config: &Descriptor,
) -> anyhow::Result<Platform> {
    if config.size > 1 << 20 {
        bail!(
            "{image}: config is {} bytes; not an image config",
            config.size
        );
    }
    let parts: Vec<bytes::Bytes> = registry.blob(image, config).await?.try_collect().await?;
    let bytes = parts.concat();
    if Digest::of(&bytes) != config.digest {
        bail!(
            "{image}: config does not match its digest {}",
            config.digest
        );
    }
    let p: crate::primitives::oci::ImageConfigPlatform =
        serde_json::from_slice(&bytes).with_context(|| format!("{image}: config is not JSON"))?;
    Ok(p.platform())
}

/// Joins `members` into one index pushed as `target`.
pub async fn index(
    registry: &RegistryClient,
    target: &ImageRef,
    members: &[ImageRef],
    jobs: usize,
    sign: Option<&crate::domain::signatures::sign::SigningKey>,
) -> anyhow::Result<IndexReport> {
    let Some(tag) = &target.tag else {
        return Err(crate::primitives::error::BadInput(format!(
            "--push {target}: give a tag to push the index under"
        ))
        .into());
    };
    // Each member's platform manifests, with their platforms.
    let mut entries: Vec<(ImageRef, Descriptor)> = Vec::new();
    for m in members {
        let r = registry.resolve(m).await?;
        let (_, doc) = Document::parse(&r.bytes).map_err(|e| anyhow!("{m}: {e}"))?;
        match doc {
            Document::Manifest(man) => {
                let platform = config_platform(registry, m, &man.config).await?;
                entries.push((
                    m.clone(),
                    Descriptor {
                        platform: Some(platform),
                        ..r.descriptor.clone()
                    },
                ));
            }
            Document::Index(idx) => {
                for d in idx
                    .manifests
                    .iter()
                    .filter(|d| media::is_manifest(&d.media_type))
                {
                    let platform = d.platform.clone().ok_or_else(|| {
                        anyhow!("{m}: index entry {} names no platform", d.digest)
                    })?;
                    if platform.os == "unknown" {
                        continue; // attestations
                    }
                    entries.push((m.clone(), d.clone()));
                }
            }
        }
    }
    let mut seen: BTreeMap<String, &ImageRef> = BTreeMap::new();
    for (m, d) in &entries {
        let p = d.platform.as_ref().expect("set above").to_string();
        if let Some(first) = seen.insert(p.clone(), m) {
            return Err(crate::primitives::error::BadInput(format!(
                "{first} and {m} are both {p}; each platform may appear once in an index"
            ))
            .into());
        }
    }
    // Members from other repositories: their content into the target's.
    let repo = ImageRef {
        tag: None,
        digest: None,
        ..target.clone()
    };
    let mut report = Vec::new();
    let mut pushed = crate::sink::registry::Tally::default();
    for (m, d) in &entries {
        let copied = m.name() != target.name();
        if copied {
            // On the same registry the member's blobs are mounted, not
            // fetched and uploaded again.
            let sink = RegistryPush::new(registry.clone(), repo.clone()).mount_from([m]);
            let platform = d.platform.clone().expect("set above");
            let opts = CopyOptions {
                platforms: vec![platform],
                jobs,
                cache: None,
                gate: None,
                absent: None,
            };
            let member = ImageRef {
                tag: None,
                digest: Some(d.digest.clone()),
                ..m.clone()
            };
            Engine::new(registry, &sink, jobs, Progress::hidden())
                .copy(&member, &opts)
                .await
                .map_err(|e| anyhow!("copying {m} into {}: {e:#}", target.name()))?;
            pushed.add(&sink.tally());
        }
        report.push(IndexMember {
            from: m.to_string(),
            platform: d.platform.as_ref().expect("set above").to_string(),
            manifest: d.digest.clone(),
            copied,
        });
    }
    let descriptors: Vec<Descriptor> = entries.into_iter().map(|(_, d)| d).collect();
    let bytes = crate::primitives::oci::write::index(&descriptors, &BTreeMap::new(), false)?;
    let digest = Digest::of(&bytes);
    let bytes = bytes::Bytes::from(bytes);
    // By digest, then the signature, then the tag: a signed tag never
    // lacks its signature.
    let signature = match sign {
        Some(key) => {
            registry
                .push_manifest(target, &digest.to_string(), media::OCI_INDEX, bytes.clone())
                .await
                .map_err(|e| anyhow!("pushing the index to {target}: {e:#}"))?;
            Some(crate::ops::node_image::push_signature(registry, target, &digest, key).await?)
        }
        None => None,
    };
    registry
        .push_manifest(target, tag, media::OCI_INDEX, bytes)
        .await
        .map_err(|e| anyhow!("pushing the index to {target}: {e:#}"))?;
    Ok(IndexReport {
        name: target.to_string(),
        digest,
        members: report,
        pushed,
        signature,
    })
}
