//! A writer whose `write` system calls run on a thread of their own. kiln's
//! node layer is hashed twice (diff ID and digest) and then written; on one
//! thread those add up, while copying 1 GiB into the page cache alone costs
//! about what both hashes do. Handing 1 MiB pieces to a writing thread (which
//! hashes the digest as it writes, `domain::node_image::layer`) lets the two
//! hashes and the writing overlap on two cores. The queue is bounded (a few
//! MiB in flight), so memory stays flat.
//!
//! [`FileBehind`] is the same for async code: a blob's file written by a
//! blocking task of its own, so one slow write (dirty-page throttling, a
//! network filesystem) waits there and not on the runtime's threads, where
//! every other transfer in flight is polled.

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

/// A file written by a blocking task of its own, fed through a bounded
/// queue: [`FileBehind::write`] waits (asynchronously) when the queue is
/// full, so a slow disk slows this blob alone and memory stays bounded.
pub struct FileBehind {
    tx: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
    task: Option<tokio::task::JoinHandle<io::Result<std::fs::File>>>,
}

impl FileBehind {
    /// Starts the writing task for `file` (call inside a tokio runtime).
    pub fn new(file: std::fs::File) -> Self {
        // Chunks come as the network gives them (tens to hundreds of KiB).
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(IN_FLIGHT * 4);
        let task = tokio::task::spawn_blocking(move || -> io::Result<std::fs::File> {
            let mut w = io::BufWriter::with_capacity(PIECE, file);
            while let Some(chunk) = rx.blocking_recv() {
                // On an error the receiver is dropped: the next send fails,
                // and `stopped` reports this error.
                w.write_all(&chunk)?;
            }
            w.into_inner().map_err(|e| e.into_error())
        });
        FileBehind {
            tx: Some(tx),
            task: Some(task),
        }
    }

    /// Queues `chunk` to be written.
    pub async fn write(&mut self, chunk: bytes::Bytes) -> io::Result<()> {
        let sent = match &self.tx {
            Some(tx) => tx.send(chunk).await.is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            Err(self.stopped().await)
        }
    }

    /// The writing task's own error, once it has stopped.
    async fn stopped(&mut self) -> io::Error {
        self.tx = None;
        match self.task.take() {
            Some(t) => match t.await {
                Ok(Err(e)) => e,
                _ => io::Error::other("the writing task stopped"),
            },
            None => io::Error::other("the writing task stopped"),
        }
    }

    /// Waits for every queued byte to be written; gives the file back
    /// (written, not yet synced).
    pub async fn finish(mut self) -> io::Result<std::fs::File> {
        self.tx = None;
        match self.task.take() {
            Some(t) => t
                .await
                .map_err(|_| io::Error::other("the writing task panicked"))?,
            None => Err(io::Error::other("the writing task stopped")),
        }
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

    /// Issue 39.5: a write that blocks (here: a pipe nobody reads) waits
    /// in the writing task; the runtime's only thread goes on polling the
    /// other transfers. Written in the poll, it blocked them all.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_write_does_not_stall_the_runtime() {
        let (reader, writer) = std::io::pipe().unwrap();
        let mut w = FileBehind::new(std::fs::File::from(std::os::fd::OwnedFd::from(writer)));
        let fill = async {
            // Far more than a pipe holds: the writing task blocks.
            for _ in 0..64 {
                if w.write(bytes::Bytes::from(vec![1u8; 1 << 20]))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        };
        let others = async {
            for _ in 0..1000 {
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            _ = fill => panic!("64 MiB went into a pipe nobody reads"),
            _ = others => {}
        }
        // Unblock the task (its write fails), so the runtime can end.
        drop(reader);
        assert!(w.finish().await.is_err());
    }

    #[tokio::test]
    async fn a_file_behind_gets_every_byte_and_reports_a_full_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut w = FileBehind::new(std::fs::File::create(&path).unwrap());
        let data: Vec<u8> = (0..(3 * PIECE + 999)).map(|i| (i % 253) as u8).collect();
        for c in data.chunks(65536) {
            w.write(bytes::Bytes::copy_from_slice(c)).await.unwrap();
        }
        drop(w.finish().await.unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), data);
        if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
            let mut w = FileBehind::new(full);
            let mut err = None;
            for _ in 0..64 {
                if let Err(e) = w.write(bytes::Bytes::from(vec![0u8; PIECE])).await {
                    err = Some(e);
                    break;
                }
            }
            let e = match err {
                Some(e) => e,
                None => w.finish().await.unwrap_err(),
            };
            assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        }
    }
}
