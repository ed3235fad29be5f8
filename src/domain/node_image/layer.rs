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

/// What kiln's tar writer is: bumped whenever [`write_layer`] would write
/// other bytes for the same entries (the golden test below fails then).
/// With the `tar` crate's version and [`Compression::identity`], it names
/// a layer's format in its key, instead of kiln's version: a later kiln
/// that writes the same bytes reuses the layers an earlier one wrote (the
/// cache, a previous image's record), and one that does not reuses none.
pub const LAYER_FORMAT: &str = concat!("kiln layer 3 tar ", env!("KILN_TAR"));

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
    /// Taken by digest from the previous image's record: neither written
    /// nor fetched (`record`).
    pub reused: bool,
    /// A content-keyed layer's key ([`key_of`]), by which a later build
    /// may take it; and its entries, known for it and for a kept layer
    /// (whose key may be another compressor's): what the image's build
    /// record keeps of it.
    pub key: Option<Digest>,
    pub keyed: Vec<KeyedEntry>,
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
            reused: false,
            key: None,
            keyed: Vec::new(),
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
            reused: false,
            key: None,
            keyed: Vec::new(),
        };
        Ok((layer, out))
    })
}

/// One entry of a content-keyed layer as its key sees it, and as a build
/// record keeps it (`record`): path, owner, and what it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyedEntry {
    pub path: PathBuf,
    pub uid: u64,
    pub gid: u64,
    pub what: What,
}

/// What a keyed entry is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "type", deny_unknown_fields)]
pub enum What {
    Whiteout,
    Dir {
        mode: u32,
    },
    /// `content`: the file's digest (a content blob's is its name).
    File {
        mode: u32,
        size: u64,
        content: Digest,
    },
}

/// The entries a content-keyed layer of `names` holds, read without its
/// files' bytes: each one's header fields, and each file's content digest:
/// a content blob's is its name (the store verified every blob kiln wrote
/// while it streamed, and a lent cache entry is re-hashed before use),
/// another file's is in `known` (the release's binaries, hashed for the
/// SBOM). None when a file's content digest is not known: such a layer is
/// not keyed.
pub fn keyed_entries(
    root: &Path,
    names: &[(PathBuf, bool)],
    owners: &crate::primitives::unpack::Owners,
    known: &std::collections::HashMap<PathBuf, Digest>,
) -> Option<Vec<KeyedEntry>> {
    let mut out = Vec::with_capacity(names.len());
    for (rel, whiteout) in names {
        let (uid, gid) = owners.get(rel).unwrap_or((0, 0));
        let m = std::fs::symlink_metadata(root.join(rel)).ok();
        let what = match (&m, whiteout) {
            (_, true) => What::Whiteout,
            (Some(m), _) if m.is_dir() => What::Dir {
                mode: m.mode() & 0o7777,
            },
            (Some(m), _) if m.is_file() => {
                let content = match known.get(rel) {
                    Some(d) => d.clone(),
                    None if super::plan::is_blob(rel) => {
                        Digest::parse(&format!("sha256:{}", rel.file_name()?.to_str()?)).ok()?
                    }
                    None => return None,
                };
                What::File {
                    mode: m.mode() & 0o7777,
                    size: m.len(),
                    content,
                }
            }
            _ => return None,
        };
        out.push(KeyedEntry {
            path: rel.clone(),
            uid,
            gid,
            what,
        });
    }
    Some(out)
}

/// What decides a content-keyed layer's bytes: its entries
/// ([`keyed_entries`]), [`LAYER_FORMAT`] (the tar writer), the compressor
/// with its library, version and level ([`Compression::identity`]), and
/// the mtime. Computed from a rootfs or from a build record's entries
/// alike: the one rule.
pub fn key_of(entries: &[KeyedEntry], mtime: u64, compression: &str) -> Digest {
    let mut h = Sha256::new();
    h.update(format!("{LAYER_FORMAT} {compression} {mtime}\n"));
    for e in entries {
        let what = match &e.what {
            What::Whiteout => "whiteout".to_string(),
            What::Dir { mode } => format!("dir {mode:o}"),
            What::File {
                mode,
                size,
                content,
            } => format!("file {mode:o} {size} {}", content.hex()),
        };
        h.update(format!("{} {} {} {what}\n", e.path.display(), e.uid, e.gid));
    }
    Digest::from_hasher(h)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes kiln's writer gives a fixed set of entries. When this
    /// fails, the writer changed: bump [`LAYER_FORMAT`] (layers keyed by
    /// the old one must not be taken for the new bytes), then update the
    /// digests here.
    #[test]
    fn the_writer_gives_these_bytes_or_layer_format_is_bumped() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let blob = format!("{}/{}", super::super::plan::BLOBS, "ab".repeat(32));
        std::fs::create_dir_all(root.join(super::super::plan::BLOBS)).unwrap();
        std::fs::write(root.join(&blob), b"a blob").unwrap();
        std::fs::write(root.join("var/lib/containerd/f"), b"{}").unwrap();
        use std::os::unix::fs::PermissionsExt;
        for (p, m) in [
            ("var", 0o755),
            ("var/lib", 0o755),
            ("var/lib/containerd", 0o711),
            (blob.as_str(), 0o444),
            ("var/lib/containerd/f", 0o600),
        ] {
            std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(m)).unwrap();
        }
        let mut names: Vec<(PathBuf, bool)> = Path::new(&blob)
            .ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .map(|a| (a.to_path_buf(), false))
            .collect();
        names.push((PathBuf::from("var/lib/containerd/f"), false));
        names.push((PathBuf::from("var/lib/containerd/.wh.gone"), true));
        names.sort();
        let owners = crate::primitives::unpack::Owners::new(|_| false);
        let mut got = Vec::new();
        for c in [Compression::None, Compression::Gzip] {
            let (l, _) = write_layer(root, &names, &owners, Vec::new(), 0, c).unwrap();
            got.push((l.diff_id.to_string(), l.digest.to_string()));
        }
        assert_eq!(
            got,
            [
                (GOLDEN_TAR.to_string(), GOLDEN_TAR.to_string()),
                (GOLDEN_TAR.to_string(), GOLDEN_GZIP.to_string()),
            ],
            "kiln's layer writer changed: bump LAYER_FORMAT, then update these"
        );
    }

    const GOLDEN_TAR: &str =
        "sha256:a9489178dd73fa6d163e83da2b744cf74629e56a519c83f1ef096668cbc7ee77";
    const GOLDEN_GZIP: &str =
        "sha256:748bbd75be5cfbdcfaa8414adc6d5b79be2a540b2cacc9daa4b7745e3bb50f4f";
}
