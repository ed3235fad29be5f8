//! Test endpoints in front of a registry: a bearer-token server, and a proxy
//! that sends blob downloads to another host (as registry.k8s.io sends them to
//! a CDN) and records what that host was sent.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine as _;

use crate::http::{Reply, Request, Server};
use crate::tls::TokenSigner;

mod counting;
use counting::passed_headers;
pub use counting::*;

pub const TOKEN_ISSUER: &str = "kiln-test-issuer";
pub const TOKEN_SERVICE: &str = "kiln-test-registry";

/// A token endpoint: Basic `user:pass` (GET) or an OAuth2 refresh token
/// (POST, as for Docker's identitytoken) buys a signed token for the scopes asked.
pub fn token_server(
    signer: Arc<TokenSigner>,
    user: &str,
    pass: &str,
    refresh_token: &str,
) -> Server {
    token_server_lived(signer, user, pass, refresh_token, 600)
}

/// [`token_server`] whose tokens last `lifetime` seconds, at the registry
/// and in `expires_in` alike; it counts the tokens it issued.
pub fn token_server_lived(
    signer: Arc<TokenSigner>,
    user: &str,
    pass: &str,
    refresh_token: &str,
    lifetime: u64,
) -> Server {
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    );
    let (user, refresh) = (user.to_string(), refresh_token.to_string());
    Server::start(move |req: &Request| {
        if req.path() != "/token" {
            return Reply::status(404, "{}");
        }
        let (ok, service, scopes) = match req.method.as_str() {
            "GET" => (
                req.headers.get("authorization") == Some(&basic),
                req.query("service"),
                req.query("scope"),
            ),
            "POST" => {
                let form = Request {
                    method: String::new(),
                    target: format!("/?{}", String::from_utf8_lossy(&req.body)),
                    headers: Default::default(),
                    body: vec![],
                };
                let ok = form.query("grant_type") == ["refresh_token"]
                    && form.query("refresh_token") == [refresh.clone()];
                (ok, form.query("service"), form.query("scope"))
            }
            _ => (false, vec![], vec![]),
        };
        if !ok {
            return Reply::status(401, r#"{"details":"bad credentials"}"#);
        }
        let scopes: Vec<String> = scopes
            .iter()
            .flat_map(|s| s.split(' ').map(str::to_string))
            .collect();
        let t = signer.token_lived(
            TOKEN_ISSUER,
            service.first().map(String::as_str).unwrap_or(TOKEN_SERVICE),
            &user,
            &scopes,
            lifetime,
        );
        Reply::status(
            200,
            &serde_json::json!({"token": t, "access_token": t, "expires_in": lifetime}).to_string(),
        )
    })
}

/// Forwards a request to `upstream` as it came (auth included), writes
/// too (a push's body and content type; its upload `Location` is the
/// registry's own, so the upload itself goes there).
pub fn forward(client: &reqwest::blocking::Client, upstream: &str, req: &Request) -> Reply {
    let mut r = client.request(
        reqwest::Method::from_bytes(req.method.as_bytes()).unwrap(),
        format!("{upstream}{}", req.target),
    );
    for h in ["authorization", "accept", "range", "content-type"] {
        if let Some(v) = req.headers.get(h) {
            r = r.header(h, v);
        }
    }
    if !req.body.is_empty() || matches!(req.method.as_str(), "PUT" | "PATCH" | "POST") {
        r = r.body(req.body.clone());
    }
    match r.send() {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let headers = [
                "content-type",
                "docker-content-digest",
                "www-authenticate",
                "content-range",
                "location",
                "docker-upload-uuid",
                "range",
            ]
            .iter()
            .filter_map(|h| {
                resp.headers()
                    .get(*h)
                    .map(|v| (h.to_string(), v.to_str().unwrap_or("").to_string()))
            })
            .collect();
            Reply::Full {
                status,
                headers,
                body: resp.bytes().map(|b| b.to_vec()).unwrap_or_default(),
            }
        }
        Err(e) => Reply::status(502, &format!("{{\"proxy\":\"{e}\"}}")),
    }
}

/// A client for the proxy's upstream, trusting `ca` and following no redirects.
pub fn upstream_client(ca: Option<&PathBuf>) -> reqwest::blocking::Client {
    let mut b = reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(ca) = ca {
        b = b.add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap(),
        );
    }
    b.build().unwrap()
}

pub struct RedirectProxy {
    pub server: Server,
    /// The `Authorization` header (if any) of each request the "CDN" host got.
    pub cdn_requests: Arc<Mutex<Vec<Option<String>>>>,
}

/// Serves `127.0.0.1:P` by forwarding to `upstream`, except blob GETs, which
/// are redirected to `localhost:P/cdn/<hex>` (another host name) and served
/// from `blob_path(digest)`.
pub fn redirect_proxy(
    upstream: String,
    ca: Option<PathBuf>,
    blob_path: impl Fn(&str) -> PathBuf + Send + Sync + 'static,
) -> RedirectProxy {
    let client = upstream_client(ca.as_ref());
    let port: Arc<OnceLock<u16>> = Arc::new(OnceLock::new());
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let (p, s) = (port.clone(), seen.clone());
    let server = Server::start(move |req: &Request| {
        if let Some(hex) = req.path().strip_prefix("/cdn/") {
            s.lock()
                .unwrap()
                .push(req.headers.get("authorization").cloned());
            return match std::fs::read(blob_path(&format!("sha256:{hex}"))) {
                Ok(body) => Reply::Full {
                    status: 200,
                    headers: vec![("Content-Type".into(), "application/octet-stream".into())],
                    body,
                },
                Err(_) => Reply::status(404, "{}"),
            };
        }
        if req.method == "GET" && req.path().contains("/blobs/sha256:") {
            // Only a caller the registry lets in gets the redirect, as with a real one.
            let check = forward(
                &client,
                &upstream,
                &Request {
                    method: "HEAD".into(),
                    target: req.target.clone(),
                    headers: req.headers.clone(),
                    body: vec![],
                },
            );
            if let Reply::Full { status, .. } = &check {
                if *status != 200 {
                    return check;
                }
            }
            let hex = req.path().rsplit("sha256:").next().unwrap();
            let loc = format!("http://localhost:{}/cdn/{hex}", p.get().unwrap());
            return Reply::Full {
                status: 307,
                headers: vec![("Location".into(), loc)],
                body: vec![],
            };
        }
        forward(&client, &upstream, req)
    });
    port.set(server.addr.port()).unwrap();
    RedirectProxy {
        server,
        cdn_requests: seen,
    }
}

/// What a [`fault_proxy`] does to blob downloads.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Sends the headers and half the body, then cuts the connection (`times` times).
    DropMidBlob { times: u32 },
    /// Answers 500 (`times` times).
    ServerError { times: u32 },
    /// Forwards the first `ok` GETs, then answers 500 to every later one.
    ServerErrorAfter { ok: u32 },
    /// Answers 429 with `Retry-After: secs` (`times` times).
    TooManyRequests { times: u32, secs: u32 },
    /// Sends the body `chunk` bytes at a time, `delay_ms` apart.
    Trickle { chunk: usize, delay_ms: u64 },
    /// [`Fault::Trickle`] for manifests (by tag or digest) too.
    TrickleAll { chunk: usize, delay_ms: u64 },
    /// Flips one byte in the middle, keeping the length (always).
    CorruptByte,
    /// Answers 500 with an error body that says 1 GiB and brings one byte
    /// every 200 ms, for 100 bytes at most (always). [`FaultProxy::ended`]
    /// says, as each such reply ends, whether its reader hung up first.
    StallingErrorBody,
    /// Answers `status` to every request for a manifest whose path holds
    /// `only` (by tag or digest), blobs untouched (always).
    ManifestStatus { status: u16 },
}

pub struct FaultProxy {
    pub server: Server,
    /// How many faults were injected.
    pub injected: Arc<std::sync::atomic::AtomicU32>,
    /// Range headers of the blob requests seen.
    pub ranges: Arc<Mutex<Vec<String>>>,
    /// Every blob GET as it arrived: when, which path, and whether it was
    /// answered with an injected fault.
    pub gets: Arc<Mutex<Vec<BlobGet>>>,
    /// One message per [`Fault::StallingErrorBody`] reply as it ends: true
    /// when its reader hung up before the body's end.
    pub ended: Mutex<std::sync::mpsc::Receiver<bool>>,
}

#[derive(Debug, Clone)]
pub struct BlobGet {
    pub at: std::time::Instant,
    pub path: String,
    pub injected: bool,
}

impl FaultProxy {
    /// For each injected fault, the time until the same blob was asked for
    /// again (`None`: it never was).
    pub fn retry_gaps(&self) -> Vec<Option<std::time::Duration>> {
        let gets = self.gets.lock().unwrap();
        gets.iter()
            .enumerate()
            .filter(|(_, g)| g.injected)
            .map(|(i, g)| {
                gets[i + 1..]
                    .iter()
                    .find(|n| n.path == g.path)
                    .map(|n| n.at - g.at)
            })
            .collect()
    }
}

/// A proxy in front of `upstream` that injects `fault` into GETs of blobs
/// whose digest contains `only` (every blob when empty), or of manifests
/// ([`Fault::ManifestStatus`]).
pub fn fault_proxy(upstream: String, fault: Fault, only: &str) -> FaultProxy {
    use std::sync::atomic::{AtomicU32, Ordering};
    let client = upstream_client(None);
    let injected = Arc::new(AtomicU32::new(0));
    let ranges: Arc<Mutex<Vec<String>>> = Arc::default();
    let gets: Arc<Mutex<Vec<BlobGet>>> = Arc::default();
    let (inj, rng, only) = (injected.clone(), ranges.clone(), only.to_string());
    let seen = gets.clone();
    let (ended_tx, ended) = std::sync::mpsc::channel::<bool>();
    let ended_tx = Mutex::new(ended_tx);
    let server = Server::start(move |req: &Request| {
        if let Fault::ManifestStatus { status } = fault {
            if req.path().contains("/manifests/") && req.path().contains(&only) {
                inj.fetch_add(1, Ordering::SeqCst);
                return Reply::status(
                    status,
                    r#"{"errors":[{"code":"UNKNOWN","message":"injected"}]}"#,
                );
            }
            return forward(&client, &upstream, req);
        }
        let is_manifest = matches!(fault, Fault::TrickleAll { .. })
            && req.method == "GET"
            && req.path().contains("/manifests/");
        let is_blob = is_manifest
            || req.method == "GET"
                && req.path().contains("/blobs/sha256:")
                && req.path().contains(&only);
        if !is_blob {
            return forward(&client, &upstream, req);
        }
        if let Some(r) = req.headers.get("range") {
            rng.lock().unwrap().push(r.clone());
        }
        let at = std::time::Instant::now();
        let log = |injected: bool| {
            seen.lock().unwrap().push(BlobGet {
                at,
                path: req.path().to_string(),
                injected,
            })
        };
        let budget = |times: u32| {
            inj.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < times).then_some(n + 1)
            })
            .is_ok()
        };
        match fault {
            Fault::ServerError { times } if budget(times) => {
                log(true);
                return Reply::status(
                    500,
                    r#"{"errors":[{"code":"UNKNOWN","message":"injected"}]}"#,
                );
            }
            Fault::StallingErrorBody => {
                log(true);
                inj.fetch_add(1, Ordering::SeqCst);
                let tx = ended_tx.lock().unwrap().clone();
                return Reply::Raw(Box::new(move |s| {
                    use std::io::Write;
                    let headers = vec![("Content-Type".into(), "application/json".into())];
                    let _ = crate::http::write_head(s, 500, &headers, 1 << 30);
                    for _ in 0..100 {
                        if s.write_all(b" ").and_then(|_| s.flush()).is_err() {
                            let _ = tx.send(true);
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(200));
                    }
                    let _ = tx.send(false);
                }));
            }
            Fault::ServerErrorAfter { ok } if inj.fetch_add(1, Ordering::SeqCst) >= ok => {
                log(true);
                return Reply::status(
                    500,
                    r#"{"errors":[{"code":"UNKNOWN","message":"injected"}]}"#,
                );
            }
            Fault::TooManyRequests { times, secs } if budget(times) => {
                log(true);
                return Reply::Full {
                    status: 429,
                    headers: vec![("Retry-After".into(), secs.to_string())],
                    body: b"{}".to_vec(),
                };
            }
            _ => {}
        }
        log(false);
        let Reply::Full {
            status,
            headers,
            mut body,
        } = forward(&client, &upstream, req)
        else {
            unreachable!()
        };
        if status >= 300 {
            return Reply::Full {
                status,
                headers,
                body,
            };
        }
        match fault {
            Fault::CorruptByte => {
                inj.fetch_add(1, Ordering::SeqCst);
                let n = body.len();
                if n > 0 {
                    body[n / 2] ^= 0xff;
                }
                Reply::Full {
                    status,
                    headers,
                    body,
                }
            }
            Fault::DropMidBlob { times } if body.len() > 1 && budget(times) => {
                Reply::Raw(Box::new(move |s| {
                    use std::io::Write;
                    let _ = crate::http::write_head(s, status, &headers, body.len());
                    let _ = s.write_all(&body[..body.len() / 2]);
                    let _ = s.flush();
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }))
            }
            Fault::Trickle { chunk, delay_ms } | Fault::TrickleAll { chunk, delay_ms } => {
                Reply::Raw(Box::new(move |s| {
                    use std::io::Write;
                    let _ = crate::http::write_head(s, status, &headers, body.len());
                    for c in body.chunks(chunk.max(1)) {
                        if s.write_all(c).and_then(|_| s.flush()).is_err() {
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
                    }
                }))
            }
            _ => Reply::Full {
                status,
                headers,
                body,
            },
        }
    });
    FaultProxy {
        server,
        injected,
        ranges,
        gets,
        ended: Mutex::new(ended),
    }
}

/// A registry front whose blob uploads are sent elsewhere: a POST to
/// `/blobs/uploads/` answers with an absolute `Location` on `store`, another
/// origin (`localhost:P2` instead of `127.0.0.1:P1`), as registries backed
/// by object storage do. `store` records the `Authorization` header (if any)
/// each request brought, then completes the upload with its own `basic`.
pub struct UploadProxy {
    pub front: Server,
    pub store: Server,
    pub store_auth: Arc<Mutex<Vec<Option<String>>>>,
}

pub fn upload_proxy(upstream: String, basic: String) -> UploadProxy {
    fn send(
        client: &reqwest::blocking::Client,
        url: String,
        req: &Request,
        auth: Option<&str>,
    ) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let mut r = client.request(
            reqwest::Method::from_bytes(req.method.as_bytes()).unwrap(),
            url,
        );
        for h in ["accept", "content-type", "range"] {
            if let Some(v) = req.headers.get(h) {
                r = r.header(h, v);
            }
        }
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r = r.body(req.body.clone());
        match r.send() {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let headers = passed_headers(&resp, |v| v.to_string());
                (
                    status,
                    headers,
                    resp.bytes().map(|b| b.to_vec()).unwrap_or_default(),
                )
            }
            Err(e) => (502, vec![], format!("{{\"proxy\":\"{e}\"}}").into_bytes()),
        }
    }
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let (client, up, s) = (upstream_client(None), upstream.clone(), seen.clone());
    let store = Server::start(move |req: &Request| {
        s.lock()
            .unwrap()
            .push(req.headers.get("authorization").cloned());
        let target = req.target.strip_prefix("/store").unwrap_or(&req.target);
        let (status, headers, body) = send(&client, format!("{up}{target}"), req, Some(&basic));
        Reply::Full {
            status,
            headers,
            body,
        }
    });
    let store_port = store.addr.port();
    let client = upstream_client(None);
    let front = Server::start(move |req: &Request| {
        let auth = req.headers.get("authorization").map(String::as_str);
        let (status, mut headers, body) =
            send(&client, format!("{upstream}{}", req.target), req, auth);
        if req.method == "POST" && req.path().ends_with("/blobs/uploads/") && status == 202 {
            for (k, v) in headers.iter_mut() {
                if k == "location" {
                    let url = reqwest::Url::parse(&format!("{upstream}/"))
                        .unwrap()
                        .join(v)
                        .unwrap();
                    let rest = match url.query() {
                        Some(q) => format!("{}?{q}", url.path()),
                        None => url.path().to_string(),
                    };
                    *v = format!("http://localhost:{store_port}/store{rest}");
                }
            }
        }
        Reply::Full {
            status,
            headers,
            body,
        }
    });
    UploadProxy {
        front,
        store,
        store_auth: seen,
    }
}
