//! The OCI distribution registry client, shared by the pull source
//! (`source::registry`) and the push sink (`sink::registry`): manifests and
//! blobs over HTTP(S). One room per concern: `auth` (Basic and Bearer
//! token from the Docker config), `transport` (bounded retries with
//! backoff and jitter, honouring `Retry-After`, mirror to mirror to the
//! registry), `pull` (blob resumption with Range requests), `push`,
//! `referrers` (OCI 1.1: the API, else the tag schema);
//! [`credentials`], [`hosts`] (mirrors, CAs) and [`stall`] are its inputs.
//! reqwest follows redirects (registry.k8s.io sends blobs to a CDN) and drops
//! `Authorization` when the host changes, so credentials never leave the
//! registry they belong to.

mod auth;
mod pull;
mod push;
mod referrers;
mod transport;

pub use push::Mount;
pub use referrers::{referrers_tag, ReferrerIndex};
pub(crate) use transport::read_limited;

pub mod credentials;
pub mod hosts;
pub mod stall;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::OnceCell;

use auth::CachedAuth;
use credentials::{Credential, Credentials};
use hosts::Hosts;

/// Manifests larger than this are not images; refuse before buffering them.
const MAX_MANIFEST_BYTES: usize = crate::primitives::oci::MAX_DOCUMENT_BYTES as usize;

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
pub(crate) enum FetchError {
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
use crate::primitives::error::NotFound as ManifestUnknown;

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

/// Bearer tokens without `expires_in` live 60 s (the distribution spec's default).
const DEFAULT_TOKEN_SECS: u64 = 60;

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use auth::parse_challenge;
    use auth::realm_may_get_credentials;
    use auth::same_origin;
    use std::time::Instant;

    /// Issue 39.2b: a huge `expires_in` overflowed `Instant + Duration`
    /// (a panic); now it is held to a day. Any reply answers, never panics.
    #[test]
    fn token_replies_of_any_shape_answer() {
        use auth::{token_reply, TokenError};
        let now = Instant::now();
        let (t, at) =
            token_reply(br#"{"token":"t","expires_in":18446744073709551615}"#, now).unwrap();
        assert_eq!(t, "t");
        assert!(at > now && at <= now + Duration::from_secs(24 * 3600));
        let (t, at) = token_reply(br#"{"access_token":"a"}"#, now).unwrap();
        assert_eq!((t.as_str(), at), ("a", now + Duration::from_secs(54)));
        assert_eq!(
            token_reply(br#"{"token":""}"#, now),
            Err(TokenError::NoToken)
        );
        for bad in [
            &b"[1]"[..],
            b"",
            b"{\"expires_in\":-1,\"token\":\"t\"}",
            b"\xff",
        ] {
            assert!(matches!(
                token_reply(bad, now),
                Err(TokenError::Unreadable(_))
            ));
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::primitives::fixed_proptest())]

        #[test]
        fn any_token_reply_answers(body in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
                                   secs in proptest::num::u64::ANY) {
            let now = Instant::now();
            let _ = auth::token_reply(&body, now);
            let json = format!(r#"{{"token":"x","expires_in":{secs}}}"#);
            let (_, at) = auth::token_reply(json.as_bytes(), now).unwrap();
            proptest::prop_assert!(at >= now);
        }
    }

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
