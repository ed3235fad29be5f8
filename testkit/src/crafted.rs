//! Layers that read one way with the `tar` crate and another with Go's
//! `archive/tar` (containerd's and Docker's reader), for the tests of a
//! hostile previous node image (issue 53). Each looks, to a reader that
//! takes the `tar` crate's view, like one of kiln's blob layers: the
//! store's blob directory and content blobs that hash to their names.
//! Go reads files elsewhere in them (`src/archive/tar/reader.go`: the last
//! of two PAX `path` records wins; `GNU.sparse.name` renames; an entry of
//! type NUL whose name ends in `/` is a header-only directory, so its
//! "data" is read as more headers; `SCHILY.xattr.*` records set xattrs).

use std::io::Write;

use sha2::Digest as _;

use crate::image::{sha256, Blob, Layer, OCI_LAYER_GZIP};

/// The store's blob directory, as kiln's layers write it.
pub const BLOBS: &str = "var/lib/containerd/io.containerd.content.v1.content/blobs/sha256";

/// What a planted layer tries to put in the node.
pub const EVIL_PASSWD: &[u8] = b"root::0:0:root:/root:/bin/sh\nevil::0:0::/:/bin/sh\n";
pub const EVIL_SHELL: &[u8] = b"#!/bin/sh\nexec /bin/sh -p\n";

/// The paths a planted layer aims at, for the tests to look for.
pub const PLANTED: &[&str] = &["etc/passwd", "usr/local/bin/suid-sh", "etc/shadow-link"];

/// A GNU header owned by 0:0, as kiln's are.
fn gnu() -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

/// The blob directory and its parents, as kiln's layers hold them.
fn dirs(b: &mut tar::Builder<Vec<u8>>) {
    let mut acc = String::new();
    for part in BLOBS.split('/') {
        if !acc.is_empty() {
            acc.push('/');
        }
        acc.push_str(part);
        let mut h = gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(dir_mode(&acc));
        h.set_size(0);
        h.set_mtime(0);
        b.append_data(&mut h, &acc, std::io::empty()).unwrap();
    }
}

/// The mode each directory on the blob path has in the tests' nodes (the
/// store's root 0700 as kiln's store has it, the rest 0755, as the kept
/// check reported them), so a planted layer reads as the node's own there
/// and is judged on what it plants, not refused for a mode.
pub fn dir_mode(path: &str) -> u32 {
    match path {
        "var/lib/containerd" => 0o700,
        _ => 0o755,
    }
}

fn blob_path(content: &[u8]) -> String {
    format!("{BLOBS}/{}", hex::encode(sha2::Sha256::digest(content)))
}

/// A ustar header for `size` bytes of a regular file, with `name` in it
/// (what the `tar` crate reads when no record overrides it).
fn file_header(name: &str, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_path(name).unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_cksum();
    h
}

/// The planted `etc/passwd`, as a plain entry.
fn append_passwd(b: &mut tar::Builder<Vec<u8>>) {
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(EVIL_PASSWD.len() as u64);
    b.append_data(&mut h, "etc/passwd", EVIL_PASSWD).unwrap();
}

fn finish(b: tar::Builder<Vec<u8>>) -> Vec<u8> {
    b.into_inner().unwrap()
}

/// (A) A PAX header naming the blob path, then `etc/passwd`: the `tar`
/// crate takes the first record, Go the last.
pub fn pax_path_twice() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    dirs(&mut b);
    for (content, target, mode) in [
        (EVIL_PASSWD, "etc/passwd", 0o644),
        (EVIL_SHELL, "usr/local/bin/suid-sh", 0o4755),
    ] {
        let path = blob_path(content);
        b.append_pax_extensions([("path", path.as_bytes()), ("path", target.as_bytes())])
            .unwrap();
        b.append(&file_header("x", content.len() as u64, mode), content)
            .unwrap();
    }
    finish(b)
}

/// (B) GNU sparse 0.1 records: Go renames the entry to `GNU.sparse.name`
/// and reads its data through the map; the `tar` crate ignores them.
pub fn gnu_sparse_rename() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    dirs(&mut b);
    let path = blob_path(EVIL_SHELL);
    let n = EVIL_SHELL.len().to_string();
    let map = format!("0,{n}");
    b.append_pax_extensions([
        ("path", path.as_bytes()),
        ("GNU.sparse.major", b"0".as_slice()),
        ("GNU.sparse.minor", b"1".as_slice()),
        ("GNU.sparse.name", b"usr/local/bin/suid-sh".as_slice()),
        ("GNU.sparse.numblocks", b"1".as_slice()),
        ("GNU.sparse.map", map.as_bytes()),
        ("GNU.sparse.realsize", n.as_bytes()),
    ])
    .unwrap();
    b.append(
        &file_header("x", EVIL_SHELL.len() as u64, 0o4755),
        EVIL_SHELL,
    )
    .unwrap();
    finish(b)
}

/// (C) An entry of type NUL whose name ends in `/`: to Go a directory with
/// no data, so its "data" (a tar stream of a symlink and a file) is read
/// as the next entries; to the `tar` crate a regular file whose bytes hash
/// to its name (`Path::components` drops the slash).
pub fn nul_type_directory() -> Vec<u8> {
    let mut inner = tar::Builder::new(Vec::new());
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_mode(0o777);
    h.set_size(0);
    inner
        .append_link(&mut h, "etc/shadow-link", "/etc/shadow")
        .unwrap();
    append_passwd(&mut inner);
    let mut data = inner.into_inner().unwrap();
    // No end of archive inside: Go reads on into the outer one's.
    data.truncate(data.len() - 1024);
    let name = format!("{}/", blob_path(&data));
    let mut b = tar::Builder::new(Vec::new());
    dirs(&mut b);
    // A GNU long name (the path is too long for the header), then the entry.
    let mut long = gnu();
    long.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    long.set_entry_type(tar::EntryType::GNULongName);
    long.set_mode(0o644);
    long.set_size(name.len() as u64 + 1);
    long.set_cksum();
    let mut n = name.clone().into_bytes();
    n.push(0);
    b.append(&long, &n[..]).unwrap();
    let mut h = gnu();
    h.as_gnu_mut().unwrap().name[..1].copy_from_slice(b"x");
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.as_mut_bytes()[156] = 0;
    h.set_cksum();
    b.append(&h, &data[..]).unwrap();
    finish(b)
}

/// A PAX `SCHILY.xattr.trusted.overlay.opaque` record on the store's
/// directory (to overlayfs, "hide what lower layers have here").
pub fn xattr_on_directory() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    dirs(&mut b);
    b.append_pax_extensions([("SCHILY.xattr.trusted.overlay.opaque", b"y".as_slice())])
        .unwrap();
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_size(0);
    h.set_mtime(0);
    b.append_data(&mut h, "var/lib/containerd", std::io::empty())
        .unwrap();
    finish(b)
}

/// A blob layer as kiln writes one: the blob directory and one content
/// blob that hashes to its name.
pub fn blob_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    dirs(&mut b);
    let content = b"a blob kiln once held".as_slice();
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o444);
    h.set_size(content.len() as u64);
    b.append_data(&mut h, blob_path(content), content).unwrap();
    finish(b)
}

/// (E) A directory with a size (issue 60): tar-rs reads the `var` entry's
/// "data" and skips it, Go reads a directory as header-only
/// (`isHeaderOnlyType`) and that data as two more entries: `etc/passwd`
/// and a setuid shell. Then the rest of the blob directory, as kiln's.
pub fn sized_directory() -> Vec<u8> {
    let hidden = {
        let mut b = tar::Builder::new(Vec::new());
        append_passwd(&mut b);
        let mut h = gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o4755);
        h.set_size(EVIL_SHELL.len() as u64);
        b.append_data(&mut h, "usr/local/bin/suid-sh", EVIL_SHELL)
            .unwrap();
        let mut t = b.into_inner().unwrap();
        t.truncate(t.len() - 1024);
        t
    };
    let mut b = tar::Builder::new(Vec::new());
    let mut acc = String::new();
    for (i, part) in BLOBS.split('/').enumerate() {
        if !acc.is_empty() {
            acc.push('/');
        }
        acc.push_str(part);
        let data: &[u8] = if i == 0 { &hidden } else { &[] };
        let mut h = gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(dir_mode(&acc));
        h.set_size(data.len() as u64);
        b.append_data(&mut h, &acc, data).unwrap();
    }
    let content = b"a blob kiln once held".as_slice();
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o444);
    h.set_size(content.len() as u64);
    b.append_data(&mut h, blob_path(content), content).unwrap();
    finish(b)
}

/// (F) A content blob owned by uid 2^62 + 1 (issue 60): too large for the
/// octal field, so tar-rs writes it in base-256 and reads it back
/// positive; Go reads the same bytes as a negative uid.
pub fn base256_owner() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    dirs(&mut b);
    let content = b"a blob owned by nobody's uid".as_slice();
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o444);
    h.set_size(content.len() as u64);
    h.set_uid((1 << 62) + 1);
    b.append_data(&mut h, blob_path(content), content).unwrap();
    finish(b)
}

/// (G) A gzip member whose header carries a 512-byte file name (issue
/// 60): flate2 reads names up to 64 KiB, Go's `compress/gzip` refuses one
/// over 511 bytes, so containerd cannot pull an image holding it.
pub fn named_gzip(tar: Vec<u8>) -> Layer {
    let mut gz = flate2::GzBuilder::new()
        .filename(vec![b'n'; 512])
        .write(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let bytes = gz.finish().unwrap();
    Layer {
        diff_id: sha256(&tar),
        blob: Blob::new(OCI_LAYER_GZIP, bytes),
        tar,
    }
}

/// `data` as one gzip member with kiln's own header (what kiln's writer
/// makes), so a planted layer is judged on its tar, not its gzip header.
fn kiln_gzip(data: &[u8], level: flate2::Compression) -> Vec<u8> {
    let mut w = kiln::primitives::gzip::MixedGz::new(Vec::new(), level).unwrap();
    w.write_all(data).unwrap();
    w.finish().unwrap()
}

/// A gzip layer of `tar`, one member, as kiln's writer compresses.
pub fn gzip_layer(tar: Vec<u8>) -> Layer {
    Layer {
        diff_id: sha256(&tar),
        blob: Blob::new(OCI_LAYER_GZIP, kiln_gzip(&tar, flate2::Compression::fast())),
        tar,
    }
}

/// Two gzip members: a blob layer without its end, then `etc/passwd` and
/// the end. flate2's `GzDecoder` stops after the first (a complete blob
/// layer to the `tar` crate); Go's reader reads both as one stream.
pub fn two_member_gzip() -> Layer {
    let mut first = tar::Builder::new(Vec::new());
    dirs(&mut first);
    let content = b"a blob kiln once held".as_slice();
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o444);
    h.set_size(content.len() as u64);
    h.set_mtime(0);
    first
        .append_data(&mut h, blob_path(content), content)
        .unwrap();
    let mut one = first.into_inner().unwrap();
    one.truncate(one.len() - 1024);
    let mut second = tar::Builder::new(Vec::new());
    append_passwd(&mut second);
    let two = second.into_inner().unwrap();
    let mut bytes = kiln_gzip(&one, flate2::Compression::fast());
    bytes.extend(kiln_gzip(&two, flate2::Compression::fast()));
    let mut tar = one;
    tar.extend(&two);
    Layer {
        diff_id: sha256(&tar),
        blob: Blob::new(OCI_LAYER_GZIP, bytes),
        tar,
    }
}

/// A gzip bomb: a blob of `zeros` zero bytes, named by their digest, in a
/// few hundred KiB.
pub fn gzip_bomb(zeros: u64) -> Layer {
    let mut head = tar::Builder::new(Vec::new());
    dirs(&mut head);
    let mut hash = sha2::Sha256::new();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..zeros / chunk.len() as u64 {
        hash.update(&chunk);
    }
    let name = format!("{BLOBS}/{}", hex::encode(hash.finalize()));
    let mut h = gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o444);
    h.set_size(zeros);
    h.set_mtime(0);
    head.append_data(&mut h, name, std::io::empty()).unwrap();
    let tar = head.into_inner().unwrap();
    let mut gz =
        kiln::primitives::gzip::MixedGz::new(Vec::new(), flate2::Compression::best()).unwrap();
    // The headers (without the end the builder wrote), the zeros, the end.
    gz.write_all(&tar[..tar.len() - 1024]).unwrap();
    let mut plain = sha2::Sha256::new();
    plain.update(&tar[..tar.len() - 1024]);
    for _ in 0..zeros / chunk.len() as u64 {
        gz.write_all(&chunk).unwrap();
        plain.update(&chunk);
    }
    gz.write_all(&[0u8; 1024]).unwrap();
    plain.update([0u8; 1024]);
    let bytes = gz.finish().unwrap();
    Layer {
        diff_id: format!("sha256:{}", hex::encode(plain.finalize())),
        blob: Blob::new(OCI_LAYER_GZIP, bytes),
        tar: Vec::new(),
    }
}
