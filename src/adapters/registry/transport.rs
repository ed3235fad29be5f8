//! Requests to a registry: each endpoint in turn (mirrors, then the
//! registry), bounded retries with backoff and jitter honouring
//! `Retry-After`, hosts that never answered written off for the run, and
//! one judgement per response (retry, next endpoint, or fail with the
//! registry's own error).

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RANGE, RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::StatusCode;

use super::hosts::Endpoint;
use super::{FetchError, Inner};
use crate::primitives::reference::ImageRef;

impl Inner {
    pub(super) fn client(&self, ep: &Endpoint) -> Result<reqwest::Client, FetchError> {
        let mut clients = self.clients.lock().unwrap();
        if let Some(c) = clients.get(&ep.ca_certs) {
            return Ok(c.clone());
        }
        let mut b = reqwest::Client::builder()
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60));
        for ca in &ep.ca_certs {
            let pem = std::fs::read(ca).map_err(|e| {
                FetchError::Other(format!("reading CA certificate {}: {e}", ca.display()))
            })?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| FetchError::Other(format!("CA certificate {}: {e}", ca.display())))?;
            b = b.add_root_certificate(cert);
        }
        let c = b
            .build()
            .map_err(|e| FetchError::Other(format!("HTTP client: {e}")))?;
        clients.insert(ep.ca_certs.clone(), c.clone());
        Ok(c)
    }

    /// One GET with auth, retries and backoff; a 2xx response or an error.
    pub(super) async fn send(
        &self,
        ep: &Endpoint,
        repo: &str,
        url: &str,
        accept: Option<&str>,
        range: Option<u64>,
    ) -> Result<reqwest::Response, FetchError> {
        self.request(
            ep,
            repo,
            "pull",
            reqwest::Method::GET,
            url,
            accept,
            range,
            None,
        )
        .await
    }

    /// Any request with auth for `actions` on `repo`, retries and backoff. A
    /// body, if any, is resent whole on a retry. `content_type` is the Accept
    /// header of a GET or HEAD, else the body's type.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn request(
        &self,
        ep: &Endpoint,
        repo: &str,
        actions: &str,
        method: reqwest::Method,
        url: &str,
        content_type: Option<&str>,
        range: Option<u64>,
        body: Option<Bytes>,
    ) -> Result<reqwest::Response, FetchError> {
        if self.silent.lock().unwrap().contains(&ep.base_url()) {
            return Err(FetchError::Unreachable(format!(
                "{url}: not tried: {} did not answer earlier in this run",
                ep.host
            )));
        }
        let client = self.client(ep)?;
        let scope = format!("repository:{repo}:{actions}");
        let reading = method == reqwest::Method::GET || method == reqwest::Method::HEAD;
        let accept = if reading { content_type } else { None };
        let mut authenticated = false;
        let mut attempt = 0;
        loop {
            let mut req = client.request(method.clone(), url);
            if let Some(b) = &body {
                if let Some(ct) = content_type {
                    req = req.header(CONTENT_TYPE, ct);
                }
                req = req.body(b.clone());
            } else if !reading {
                req = req.header(reqwest::header::CONTENT_LENGTH, 0);
            }
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            if let Some(off) = range {
                req = req.header(RANGE, format!("bytes={off}-"));
            }
            if let Some(h) = self.cached_auth(&ep.host, &scope) {
                req = req.header(AUTHORIZATION, h);
            }
            // Waiting for an answer to a read (an upload's time is its body's).
            let waiting = reading.then(|| {
                crate::primitives::progress::waiting(format!(
                    "{method} {url} (its answer; {} more tries)",
                    self.retry.attempts.saturating_sub(attempt + 1)
                ))
            });
            let sent = req.send().await;
            drop(waiting);
            let (retry_after, why, transport) = match sent {
                Ok(resp) => match self.judge(ep, url, resp, authenticated).await? {
                    Judged::Done(resp) => return Ok(resp),
                    Judged::Challenge(challenge) => {
                        self.authenticate(ep, &scope, &challenge).await?;
                        authenticated = true;
                        continue;
                    }
                    Judged::Retry(ra, why) => (ra, why, false),
                },
                Err(e) => {
                    let why = crate::primitives::text::error_chain(&e);
                    // A certificate problem will not fix itself: fail now, say why.
                    if why.to_lowercase().contains("certificate") {
                        return Err(FetchError::Other(format!(
                            "{url}: {why}; trust the registry's CA with --ca-cert FILE"
                        )));
                    }
                    // TLS spoken to a plain-HTTP server (rustls reads its
                    // answer as a corrupt record): no retry will help, and
                    // the fix is in how the URL was written.
                    if !ep.plain_http && why.contains("InvalidContentType") {
                        return Err(FetchError::Unreachable(format!(
                            "{url}: {why}; {} answers plain HTTP, not TLS: write http://{} for a plain-HTTP mirror",
                            ep.host, ep.host
                        )));
                    }
                    // Any other TLS failure (an alert, a failed handshake)
                    // is the same on every attempt: say it once.
                    let lower = why.to_lowercase();
                    if !ep.plain_http && (lower.contains("handshake") || lower.contains("alert")) {
                        return Err(FetchError::Unreachable(format!(
                            "{url}: {why}; TLS with {} failed (not retried)",
                            ep.host
                        )));
                    }
                    (None, why, true)
                }
            };
            attempt += 1;
            if attempt >= self.retry.attempts {
                let msg = format!("{url}: {why} (after {attempt} attempts)");
                return Err(if transport {
                    FetchError::Unreachable(msg)
                } else {
                    FetchError::Other(msg)
                });
            }
            let delay = self.retry.delay(attempt - 1, retry_after);
            tracing::debug!(%url, attempt, ?delay, "retrying: {why}");
            crate::primitives::progress::retried();
            tokio::time::sleep(delay).await;
        }
    }

    /// The endpoints to try for `image`, without mirrors written off.
    pub(super) fn endpoints(&self, image: &ImageRef) -> Vec<Endpoint> {
        let off = self.written_off.lock().unwrap();
        self.hosts
            .endpoints(&image.domain)
            .into_iter()
            .filter(|ep| {
                ep.upstream
                    || !(off.contains(&ep.base_url())
                        || off.contains(&format!("{} {}", ep.base_url(), image.path)))
            })
            .collect()
    }

    /// Remembers a mirror that cannot help for the rest of the run, so later
    /// requests fall back at once instead of paying its retries again.
    pub(super) fn write_off(&self, ep: &Endpoint, image: &ImageRef, e: &FetchError) {
        if ep.upstream {
            // A registry that does not answer at all (DNS, refused, no
            // route) is said once, with the likely fix, and the images
            // after it fail at once instead of paying its retries each.
            if matches!(e, FetchError::Unreachable(_))
                && self.silent.lock().unwrap().insert(ep.base_url())
            {
                // With a mirror given, the mirror's answer is the one that
                // matters: no advice to pass what was passed.
                let mirrored = self
                    .hosts
                    .endpoints(&image.domain)
                    .iter()
                    .any(|m| !m.upstream);
                let advice = if mirrored {
                    "its mirrors answer for it".to_string()
                } else {
                    format!(
                        "check the network, or fetch through a mirror (--mirror {}=URL)",
                        image.domain
                    )
                };
                tracing::warn!(
                    "{} does not answer ({e}); not tried again in this run: {advice}",
                    ep.host
                );
            }
            return;
        }
        let key = match e {
            FetchError::Unreachable(_) => ep.base_url(),
            FetchError::NotFound(_) => format!("{} {}", ep.base_url(), image.path),
            _ => return,
        };
        tracing::info!(mirror = %ep.base_url(), repo = %image.path, "mirror written off for this run: {e}");
        self.written_off.lock().unwrap().insert(key);
    }
}

/// What one answer from a registry means for the request.
enum Judged {
    Done(reqwest::Response),
    /// 401 with this `WWW-Authenticate`: authenticate, then ask again.
    Challenge(String),
    /// Worth another try (429, 5xx), after `Retry-After` if it said.
    Retry(Option<Duration>, String),
}

impl Inner {
    /// Sorts a response: success, a challenge to answer, a retry, or a
    /// definitive error (401/403 after authenticating, 404, other 4xx).
    async fn judge(
        &self,
        ep: &Endpoint,
        url: &str,
        resp: reqwest::Response,
        authenticated: bool,
    ) -> Result<Judged, FetchError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(Judged::Done(resp));
        }
        match status {
            StatusCode::UNAUTHORIZED if !authenticated => Ok(Judged::Challenge(
                resp.headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
            )),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                let detail = registry_error(resp, self.retry.stall).await;
                let hint = if self.credential(&ep.host).await.ok().flatten().is_some() {
                    format!(
                        "the credentials for {} were rejected; check them (docker login {})",
                        ep.host, ep.host
                    )
                } else {
                    format!("{} requires credentials; run docker login {} or add them to ~/.docker/config.json", ep.host, ep.host)
                };
                Err(FetchError::Auth(format!(
                    "{url}: {} {detail}: {hint}",
                    status.as_u16()
                )))
            }
            StatusCode::NOT_FOUND => Err(FetchError::NotFound(format!(
                "{url}: 404 {}",
                registry_error(resp, self.retry.stall).await
            ))),
            s if s == StatusCode::TOO_MANY_REQUESTS
                || (s.is_server_error() && s != StatusCode::NOT_IMPLEMENTED) =>
            {
                let ra = resp
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                Ok(Judged::Retry(
                    ra,
                    format!(
                        "{} {}",
                        s.as_u16(),
                        registry_error(resp, self.retry.stall).await
                    ),
                ))
            }
            s => Err(FetchError::Other(format!(
                "{url}: {} {}",
                s.as_u16(),
                registry_error(resp, self.retry.stall).await
            ))),
        }
    }
}

/// An error reply's JSON is a few lines; more is not read.
const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// The registry's error JSON, shortened: `MANIFEST_UNKNOWN: manifest unknown`.
/// The body is read up to [`MAX_ERROR_BODY_BYTES`] and for one stall window
/// at most; past either, the status alone is said.
pub(super) async fn registry_error(resp: reqwest::Response, stall: Duration) -> String {
    let reason = resp.status().canonical_reason().unwrap_or("").to_string();
    let read = read_limited(resp, MAX_ERROR_BODY_BYTES, stall, "error body", None);
    let body = match tokio::time::timeout(stall, read).await {
        Ok(Ok(b)) => b,
        _ => return reason,
    };
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<E>,
    }
    #[derive(serde::Deserialize)]
    struct E {
        code: Option<String>,
        message: Option<String>,
    }
    match serde_json::from_slice::<Errors>(&body) {
        Ok(e) if !e.errors.is_empty() => {
            let parts: Vec<String> = e
                .errors
                .iter()
                .map(|e| {
                    format!(
                        "{}: {}",
                        e.code.clone().unwrap_or_default(),
                        e.message.clone().unwrap_or_default()
                    )
                })
                .collect();
            format!("{reason} ({})", parts.join(", "))
        }
        _ => reason,
    }
}

/// A body of at most `limit` bytes (`what` names it in the error), whose
/// bytes must keep coming ([`crate::adapters::registry::stall`]): every body
/// kiln holds in memory comes through here. `left`: the tries left if it
/// stalls, said while it waits.
pub(crate) async fn read_limited(
    resp: reqwest::Response,
    limit: usize,
    stall: Duration,
    what: &str,
    left: Option<u32>,
) -> Result<Bytes, FetchError> {
    let over = || FetchError::Other(format!("{what} over the {limit}-byte limit"));
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(over());
    }
    let tries = left
        .map(|n| format!("; {n} more tries"))
        .unwrap_or_default();
    let label = format!("the body of {} ({what}{tries})", resp.url());
    let mut body = crate::adapters::registry::stall::guard(resp.bytes_stream(), stall, label);
    let mut buf = Vec::new();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(c) => buf.extend_from_slice(&c),
            Err(why) if why.starts_with("stalled") => return Err(FetchError::Stalled(why)),
            Err(why) => return Err(FetchError::Other(why)),
        }
        if buf.len() > limit {
            return Err(over());
        }
    }
    Ok(Bytes::from(buf))
}
