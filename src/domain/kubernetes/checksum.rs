//! A release's checksum and its download: the SHA-512 a tarball must have
//! (a flag's, else the `.sha512` its release publishes beside it, read
//! capped), and the tarball streamed to a file, hashed as it comes.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use futures_util::StreamExt;
use sha2::{Digest as _, Sha512};

use super::{bad, is_url};

/// The SHA-512 release tarball SRC (a URL or a file) must have: `sha512`
/// if given, else the one its release publishes beside it (`SRC.sha512`).
/// A directory has none: it cannot be checked, nor locked.
pub async fn expected_sha512(
    src: &str,
    sha512: Option<&str>,
    http: &reqwest::Client,
) -> anyhow::Result<String> {
    if let Some(s) = sha512 {
        return parse_sha512(s).map_err(|e| bad(src, e));
    }
    let sums = format!("{src}.sha512");
    if is_url(src) {
        let sum = get_text(http, &sums).await.map_err(|e| {
            bad(
                src,
                format!("no checksum: {e:#}; pass --kubernetes-sha512 HEX"),
            )
        })?;
        return parse_sha512(&sum).map_err(|e| bad(src, format!("{sums}: {e}")));
    }
    if Path::new(src).is_dir() {
        return Err(bad(
            src,
            "a directory has no SHA-512 to check or lock; give the release tarball",
        ));
    }
    let text = std::fs::read_to_string(&sums).map_err(|_| {
        bad(src, format!("no checksum: {sums} is missing; pass --kubernetes-sha512 HEX (the release site publishes SRC.sha512)"))
    })?;
    parse_sha512(&text).map_err(|e| bad(src, format!("{sums}: {e}")))
}

/// A `.sha512` file's sum (`HEX` or `HEX  NAME`), or a flag's.
fn parse_sha512(text: &str) -> Result<String, String> {
    let sum = text
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    if sum.len() != 128 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{:?} is not a SHA-512 (128 hex digits)",
            crate::primitives::text::one_line(&sum)
        ));
    }
    Ok(sum)
}

pub(super) fn check_sum(src: &str, want: &str, got: &str) -> anyhow::Result<()> {
    if want != got {
        return Err(bad(
            src,
            format!("SHA-512 mismatch: expected {want}, the file has {got}; nothing was written (is the tarball corrupt or replaced?)"),
        ));
    }
    Ok(())
}

pub(super) fn is_loopback_url(url: &str) -> bool {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(crate::adapters::registry::hosts::is_loopback)
        })
        .unwrap_or(false)
}

async fn get_text(http: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let r = http.get(url).send().await?.error_for_status()?;
    // A checksum file is one line: capped and stall-guarded as it comes.
    let bytes = crate::adapters::registry::read_limited(
        r,
        4096,
        crate::adapters::registry::stall::DEFAULT,
        "checksum file",
        None,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Streams `url` to `to`, hashing as it goes; returns the hex SHA-512.
pub(super) async fn download(
    http: &reqwest::Client,
    url: &str,
    to: &Path,
) -> anyhow::Result<String> {
    let r = http
        .get(url)
        .send()
        .await
        .with_context(|| format!("fetching {url}"))?
        .error_for_status()?;
    let mut body = r.bytes_stream();
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(to)?);
    let mut hash = Sha512::new();
    while let Some(chunk) = body.next().await {
        crate::primitives::interrupt::check()?;
        let chunk = chunk.with_context(|| format!("reading {url}"))?;
        hash.update(&chunk);
        f.write_all(&chunk)?;
    }
    f.flush()?;
    Ok(hex::encode(hash.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_parse_as_published() {
        let hex = "ab".repeat(64);
        assert_eq!(
            parse_sha512(&format!("{hex}  kubernetes-server-linux-amd64.tar.gz\n")).unwrap(),
            hex
        );
        assert!(parse_sha512("abc").is_err());
    }
}
