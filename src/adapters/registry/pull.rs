//! Pulling: manifests by tag or digest (size-bounded, digest-checked against
//! a pinned reference), and blobs as streams that resume with `Range` when
//! a download breaks or stalls. The registry client as a copy source.

use std::sync::Arc;

use anyhow::anyhow;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream};
use futures_util::StreamExt;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;

use super::hosts::Endpoint;
use super::transport::read_limited;
use super::{FetchError, Inner, ManifestUnknown, RegistryClient, MAX_MANIFEST_BYTES};
use crate::primitives::digest::Digest;
use crate::primitives::handoff::{BlobStream, Resolved};
use crate::primitives::oci::{media, Descriptor, Document};
use crate::primitives::reference::ImageRef;

impl RegistryClient {
    /// Fetches a manifest by tag or digest from the first endpoint that has
    /// it, checked against the digest the registry (or the caller) names.
    async fn fetch_manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        expect: Option<&Digest>,
    ) -> anyhow::Result<(Bytes, Digest, String)> {
        self.fetch_manifest_from(self.inner.endpoints(image), image, reference, expect)
            .await
    }

    pub(super) async fn fetch_manifest_from(
        &self,
        endpoints: Vec<Endpoint>,
        image: &ImageRef,
        reference: &str,
        expect: Option<&Digest>,
    ) -> anyhow::Result<(Bytes, Digest, String)> {
        let mut errors = Vec::new();
        // Unknown: some endpoint said so, and no other answered otherwise.
        let (mut unknown, mut other) = (false, false);
        // Who said "no such manifest", and who could not be asked.
        let (mut said_unknown, mut unasked) = (Vec::new(), Vec::new());
        for ep in endpoints {
            let url = format!("{}/v2/{}/manifests/{reference}", ep.base_url(), image.path);
            let mut stalls = 0;
            let result = loop {
                let result = async {
                let resp = self.inner.send(&ep, &image.path, &url, Some(&media::ACCEPT.join(", ")), None).await?;
                let header_digest = resp.headers().get("Docker-Content-Digest").and_then(|v| v.to_str().ok()).map(str::to_string);
                let content_type = resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let body = read_limited(resp, MAX_MANIFEST_BYTES, self.inner.retry.stall, "manifest", Some(self.inner.retry.resumes.min(2) - stalls)).await.map_err(|e| match e {
                    FetchError::Stalled(m) => FetchError::Stalled(format!("{url}: {m}")),
                    FetchError::Other(m) => FetchError::Other(format!("{url}: {m}")),
                    e => e,
                })?;
                let digest = Digest::of(&body);
                if let Some(want) = expect {
                    if *want != digest {
                        return Err(FetchError::Other(format!("{url}: manifest digest mismatch: expected {want}, got {digest}")));
                    }
                } else if let Some(h) = header_digest.filter(|h| h.starts_with("sha256:")) {
                    if h != digest.as_str() {
                        return Err(FetchError::Other(format!("{url}: manifest digest mismatch: registry says {h}, content is {digest}")));
                    }
                }
                Ok((body, digest, content_type))
            }
            .await;
                match result {
                    // A stalled answer is asked again, a bounded number of times.
                    Err(FetchError::Stalled(ref why))
                        if stalls < self.inner.retry.resumes.min(2) =>
                    {
                        stalls += 1;
                        tracing::debug!(%url, "asking again: {why}");
                    }
                    Err(FetchError::Stalled(why)) => {
                        break Err(FetchError::Stalled(format!(
                            "{why} (asked {} times)",
                            stalls + 1
                        )))
                    }
                    r => break r,
                }
            };
            match result {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::debug!(endpoint = %ep.base_url(), "manifest fetch failed: {e}");
                    match e {
                        FetchError::NotFound(_) => {
                            unknown = true;
                            said_unknown.push(ep.clone());
                        }
                        FetchError::Unreachable(_) => unasked.push(ep.host.clone()),
                        _ => other = true,
                    }
                    // A mirror without an image's signature or referrers
                    // index may still hold the image: it stays in use.
                    let attachment = matches!(e, FetchError::NotFound(_))
                        && super::referrers::is_attachment_tag(reference);
                    if !attachment {
                        self.inner.write_off(&ep, image, &e);
                    }
                    errors.push(e.to_string());
                }
            }
        }
        let joined = errors.join("; then ");
        if unknown && !other {
            // The answer first, in one short line: who has no such thing,
            // who could not be asked, and what the first one holds like it.
            let at: Vec<String> = said_unknown.iter().map(Endpoint::base_url).collect();
            let mut msg = format!(
                "no {}:{reference} at {} (404, manifest unknown)",
                image.path,
                at.join(", ")
            );
            if !unasked.is_empty() {
                msg.push_str(&format!("; {} could not be asked", unasked.join(", ")));
            }
            // Only for a tag a user named: a missing signature or referrers
            // index is the usual answer, and its message is never shown.
            if expect.is_none() && !super::referrers::is_attachment_tag(reference) {
                if let Some(ep) = said_unknown.first() {
                    let like = self.tags_like(ep, image, reference).await;
                    if !like.is_empty() {
                        msg.push_str(&format!("; {} has {}", ep.base_url(), like.join(", ")));
                    }
                }
            }
            return Err(ManifestUnknown(msg).into());
        }
        if !unknown && !other && !unasked.is_empty() {
            return Err(crate::primitives::error::Unreachable(joined).into());
        }
        Err(anyhow!("{joined}"))
    }

    /// Up to five tags of `image`'s repository at `ep` that look like `tag`
    /// (one starts with the other, or they share most of their start), for
    /// a message; none when the registry will not list them.
    async fn tags_like(&self, ep: &Endpoint, image: &ImageRef, tag: &str) -> Vec<String> {
        let url = format!("{}/v2/{}/tags/list", ep.base_url(), image.path);
        let Ok(resp) = self.inner.send(ep, &image.path, &url, None, None).await else {
            return vec![];
        };
        let Ok(body) = read_limited(
            resp,
            MAX_MANIFEST_BYTES,
            self.inner.retry.stall,
            "tag list",
            None,
        )
        .await
        else {
            return vec![];
        };
        #[derive(serde::Deserialize)]
        struct Tags {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let tags = serde_json::from_slice::<Tags>(&body)
            .ok()
            .and_then(|t| t.tags)
            .unwrap_or_default();
        let common = |t: &str| {
            t.chars()
                .zip(tag.chars())
                .take_while(|(a, b)| a == b)
                .count()
        };
        let mut like: Vec<String> = tags
            .into_iter()
            .filter(|t| {
                t.starts_with(tag)
                    || tag.starts_with(t.as_str())
                    || 3 * common(t) >= 2 * tag.len().max(3)
            })
            .collect();
        like.sort();
        like.truncate(5);
        like
    }

    /// The plain answer for a pinned digest no endpoint has: say so, and
    /// what the tag (if any) points at now.
    async fn unknown_pin(&self, image: &ImageRef, pin: &Digest) -> anyhow::Error {
        let now = match &image.tag {
            // Every endpoint again: one that lacks the digest may have the tag.
            Some(tag) => match self
                .fetch_manifest_from(self.inner.hosts.endpoints(&image.domain), image, tag, None)
                .await
            {
                Ok((_, d, _)) => format!("; the tag {tag} is {d}"),
                Err(_) => format!("; the tag {tag} is not there either"),
            },
            None => String::new(),
        };
        anyhow!("the registry has no manifest {pin}{now}; fix the pin or run kiln lock")
    }
}

/// A blob download that survives broken connections: on an error mid-body it
/// asks again from the byte it reached (Range), a bounded number of times.
/// The engine's verifier checks the bytes as one whole, whatever the resumes.
struct Download {
    inner: Arc<Inner>,
    ep: Endpoint,
    repo: String,
    url: String,
    body: Option<BoxStream<'static, Result<Bytes, String>>>,
    offset: u64,
    skip: u64,
    resumes: u32,
}

fn resumable(d: Download) -> BlobStream {
    Box::pin(stream::unfold(d, |mut d| async move {
        loop {
            let body = d.body.as_mut()?;
            match body.next().await {
                None => return None,
                Some(Ok(mut chunk)) => {
                    if d.skip > 0 {
                        let n = (d.skip as usize).min(chunk.len());
                        chunk = chunk.slice(n..);
                        d.skip -= n as u64;
                        if chunk.is_empty() {
                            continue;
                        }
                    }
                    d.offset += chunk.len() as u64;
                    return Some((Ok(chunk), d));
                }
                Some(Err(why)) => {
                    if d.resumes >= d.inner.retry.resumes {
                        d.body = None;
                        return Some((
                            Err(anyhow!(
                                "{}: download broke at byte {} after {} resumptions: {why}",
                                d.url,
                                d.offset,
                                d.resumes
                            )),
                            d,
                        ));
                    }
                    d.resumes += 1;
                    tracing::debug!(url = %d.url, offset = d.offset, "resuming blob download: {why}");
                    crate::primitives::progress::retried();
                    tokio::time::sleep(d.inner.retry.delay(d.resumes - 1, None)).await;
                    match d
                        .inner
                        .send(&d.ep, &d.repo, &d.url, None, Some(d.offset))
                        .await
                    {
                        Ok(resp) => {
                            // A server that ignores Range sends it all again: skip what we have.
                            d.skip = if resp.status() == StatusCode::PARTIAL_CONTENT {
                                0
                            } else {
                                d.offset
                            };
                            let what = format!(
                                "{} from byte {} ({} more resumptions)",
                                d.url,
                                d.offset,
                                d.inner.retry.resumes.saturating_sub(d.resumes)
                            );
                            d.body = Some(crate::adapters::registry::stall::guard(
                                resp.bytes_stream(),
                                d.inner.retry.stall,
                                what,
                            ));
                        }
                        Err(e) => {
                            d.body = None;
                            return Some((
                                Err(anyhow!("{}: resuming at byte {}: {e}", d.url, d.offset)),
                                d,
                            ));
                        }
                    }
                }
            }
        }
    }))
}

impl RegistryClient {
    /// `image`'s top-level manifest or index, by digest or tag.
    pub async fn resolve(&self, image: &ImageRef) -> anyhow::Result<Resolved> {
        let reference = match (&image.digest, &image.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        };
        let fetched = self
            .fetch_manifest(image, &reference, image.digest.as_ref())
            .await;
        let (bytes, digest, content_type) = match (fetched, &image.digest) {
            (Ok(f), _) => f,
            (Err(e), Some(pin)) if e.is::<ManifestUnknown>() => {
                return Err(self.unknown_pin(image, pin).await)
            }
            (Err(e), _) => return Err(e),
        };
        let media_type = match Document::parse(&bytes) {
            Ok((m, _)) => m,
            Err(e) => return Err(anyhow!("{e} (Content-Type {content_type})")),
        };
        Ok(Resolved {
            descriptor: Descriptor::new(&media_type, digest, bytes.len() as u64),
            bytes,
        })
    }

    /// A manifest named by an index entry, checked against its digest.
    pub async fn manifest(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<Bytes> {
        let (bytes, _, _) = self
            .fetch_manifest(image, desc.digest.as_str(), Some(&desc.digest))
            .await?;
        Ok(bytes)
    }

    /// A blob as a stream that resumes with Range requests when cut.
    pub async fn blob(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<BlobStream> {
        let mut errors = Vec::new();
        for ep in self.inner.endpoints(image) {
            let url = format!("{}/v2/{}/blobs/{}", ep.base_url(), image.path, desc.digest);
            match self.inner.send(&ep, &image.path, &url, None, None).await {
                Ok(resp) => {
                    let what = format!("{url} ({} more resumptions)", self.inner.retry.resumes);
                    return Ok(resumable(Download {
                        inner: self.inner.clone(),
                        ep,
                        repo: image.path.clone(),
                        url,
                        body: Some(crate::adapters::registry::stall::guard(
                            resp.bytes_stream(),
                            self.inner.retry.stall,
                            what,
                        )),
                        offset: 0,
                        skip: 0,
                        resumes: 0,
                    }));
                }
                Err(e) => {
                    if matches!(e, FetchError::Unreachable(_)) {
                        self.inner.write_off(&ep, image, &e);
                    }
                    errors.push(e.to_string())
                }
            }
        }
        Err(anyhow!("{}", errors.join("; then ")))
    }

    /// The endpoints tried for `image`, for messages.
    pub fn describe(&self, image: &ImageRef) -> String {
        let eps: Vec<String> = self
            .inner
            .hosts
            .endpoints(&image.domain)
            .iter()
            .map(|e| format!("{}/v2/{}", e.base_url(), image.path))
            .collect();
        eps.join(" then ")
    }
}
