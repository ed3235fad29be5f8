//! The physical floors the rows are measured against: every blob read once
//! over parallel HTTP and hashed; an archive written once and synced.

use std::process::Command;
use std::time::{Duration, Instant};

use sha2::Digest as _;

pub async fn floor(registry: &str, blobs: &[(String, String)]) -> Duration {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (repo, digest) in blobs {
        let (client, url, digest) = (
            client.clone(),
            format!("http://{registry}/v2/{repo}/blobs/{digest}"),
            digest.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut resp = client.get(&url).send().await.unwrap();
            let mut h = sha2::Sha256::new();
            while let Some(chunk) = resp.chunk().await.unwrap() {
                h.update(&chunk);
            }
            assert_eq!(format!("sha256:{}", hex::encode(h.finalize())), digest);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

/// Lets earlier runs' dirty pages reach the disk, so no run pays for another's.
pub fn settle() {
    let _ = Command::new("sync").status();
}

/// Writes `size` bytes to `path` once, synced: the archive write's floor.
pub fn write_once(path: &std::path::Path, size: u64) -> std::io::Result<()> {
    use std::io::Write;
    let buf = vec![0x5au8; 1 << 20];
    let mut f = std::fs::File::create(path)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    std::fs::remove_file(path)
}
