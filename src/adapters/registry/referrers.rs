//! OCI 1.1 referrers: the documents whose `subject` is an image
//! (signatures, SBOMs, provenance). From the distribution spec 1.1:
//! - read with `GET /v2/<name>/referrers/<digest>`, an image index whose
//!   entries carry `artifactType`; a registry without the API answers 404;
//! - pushed as a manifest with a `subject`; a registry with the API says
//!   so with an `OCI-Subject` header on the PUT's answer, and one without
//!   needs the client to keep the "referrers tag schema": an image index
//!   tagged `<alg>-<hex>` (the subject's digest) listing them.

use anyhow::anyhow;
use bytes::Bytes;

use super::transport::read_limited;
use super::{FetchError, RegistryClient, MAX_MANIFEST_BYTES};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, referrer_entry, referrers_index};
use crate::primitives::reference::ImageRef;

/// The tag of the referrers tag schema for `subject`: `sha256-<hex>`.
pub fn referrers_tag(subject: &Digest) -> String {
    subject.as_str().replacen(':', "-", 1)
}

/// Whether a tag names something attached to an image by its digest
/// (`sha256-<hex>` for referrers, cosign's `sha256-<hex>.sig`, `.att`,
/// `.sbom`) rather than an image of its own.
pub(super) fn is_attachment_tag(tag: &str) -> bool {
    let Some(rest) = tag.strip_prefix("sha256-") else {
        return false;
    };
    let hex = rest.split('.').next().unwrap_or("");
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// How a pushed referrer can be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ReferrerIndex {
    /// The registry indexes it (referrers API).
    Api,
    /// Listed in the `<alg>-<hex>` index kiln keeps.
    TagSchema,
}

impl RegistryClient {
    /// The referrers API's index for `subject`, from the first endpoint
    /// that serves the API; `None` when none does.
    pub async fn referrers(&self, image: &ImageRef, subject: &Digest) -> Option<Bytes> {
        for ep in self.inner.endpoints(image) {
            let url = format!("{}/v2/{}/referrers/{subject}", ep.base_url(), image.path);
            let answer = async {
                let resp = self
                    .inner
                    .send(&ep, &image.path, &url, Some(media::OCI_INDEX), None)
                    .await?;
                read_limited(
                    resp,
                    MAX_MANIFEST_BYTES,
                    self.inner.retry.stall,
                    "manifest",
                    None,
                )
                .await
            }
            .await;
            match answer {
                Ok(b) => return Some(b),
                Err(FetchError::NotFound(_)) => {}
                Err(e) => tracing::debug!(%url, "referrers: {e}"),
            }
        }
        None
    }

    /// PUTs `manifest` (whose `subject` is `subject`) by its digest; where
    /// the registry does not index it, adds it to the tag schema's index.
    pub async fn push_referrer(
        &self,
        target: &ImageRef,
        manifest: Bytes,
        artifact_type: &str,
        subject: &Digest,
    ) -> anyhow::Result<ReferrerIndex> {
        let digest = Digest::of(&manifest);
        let size = manifest.len();
        let indexed = self
            .put_manifest(target, digest.as_str(), media::OCI_MANIFEST, manifest)
            .await?
            .headers()
            .contains_key("OCI-Subject");
        if indexed {
            return Ok(ReferrerIndex::Api);
        }
        let tag = referrers_tag(subject);
        let ep = self.push_endpoint(target);
        let index = match self.fetch_manifest_from(vec![ep], target, &tag, None).await {
            Ok((bytes, _, _)) => serde_json::from_slice::<serde_json::Value>(&bytes)
                .map_err(|e| anyhow!("{target}: the referrers index {tag}: {e}"))?,
            Err(e) if e.is::<super::ManifestUnknown>() => referrers_index(Vec::new()),
            Err(e) => return Err(e),
        };
        let entry = referrer_entry(media::OCI_MANIFEST, &digest, size as u64, artifact_type);
        let index = with_referrer(index, &digest, entry)
            .map_err(|e| anyhow!("{target}: the referrers index {tag} {e}"))?;
        self.put_manifest(
            target,
            &tag,
            media::OCI_INDEX,
            Bytes::from(serde_json::to_vec(&index)?),
        )
        .await?;
        Ok(ReferrerIndex::TagSchema)
    }
}

/// The referrers tag's index (whatever JSON the registry sent) with `entry`
/// in place of any earlier entry for `digest`. Read with `get_mut`, never
/// by indexing: an array or a string under the tag must not panic.
fn with_referrer(
    mut index: serde_json::Value,
    digest: &Digest,
    entry: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let entries = index
        .get_mut("manifests")
        .and_then(|m| m.as_array_mut())
        .ok_or(
            "has no manifests list; delete the tag or push to a registry with the referrers API",
        )?;
    entries.retain(|m| m.get("digest").and_then(|d| d.as_str()) != Some(digest.as_str()));
    entries.push(entry);
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39.2a: a tag holding an array, a string or an object without
    /// a list is an error, not a panic; an earlier entry is replaced.
    #[test]
    fn a_referrers_tag_of_any_json_is_an_error_not_a_panic() {
        let d = Digest::of(b"x");
        let entry = referrer_entry(media::OCI_MANIFEST, &d, 1, "a/b");
        for hostile in [
            serde_json::json!([1, 2]),
            serde_json::json!("index"),
            serde_json::json!({"manifests": {"digest": "x"}}),
        ] {
            let e = with_referrer(hostile, &d, entry.clone()).unwrap_err();
            assert!(e.contains("no manifests"), "{e}");
        }
        let index = referrers_index(vec![entry.clone(), serde_json::json!(7)]);
        let index = with_referrer(index, &d, entry).unwrap();
        assert_eq!(index["manifests"].as_array().unwrap().len(), 2);
    }
}
