//! A gzip writer that stores, rather than deflates again, the stretches its
//! caller marks as already compressed. A node image's added layer is mostly
//! the store's layer blobs (gzip or zstd already): deflating them costs a
//! CPU-second per ~40 MB and saves nothing. Stored stretches go out as
//! deflate stored blocks at memory speed; everything else is deflated as
//! usual. The result is one ordinary gzip member any reader accepts, and the
//! same input with the same marks gives the same bytes.
//!
//! Why not flate2's `GzEncoder`: it cannot switch between deflating and
//! storing mid-stream; this uses flate2's raw `Compress` for the deflated
//! parts and writes the stored blocks, header and trailer itself (RFC 1951
//! §3.2.4, RFC 1952).

use std::io::{self, Write};

use flate2::{Compress, FlushCompress, Status};

/// The member header kiln writes: deflate, no flags (no FEXTRA, FNAME,
/// FCOMMENT, FHCRC), mtime 0, OS unknown. The only one a kept layer may
/// have (`primitives::unpack::exact`).
pub const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
/// A stored block holds at most this many bytes.
const STORED_MAX: usize = 65_535;

pub struct MixedGz<W: Write> {
    out: W,
    deflate: Compress,
    /// Bytes given to `deflate` since its last reset.
    deflating: bool,
    stored: bool,
    crc: crc32fast::Hasher,
    size: u64,
    buf: Vec<u8>,
}

impl<W: Write> MixedGz<W> {
    pub fn new(mut out: W, level: flate2::Compression) -> io::Result<Self> {
        out.write_all(&HEADER)?;
        Ok(MixedGz {
            out,
            deflate: Compress::new(level, false),
            deflating: false,
            stored: false,
            crc: crc32fast::Hasher::new(),
            size: 0,
            buf: Vec::with_capacity(1 << 17),
        })
    }

    /// From here on, bytes are stored (`true`) or deflated (`false`).
    pub fn set_stored(&mut self, stored: bool) -> io::Result<()> {
        if stored && !self.stored && self.deflating {
            // End the deflated part on a byte boundary, not as the last block.
            self.run(&[], FlushCompress::Sync)?;
            // Its window must not reach across the stored bytes.
            self.deflate.reset();
            self.deflating = false;
        }
        self.stored = stored;
        Ok(())
    }

    fn run(&mut self, mut input: &[u8], flush: FlushCompress) -> io::Result<()> {
        loop {
            self.buf.clear();
            let before_in = self.deflate.total_in();
            let status = self
                .deflate
                .compress_vec(input, &mut self.buf, flush)
                .map_err(io::Error::other)?;
            let used = (self.deflate.total_in() - before_in) as usize;
            input = &input[used..];
            self.out.write_all(&self.buf)?;
            let full = self.buf.len() == self.buf.capacity();
            match status {
                Status::StreamEnd => return Ok(()),
                _ if input.is_empty() && !full => return Ok(()),
                _ => {}
            }
        }
    }

    fn stored_blocks(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(STORED_MAX) {
            let len = chunk.len() as u16;
            self.out.write_all(&[0])?; // BFINAL 0, BTYPE 00, padded to a byte
            self.out.write_all(&len.to_le_bytes())?;
            self.out.write_all(&(!len).to_le_bytes())?;
            self.out.write_all(chunk)?;
        }
        Ok(())
    }

    /// Ends the deflate stream and writes the trailer; returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        if self.stored || !self.deflating {
            // The last block: an empty, final stored block.
            self.out.write_all(&[1, 0, 0, 0xff, 0xff])?;
        } else {
            self.run(&[], FlushCompress::Finish)?;
        }
        let crc = self.crc.clone().finalize();
        self.out.write_all(&crc.to_le_bytes())?;
        self.out.write_all(&(self.size as u32).to_le_bytes())?;
        Ok(self.out)
    }
}

impl<W: Write> Write for MixedGz<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.crc.update(data);
        self.size += data.len() as u64;
        if self.stored {
            self.stored_blocks(data)?;
        } else {
            self.deflating = true;
            self.run(data, FlushCompress::None)?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gz(parts: &[(&[u8], bool)]) -> Vec<u8> {
        let mut w = MixedGz::new(Vec::new(), flate2::Compression::default()).unwrap();
        for (data, stored) in parts {
            w.set_stored(*stored).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap()
    }

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn mixed_stretches_read_back_whole() {
        let text = b"kiln kiln kiln kiln ".repeat(5000);
        let noise: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for parts in [
            vec![],
            vec![(&text[..], false)],
            vec![(&noise[..], true)],
            vec![(&text[..], false), (&noise[..], true), (&text[..], false)],
            vec![(&noise[..], true), (&text[..], false), (&noise[..], true)],
            vec![(&b""[..], true), (&text[..10], false), (&b""[..], true)],
        ] {
            let want: Vec<u8> = parts.iter().flat_map(|(d, _)| d.iter().copied()).collect();
            let b = gz(&parts);
            assert_eq!(gunzip(&b), want);
            assert_eq!(gz(&parts), b, "deterministic");
        }
        // Repetitive text after a stored stretch still compresses.
        let b = gz(&[(&noise[..], true), (&text[..], false)]);
        assert!(b.len() < noise.len() + text.len() / 10);
    }
}
