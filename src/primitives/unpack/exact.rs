//! A layer's compressed stream read one way only: exactly one gzip member
//! or one zstd frame, as its media type says, and nothing after it.
//!
//! Why: readers differ past the first member. flate2's `GzDecoder` stops
//! there; Go's `compress/gzip` (containerd, Docker) reads every member as
//! one stream (`Reader.Multistream`, on by default), so a second member is
//! bytes only one of them sees. A zstd stream may likewise hold further
//! frames (skippable or not). kiln writes one member or one frame
//! (`primitives::gzip::MixedGz`, libzstd's one frame), so anything after it
//! is refused, not skipped. A gzip member's header must be kiln's own
//! ([`crate::primitives::gzip::HEADER`]): flate2 reads a name or comment
//! of up to 64 KiB, Go's `compress/gzip` refuses one over 511 bytes
//! (`gzip: invalid header`), so a header with any optional field is one
//! the two may judge differently. Used where a layer's bytes are judged as
//! another program will read them (`domain::node_image::kept`); the subset
//! accepted is listed once, in `domain::node_image::reread`.

use std::io::{self, BufRead, BufReader, Cursor, Read};

use anyhow::{anyhow, bail};

use crate::primitives::oci::media;

/// How a layer's bytes are compressed, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCompression {
    Gzip,
    Zstd,
    None,
}

impl LayerCompression {
    /// The compression a layer media type names; `None` for a type that is
    /// not a layer's (a foreign or unknown one).
    pub fn of(media_type: &str) -> Option<Self> {
        match media_type {
            media::OCI_LAYER_GZIP | media::DOCKER_LAYER_GZIP => Some(Self::Gzip),
            media::OCI_LAYER_ZSTD => Some(Self::Zstd),
            media::OCI_LAYER | media::DOCKER_LAYER => Some(Self::None),
            _ => None,
        }
    }
}

/// A gzip member's header, checked to be kiln's, then the rest.
type Checked<R> = io::Chain<Cursor<[u8; 10]>, BufReader<R>>;

enum Inner<R: Read> {
    Gzip(Box<flate2::bufread::GzDecoder<Checked<R>>>),
    Zstd(zstd::stream::read::Decoder<'static, BufReader<R>>),
    None(BufReader<R>),
}

/// A layer's uncompressed bytes, read exactly ([module doc](self)); call
/// [`Exact::finish`] once the reader gave its end.
pub struct Exact<R: Read> {
    inner: Inner<R>,
}

/// Opens `blob` as `how` says it is compressed.
pub fn open_exact<R: Read>(blob: R, how: LayerCompression) -> anyhow::Result<Exact<R>> {
    let mut buffered = BufReader::new(blob);
    let inner = match how {
        LayerCompression::Gzip => {
            let mut header = [0u8; 10];
            buffered
                .read_exact(&mut header)
                .map_err(|e| anyhow!("gzip: the member header: {e}"))?;
            if header != crate::primitives::gzip::HEADER {
                bail!(
                    "gzip: a member header that is not kiln's ({}): optional fields (a name, a comment, extra data, a header CRC) are read differently by other readers",
                    hex::encode(header)
                );
            }
            Inner::Gzip(Box::new(flate2::bufread::GzDecoder::new(
                Cursor::new(header).chain(buffered),
            )))
        }
        LayerCompression::Zstd => Inner::Zstd(
            zstd::stream::read::Decoder::with_buffer(buffered)
                .map_err(|e| anyhow!("zstd: {e}"))?
                .single_frame(),
        ),
        LayerCompression::None => Inner::None(buffered),
    };
    Ok(Exact { inner })
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Gzip(g) => g.read(buf),
            Inner::Zstd(z) => z.read(buf),
            Inner::None(r) => r.read(buf),
        }
    }
}

impl<R: Read> Exact<R> {
    /// Errs unless the uncompressed stream is at its end and no compressed
    /// byte follows the one member or frame (for an uncompressed layer, the
    /// stream's own end is the check).
    pub fn finish(mut self) -> anyhow::Result<()> {
        let mut one = [0u8; 1];
        if self.read(&mut one)? != 0 {
            bail!("the layer has bytes after its end");
        }
        let rest = match &mut self.inner {
            Inner::Gzip(g) => g.get_mut().fill_buf()?.is_empty(),
            Inner::Zstd(z) => z.get_mut().fill_buf()?.is_empty(),
            Inner::None(_) => return Ok(()),
        };
        if !rest {
            let what = match self.inner {
                Inner::Gzip(_) => "a second gzip member (or bytes) after the first",
                _ => "a second zstd frame (or bytes) after the first",
            };
            bail!("the layer holds {what}, which other readers read on into");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// One gzip member as kiln writes it.
    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz =
            crate::primitives::gzip::MixedGz::new(Vec::new(), flate2::Compression::fast()).unwrap();
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    }

    fn read_all(bytes: &[u8], how: LayerCompression) -> anyhow::Result<Vec<u8>> {
        let mut r = open_exact(bytes, how)?;
        let mut out = Vec::new();
        r.read_to_end(&mut out)?;
        r.finish()?;
        Ok(out)
    }

    #[test]
    fn one_member_reads_and_a_second_is_refused() {
        let one = gzip(b"first");
        assert_eq!(read_all(&one, LayerCompression::Gzip).unwrap(), b"first");
        let mut two = one.clone();
        two.extend(gzip(b"second"));
        let e = read_all(&two, LayerCompression::Gzip).unwrap_err();
        assert!(format!("{e}").contains("second gzip member"), "{e}");
        // Trailing garbage, too.
        let mut junk = one;
        junk.push(0);
        assert!(read_all(&junk, LayerCompression::Gzip).is_err());
    }

    #[test]
    fn one_zstd_frame_reads_and_a_second_is_refused() {
        let one = zstd::encode_all(&b"first"[..], 3).unwrap();
        assert_eq!(read_all(&one, LayerCompression::Zstd).unwrap(), b"first");
        let mut two = one.clone();
        two.extend(zstd::encode_all(&b"second"[..], 3).unwrap());
        assert!(read_all(&two, LayerCompression::Zstd).is_err());
    }

    /// Finding 2 of issue 60: a 512-byte FNAME, which flate2 reads and Go
    /// refuses; and every other optional field, or another mtime or OS.
    #[test]
    fn only_kilns_own_member_header_is_read() {
        let mut kilns = Vec::new();
        let mut w =
            crate::primitives::gzip::MixedGz::new(&mut kilns, flate2::Compression::fast()).unwrap();
        w.write_all(b"tar bytes").unwrap();
        w.finish().unwrap();
        assert_eq!(
            read_all(&kilns, LayerCompression::Gzip).unwrap(),
            b"tar bytes"
        );
        let named = flate2::GzBuilder::new()
            .filename(vec![b'a'; 512])
            .write(Vec::new(), flate2::Compression::fast());
        let mut named = named;
        named.write_all(b"tar bytes").unwrap();
        let named = named.finish().unwrap();
        let e = read_all(&named, LayerCompression::Gzip).unwrap_err();
        assert!(format!("{e}").contains("not kiln's"), "{e}");
        for (at, v) in [
            (3usize, 2u8),
            (3, 4),
            (3, 8),
            (3, 16),
            (4, 1),
            (8, 2),
            (9, 3),
        ] {
            let mut other = kilns.clone();
            other[at] = v;
            assert!(
                read_all(&other, LayerCompression::Gzip).is_err(),
                "byte {at} = {v}"
            );
        }
        // A trailer that does not match (CRC, then size).
        for at in [kilns.len() - 8, kilns.len() - 1] {
            let mut bad = kilns.clone();
            bad[at] ^= 1;
            assert!(
                read_all(&bad, LayerCompression::Gzip).is_err(),
                "trailer byte {at}"
            );
        }
    }

    #[test]
    fn a_media_type_that_lies_is_refused() {
        assert!(read_all(b"plain tar bytes", LayerCompression::Gzip).is_err());
        assert!(read_all(&gzip(b"x"), LayerCompression::Zstd).is_err());
    }
}
