//! A registry as a sink: `kiln build --push`. Blobs the registry already has
//! are skipped; manifests go up by digest, then the top one under its tag.

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::anyhow;
use bytes::Bytes;
use futures_util::TryStreamExt;

use super::Sink;
use crate::adapters::registry::RegistryClient;
use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::{media, Descriptor};
use crate::primitives::reference::ImageRef;

pub struct RegistryPush {
    registry: RegistryClient,
    target: ImageRef,
    /// Documents pushed by digest, kept to push again under the tag.
    docs: Mutex<HashMap<Digest, (String, Bytes)>>,
}

impl RegistryPush {
    pub fn new(registry: RegistryClient, target: ImageRef) -> Self {
        RegistryPush {
            registry,
            target,
            docs: Mutex::new(HashMap::new()),
        }
    }
}

fn is_document(m: &str) -> bool {
    media::is_index(m) || media::is_manifest(m)
}

impl Sink for RegistryPush {
    async fn has(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        // Documents are small and always sent again: the top one is needed
        // in hand to tag it, even when the registry has it (a reproducible
        // rebuild pushes the very same image).
        if is_document(&desc.media_type) {
            return Ok(false);
        }
        self.registry
            .exists(&self.target, "blobs", &desc.digest)
            .await
    }

    async fn put_stream(&self, desc: &Descriptor, data: BlobStream) -> anyhow::Result<u64> {
        if is_document(&desc.media_type) {
            let parts: Vec<Bytes> = data.try_collect().await?;
            let bytes = Bytes::from(parts.concat());
            self.registry
                .push_manifest(
                    &self.target,
                    desc.digest.as_str(),
                    &desc.media_type,
                    bytes.clone(),
                )
                .await?;
            self.docs
                .lock()
                .unwrap()
                .insert(desc.digest.clone(), (desc.media_type.clone(), bytes));
            return Ok(desc.size);
        }
        self.registry.push_blob(&self.target, desc, data).await
    }

    async fn read(&self, _digest: &Digest) -> anyhow::Result<Option<Bytes>> {
        Ok(None)
    }

    async fn record(&self, name: &str, target: &Descriptor) -> anyhow::Result<()> {
        let Some(tag) = self.target.tag.as_ref().filter(|_| !name.contains('@')) else {
            return Ok(());
        };
        let (media_type, bytes) = self
            .docs
            .lock()
            .unwrap()
            .get(&target.digest)
            .cloned()
            .ok_or_else(|| {
                anyhow!(
                    "{}: the registry had it already; nothing to tag from",
                    target.digest
                )
            })?;
        self.registry
            .push_manifest(&self.target, tag, &media_type, bytes)
            .await
    }
}
