//! A proxy that records every request that crosses it and its body bytes:
//! bytes counted where they arrive (the registry's door), not from kiln's
//! report; and one that paces them.

use std::sync::{Arc, Mutex, OnceLock};

use crate::http::{Reply, Request, Server};

use super::upstream_client;

/// One request that crossed a [`CountingProxy`]: what the registry got and
/// what it sent back, in body bytes.
#[derive(Debug, Clone)]
pub struct Crossed {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    pub status: u16,
    /// Request body bytes (an upload's blob, a manifest PUT).
    pub sent: u64,
    /// Response body bytes (a blob or manifest GET).
    pub received: u64,
}

/// The blob uploads the registry received (the PUTs that complete them):
/// digest → body bytes.
pub fn blob_uploads(log: &[Crossed]) -> std::collections::BTreeMap<String, u64> {
    log.iter()
        .filter(|c| c.method == "PUT" && c.target.contains("/blobs/uploads/"))
        .map(|c| {
            let url = reqwest::Url::parse(&format!("http://x{}", c.target)).unwrap();
            let digest = url
                .query_pairs()
                .find(|(k, _)| k == "digest")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            (digest, c.sent)
        })
        .collect()
}

/// The blob bytes the registry received, every upload counted (a blob
/// uploaded twice, twice).
pub fn blob_bytes_uploaded(log: &[Crossed]) -> u64 {
    log.iter()
        .filter(|c| c.method == "PUT" && c.target.contains("/blobs/uploads/"))
        .map(|c| c.sent)
        .sum()
}

/// The blob bytes the registry sent (blob GETs).
pub fn blob_bytes_pulled(log: &[Crossed]) -> u64 {
    log.iter()
        .filter(|c| c.method == "GET" && c.target.contains("/blobs/"))
        .map(|c| c.received)
        .sum()
}

/// A registry front that forwards everything and records each request's
/// body bytes both ways: bytes moved, counted at the registry's door rather
/// than from the client's own report. Upload `Location`s are rewritten to
/// come back through it.
pub struct CountingProxy {
    pub server: Server,
    pub log: Arc<Mutex<Vec<Crossed>>>,
}

impl CountingProxy {
    /// `host:port`, to use in references.
    pub fn addr(&self) -> String {
        self.server.addr.to_string()
    }

    /// Takes what was logged so far (the log starts again empty).
    pub fn take(&self) -> Vec<Crossed> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// The registry's answer headers a client needs passed on (an upload's
/// Location, a digest, an auth challenge), each value through `rewrite`.
pub(super) fn passed_headers(
    resp: &reqwest::blocking::Response,
    rewrite: impl Fn(&str) -> String,
) -> Vec<(String, String)> {
    const PASSED: &[&str] = &[
        "content-type",
        "docker-content-digest",
        "www-authenticate",
        "location",
        "range",
        "docker-upload-uuid",
    ];
    resp.headers()
        .iter()
        .filter(|(k, _)| PASSED.contains(&k.as_str()))
        .map(|(k, v)| (k.to_string(), rewrite(v.to_str().unwrap_or(""))))
        .collect()
}

pub fn counting_proxy(upstream: String) -> CountingProxy {
    paced_proxy(upstream, std::time::Duration::ZERO)
}

/// [`counting_proxy`] that holds each blob upload (a PUT) for `hold`
/// before passing it on: a slow link, so a push lasts longer than a
/// registry's tokens do. Pacing only: no test waits on it.
pub fn paced_proxy(upstream: String, hold: std::time::Duration) -> CountingProxy {
    let log: Arc<Mutex<Vec<Crossed>>> = Arc::default();
    let me: Arc<OnceLock<String>> = Arc::default();
    let (l, m) = (log.clone(), me.clone());
    let client = upstream_client(None);
    let server = Server::start(move |req: &Request| {
        if req.method == "PUT" && req.path().contains("/blobs/uploads/") && !hold.is_zero() {
            std::thread::sleep(hold);
        }
        let mut r = client.request(
            reqwest::Method::from_bytes(req.method.as_bytes()).unwrap(),
            format!("{upstream}{}", req.target),
        );
        for h in ["authorization", "accept", "range", "content-type"] {
            if let Some(v) = req.headers.get(h) {
                r = r.header(h, v);
            }
        }
        if !req.body.is_empty() || req.method == "PUT" || req.method == "POST" {
            r = r.body(req.body.clone());
        }
        let resp = match r.send() {
            Ok(resp) => resp,
            Err(e) => return Reply::status(502, &format!("{{\"proxy\":\"{e}\"}}")),
        };
        let status = resp.status().as_u16();
        let me = m.get().cloned().unwrap_or_default();
        let mut headers = passed_headers(&resp, |v| v.replace(&upstream, &me));
        let length = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("0")
            .to_string();
        let body = resp.bytes().map(|b| b.to_vec()).unwrap_or_default();
        l.lock().unwrap().push(Crossed {
            method: req.method.clone(),
            target: req.target.clone(),
            status,
            sent: req.body.len() as u64,
            received: body.len() as u64,
        });
        if req.method == "HEAD" {
            // A HEAD's length is the resource's, with no body.
            headers.push(("Content-Length".into(), length));
            return Reply::Raw(Box::new(move |s: &mut std::net::TcpStream| {
                let mut head = format!("HTTP/1.1 {status} Status\r\nConnection: close\r\n");
                for (k, v) in &headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = std::io::Write::write_all(s, head.as_bytes());
            }));
        }
        Reply::Full {
            status,
            headers,
            body,
        }
    });
    me.set(server.url()).unwrap();
    CountingProxy { server, log }
}
