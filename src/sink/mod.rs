//! Where images go. The engine hands a sink verified documents and
//! verifying streams; a sink commits a blob only once its stream has ended
//! without error. What a store adds on top (containerd's GC labels and CRI
//! labels, a layout's index, a registry's tags) is the sink's own business:
//! the engine knows no protocol.

pub mod blobdir;
pub mod cache;
pub mod containerd;
pub mod layout;
pub mod registry;
pub mod since;

use std::future::Future;

use bytes::Bytes;

use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::Descriptor;

pub trait Sink: Send + Sync {
    /// Whether the blob is already present, complete. A store with GC also
    /// protects it for the rest of the run from here on: the caller is about
    /// to rely on it.
    fn has(&self, desc: &Descriptor) -> impl Future<Output = anyhow::Result<bool>> + Send;
    /// Stores a blob from a stream that fails if the content is not `desc`'s.
    fn put_stream(
        &self,
        desc: &Descriptor,
        stream: BlobStream,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send;
    /// Stores a verified manifest or index whose `children` (the manifests
    /// of an index that were stored; a manifest's config and layers) are
    /// already stored. Returns the bytes written (0 if it was present).
    fn put_document(
        &self,
        desc: &Descriptor,
        bytes: Bytes,
        children: &[Descriptor],
    ) -> impl Future<Output = anyhow::Result<u64>> + Send {
        let _ = children;
        async move {
            if self.has(desc).await? {
                Ok(0)
            } else {
                self.put_bytes(desc, bytes).await
            }
        }
    }
    /// Records a layer blob without its bytes, which a node image holds in
    /// a layer it reuses by digest (`CopyOptions::absent`). Only a store
    /// that is becoming a node image's can; others refuse.
    fn put_absent(&self, desc: &Descriptor) -> impl Future<Output = anyhow::Result<()>> + Send {
        async move {
            anyhow::bail!(
                "{}: this sink needs the blob's bytes; it cannot record it absent",
                desc.digest
            )
        }
    }
    /// Takes the blob without its bytes if it can (a registry mounting it
    /// from another repository of its own); asked right before the bytes
    /// would be read. Most sinks cannot.
    fn take_without_bytes(
        &self,
        desc: &Descriptor,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send {
        let _ = desc;
        async { Ok(false) }
    }
    /// Reads back a small blob (manifest, config) if present, unverified; for
    /// re-runs that need no network.
    fn read(&self, digest: &Digest) -> impl Future<Output = anyhow::Result<Option<Bytes>>> + Send;
    /// Whether `name` may be pointed at `target`; asked before anything of
    /// the image is written, so a refusal changes nothing.
    fn check_record(
        &self,
        name: &str,
        target: &Descriptor,
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        let _ = (name, target);
        async { Ok(()) }
    }
    /// Points `name` (`NAME:TAG` or `NAME@DIGEST`) at `target`, once all of
    /// its content is stored.
    fn record(
        &self,
        name: &str,
        target: &Descriptor,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Whether the blob's bytes can be read back in full (the completeness
    /// walk's test). A store whose metadata can outlive its files (containerd)
    /// checks the file too; others trust [`Sink::has`].
    fn readable(&self, desc: &Descriptor) -> impl Future<Output = anyhow::Result<bool>> + Send {
        self.has(desc)
    }

    /// The children a blob's GC labels keep; `None` for a store without GC.
    fn gc_refs(
        &self,
        _digest: &Digest,
    ) -> impl Future<Output = anyhow::Result<Option<Vec<Digest>>>> + Send {
        async { Ok(None) }
    }

    /// Stores a blob from a file whose bytes are proven to be `desc`'s (a
    /// cache entry). Stores on the same filesystem link it rather than copy.
    fn put_file(
        &self,
        desc: &Descriptor,
        entry: &crate::sink::cache::Kept,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send {
        let path = entry.clone();
        async move {
            let f = tokio::fs::File::open(&path).await?;
            let stream: BlobStream = Box::pin(futures_util::TryStreamExt::map_err(
                tokio_util::io::ReaderStream::with_capacity(f, 256 << 10),
                anyhow::Error::from,
            ));
            self.put_stream(desc, stream).await
        }
    }

    /// Stores a small verified blob held in memory.
    fn put_bytes(
        &self,
        desc: &Descriptor,
        bytes: Bytes,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send {
        let stream: BlobStream = Box::pin(futures_util::stream::once(async move { Ok(bytes) }));
        self.put_stream(desc, stream)
    }
}
