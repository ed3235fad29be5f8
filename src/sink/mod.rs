//! Where images go. The engine hands a sink verified documents and
//! verifying streams; a sink commits a blob only once its stream has ended
//! without error.

pub mod containerd;
pub mod oci_layout;
pub mod registry;

use std::collections::BTreeMap;
use std::future::Future;

use bytes::Bytes;

use crate::digest::Digest;
use crate::oci::Descriptor;
use crate::source::BlobStream;

pub type Labels = BTreeMap<String, String>;

/// An image record to create: a name pointing at a top-level descriptor.
#[derive(Debug, Clone)]
pub struct ImageRecord {
    pub name: String,
    pub target: Descriptor,
    pub labels: Labels,
}

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
        labels: Labels,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send;
    /// Reads back a small blob (manifest, config) if present, unverified; for
    /// re-runs that need no network.
    fn read(&self, digest: &Digest) -> impl Future<Output = anyhow::Result<Option<Bytes>>> + Send;
    /// Adds labels to a blob that is already present.
    fn add_labels(
        &self,
        desc: &Descriptor,
        labels: Labels,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// The image record of that name, if any.
    fn image_record(
        &self,
        name: &str,
    ) -> impl Future<Output = anyhow::Result<Option<ImageRecord>>> + Send;
    /// Creates or replaces an image record.
    fn record(&self, record: &ImageRecord) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The children a blob's GC labels keep; `None` for a store without GC.
    fn gc_refs(
        &self,
        _digest: &Digest,
    ) -> impl Future<Output = anyhow::Result<Option<Vec<Digest>>>> + Send {
        async { Ok(None) }
    }

    /// Stores a small verified blob held in memory.
    fn put_bytes(
        &self,
        desc: &Descriptor,
        bytes: Bytes,
        labels: Labels,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send {
        let stream: BlobStream = Box::pin(futures_util::stream::once(async move { Ok(bytes) }));
        self.put_stream(desc, stream, labels)
    }
}
