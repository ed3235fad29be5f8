//! Pushing: blobs (skipped when the registry has them, mounted from another
//! repository of the same registry when it holds them there, else one
//! monolithic upload) and manifests by tag, for `--push` and `kiln index`;
//! always to the registry itself, never to a mirror.

use anyhow::anyhow;
use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::StatusCode;

use super::auth::same_origin;
use super::hosts::Endpoint;
use super::transport::registry_error;
use super::{FetchError, RegistryClient};
use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::{media, Descriptor};
use crate::primitives::reference::ImageRef;

impl RegistryClient {
    pub(super) fn push_endpoint(&self, image: &ImageRef) -> Endpoint {
        self.inner
            .hosts
            .endpoints(&image.domain)
            .pop()
            .expect("the registry itself is always last")
    }

    /// Whether the registry already has a blob (`what` = "blobs") or manifest ("manifests").
    pub async fn exists(
        &self,
        image: &ImageRef,
        what: &str,
        digest: &Digest,
    ) -> anyhow::Result<bool> {
        let ep = self.push_endpoint(image);
        let url = format!("{}/v2/{}/{what}/{digest}", ep.base_url(), image.path);
        let accept = (what == "manifests").then(|| media::ACCEPT.join(", "));
        match self
            .inner
            .request(
                &ep,
                &image.path,
                "pull,push",
                reqwest::Method::HEAD,
                &url,
                accept.as_deref(),
                None,
                None,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(FetchError::NotFound(_)) => Ok(false),
            Err(e) => Err(anyhow!("{e}")),
        }
    }

    /// Asks the registry to mount `desc` into `image`'s repository from
    /// `from`'s (OCI distribution spec, "Mounting a blob from another
    /// repository": `POST /v2/<name>/blobs/uploads/?mount=<digest>&from=<other>`).
    /// 201: mounted, nothing to upload. 202: the registry opened an
    /// ordinary upload session instead; its Location is given back for the
    /// upload. Scopes: with token auth the registry's challenge names both
    /// repositories, and kiln asks the token server for what it names.
    pub async fn mount_blob(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        from: &ImageRef,
    ) -> anyhow::Result<Mount> {
        let query = format!("?mount={}&from={}", desc.digest, from.path);
        let (resp, location) = self.start_upload(image, &query).await?;
        if resp == StatusCode::CREATED {
            return Ok(Mount::Mounted);
        }
        Ok(Mount::Upload(location?))
    }

    /// `POST /v2/<name>/blobs/uploads/<query>`: the registry's answer and
    /// the upload session's Location (absolute), if it opened one.
    async fn start_upload(
        &self,
        image: &ImageRef,
        query: &str,
    ) -> anyhow::Result<(StatusCode, anyhow::Result<String>)> {
        let ep = self.push_endpoint(image);
        let url = format!("{}/v2/{}/blobs/uploads/{query}", ep.base_url(), image.path);
        let resp = self
            .inner
            .request(
                &ep,
                &image.path,
                "pull,push",
                reqwest::Method::POST,
                &url,
                None,
                None,
                None,
            )
            .await
            .map_err(|e| anyhow!("{e}"))?;
        Ok((resp.status(), upload_location(&ep, &url, &resp)))
    }

    /// Uploads a blob in one PUT, streaming `data` (which fails unless
    /// verified); into `session` when the registry opened one already.
    pub async fn push_blob(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        data: BlobStream,
        session: Option<String>,
    ) -> anyhow::Result<u64> {
        let ep = self.push_endpoint(image);
        let loc = match session {
            Some(loc) => loc,
            None => self.start_upload(image, "").await?.1?,
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        let url = format!("{loc}{sep}digest={}", desc.digest);
        let mut req = self
            .inner
            .client(&ep)
            .map_err(|e| anyhow!("{e}"))?
            .put(&url)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, desc.size)
            .body(reqwest::Body::wrap_stream(data));
        // The registry's credentials never go to another origin.
        if same_origin(&url, &ep.base_url()) {
            if let Some(h) = self
                .inner
                .cached_auth(&ep.host, &format!("repository:{}:pull,push", image.path))
            {
                req = req.header(AUTHORIZATION, h);
            }
        } else {
            tracing::debug!(%url, "upload Location on another origin: sent without Authorization");
        }
        let resp = req.send().await.map_err(|e| {
            anyhow!(
                "uploading {}: {}",
                desc.digest,
                crate::primitives::text::error_chain(&e)
            )
        })?;
        // The token the upload went with ran out (a long push; Docker Hub's
        // last 300 s): renewed for this repository, and the engine sends
        // the blob again into a new session (once: the engine's `twice`).
        if resp.status() == StatusCode::UNAUTHORIZED {
            let challenge = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let scope = format!("repository:{}:pull,push", image.path);
            self.inner
                .authenticate(&ep, &scope, &challenge)
                .await
                .map_err(|e| anyhow!("uploading {}: {e}", desc.digest))?;
            return Err(crate::primitives::error::SendAgain(format!(
                "uploading {} to {}: its token expired and was renewed",
                desc.digest, ep.host
            ))
            .into());
        }
        if resp.status() != StatusCode::CREATED {
            let status = resp.status().as_u16();
            return Err(anyhow!(
                "uploading {} to {}: {status} {}",
                desc.digest,
                ep.host,
                registry_error(resp, self.inner.retry.stall).await
            ));
        }
        Ok(desc.size)
    }

    /// PUTs a manifest or index under a tag or its digest.
    pub async fn push_manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        media_type: &str,
        bytes: Bytes,
    ) -> anyhow::Result<()> {
        self.put_manifest(image, reference, media_type, bytes)
            .await
            .map(|_| ())
    }

    /// [`Self::push_manifest`], the registry's answer kept (its headers).
    pub(super) async fn put_manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        media_type: &str,
        bytes: Bytes,
    ) -> anyhow::Result<reqwest::Response> {
        let ep = self.push_endpoint(image);
        let url = format!("{}/v2/{}/manifests/{reference}", ep.base_url(), image.path);
        self.inner
            .request(
                &ep,
                &image.path,
                "pull,push",
                reqwest::Method::PUT,
                &url,
                Some(media_type),
                None,
                Some(bytes),
            )
            .await
            .map_err(|e| anyhow!("{e}"))
    }
}

/// What a mount request came to.
#[derive(Debug)]
pub enum Mount {
    Mounted,
    /// An upload session to PUT the blob into.
    Upload(String),
}

/// An upload session's Location, made absolute: relative, or absolute on
/// any host (a storage backend, or a hostile one).
fn upload_location(ep: &Endpoint, asked: &str, resp: &reqwest::Response) -> anyhow::Result<String> {
    let loc = resp
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| anyhow!("{asked}: no upload Location"))?;
    Ok(reqwest::Url::parse(&ep.base_url())
        .and_then(|b| b.join(loc))
        .map_err(|e| anyhow!("{asked}: bad upload Location {loc:?}: {e}"))?
        .to_string())
}
