//! A differential bundle's sink (`kiln bundle --since OLD`): a layout that
//! leaves out every image layer an earlier bundle already holds. Documents
//! and configs always go in (small, and what a build reads to know which
//! layers it needs); a layer OLD holds is answered "present", so it is
//! neither fetched nor written, and counted. `kiln build --from NEW --from
//! OLD` then finds it in OLD. OLD's copy counts only once it is read and
//! hashed (its size and digest): a truncated or tampered OLD would
//! otherwise make NEW leave out a layer that then is nowhere, found only
//! offline (issue 44.7). A damaged copy is carried in NEW instead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use bytes::Bytes;

use super::layout::OciLayout;
use super::Sink;
use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::{media, Descriptor};

/// Where a differential bundle says what it leaves to its predecessor.
pub const SINCE_FILE: &str = "kiln/since.json";

pub struct Leaving<'a> {
    pub inner: &'a OciLayout,
    old: Option<&'a crate::source::archive::ArchiveSource>,
    /// OLD's copies checked so far, and whether each verified.
    checked: Mutex<HashMap<Digest, bool>>,
    left: AtomicU64,
    left_bytes: AtomicU64,
}

/// Layers only: manifests, indexes and configs are what a reader needs to
/// know an image's layers, so a differential bundle always carries them.
fn is_layer(m: &str) -> bool {
    !(media::is_index(m)
        || media::is_manifest(m)
        || m == media::OCI_CONFIG
        || m == media::DOCKER_CONFIG
        || m.ends_with("+json"))
}

impl<'a> Leaving<'a> {
    pub fn new(
        inner: &'a OciLayout,
        old: Option<&'a crate::source::archive::ArchiveSource>,
    ) -> Self {
        Leaving {
            inner,
            old,
            checked: Mutex::default(),
            left: AtomicU64::new(0),
            left_bytes: AtomicU64::new(0),
        }
    }

    /// Whether OLD holds a copy of `desc` that verifies (checked once).
    fn old_holds(&self, desc: &Descriptor) -> bool {
        let Some(old) = self.old else {
            return false;
        };
        if let Some(ok) = self.checked.lock().unwrap().get(&desc.digest) {
            return *ok;
        }
        let named = old.names_blob(&desc.digest);
        let ok = named && old.verify_blob(desc);
        if named && !ok {
            tracing::warn!(
                blob = %desc.digest,
                "the earlier bundle's copy is not what its name says (truncated or changed); this bundle carries the layer itself"
            );
        }
        self.checked.lock().unwrap().insert(desc.digest.clone(), ok);
        ok
    }

    /// Layers left out, and their bytes.
    pub fn left(&self) -> (u64, u64) {
        (self.left.load(Relaxed), self.left_bytes.load(Relaxed))
    }
}

impl Sink for Leaving<'_> {
    async fn has(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        if is_layer(&desc.media_type) && self.old_holds(desc) {
            self.left.fetch_add(1, Relaxed);
            self.left_bytes.fetch_add(desc.size, Relaxed);
            return Ok(true);
        }
        self.inner.has(desc).await
    }

    async fn put_stream(&self, desc: &Descriptor, stream: BlobStream) -> anyhow::Result<u64> {
        self.inner.put_stream(desc, stream).await
    }

    async fn put_file(
        &self,
        desc: &Descriptor,
        path: &crate::sink::cache::Kept,
    ) -> anyhow::Result<u64> {
        self.inner.put_file(desc, path).await
    }

    async fn put_bytes(&self, desc: &Descriptor, bytes: Bytes) -> anyhow::Result<u64> {
        self.inner.put_bytes(desc, bytes).await
    }

    async fn read(&self, digest: &Digest) -> anyhow::Result<Option<Bytes>> {
        self.inner.read(digest).await
    }

    async fn check_record(&self, name: &str, target: &Descriptor) -> anyhow::Result<()> {
        self.inner.check_record(name, target).await
    }

    async fn record(&self, name: &str, target: &Descriptor) -> anyhow::Result<()> {
        self.inner.record(name, target).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_layers_are_left_out() {
        assert!(is_layer(media::OCI_LAYER_GZIP));
        assert!(is_layer(media::DOCKER_LAYER_GZIP));
        assert!(is_layer(media::OCI_LAYER_ZSTD));
        for doc in [
            media::OCI_INDEX,
            media::OCI_MANIFEST,
            media::DOCKER_LIST,
            media::OCI_CONFIG,
            media::DOCKER_CONFIG,
            media::OCI_EMPTY,
        ] {
            assert!(!is_layer(doc), "{doc}");
        }
    }
}
