//! What a source hands the copy engine: a resolved top-level document and
//! blob byte streams. Apart from the sources themselves, so the registry
//! client (an adapter below them) can produce them without importing the
//! sources that use it.

use bytes::Bytes;
use futures_util::stream::BoxStream;

use crate::primitives::oci::Descriptor;

/// A blob's bytes as they arrive (verified by the copy engine, not here).
pub type BlobStream = BoxStream<'static, anyhow::Result<Bytes>>;

/// A top-level manifest or index as resolved from a reference.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub descriptor: Descriptor,
    pub bytes: Bytes,
}
