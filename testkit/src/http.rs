//! A minimal HTTP/1.1 server on 127.0.0.1 for test endpoints (token server,
//! redirecting and fault-injecting proxies). One request per connection; it
//! stops when dropped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Request {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// Lower-cased names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn query(&self, key: &str) -> Vec<String> {
        let url = reqwest::Url::parse(&format!("http://x{}", self.target)).unwrap();
        url.query_pairs()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
            .collect()
    }
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

pub type Raw = Box<dyn FnOnce(&mut TcpStream) + Send>;

pub enum Reply {
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Writes the response itself (for faults: cut connections, trickles).
    Raw(Raw),
}

impl Reply {
    pub fn status(status: u16, body: &str) -> Reply {
        Reply::Full {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
        }
    }
}

pub fn write_head(
    s: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    len: usize,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {len}\r\nConnection: close\r\n",
        reason(status)
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
}

fn reason(s: u16) -> &'static str {
    match s {
        200 => "OK",
        206 => "Partial Content",
        307 => "Temporary Redirect",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let handler = Arc::new(handler);
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let h = handler.clone();
                        std::thread::spawn(move || serve(stream, &*h));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(stream: TcpStream, handler: &(dyn Fn(&Request) -> Reply + Send + Sync)) {
    stream.set_nonblocking(false).ok();
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    // A TLS handshake (0x16): answered in plain HTTP, as a plain-HTTP
    // registry does, so a client that tries HTTPS first (Docker's
    // containerd store, for an insecure registry) is told "server gave
    // HTTP response to HTTPS client" and falls back to HTTP.
    let mut first = [0u8; 1];
    if stream.peek(&mut first).is_ok_and(|n| n == 1) && first[0] == 0x16 {
        let mut s = &stream;
        let _ = s.write_all(b"HTTP/1.0 400 Bad Request\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n");
        return;
    }
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            // A repeated header (skopeo sends one Accept per media type)
            // is one list, as HTTP allows.
            headers
                .entry(k.trim().to_lowercase())
                .and_modify(|all: &mut String| {
                    all.push_str(", ");
                    all.push_str(v.trim());
                })
                .or_insert_with(|| v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    let req = Request {
        method,
        target,
        headers,
        body,
    };
    let mut stream = stream;
    match handler(&req) {
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let _ = write_head(&mut stream, status, &headers, body.len())
                .and_then(|_| stream.write_all(&body));
        }
        Reply::Raw(f) => f(&mut stream),
    }
    let _ = stream.flush();
}
