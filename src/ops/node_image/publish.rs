//! The last two steps of a push, in this order, after everything else is
//! in the registry by digest (blobs, manifests, referrers) and after the
//! verify when one is asked: the signature (`--sign-key`), then the tag.
//! A verify that fails or cannot run, or a signature that cannot be
//! pushed, leaves the tag where it was: nobody pulls an image by its tag
//! before it held its checks, and a signed tag never lacks its signature.

use super::*;

/// What publishing did, for the report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Published {
    /// `REPO:TAG` now names the image.
    pub tagged: String,
    /// The key it was signed with, and where the signature is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_with: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// Signs (when `key` is given) and then tags the image `report` names, in
/// `target`'s repository; records both in the report.
pub async fn publish(
    registry: &RegistryClient,
    target: &ImageRef,
    report: &mut NodeImageReport,
    key: Option<&crate::domain::signatures::sign::SigningKey>,
) -> anyhow::Result<()> {
    let (mut signed_with, mut signature) = (None, None);
    if let Some(key) = key {
        signature = Some(push_signature(registry, target, &report.digest, key).await?);
        signed_with = Some(key.name.clone());
    }
    let tagged = match &target.tag {
        Some(tag) => {
            registry
                .push_manifest(target, tag, &report.media_type, report.top_document.clone())
                .await
                .map_err(|e| anyhow!("tagging {target}: {e:#}"))?;
            target.to_string()
        }
        None => format!("{}@{}", target.name(), report.digest),
    };
    report.published = Some(Published {
        tagged,
        signed_with,
        signature,
    });
    Ok(())
}

/// Pushes `key`'s signature of `target`'s image `digest` under cosign's
/// `sha256-<hex>.sig` tag; says where it is. Before any tag names the
/// image (`kiln build --push`, `kiln index --push`).
pub async fn push_signature(
    registry: &RegistryClient,
    target: &ImageRef,
    digest: &Digest,
    key: &crate::domain::signatures::sign::SigningKey,
) -> anyhow::Result<String> {
    let failed =
        |e: anyhow::Error| anyhow!("signing {}@{digest}: {e:#}; not tagged", target.name());
    let sig = key.sign(&target.name(), digest).map_err(failed)?;
    for (desc, data) in [&sig.config, &sig.payload] {
        attach::push_bytes(registry, target, desc, bytes::Bytes::from(data.clone()))
            .await
            .map_err(failed)?;
    }
    let tag = crate::domain::signatures::cosign::sidecar_tag(digest);
    registry
        .push_manifest(
            target,
            &tag,
            crate::primitives::oci::media::OCI_MANIFEST,
            bytes::Bytes::from(sig.manifest),
        )
        .await
        .map_err(failed)?;
    Ok(format!("{}:{tag}", target.name()))
}
