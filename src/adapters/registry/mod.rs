//! The OCI distribution registry client, shared by the pull source
//! (`source::registry`) and the push sink (`sink::registry`): manifests and
//! blobs over HTTP(S),
//! Basic and Bearer-token auth from the Docker config, bounded retries with
//! backoff and jitter (honouring `Retry-After`), blob resumption with Range
//! requests, and fallback from mirror to mirror to the registry itself.
//! reqwest follows redirects (registry.k8s.io sends blobs to a CDN) and drops
//! `Authorization` when the host changes, so credentials never leave the
//! registry they belong to.

pub mod credentials;
pub mod hosts;
pub mod stall;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use base64::Engine as _;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream};
use futures_util::StreamExt;
use rand::Rng;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RANGE, RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use tokio::sync::OnceCell;

use crate::adapters::registry::credentials::{Credential, Credentials};
use crate::adapters::registry::hosts::{Endpoint, Hosts};
use crate::primitives::digest::Digest;
use crate::primitives::handoff::{BlobStream, Resolved};
use crate::primitives::oci::{media, Descriptor, Document};
use crate::primitives::reference::ImageRef;

/// Manifests larger than this are not images; refuse before buffering them.
const MAX_MANIFEST_BYTES: usize = 8 << 20;

/// How hard to try before giving up on an endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts per request (connection errors, 5xx, 429).
    pub attempts: u32,
    /// Resumptions of one broken blob download.
    pub resumes: u32,
    pub base: Duration,
    pub max_delay: Duration,
    /// A transfer bringing less than [`crate::adapters::registry::stall::MIN_BYTES`] in this
    /// long is stalled: retried (a manifest) or resumed (a blob), bounded.
    pub stall: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 5,
            resumes: 5,
            base: Duration::from_millis(250),
            max_delay: Duration::from_secs(10),
            stall: crate::adapters::registry::stall::DEFAULT,
        }
    }
}

impl Retry {
    fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(ra) = retry_after {
            return ra.min(Duration::from_secs(60));
        }
        let exp = self
            .base
            .saturating_mul(1 << attempt.min(10))
            .min(self.max_delay);
        // Full jitter in [exp/2, exp].
        let ms = exp.as_millis() as u64;
        Duration::from_millis(rand::thread_rng().gen_range(ms / 2..=ms.max(1)))
    }
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Auth(String),
    /// No answer at all after every attempt (connection refused, DNS, timeouts).
    #[error("{0}")]
    Unreachable(String),
    /// The body stopped coming ([`crate::adapters::registry::stall`]).
    #[error("{0}")]
    Stalled(String),
    #[error("{0}")]
    Other(String),
}

/// Every endpoint answered that it has no such manifest.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ManifestUnknown(String);

struct Inner {
    hosts: Hosts,
    creds: Arc<Credentials>,
    /// Each registry's credential, looked up (a helper run) once per run.
    looked_up: Mutex<HashMap<String, Arc<OnceCell<Lookup>>>>,
    retry: Retry,
    clients: Mutex<HashMap<Vec<PathBuf>, reqwest::Client>>,
    /// `Authorization` values by (host, scope), with when they expire.
    auth: Mutex<HashMap<(String, String), CachedAuth>>,
    /// Mirrors written off for the run: unreachable ones (by base URL), and
    /// ones that said a repository has no such manifest (base URL + repo).
    written_off: Mutex<std::collections::HashSet<String>>,
    /// Registries (base URLs, not mirrors) that did not answer at all after
    /// every attempt: said once, and not asked again for the next image.
    silent: Mutex<std::collections::HashSet<String>>,
}

/// A credential lookup's outcome, kept for the run (errors too).
type Lookup = Result<Option<Credential>, String>;
/// An `Authorization` value and when it stops being good (`None`: never).
type CachedAuth = (String, Option<Instant>);

/// Bearer tokens without `expires_in` live 60 s (the distribution spec's default).
const DEFAULT_TOKEN_SECS: u64 = 60;

/// Whether `url` is on `base`'s origin (scheme, host and port): only then
/// may it see that registry's `Authorization`.
fn same_origin(url: &str, base: &str) -> bool {
    match (reqwest::Url::parse(url), reqwest::Url::parse(base)) {
        (Ok(a), Ok(b)) => {
            a.scheme() == b.scheme()
                && a.host_str() == b.host_str()
                && a.port_or_known_default() == b.port_or_known_default()
        }
        _ => false,
    }
}

/// The domain a host sits in (`registry-1.docker.io` -> `docker.io`), when
/// that still has two labels or more.
fn parent_domain(host: &str) -> Option<&str> {
    let host = host.split(':').next().unwrap_or(host);
    let (_, parent) = host.split_once('.')?;
    parent.contains('.').then_some(parent)
}

/// Whether a registry's credentials may go to its token realm: same host,
/// or the same domain (Docker Hub's `auth.docker.io` for
/// `registry-1.docker.io`; GitLab's `gitlab.com` for `registry.gitlab.com`).
fn realm_may_get_credentials(registry: &str, realm: &str) -> bool {
    let bare = |h: &str| h.split(':').next().unwrap_or(h).to_ascii_lowercase();
    let (r, t) = (bare(registry), bare(realm));
    r == t || parent_domain(&r).is_some_and(|p| p == t || parent_domain(&t) == Some(p))
}

#[derive(Clone)]
pub struct RegistryClient {
    inner: Arc<Inner>,
}

impl RegistryClient {
    /// A plain HTTPS client (no registry auth) trusting `--ca-cert`'s CAs:
    /// for downloads that are not registry content (a Kubernetes release).
    pub fn http_client(&self) -> anyhow::Result<reqwest::Client> {
        let ep = crate::adapters::registry::hosts::Endpoint {
            host: String::new(),
            plain_http: false,
            ca_certs: self.inner.hosts.global_ca().to_vec(),
            upstream: false,
        };
        self.inner.client(&ep).map_err(|e| anyhow::anyhow!("{e}"))
    }

    pub fn new(hosts: Hosts, creds: Credentials, retry: Retry) -> Self {
        RegistryClient {
            inner: Arc::new(Inner {
                hosts,
                creds: Arc::new(creds),
                looked_up: Mutex::new(HashMap::new()),
                retry,
                clients: Mutex::new(HashMap::new()),
                auth: Mutex::new(HashMap::new()),
                written_off: Mutex::new(Default::default()),
                silent: Mutex::new(Default::default()),
            }),
        }
    }

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

    async fn fetch_manifest_from(
        &self,
        endpoints: Vec<Endpoint>,
        image: &ImageRef,
        reference: &str,
        expect: Option<&Digest>,
    ) -> anyhow::Result<(Bytes, Digest, String)> {
        let mut errors = Vec::new();
        // Unknown: some endpoint said so, and no other answered otherwise.
        let (mut unknown, mut other) = (false, false);
        for ep in endpoints {
            let url = format!("{}/v2/{}/manifests/{reference}", ep.base_url(), image.path);
            let mut stalls = 0;
            let result = loop {
                let result = async {
                let resp = self.inner.send(&ep, &image.path, &url, Some(&media::ACCEPT.join(", ")), None).await?;
                let header_digest = resp.headers().get("Docker-Content-Digest").and_then(|v| v.to_str().ok()).map(str::to_string);
                let content_type = resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let body = read_limited(resp, MAX_MANIFEST_BYTES, self.inner.retry.stall).await.map_err(|e| match e {
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
                        FetchError::NotFound(_) => unknown = true,
                        FetchError::Unreachable(_) => {}
                        _ => other = true,
                    }
                    self.inner.write_off(&ep, image, &e);
                    errors.push(e.to_string());
                }
            }
        }
        let joined = errors.join("; then ");
        if unknown && !other {
            return Err(ManifestUnknown(joined).into());
        }
        Err(anyhow!("{joined}"))
    }
}

impl RegistryClient {
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

/// Pushing: to the registry itself, never to a mirror.
impl RegistryClient {
    fn push_endpoint(&self, image: &ImageRef) -> Endpoint {
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

    /// Uploads a blob in one PUT, streaming `data` (which fails unless verified).
    pub async fn push_blob(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        data: BlobStream,
    ) -> anyhow::Result<u64> {
        let ep = self.push_endpoint(image);
        let start = format!("{}/v2/{}/blobs/uploads/", ep.base_url(), image.path);
        let resp = self
            .inner
            .request(
                &ep,
                &image.path,
                "pull,push",
                reqwest::Method::POST,
                &start,
                None,
                None,
                None,
            )
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let loc = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| anyhow!("{start}: no upload Location"))?;
        // Relative, or absolute on any host (a storage backend, or a hostile one).
        let loc = reqwest::Url::parse(&ep.base_url())
            .and_then(|b| b.join(loc))
            .map_err(|e| anyhow!("{start}: bad upload Location {loc:?}: {e}"))?
            .to_string();
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
        if resp.status() != StatusCode::CREATED {
            let status = resp.status().as_u16();
            return Err(anyhow!(
                "uploading {} to {}: {status} {}",
                desc.digest,
                ep.host,
                registry_error(resp).await
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
            .map_err(|e| anyhow!("{e}"))?;
        Ok(())
    }
}

impl Inner {
    fn client(&self, ep: &Endpoint) -> Result<reqwest::Client, FetchError> {
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
    async fn send(
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
    async fn request(
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
            let (retry_after, why, transport) = match req.send().await {
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
    fn endpoints(&self, image: &ImageRef) -> Vec<Endpoint> {
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
    fn write_off(&self, ep: &Endpoint, image: &ImageRef, e: &FetchError) {
        if ep.upstream {
            // A registry that does not answer at all (DNS, refused, no
            // route) is said once, with the likely fix, and the images
            // after it fail at once instead of paying its retries each.
            if matches!(e, FetchError::Unreachable(_))
                && self.silent.lock().unwrap().insert(ep.base_url())
            {
                tracing::warn!(
                    "{} does not answer ({e}); not tried again in this run: check the network, or fetch through a mirror (--mirror {}=URL)",
                    ep.host,
                    image.domain
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

    fn cached_auth(&self, host: &str, scope: &str) -> Option<String> {
        let auth = self.auth.lock().unwrap();
        let now = Instant::now();
        [scope, "*"]
            .iter()
            .filter_map(|s| auth.get(&(host.to_string(), s.to_string())))
            .find(|(_, expires)| expires.is_none_or(|t| t > now))
            .map(|(h, _)| h.clone())
    }

    /// The Docker config's credential for `host`; a credential helper runs
    /// off the async runtime, at most once per host per run.
    async fn credential(&self, host: &str) -> Result<Option<Credential>, FetchError> {
        let cell = self
            .looked_up
            .lock()
            .unwrap()
            .entry(host.to_string())
            .or_default()
            .clone();
        let creds = self.creds.clone();
        let h = host.to_string();
        cell.get_or_init(|| async move {
            tokio::task::spawn_blocking(move || creds.get(&h).map_err(|e| format!("{e:#}")))
                .await
                .unwrap_or_else(|e| Err(format!("credential lookup: {e}")))
        })
        .await
        .clone()
        .map_err(FetchError::Auth)
    }

    /// Answers a `WWW-Authenticate` challenge: Basic from the Docker config,
    /// or a Bearer token from the challenge's realm.
    async fn authenticate(
        &self,
        ep: &Endpoint,
        scope: &str,
        challenge: &str,
    ) -> Result<(), FetchError> {
        let cred = self.credential(&ep.host).await?;
        let (scheme, params) = parse_challenge(challenge);
        let header = match scheme.as_str() {
            "basic" => match cred {
                Some(Credential::Basic { username, password }) => {
                    let v = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}")));
                    self.auth.lock().unwrap().insert((ep.host.clone(), "*".into()), (v, None));
                    return Ok(());
                }
                _ => return Err(FetchError::Auth(format!("{} requires credentials (Basic); run docker login {} or add them to ~/.docker/config.json", ep.host, ep.host))),
            },
            "bearer" => {
                let realm = params.get("realm").ok_or_else(|| FetchError::Auth(format!("{}: Bearer challenge without realm", ep.host)))?;
                let realm_url = reqwest::Url::parse(realm).map_err(|e| FetchError::Auth(format!("{}: bad token realm {realm:?}: {e}", ep.host)))?;
                let realm_host = realm_url.host_str().unwrap_or("");
                let loopback = crate::adapters::registry::hosts::is_loopback(realm_host);
                if realm_url.scheme() != "https" && !loopback && !ep.plain_http {
                    return Err(FetchError::Auth(format!("{}: refusing to send credentials to a plain-HTTP token realm {realm}", ep.host)));
                }
                // A realm on another domain gets no credentials: it asks anonymously.
                let cred = if realm_may_get_credentials(&ep.host, realm_host) {
                    cred
                } else {
                    if cred.is_some() {
                        tracing::warn!("{}: not sending its credentials to the token server {realm_host} on another domain; asking for an anonymous token", ep.host);
                    }
                    None
                };
                let service = params.get("service").cloned().unwrap_or_default();
                let scope = params.get("scope").cloned().unwrap_or_else(|| scope.to_string());
                let client = self.client(ep)?;
                let req = match &cred {
                    Some(Credential::IdentityToken(t)) => client.post(realm_url.clone()).form(&[
                        ("grant_type", "refresh_token"),
                        ("refresh_token", t.as_str()),
                        ("service", service.as_str()),
                        ("scope", scope.as_str()),
                        ("client_id", "kiln"),
                    ]),
                    other => {
                        let mut r = client.get(realm_url.clone()).query(&[("service", service.as_str()), ("scope", scope.as_str())]);
                        if let Some(Credential::Basic { username, password }) = other {
                            r = r.basic_auth(username, Some(password));
                        }
                        r
                    }
                };
                let resp = req.send().await.map_err(|e| FetchError::Other(format!("token request to {realm}: {}", crate::primitives::text::error_chain(&e))))?;
                if !resp.status().is_success() {
                    let hint = if cred.is_some() { "the credentials were rejected" } else { "it requires credentials; run docker login or add them to ~/.docker/config.json" };
                    return Err(FetchError::Auth(format!("{}: token server {realm} answered {}: {hint}", ep.host, resp.status().as_u16())));
                }
                #[derive(serde::Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                    expires_in: Option<u64>,
                }
                let t: Token = resp.json().await.map_err(|e| FetchError::Other(format!("token from {realm}: {e}")))?;
                let token = t.token.or(t.access_token).filter(|t| !t.is_empty()).ok_or_else(|| FetchError::Auth(format!("token server {realm} sent no token")))?;
                // Refreshed a little early, so a request never carries a stale one.
                let secs = t.expires_in.unwrap_or(DEFAULT_TOKEN_SECS);
                let expires = Instant::now() + Duration::from_secs(secs) - Duration::from_secs(secs / 10);
                (format!("Bearer {token}"), Some(expires))
            }
            _ => return Err(FetchError::Auth(format!("{} answered 401 with an unsupported challenge {challenge:?}", ep.host))),
        };
        self.auth
            .lock()
            .unwrap()
            .insert((ep.host.clone(), scope.to_string()), header);
        Ok(())
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
                let detail = registry_error(resp).await;
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
                registry_error(resp).await
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
                    format!("{} {}", s.as_u16(), registry_error(resp).await),
                ))
            }
            s => Err(FetchError::Other(format!(
                "{url}: {} {}",
                s.as_u16(),
                registry_error(resp).await
            ))),
        }
    }
}

/// `Bearer realm="…",service="…"` -> ("bearer", {realm, service}).
fn parse_challenge(h: &str) -> (String, HashMap<String, String>) {
    let (scheme, rest) = h.trim().split_once(' ').unwrap_or((h.trim(), ""));
    let mut params = HashMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((k, v)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().trim_start_matches(',').trim().to_lowercase();
        let v = v.trim_start();
        let (value, tail) = if let Some(q) = v.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_string(), &q[end + 1..]),
                None => (q.to_string(), ""),
            }
        } else {
            let end = v.find(',').unwrap_or(v.len());
            (v[..end].trim().to_string(), &v[end..])
        };
        params.insert(k, value);
        rest = tail.trim_start_matches([',', ' ']);
    }
    (scheme.to_lowercase(), params)
}

/// The registry's error JSON, shortened: `MANIFEST_UNKNOWN: manifest unknown`.
async fn registry_error(resp: reqwest::Response) -> String {
    let reason = resp.status().canonical_reason().unwrap_or("").to_string();
    let body = resp.bytes().await.unwrap_or_default();
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

async fn read_limited(
    resp: reqwest::Response,
    limit: usize,
    stall: Duration,
) -> Result<Bytes, FetchError> {
    let over = || FetchError::Other(format!("manifest over the {limit}-byte limit"));
    if resp.content_length().is_some_and(|n| n as usize > limit) {
        return Err(over());
    }
    let mut body = crate::adapters::registry::stall::guard(resp.bytes_stream(), stall);
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
                            d.body = Some(crate::adapters::registry::stall::guard(
                                resp.bytes_stream(),
                                d.inner.retry.stall,
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

/// Pulling: what the pull source ([`crate::source::registry`]) asks for.
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
                    return Ok(resumable(Download {
                        inner: self.inner.clone(),
                        ep,
                        repo: image.path.clone(),
                        url,
                        body: Some(crate::adapters::registry::stall::guard(
                            resp.bytes_stream(),
                            self.inner.retry.stall,
                        )),
                        offset: 0,
                        skip: 0,
                        resumes: 0,
                    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_tokens_are_not_sent() {
        let src = RegistryClient::new(Hosts::default(), Credentials::default(), Retry::default());
        let key = ("r.example".to_string(), "repository:a:pull".to_string());
        let past = Instant::now() - Duration::from_secs(1);
        let future = Instant::now() + Duration::from_secs(60);
        let inner = &src.inner;
        inner
            .auth
            .lock()
            .unwrap()
            .insert(key.clone(), ("Bearer old".into(), Some(past)));
        assert_eq!(inner.cached_auth("r.example", "repository:a:pull"), None);
        inner
            .auth
            .lock()
            .unwrap()
            .insert(key, ("Bearer new".into(), Some(future)));
        assert_eq!(
            inner
                .cached_auth("r.example", "repository:a:pull")
                .as_deref(),
            Some("Bearer new")
        );
    }

    #[test]
    fn credentials_stay_with_their_origin_and_domain() {
        assert!(same_origin(
            "https://r.example/v2/x/blobs/uploads/1?a=b",
            "https://r.example"
        ));
        assert!(same_origin("https://r.example:443/u", "https://r.example"));
        assert!(!same_origin("https://s3.other/u", "https://r.example"));
        assert!(!same_origin("http://r.example/u", "https://r.example"));
        assert!(!same_origin(
            "http://localhost:5001/u",
            "http://127.0.0.1:5001"
        ));
        assert!(!same_origin(
            "http://127.0.0.1:5002/u",
            "http://127.0.0.1:5001"
        ));
        assert!(realm_may_get_credentials(
            "registry-1.docker.io",
            "auth.docker.io"
        ));
        assert!(realm_may_get_credentials(
            "registry.gitlab.com",
            "gitlab.com"
        ));
        assert!(realm_may_get_credentials("ghcr.io", "ghcr.io"));
        assert!(realm_may_get_credentials(
            "127.0.0.1:5000",
            "127.0.0.1:5001"
        ));
        assert!(!realm_may_get_credentials("ghcr.io", "evil.io"));
        assert!(!realm_may_get_credentials(
            "registry.example.com",
            "auth.evil.com"
        ));
        assert!(!realm_may_get_credentials("quay.io", "attacker.example"));
    }

    #[test]
    fn parses_challenges() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(s, "bearer");
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "registry.example");
        assert_eq!(p["scope"], "repository:a/b:pull,push");
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(
            (s.as_str(), p["realm"].as_str()),
            ("basic", "Registry Realm")
        );
    }

    #[test]
    fn backoff_grows_and_honours_retry_after() {
        let r = Retry::default();
        assert!(r.delay(0, None) <= Duration::from_millis(250));
        assert!(r.delay(3, None) >= Duration::from_millis(1000));
        assert!(r.delay(20, None) <= Duration::from_secs(10));
        assert_eq!(
            r.delay(0, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
    }
}
