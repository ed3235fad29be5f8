//! How kiln words things for people: one-line errors and byte counts.

/// Folds any text (a multi-line error chain) onto one line, its URLs
/// shown without secrets ([`redact_urls`]) and its control characters
/// escaped ([`printable`]).
pub fn one_line(s: &str) -> String {
    printable(&redact_urls(
        &s.split_whitespace().collect::<Vec<_>>().join(" "),
    ))
}

/// `s` with every control character (ESC, CR, BEL, the C1 range...)
/// written as `\u{..}`: text another program printed (a node's stderr)
/// cannot move the cursor, erase kiln's lines or forge one of its own on a
/// terminal, nor reach `--json` as anything but text.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Every `http://` and `https://` URL in `s` without its query string and
/// fragment (`?…`) and without credentials in its userinfo: a redirect to
/// a pre-signed blob URL carries `X-Amz-Signature`, `X-Amz-Security-Token`
/// and the like there, and they must not reach a terminal or a CI log.
/// Every message kiln shows (errors, waiting lines, log lines) goes
/// through here.
pub fn redact_urls(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = ["http://", "https://"]
        .iter()
        .filter_map(|p| rest.find(p).map(|i| (i, p.len())))
        .min()
    {
        let (start, scheme) = at;
        out.push_str(&rest[..start]);
        let url = &rest[start..];
        let end = url
            .find(|c: char| c.is_whitespace() || "\"'<>)]}`".contains(c))
            .unwrap_or(url.len());
        let (token, after) = url.split_at(end);
        let u = Url::split(token, scheme);
        out.push_str(u.scheme);
        if u.userinfo {
            out.push_str("<redacted>@");
        }
        out.push_str(u.host);
        out.push_str(u.path);
        if u.query {
            out.push_str("?<redacted>");
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// A URL's parts, as [`redact_urls`] and [`url_kept`] read them.
struct Url<'a> {
    scheme: &'a str,
    /// Whether credentials preceded the host (`user:pass@`).
    userinfo: bool,
    host: &'a str,
    path: &'a str,
    /// Whether a query or fragment followed the path.
    query: bool,
}

impl<'a> Url<'a> {
    /// `token` a URL whose scheme (`https://`) is `scheme` bytes long.
    fn split(token: &'a str, scheme: usize) -> Url<'a> {
        let (head, tail) = token.split_at(scheme);
        let authority_end = tail.find(['/', '?', '#']).unwrap_or(tail.len());
        let (authority, rest) = tail.split_at(authority_end);
        let (userinfo, host) = match authority.rfind('@') {
            Some(i) => (true, &authority[i + 1..]),
            None => (false, authority),
        };
        let (path, query) = match rest.find(['?', '#']) {
            Some(q) => (&rest[..q], true),
            None => (rest, false),
        };
        Url {
            scheme: head,
            userinfo,
            host,
            path,
            query,
        }
    }
}

/// A URL as kiln records it (a release's source in the report, the SBOM,
/// the provenance and the lock): scheme, host and path only. A pre-signed
/// URL's query (`X-Amz-Signature`, a session token) and any userinfo are
/// secrets, and change from one download to the next. Anything that is
/// not an `http(s)://` URL is kept as it is.
pub fn url_kept(s: &str) -> String {
    match ["http://", "https://"].iter().find(|p| s.starts_with(**p)) {
        Some(p) => {
            let u = Url::split(s, p.len());
            format!("{}{}{}", u.scheme, u.host, u.path)
        }
        None => s.to_string(),
    }
}

/// An error and its causes on one line, each said once (HTTP stacks repeat
/// their cause inside their own message).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !parts.iter().any(|p| p.contains(&m)) {
            parts.push(m);
        }
        src = s.source();
    }
    parts.join(": ")
}

/// Human-readable size: `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A size as users write it: bytes, or a number with K, M, G or T (powers
/// of 1024), optionally followed by B or iB, in any case (`500M`, `64G`,
/// `2GiB`, `1kb`). One rule for every size flag (`--max-bytes`,
/// `cache prune --max-size`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let want = || format!("{s:?} is not a size (e.g. 4096, 500M, 64G, 2GiB)");
    let n: u64 = n.parse().map_err(|_| want())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(want()),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Writes one line to stdout or stderr. A reader that went away (`kiln ...
/// | head`) stops kiln as an interrupt does ([`crate::primitives::interrupt::reader_gone`]):
/// it unwinds, cleaning up, and exits quietly with the status a shell shows
/// for SIGPIPE (141), as other command-line tools end; never a panic, never
/// an exit from inside a write. (SIGPIPE itself stays ignored: kiln's
/// sockets must report a dead peer as an error.)
pub fn write_line(stdout: bool, args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    // Every line kiln prints is redacted as errors and logs are.
    let line = redact_urls(&args.to_string());
    let written = if stdout {
        writeln!(std::io::stdout().lock(), "{line}")
    } else {
        writeln!(std::io::stderr().lock(), "{line}")
    };
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            crate::primitives::interrupt::reader_gone();
        }
    }
}

/// stderr for `tracing`'s log lines, stopping kiln as [`write_line`] does
/// when the reader went away; the line is dropped (tracing would otherwise
/// report the failed write with `eprintln!`, which panics).
pub struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // tracing writes each formatted line in one call: its URLs are
        // redacted as a whole.
        let line = redact_urls(&String::from_utf8_lossy(buf));
        match std::io::stderr().write_all(line.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                crate::primitives::interrupt::reader_gone();
                Ok(buf.len())
            }
            r => r.map(|()| buf.len()),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_users_write_them() {
        for (s, n) in [
            ("4096", 4096),
            ("500M", 500 << 20),
            ("64G", 64 << 30),
            ("2GiB", 2 << 30),
            ("2gb", 2 << 30),
            ("1kb", 1024),
            (" 3 T ", 3 << 40),
        ] {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
        for bad in ["12Q", "G", "20 parsecs", "1GBI", "1ibb", "", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    /// Issue 45.4: a pre-signed URL's signature and a URL's credentials
    /// never reach a message.
    #[test]
    fn urls_are_shown_without_queries_or_credentials() {
        let s = "waiting 30s on the body of https://bucket.s3.amazonaws.com/blobs/x?X-Amz-Signature=abc&X-Amz-Security-Token=def (manifest): 0 B; http://user:pw@127.0.0.1:5000/v2/ and (https://h/p#frag) https://h";
        let r = redact_urls(s);
        for secret in ["abc", "def", "pw", "frag", "user"] {
            assert!(!r.contains(secret), "{r}");
        }
        assert_eq!(
            r,
            "waiting 30s on the body of https://bucket.s3.amazonaws.com/blobs/x?<redacted> (manifest): 0 B; http://<redacted>@127.0.0.1:5000/v2/ and (https://h/p?<redacted>) https://h"
        );
        assert_eq!(one_line("no urls\nhere"), "no urls here");
    }

    #[test]
    fn words() {
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }
}
