//! A layer's compressed stream read one way only: exactly one gzip member
//! or one zstd frame, as its media type says, and nothing after it.
//!
//! Why: readers differ past the first member. flate2's `GzDecoder` stops
//! there; Go's `compress/gzip` (containerd, Docker) reads every member as
//! one stream (`Reader.Multistream`, on by default), so a second member is
//! bytes only one of them sees. A zstd stream may likewise hold further
//! frames (skippable or not). kiln writes one member or one frame
//! (`primitives::gzip::MixedGz`, libzstd's one frame), so anything after it
//! is refused, not skipped. Used where a layer's bytes are judged as
//! another program will read them (`domain::node_image::kept`).

use std::io::{self, BufRead, BufReader, Read};

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

enum Inner<R: Read> {
    Gzip(Box<flate2::bufread::GzDecoder<BufReader<R>>>),
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
    let buffered = BufReader::new(blob);
    let inner = match how {
        LayerCompression::Gzip => Inner::Gzip(Box::new(flate2::bufread::GzDecoder::new(buffered))),
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
            Inner::Gzip(g) => g.get_mut(),
            Inner::Zstd(z) => z.get_mut(),
            Inner::None(_) => return Ok(()),
        };
        if !rest.fill_buf()?.is_empty() {
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

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
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

    #[test]
    fn a_media_type_that_lies_is_refused() {
        assert!(read_all(b"plain tar bytes", LayerCompression::Gzip).is_err());
        assert!(read_all(&gzip(b"x"), LayerCompression::Zstd).is_err());
    }
}
