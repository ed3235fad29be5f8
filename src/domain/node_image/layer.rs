//! Writing one of kiln's layers: its entries as a deterministic tar (sorted,
//! fixed owners and mtimes), compressed as asked, hashed on the way out for
//! both its diff ID and its digest; and the key of a content-keyed layer.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use sha2::{Digest as _, Sha256};

use crate::primitives::digest::Digest;
use crate::primitives::oci::media;
use crate::primitives::write_behind::WriteBehind;

/// Writes through to `inner`, hashing and counting what passes.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    n: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.hash.update(&buf[..k]);
        self.n += k as u64;
        Ok(k)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// How kiln's layer is compressed (`--layer-compression`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Every runtime reads it (the default).
    #[default]
    Gzip,
    /// Compressed on all cores; on 2 cores slower than gzip
    /// (docs/performance.md). containerd 1.5+ and Docker 23+ read it.
    Zstd,
    /// No compression: fastest; the layer is mostly compressed blobs anyway.
    None,
}

/// The levels kiln compresses at: part of what decides a layer's bytes.
const GZIP_LEVEL: u32 = 6;
const ZSTD_LEVEL: i32 = 3;

impl Compression {
    /// What made a layer's compressed bytes: the algorithm, the library
    /// and its version, the level. Part of a cached layer's key: the same
    /// tar under another library or level is other bytes (issue 44.6).
    pub fn identity(self) -> String {
        match self {
            Compression::Gzip => format!(
                "gzip flate2 {} zlib-rs {} level {GZIP_LEVEL}",
                env!("KILN_FLATE2"),
                env!("KILN_ZLIB_RS")
            ),
            Compression::Zstd => format!(
                "zstd libzstd {} level {ZSTD_LEVEL}",
                zstd::zstd_safe::version_string()
            ),
            Compression::None => "none".into(),
        }
    }

    pub fn media_type(self) -> &'static str {
        match self {
            Compression::Gzip => media::OCI_LAYER_GZIP,
            Compression::Zstd => media::OCI_LAYER_ZSTD,
            Compression::None => media::OCI_LAYER,
        }
    }
}

/// The compressor the tar streams into, itself writing into the hashing file.
enum Compressor<W: Write> {
    Gzip(crate::primitives::gzip::MixedGz<W>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
    None(W),
}

impl<W: Write> Compressor<W> {
    pub(super) fn new(kind: Compression, out: W) -> std::io::Result<Self> {
        Ok(match kind {
            // No timestamp in the header: the same tar gives the same bytes.
            Compression::Gzip => Compressor::Gzip(crate::primitives::gzip::MixedGz::new(
                out,
                flate2::Compression::new(GZIP_LEVEL),
            )?),
            Compression::Zstd => {
                let mut z = zstd::stream::write::Encoder::new(out, ZSTD_LEVEL)?;
                // Workers >= 1 give the same bytes whatever their number.
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                z.multithread(cores as u32)?;
                z.include_checksum(true)?;
                Compressor::Zstd(z)
            }
            Compression::None => Compressor::None(out),
        })
    }

    /// The next bytes are already compressed (a stored layer blob): gzip
    /// stores them instead of deflating them again; zstd finds that itself.
    fn set_stored(&mut self, stored: bool) -> std::io::Result<()> {
        match self {
            Compressor::Gzip(g) => g.set_stored(stored),
            _ => Ok(()),
        }
    }

    fn finish(self) -> std::io::Result<W> {
        match self {
            Compressor::Gzip(g) => g.finish(),
            Compressor::Zstd(z) => z.finish(),
            Compressor::None(w) => Ok(w),
        }
    }
}

impl<W: Write> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Compressor::Gzip(g) => g.write(buf),
            Compressor::Zstd(z) => z.write(buf),
            Compressor::None(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Compressor::Gzip(g) => g.flush(),
            Compressor::Zstd(z) => z.flush(),
            Compressor::None(w) => w.flush(),
        }
    }
}

/// A layer blob written out.
#[derive(Debug, Clone)]
pub struct LayerBlob {
    pub media_type: &'static str,
    pub digest: Digest,
    pub size: u64,
    pub diff_id: Digest,
    pub entries: usize,
    /// What it holds, for the config's history and the report.
    pub holds: String,
    /// Taken from the cache rather than compressed again.
    pub cached: bool,
}

#[cfg(test)]
impl LayerBlob {
    /// A layer named `name` (its digest and diff ID are the name's), for
    /// the planner's tests.
    pub fn named(name: &str, size: u64) -> LayerBlob {
        LayerBlob {
            media_type: media::OCI_LAYER_GZIP,
            digest: Digest::of(name.as_bytes()),
            size,
            diff_id: Digest::of(name.as_bytes()),
            entries: 1,
            holds: name.into(),
            cached: false,
        }
    }
}

/// One of kiln's layers: `entries` (path, is a whiteout; sorted, from
/// [`super::plan`]) as a tar, compressed as asked. Streams into `out` (and
/// gives it back): its digest is known only at the end.
pub fn write_layer<W: Write + Send>(
    root: &Path,
    names: &[(PathBuf, bool)],
    owners: &crate::primitives::unpack::Owners,
    out: W,
    mtime: u64,
    compression: Compression,
) -> anyhow::Result<(LayerBlob, W)> {
    // The compressed stream is hashed (its digest) and written on a thread
    // of its own: this one reads, tars, hashes the tar (its diff ID) and
    // compresses. Two cores, two hashes at once.
    std::thread::scope(|scope| {
        let file = WriteBehind::new(
            scope,
            Hashing {
                inner: out,
                hash: Sha256::new(),
                n: 0,
            },
        );
        let tar_out = Hashing {
            inner: Compressor::new(compression, file)?,
            hash: Sha256::new(),
            n: 0,
        };
        // Large writes into the hashing and compression chain.
        let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(1 << 20, tar_out));
        tar.follow_symlinks(false);
        let mut entries = 0;
        for (rel, whiteout) in names {
            crate::primitives::interrupt::check()?;
            let owner = owners.get(rel).unwrap_or((0, 0));
            let stored = !whiteout && compressed_already(&root.join(rel));
            if stored {
                let w = tar.get_mut();
                w.flush()?;
                w.get_mut().inner.set_stored(true)?;
            }
            if append_entry(&mut tar, root, rel, *whiteout, owner, mtime)? {
                entries += 1;
            }
            if stored {
                let w = tar.get_mut();
                w.flush()?;
                w.get_mut().inner.set_stored(false)?;
            }
        }
        let tar_out = tar
            .into_inner()?
            .into_inner()
            .map_err(|e| anyhow!("{}", e.error()))?;
        let diff_id = Digest::from_hasher(tar_out.hash);
        let mut file = tar_out.inner.finish()?;
        file.flush()?;
        let Hashing {
            inner: out,
            hash,
            n: size,
        } = file.finish()?;
        let layer = LayerBlob {
            media_type: compression.media_type(),
            digest: Digest::from_hasher(hash),
            size,
            diff_id,
            entries,
            holds: String::new(),
            cached: false,
        };
        Ok((layer, out))
    })
}

/// What decides a content-keyed layer's bytes, hashed without reading its
/// files: each entry's header fields, and each file's content digest: a
/// content blob's is its name (the store verified every blob kiln wrote
/// while it streamed, and a lent cache entry is re-hashed before use),
/// another file's is in `known` (the release's binaries, hashed for the
/// SBOM). kiln's version stands for its tar code; the compressor is named
/// with its library, version and level ([`Compression::identity`]). None
/// when a file's
/// content digest is not known: such a layer is not keyed.
pub fn content_key(
    root: &Path,
    names: &[(PathBuf, bool)],
    owners: &crate::primitives::unpack::Owners,
    mtime: u64,
    compression: Compression,
    known: &std::collections::HashMap<PathBuf, Digest>,
) -> Option<Digest> {
    let mut h = Sha256::new();
    h.update(format!(
        "kiln layer 2 {} {} {mtime}\n",
        env!("CARGO_PKG_VERSION"),
        compression.identity()
    ));
    for (rel, whiteout) in names {
        let (uid, gid) = owners.get(rel).unwrap_or((0, 0));
        let m = std::fs::symlink_metadata(root.join(rel)).ok();
        let what = match (&m, whiteout) {
            (_, true) => "whiteout".to_string(),
            (Some(m), _) if m.is_dir() => format!("dir {:o}", m.mode() & 0o7777),
            (Some(m), _) if m.is_file() => {
                let content = match known.get(rel) {
                    Some(d) => d.to_string(),
                    None if super::plan::is_blob(rel) => rel.file_name()?.to_str()?.to_string(),
                    None => return None,
                };
                format!("file {:o} {} {content}", m.mode() & 0o7777, m.len())
            }
            _ => return None,
        };
        h.update(format!("{} {uid} {gid} {what}\n", rel.display()));
    }
    Some(Digest::from_hasher(h))
}

/// Whether a file's bytes are compressed already (gzip, zstd, xz, bzip2
/// magic) and big enough to matter: a stored layer blob.
fn compressed_already(path: &Path) -> bool {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !m.is_file() || m.len() < 64 << 10 {
        return false;
    }
    let mut magic = [0u8; 4];
    let read =
        std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
    read.is_ok()
        && (magic.starts_with(&[0x1f, 0x8b])
            || magic == [0x28, 0xb5, 0x2f, 0xfd]
            || magic == [0xfd, 0x37, 0x7a, 0x58]
            || magic.starts_with(b"BZh"))
}

/// The header kiln writes for one entry (its path is set as it is
/// appended): GNU format, as `tar::Header::new_gnu` makes it. The one
/// place these fields are decided, for writing a layer and for reading one
/// back as kiln would have written it (`reread`).
pub(super) fn entry_header(
    kind: tar::EntryType,
    mode: u32,
    (uid, gid): (u64, u64),
    mtime: u64,
    size: u64,
) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mtime(mtime);
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(gid);
    h.set_size(size);
    h
}

/// The header blocks kiln's writer puts before an entry's data (a GNU
/// long-name record first when the path needs one): what [`write_layer`]
/// writes for it, byte for byte, as the same `tar::Builder` writes them.
pub(super) fn header_blocks(rel: &Path, header: &tar::Header) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = header.clone();
    // No data: `append_data` writes the headers and pads nothing.
    b.append_data(&mut h, rel, std::io::empty())?;
    Ok(b.get_ref().clone())
}

/// Appends `rel` (or a whiteout for it) to kiln's layer: modes as on disk,
/// `owner` as the base's headers said (0:0 for what kiln added), whoever
/// ran kiln; mtime fixed; files read without following links. False for
/// what kiln does not carry (sockets, devices).
fn append_entry<W: Write>(
    tar: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    whiteout: bool,
    owner: (u64, u64),
    mtime: u64,
) -> anyhow::Result<bool> {
    use tar::EntryType;
    if whiteout {
        let mut h = entry_header(EntryType::Regular, 0o644, (0, 0), mtime, 0);
        tar.append_data(&mut h, rel, std::io::empty())?;
        return Ok(true);
    }
    let full = root.join(rel);
    let m = std::fs::symlink_metadata(&full)?;
    let mode = m.mode() & 0o7777;
    if m.is_dir() {
        let mut h = entry_header(EntryType::Directory, mode, owner, mtime, 0);
        tar.append_data(&mut h, rel, std::io::empty())?;
    } else if m.file_type().is_symlink() {
        let mut h = entry_header(EntryType::Symlink, mode, owner, mtime, 0);
        tar.append_link(&mut h, rel, std::fs::read_link(&full)?)?;
    } else if m.is_file() {
        let mut h = entry_header(EntryType::Regular, mode, owner, mtime, m.len());
        let f = rustix::fs::openat(
            rustix::fs::CWD,
            &full,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        tar.append_data(&mut h, rel, std::fs::File::from(f))?;
    } else {
        return Ok(false);
    }
    Ok(true)
}
