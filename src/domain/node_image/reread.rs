//! Reading a layer back as kiln writes it: every entry parsed, its header
//! blocks re-created by kiln's own writer (`layer::header_blocks`) from
//! what was parsed, and compared byte for byte before its data is read; its
//! padding zero; the two zero blocks that end an archive, and then nothing.
//!
//! Why not read it with a tar parser and check what it says: two parsers
//! disagree on the same bytes, and containerd and Docker read layers with
//! Go's `archive/tar` (`src/archive/tar/reader.go`), not the `tar` crate.
//! There, a PAX record given twice takes the last value (`parsePAX` fills a
//! map), GNU sparse records rename and resize an entry
//! (`GNU.sparse.name`, `realsize`), an entry of type NUL whose name ends in
//! `/` is a directory with no data (`Next`: "Legacy archives use trailing
//! slash for directories"), and PAX `SCHILY.xattr.*` records set xattrs;
//! the `tar` crate reads each of these otherwise. A layer whose every byte
//! is what kiln's writer writes for the entries parsed is one kiln wrote:
//! it has none of these, and every reader reads it as kiln does. So the
//! rule is the writer's, and nothing is accepted that it would not emit:
//! only regular files and directories, GNU long names as the writer makes
//! them, no other extension record.
//!
//! Matching the writer is not enough on its own: tar-rs also writes a
//! directory header with a size, and Go reads a directory, link or device
//! as header-only (`isHeaderOnlyType`), so the bytes tar-rs would take as
//! that directory's data Go reads as further entries; and tar-rs writes a
//! number too large for octal in base-256, which Go reads as negative
//! where tar-rs reads it as positive. So the rule is the writer's *and*
//! Go's, the subset below, checked here and nowhere else.
//!
//! # The subset kiln accepts (what kiln writes and Go reads the same way)
//! - Entries of type `0` (regular file) or `5` (directory), each preceded
//!   at most by one GNU long-name record (`L`) as tar-rs writes it; no PAX,
//!   GNU sparse, NUL-typed, link or device entry.
//! - A directory's size is 0: it is header-only in Go's reader.
//! - Every numeric field (mode, uid, gid, size, mtime) in octal, never in
//!   base-256; uid and gid at most [`OWNER_MAX`].
//! - A plain relative UTF-8 path; every header block byte for byte what
//!   kiln's writer writes for what was parsed; data padding zero; the two
//!   zero blocks that end an archive, and nothing after them.
//! - Compressed (`primitives::unpack::exact`): one gzip member with kiln's
//!   own 10-byte header (no FEXTRA, FNAME, FCOMMENT, FHCRC) and a trailer
//!   that matches, or one zstd frame, and nothing after it.
//!
//! The tests read every layer this reader accepts with Go's own
//! `archive/tar` and `compress/gzip` (testkit's layer oracle) and fail
//! where the two listings differ.
//!
//! The work is bounded: the first block that differs ends the read, a long
//! name is at most [`LONG_NAME_MAX`], and each entry's data is counted by
//! the caller (the unpack budget) before it is read.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use sha2::{Digest as _, Sha256};

use crate::primitives::digest::Digest;

const BLOCK: usize = 512;
/// The longest path kiln's writer puts in a GNU long-name record (Linux's
/// PATH_MAX).
pub const LONG_NAME_MAX: u64 = 4096;
/// The largest uid or gid kept: what fits the header's 8-byte octal field
/// (7 digits), so it is never written in base-256.
pub const OWNER_MAX: u64 = 0o7_777_777;
/// Offsets of a ustar header's numeric fields (mode, uid, gid,
/// size, mtime), each checked to be octal, not base-256.
const NUMERIC: [(&str, usize); 5] = [
    ("mode", 100),
    ("uid", 108),
    ("gid", 116),
    ("size", 124),
    ("mtime", 136),
];

/// One entry as parsed (and found to be as kiln writes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub dir: bool,
    pub mode: u32,
    pub owner: (u64, u64),
    pub mtime: u64,
    pub size: u64,
}

/// What a layer read back gave: its diff ID (every uncompressed byte) and
/// how many entries it has.
#[derive(Debug)]
pub struct Reread {
    pub diff_id: Digest,
    pub entries: usize,
}

/// Hashes and counts what is read through it.
struct Counted<R> {
    inner: R,
    hash: Sha256,
    n: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.hash.update(&buf[..k]);
        self.n += k as u64;
        Ok(k)
    }
}

/// Reads `tar` (a layer's uncompressed bytes) through as kiln's writer
/// would have written it ([module doc](self)); `each` gets each entry and
/// a reader of exactly its data, which it may read or leave (the rest is
/// read and hashed here). `Err` says where the layer is not kiln's.
pub fn reread(
    tar: impl Read,
    mut each: impl FnMut(&Entry, &mut dyn Read) -> anyhow::Result<()>,
) -> anyhow::Result<Reread> {
    let mut r = Counted {
        inner: tar,
        hash: Sha256::new(),
        n: 0,
    };
    let mut entries = 0usize;
    loop {
        let at = r.n;
        let first = block(&mut r)?.ok_or_else(|| {
            anyhow!("the layer ends at byte {at} without the blocks that end an archive")
        })?;
        if first.iter().all(|b| *b == 0) {
            let second = block(&mut r)?;
            if !second.is_some_and(|b| b.iter().all(|b| *b == 0)) {
                bail!("the layer has one zero block at byte {at}, not the two that end an archive");
            }
            let mut one = [0u8; 1];
            if r.read(&mut one)? != 0 {
                bail!(
                    "the layer has bytes after the end of its archive (byte {})",
                    r.n
                );
            }
            return Ok(Reread {
                diff_id: Digest::from_hasher(r.hash),
                entries,
            });
        }
        let mut got = first.to_vec();
        let (name, main) = match first[156] {
            b'L' => {
                let size = header_of(&first)?
                    .size()
                    .map_err(|e| anyhow!("entry at byte {at}: {e}"))?;
                if size > LONG_NAME_MAX {
                    bail!("entry at byte {at}: a long name of {size} bytes");
                }
                // The writer's record: the name and a NUL (counted in its
                // size, as GNU tar does), padded.
                let blocks = (size as usize).div_ceil(BLOCK);
                let mut data = vec![0u8; blocks * BLOCK];
                r.read_exact(&mut data)
                    .map_err(|e| anyhow!("entry at byte {at}: {e}"))?;
                got.extend_from_slice(&data);
                let main = block(&mut r)?
                    .ok_or_else(|| anyhow!("entry at byte {at}: a long name and no entry"))?;
                got.extend_from_slice(&main);
                let name = data[..size as usize]
                    .split(|b| *b == 0)
                    .next()
                    .unwrap_or_default()
                    .to_vec();
                (name, main)
            }
            _ => {
                let name = first[..100]
                    .split(|b| *b == 0)
                    .next()
                    .unwrap_or_default()
                    .to_vec();
                (name, first)
            }
        };
        let entry = parse(&name, &main).map_err(|e| anyhow!("entry at byte {at}: {e}"))?;
        let kind = if entry.dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        };
        let header =
            super::layer::entry_header(kind, entry.mode, entry.owner, entry.mtime, entry.size);
        let want = super::layer::header_blocks(&entry.path, &header).map_err(|e| {
            anyhow!(
                "entry {}: kiln's writer refuses it: {e}",
                entry.path.display()
            )
        })?;
        if want != got {
            bail!(
                "entry {}: its headers are not as kiln writes them (other readers may read another entry there)",
                entry.path.display()
            );
        }
        let mut data = (&mut r).take(entry.size);
        each(&entry, &mut data)?;
        std::io::copy(&mut data, &mut std::io::sink())?;
        if data.limit() != 0 {
            bail!(
                "entry {}: the layer ends inside its data",
                entry.path.display()
            );
        }
        let pad = (BLOCK - (entry.size as usize % BLOCK)) % BLOCK;
        let mut zeros = vec![0u8; pad];
        r.read_exact(&mut zeros)
            .map_err(|e| anyhow!("entry {}: {e}", entry.path.display()))?;
        if zeros.iter().any(|b| *b != 0) {
            bail!("entry {}: its padding is not zero", entry.path.display());
        }
        entries += 1;
    }
}

/// Fails once more than `left` bytes have been read through it.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            std::io::Error::other("it inflates to more than it may (a bomb, or not kiln's)")
        })?;
        Ok(n)
    }
}

/// A layer blob as kiln reads one it did not just write: decompressed
/// exactly as `how` says (`unpack::exact`), at most `inflated` bytes, and
/// read back through [`reread`]; the one composition of the two, so the
/// tests judge against Go's readers what the build judges.
pub fn reread_blob(
    blob: impl Read,
    how: crate::primitives::unpack::LayerCompression,
    inflated: u64,
    each: impl FnMut(&Entry, &mut dyn Read) -> anyhow::Result<()>,
) -> anyhow::Result<Reread> {
    let mut tar = crate::primitives::unpack::open_exact(blob, how)?;
    let read = reread(
        Capped {
            inner: &mut tar,
            left: inflated,
        },
        each,
    )?;
    tar.finish()?;
    Ok(read)
}

/// The next block, or `None` at a clean end (no byte of it).
fn block(r: &mut impl Read) -> anyhow::Result<Option<[u8; BLOCK]>> {
    let mut b = [0u8; BLOCK];
    let mut n = 0;
    while n < BLOCK {
        match r.read(&mut b[n..])? {
            0 if n == 0 => return Ok(None),
            0 => bail!("the layer ends inside a block"),
            k => n += k,
        }
    }
    Ok(Some(b))
}

fn header_of(b: &[u8; BLOCK]) -> anyhow::Result<tar::Header> {
    let mut h = tar::Header::new_old();
    h.as_mut_bytes().copy_from_slice(b);
    Ok(h)
}

/// The fields kiln's writer sets, from a main header and its name; only
/// the entry types it writes into layers that may be kept.
fn parse(name: &[u8], main: &[u8; BLOCK]) -> anyhow::Result<Entry> {
    let h = header_of(main)?;
    for (field, at) in NUMERIC {
        // tar-rs writes base-256 (high bit set) where octal cannot hold the
        // number; Go reads such a field signed, tar-rs unsigned.
        if main[at] & 0x80 != 0 {
            bail!("its {field} is in base-256, which readers read differently");
        }
    }
    let dir = match main[156] {
        b'0' => false,
        b'5' => true,
        other => bail!(
            "type {:?}: not a regular file or a directory (a tar extension or entry kiln does not write)",
            char::from(other)
        ),
    };
    let path = std::str::from_utf8(name).map_err(|_| anyhow!("a name that is not UTF-8"))?;
    let plain = !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain {
        bail!("{path:?} is not a plain relative path");
    }
    let entry = Entry {
        path: PathBuf::from(path),
        dir,
        mode: h.mode()?,
        owner: (h.uid()?, h.gid()?),
        mtime: h.mtime()?,
        size: h.size()?,
    };
    if entry.dir && entry.size != 0 {
        bail!(
            "directory {path:?} has a size of {} bytes: Go's archive/tar reads a directory as header-only, so those bytes would be read as further entries",
            entry.size
        );
    }
    if entry.owner.0 > OWNER_MAX || entry.owner.1 > OWNER_MAX {
        bail!(
            "{path:?} has owner {}:{}, over {OWNER_MAX}",
            entry.owner.0,
            entry.owner.1
        );
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer of `files` (path, content; `None` a directory) as kiln's
    /// writer writes it.
    pub(crate) fn kiln_tar(files: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, content) in files {
            let (kind, mode, size) = match content {
                None => (tar::EntryType::Directory, 0o755, 0),
                Some(c) => (tar::EntryType::Regular, 0o444, c.len() as u64),
            };
            let mut h = super::super::layer::entry_header(kind, mode, (0, 0), 0, size);
            b.append_data(&mut h, path, content.unwrap_or_default())
                .unwrap();
        }
        b.into_inner().unwrap()
    }

    /// As [`kiln_tar`], every entry owned by `owner`.
    fn kiln_tar_owned(files: &[(&str, Option<&[u8]>)], owner: (u64, u64)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, content) in files {
            let c = content.unwrap_or_default();
            let kind = if content.is_some() {
                tar::EntryType::Regular
            } else {
                tar::EntryType::Directory
            };
            let mut h = super::super::layer::entry_header(kind, 0o444, owner, 0, c.len() as u64);
            b.append_data(&mut h, path, c).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn read(bytes: &[u8]) -> anyhow::Result<Vec<Entry>> {
        let mut seen = Vec::new();
        reread(bytes, |e, _| {
            seen.push(e.clone());
            Ok(())
        })?;
        Ok(seen)
    }

    const LONG: &str = "var/lib/containerd/io.containerd.content.v1.content/blobs/sha256/0123456789012345678901234567890123456789012345678901234567890123";

    #[test]
    fn a_layer_kiln_wrote_reads_back_with_its_diff_id() {
        let tar = kiln_tar(&[("var", None), ("var/lib", None), (LONG, Some(b"data"))]);
        let got = reread(&tar[..], |_, _| Ok(())).unwrap();
        assert_eq!(got.diff_id, Digest::of(&tar));
        assert_eq!(got.entries, 3);
        assert_eq!(read(&tar).unwrap()[2].path, Path::new(LONG));
    }

    /// Each way of making other readers see other entries, on a layer
    /// that is otherwise kiln's.
    #[test]
    fn what_the_writer_would_not_write_is_refused() {
        let good = kiln_tar(&[("var", None), (LONG, Some(b"data"))]);
        // Trailing bytes, a missing end block, a header after one zero block.
        let mut trailing = good.clone();
        trailing.extend([0u8; 512]);
        assert!(read(&trailing).is_err());
        assert!(read(&good[..good.len() - 512]).is_err());
        let mut one_zero = good[..good.len() - 1024].to_vec();
        one_zero.extend([0u8; 512]);
        one_zero.extend(&kiln_tar(&[("etc", None)]));
        assert!(read(&one_zero).is_err());
        // A PAX header (type 'x') before an entry.
        let mut b = tar::Builder::new(Vec::new());
        b.append_pax_extensions([("path", b"etc/passwd".as_slice())])
            .unwrap();
        let mut pax = b.into_inner().unwrap();
        pax.truncate(pax.len() - 1024);
        pax.extend(&good);
        assert!(format!("{:#}", read(&pax).unwrap_err()).contains("type 'x'"));
        // Type NUL for a regular file, a name ending in '/'.
        let mut nul = kiln_tar(&[("var/", Some(b"x"))]);
        nul[156] = 0;
        assert!(read(&nul).is_err());
        // Non-zero padding.
        let mut pad = kiln_tar(&[("f", Some(b"x"))]);
        pad[512 + 1] = 1;
        assert!(format!("{:#}", read(&pad).unwrap_err()).contains("padding"));
        // A directory with a size (and data).
        let mut sized = kiln_tar(&[("d", None)]);
        let mut h = header_of(sized[..512].try_into().unwrap()).unwrap();
        h.set_size(1);
        h.set_cksum();
        sized[..512].copy_from_slice(h.as_bytes());
        assert!(read(&sized).is_err());
        // A uid only base-256 holds (Go reads it negative, tar-rs positive).
        let mut h =
            super::super::layer::entry_header(tar::EntryType::Regular, 0o444, (1 << 62, 0), 0, 1);
        let mut b = tar::Builder::new(Vec::new());
        b.append_data(&mut h, "f", &b"x"[..]).unwrap();
        let e = read(&b.into_inner().unwrap()).unwrap_err();
        assert!(format!("{e:#}").contains("base-256"), "{e:#}");
        // An owner octal holds but over the limit kiln keeps.
        let big = kiln_tar_owned(&[("f", Some(b"x"))], (OWNER_MAX + 1, 0));
        assert!(read(&big).is_err());
        assert!(read(&kiln_tar_owned(&[("f", Some(b"x"))], (OWNER_MAX, 0))).is_ok());
        // An empty name.
        let mut empty = kiln_tar(&[("d", None)]);
        empty[0] = 0;
        assert!(read(&empty).is_err());
    }

    /// Finding 1 of issue 60, as it was planted: tar-rs writes a directory
    /// header with a size and that many bytes after it; Go reads the
    /// directory as header-only and the bytes as two more entries (a
    /// passwordless root, a setuid file). Byte for byte what kiln's writer
    /// writes for a sized directory, so only the size rule refuses it.
    #[test]
    fn a_directory_with_a_size_hides_no_tar() {
        let hidden = {
            let mut b = tar::Builder::new(Vec::new());
            let passwd = b"root::0:0:root:/root:/bin/sh\n";
            let mut h = super::super::layer::entry_header(
                tar::EntryType::Regular,
                0o644,
                (0, 0),
                0,
                passwd.len() as u64,
            );
            b.append_data(&mut h, "etc/passwd", &passwd[..]).unwrap();
            let mut h =
                super::super::layer::entry_header(tar::EntryType::Regular, 0o4755, (0, 0), 0, 1);
            b.append_data(&mut h, "usr/local/bin/suid-sh", &b"x"[..])
                .unwrap();
            let mut t = b.into_inner().unwrap();
            t.truncate(t.len() - 1024); // no end blocks: the outer archive goes on
            t
        };
        let mut b = tar::Builder::new(Vec::new());
        let mut h = super::super::layer::entry_header(
            tar::EntryType::Directory,
            0o755,
            (0, 0),
            0,
            hidden.len() as u64,
        );
        b.append_data(&mut h, "var", &hidden[..]).unwrap();
        let mut h =
            super::super::layer::entry_header(tar::EntryType::Directory, 0o755, (0, 0), 0, 0);
        b.append_data(&mut h, "var/lib", std::io::empty()).unwrap();
        let planted = b.into_inner().unwrap();
        let e = read(&planted).unwrap_err();
        assert!(format!("{e:#}").contains("header-only"), "{e:#}");
    }

    /// Random changes to a kiln-written layer: each gives a layer that is
    /// either still byte for byte what the writer writes for what is
    /// parsed (its diff ID that of the bytes read), or refused; never one
    /// read as something else.
    #[test]
    fn mutations_are_recreated_byte_for_byte_or_refused() {
        use proptest::prelude::*;
        let base = kiln_tar(&[
            ("var", None),
            ("var/lib", None),
            (LONG, Some(b"some blob bytes")),
            ("var/lib/f", Some(&[7u8; 700][..])),
        ]);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 2000,
            ..Default::default()
        });
        let len = base.len();
        runner
            .run(
                &(
                    proptest::collection::vec((0..len, any::<u8>()), 1..4),
                    0usize..3,
                    proptest::collection::vec(any::<u8>(), 0..600),
                ),
                |(flips, how, extra)| {
                    let mut t = base.clone();
                    for (at, v) in &flips {
                        t[*at] = *v;
                    }
                    match how {
                        1 => t.extend(&extra),
                        2 => t.truncate(len.saturating_sub(extra.len())),
                        _ => {}
                    }
                    let mut entries = Vec::new();
                    match reread(&t[..], |e, data| {
                        let mut d = Vec::new();
                        data.read_to_end(&mut d)?;
                        entries.push((e.clone(), d));
                        Ok(())
                    }) {
                        Err(_) => {}
                        Ok(got) => {
                            // Accepted: the bytes are what the writer writes
                            // for what was parsed.
                            let mut b = tar::Builder::new(Vec::new());
                            for (e, d) in &entries {
                                let kind = if e.dir {
                                    tar::EntryType::Directory
                                } else {
                                    tar::EntryType::Regular
                                };
                                let mut h = super::super::layer::entry_header(
                                    kind, e.mode, e.owner, e.mtime, e.size,
                                );
                                b.append_data(&mut h, &e.path, &d[..]).unwrap();
                            }
                            let again = b.into_inner().unwrap();
                            prop_assert_eq!(&again, &t);
                            prop_assert_eq!(got.diff_id, Digest::of(&t));
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
    }
}
