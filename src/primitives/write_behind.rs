//! A writer whose `write` system calls run on a thread of their own. kiln's
//! node layer is hashed twice (diff ID and digest) and then written; on one
//! thread those add up, while copying 1 GiB into the page cache alone costs
//! about what both hashes do. Handing 1 MiB pieces to a writing thread lets
//! the hashing and the writing overlap on two cores. The queue is bounded
//! (a few MiB in flight), so memory stays flat.

use std::io::{self, Write};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

const PIECE: usize = 1 << 20;
const IN_FLIGHT: usize = 4;

pub struct WriteBehind<'scope, W: Write + Send + 'scope> {
    tx: Option<SyncSender<Vec<u8>>>,
    buf: Vec<u8>,
    writer: Option<ScopedJoinHandle<'scope, io::Result<W>>>,
}

impl<'scope, W: Write + Send + 'scope> WriteBehind<'scope, W> {
    /// Starts the writing thread for `out` within `scope`.
    pub fn new<'env>(scope: &'scope Scope<'scope, 'env>, mut out: W) -> Self {
        let (tx, rx) = sync_channel::<Vec<u8>>(IN_FLIGHT);
        let writer = scope.spawn(move || -> io::Result<W> {
            for piece in rx {
                // On an error the receiver is dropped: the next send fails,
                // and `finish` reports this error, not that one.
                out.write_all(&piece)?;
            }
            out.flush()?;
            Ok(out)
        });
        WriteBehind {
            tx: Some(tx),
            buf: Vec::with_capacity(PIECE),
            writer: Some(writer),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = std::mem::replace(&mut self.buf, Vec::with_capacity(PIECE));
        let sent = self.tx.as_ref().map(|tx| tx.send(piece));
        match sent {
            Some(Ok(())) => Ok(()),
            _ => Err(self.stopped()),
        }
    }

    /// The writing thread's own error, once it has stopped.
    fn stopped(&mut self) -> io::Error {
        self.tx = None;
        match self.writer.take().map(|w| w.join()) {
            Some(Ok(Err(e))) => e,
            _ => io::Error::other("the writing thread stopped"),
        }
    }

    /// Sends what is left, waits for every byte to be written, and gives
    /// the writer back.
    pub fn finish(mut self) -> io::Result<W> {
        self.send()?;
        self.tx = None;
        match self.writer.take().map(|w| w.join()) {
            Some(Ok(done)) => done,
            Some(Err(_)) => Err(io::Error::other("the writing thread panicked")),
            None => Err(io::Error::other("the writing thread stopped")),
        }
    }
}

impl<'scope, W: Write + Send + 'scope> Write for WriteBehind<'scope, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(PIECE - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == PIECE {
            self.send()?;
        }
        Ok(n)
    }

    /// Hands over what is buffered; the bytes are written when `finish`
    /// returns.
    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_arrives_in_order() {
        let data: Vec<u8> = (0..(3 * PIECE + 12345)).map(|i| (i % 251) as u8).collect();
        let out = std::thread::scope(|s| {
            let mut w = WriteBehind::new(s, Vec::new());
            for chunk in data.chunks(7777) {
                w.write_all(chunk).unwrap();
            }
            w.flush().unwrap();
            w.write_all(b"end").unwrap();
            w.finish().unwrap()
        });
        assert_eq!(&out[..data.len()], &data[..]);
        assert_eq!(&out[data.len()..], b"end");
    }

    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_writers_error_is_the_one_reported() {
        let e = std::thread::scope(|s| {
            let mut w = WriteBehind::new(s, Full);
            let mut first = None;
            for _ in 0..(IN_FLIGHT + 4) {
                if let Err(e) = w.write_all(&vec![0u8; PIECE]) {
                    first = Some(e);
                    break;
                }
            }
            first.unwrap_or_else(|| w.finish().err().unwrap())
        });
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
    }
}
