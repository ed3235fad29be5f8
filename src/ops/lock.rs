//! `kiln lock`: every manifest entry pinned to the digest its tag resolves
//! to now; the manifest's text, comments and order kept.

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
    })
}
