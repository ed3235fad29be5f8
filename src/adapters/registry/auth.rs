//! Registry auth: Basic and Bearer-token challenges (`WWW-Authenticate`),
//! tokens cached per host and scope until they expire, and the rule that a
//! registry's credentials go only to its own origin or a token realm in
//! its own domain.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::credentials::Credential;
use super::hosts::Endpoint;
use super::{FetchError, Inner, DEFAULT_TOKEN_SECS};

/// An `Authorization` value and when it stops being good (`None`: never).
pub(super) type CachedAuth = (String, Option<Instant>);

/// Whether `url` is on `base`'s origin (scheme, host and port): only then
/// may it see that registry's `Authorization`.
pub(super) fn same_origin(url: &str, base: &str) -> bool {
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
pub(super) fn realm_may_get_credentials(registry: &str, realm: &str) -> bool {
    let bare = |h: &str| h.split(':').next().unwrap_or(h).to_ascii_lowercase();
    let (r, t) = (bare(registry), bare(realm));
    r == t || parent_domain(&r).is_some_and(|p| p == t || parent_domain(&t) == Some(p))
}

impl Inner {
    pub(super) fn cached_auth(&self, host: &str, scope: &str) -> Option<String> {
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
    pub(super) async fn credential(&self, host: &str) -> Result<Option<Credential>, FetchError> {
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
    pub(super) async fn authenticate(
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
                let body = super::transport::read_limited(resp, MAX_TOKEN_REPLY_BYTES, self.retry.stall, "token reply", None)
                    .await
                    .map_err(|e| FetchError::Other(format!("token from {realm}: {e}")))?;
                let (token, expires) = token_reply(&body, Instant::now()).map_err(|e| match e {
                    TokenError::NoToken => FetchError::Auth(format!("token server {realm} sent no token")),
                    TokenError::Unreadable(e) => FetchError::Other(format!("token from {realm}: {e}")),
                })?;
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

/// A token reply is a small JSON object; a JWT is a few KiB.
const MAX_TOKEN_REPLY_BYTES: usize = 1 << 20;

/// Tokens are asked for again after a day at most, whatever `expires_in`
/// says (a huge one would overflow the clock).
const MAX_TOKEN_SECS: u64 = 24 * 3600;

#[derive(Debug, PartialEq)]
pub(super) enum TokenError {
    NoToken,
    Unreadable(String),
}

/// A token server's reply (`token` or `access_token`, `expires_in`): the
/// token and when to ask again, a little before it expires so a request
/// never carries a stale one. Any bytes give an answer, never a panic.
pub(super) fn token_reply(body: &[u8], now: Instant) -> Result<(String, Instant), TokenError> {
    #[derive(serde::Deserialize)]
    struct Token {
        token: Option<String>,
        access_token: Option<String>,
        expires_in: Option<u64>,
    }
    let t: Token =
        serde_json::from_slice(body).map_err(|e| TokenError::Unreadable(e.to_string()))?;
    let token = t
        .token
        .or(t.access_token)
        .filter(|t| !t.is_empty())
        .ok_or(TokenError::NoToken)?;
    let secs = t
        .expires_in
        .unwrap_or(DEFAULT_TOKEN_SECS)
        .min(MAX_TOKEN_SECS);
    Ok((token, now + Duration::from_secs(secs - secs / 10)))
}

/// `Bearer realm="…",service="…"` -> ("bearer", {realm, service}).
pub(super) fn parse_challenge(h: &str) -> (String, HashMap<String, String>) {
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
