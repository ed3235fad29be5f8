//! The tar file itself: entry names cleaned (none may escape), the index
//! of where each entry's bytes sit, reads and hashes of those spans, and
//! gzipped archives decompressed once to a private file, bounded in size.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use super::{Span, GUNZIP_PREFIX, MAX_GUNZIP_RATIO};
use crate::primitives::digest::Digest;

/// Archive entry names as written (`./x` and `x` alike), refusing any that
/// could escape when unpacked.
pub(super) fn clean(name: &str) -> anyhow::Result<String> {
    let p = Path::new(name);
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                bail!("entry {name:?} points outside the archive; refusing it")
            }
        }
    }
    Ok(parts.join("/"))
}

/// Every regular file's span; symlinks (docker save links shared layers)
/// resolve to their target's span.
pub(super) fn index_tar(f: std::fs::File, archive: usize) -> anyhow::Result<HashMap<String, Span>> {
    let mut tar = tar::Archive::new(f);
    let mut files = HashMap::new();
    let mut links = Vec::new();
    let entries = tar
        .entries()
        .map_err(|e| anyhow!("is not a tar archive: {e}"))?;
    for entry in entries {
        let entry = entry.map_err(|e| anyhow!("is not a tar archive (or is truncated): {e}"))?;
        let raw = entry
            .path()
            .map_err(|e| anyhow!("bad entry name: {e}"))?
            .to_string_lossy()
            .into_owned();
        let name = clean(&raw)?;
        let kind = entry.header().entry_type();
        if kind.is_file() {
            files.insert(
                name,
                Span {
                    archive,
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                },
            );
        } else if kind.is_symlink() || kind.is_hard_link() {
            let target = entry
                .link_name()
                .ok()
                .flatten()
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            let base = if kind.is_symlink() {
                Path::new(&name)
                    .parent()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            let joined = if base.is_empty() {
                target.clone()
            } else {
                format!("{base}/{target}")
            };
            links.push((
                name,
                resolve_dots(&joined).ok_or_else(|| {
                    anyhow!("link {raw:?} -> {target:?} points outside the archive; refusing it")
                })?,
            ));
        }
    }
    if files.is_empty() {
        bail!("is not a tar archive, or is empty");
    }
    for (name, target) in links {
        if let Some(span) = files.get(&target).copied() {
            files.insert(name, span);
        }
    }
    Ok(files)
}

/// `a/b/../c` -> `a/c`; None if `..` climbs above the root.
pub(super) fn resolve_dots(p: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            s => out.push(s),
        }
    }
    Some(out.join("/"))
}

pub(super) fn read_span(file: &std::fs::File, span: Span, limit: u64) -> anyhow::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    if span.size > limit {
        bail!(
            "{} bytes is over the {limit}-byte limit for a document",
            span.size
        );
    }
    let mut buf = vec![0; span.size as usize];
    file.read_exact_at(&mut buf, span.offset)?;
    Ok(Bytes::from(buf))
}

/// Decompresses a gzipped archive to a temp file, bounded by
/// [`MAX_GUNZIP_RATIO`] × its size and by the free space of the temp
/// directory; removed on drop, and by the next run if this one is killed.
pub(super) fn gunzip_bounded(f: std::fs::File) -> anyhow::Result<tempfile::NamedTempFile> {
    let tmpdir = std::env::temp_dir();
    sweep_dead_gunzips(&tmpdir);
    let packed = f.metadata()?.len();
    let by_ratio = packed
        .saturating_mul(MAX_GUNZIP_RATIO)
        .saturating_add(64 << 20);
    let free = rustix::fs::statvfs(&tmpdir)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .unwrap_or(u64::MAX)
        .saturating_sub(64 << 20);
    let bound = by_ratio.min(free);
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!("{GUNZIP_PREFIX}{}-", std::process::id()))
        .tempfile_in(&tmpdir)?;
    let mut gz = Read::take(flate2::read::GzDecoder::new(f), bound + 1);
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        crate::primitives::fault::point("gunzip");
        crate::primitives::interrupt::check()?;
        let k = gz.read(&mut buf).context("is not a valid gzip file")?;
        if k == 0 {
            break;
        }
        std::io::Write::write_all(&mut tmp, &buf[..k])?;
        n += k as u64;
    }
    if n > bound {
        bail!(
            "decompresses to more than {bound} bytes ({}); if it is genuine, gunzip it yourself and pass the .tar",
            if bound == by_ratio {
                format!("{MAX_GUNZIP_RATIO}x its size")
            } else {
                format!("the free space in {}", tmpdir.display())
            }
        );
    }
    Ok(tmp)
}

fn sweep_dead_gunzips(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(GUNZIP_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(crate::adapters::daemon::process_gone) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The digest of a file in the archive, and whether it is gzip-compressed.
pub(super) fn hash_span(file: &std::fs::File, span: Span) -> anyhow::Result<(Digest, bool)> {
    let mut f = super::reopen(file)?;
    f.seek(SeekFrom::Start(span.offset))?;
    let mut r = f.take(span.size);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut first = true;
    let mut gzip = false;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if first {
            gzip = n >= 2 && buf[0] == 0x1f && buf[1] == 0x8b;
            first = false;
        }
        h.update(&buf[..n]);
    }
    Ok((Digest::from_hasher(h), gzip))
}
