//! A registry as a sink: `kiln build --push`, `kiln index`. A blob the
//! registry already has in the target repository is skipped (HEAD); one it
//! has in another repository kiln names (the base's, an index member's) is
//! mounted; only the rest is uploaded. Manifests go up by digest, then the
//! top one under its tag. What went which way is counted ([`Tally`]).

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::anyhow;
use bytes::Bytes;
use futures_util::TryStreamExt;

use super::Sink;
use crate::adapters::registry::{Mount, RegistryClient};
use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::{media, Descriptor};
use crate::primitives::reference::ImageRef;

pub struct RegistryPush {
    registry: RegistryClient,
    target: ImageRef,
    /// Repositories of the same registry to mount blobs from.
    mount_from: Vec<ImageRef>,
    /// Documents pushed by digest, kept to push again under the tag.
    docs: Mutex<HashMap<Digest, (String, Bytes)>>,
    /// Upload sessions a refused mount opened, for the PUT that follows.
    sessions: Mutex<HashMap<Digest, String>>,
    tally: Mutex<Tally>,
}

/// Blobs (not manifests) by how they reached the registry, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tally {
    pub uploaded: u64,
    pub uploaded_bytes: u64,
    pub mounted: u64,
    pub mounted_bytes: u64,
    /// Already in the target repository.
    pub skipped: u64,
    pub skipped_bytes: u64,
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        self.uploaded += o.uploaded;
        self.uploaded_bytes += o.uploaded_bytes;
        self.mounted += o.mounted;
        self.mounted_bytes += o.mounted_bytes;
        self.skipped += o.skipped;
        self.skipped_bytes += o.skipped_bytes;
    }

    /// "N blobs uploaded (X), M mounted (Y), K already there (Z)".
    pub fn describe(&self) -> String {
        let b = crate::primitives::text::human_bytes;
        format!(
            "{} blobs uploaded ({}), {} mounted ({}), {} already there ({})",
            self.uploaded,
            b(self.uploaded_bytes),
            self.mounted,
            b(self.mounted_bytes),
            self.skipped,
            b(self.skipped_bytes)
        )
    }
}

impl RegistryPush {
    pub fn new(registry: RegistryClient, target: ImageRef) -> Self {
        RegistryPush {
            registry,
            target,
            mount_from: Vec::new(),
            docs: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            tally: Mutex::default(),
        }
    }

    /// Mounts from these repositories when they are on the target's
    /// registry (others are left out: a mount never crosses registries).
    pub fn mount_from<'a>(mut self, repos: impl IntoIterator<Item = &'a ImageRef>) -> Self {
        for r in repos {
            if r.domain == self.target.domain
                && r.path != self.target.path
                && !self.mount_from.iter().any(|m| m.path == r.path)
            {
                self.mount_from.push(r.clone());
            }
        }
        self
    }

    pub fn tally(&self) -> Tally {
        *self.tally.lock().unwrap()
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
        if self
            .registry
            .exists(&self.target, "blobs", &desc.digest)
            .await?
        {
            let mut t = self.tally.lock().unwrap();
            t.skipped += 1;
            t.skipped_bytes += desc.size;
            return Ok(true);
        }
        // Not asked to mount here: `has` runs before the copy engine's
        // permit, and a mount the registry refuses opens an upload session
        // that would wait, its token ageing, until the permit came (issue
        // 44.4). The mount is tried in `take_without_bytes`, right before
        // the bytes are read and the PUT.
        Ok(false)
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
        // The session a refused mount opened (`take_without_bytes`, just
        // before), else a new one.
        let session = self.sessions.lock().unwrap().remove(&desc.digest);
        let n = self
            .registry
            .push_blob(&self.target, desc, data, session)
            .await?;
        let mut t = self.tally.lock().unwrap();
        t.uploaded += 1;
        t.uploaded_bytes += desc.size;
        Ok(n)
    }

    /// Mounted from a repository kiln names, if the registry will; a
    /// refused mount opens the upload session the PUT then goes into.
    async fn take_without_bytes(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        if is_document(&desc.media_type) {
            return Ok(false);
        }
        for from in &self.mount_from {
            match self.registry.mount_blob(&self.target, desc, from).await {
                Ok(Mount::Mounted) => {
                    let mut t = self.tally.lock().unwrap();
                    t.mounted += 1;
                    t.mounted_bytes += desc.size;
                    return Ok(true);
                }
                Ok(Mount::Upload(s)) => {
                    self.sessions.lock().unwrap().insert(desc.digest.clone(), s);
                    return Ok(false);
                }
                Err(e) => tracing::debug!("mounting {} from {from}: {e:#}", desc.digest),
            }
        }
        Ok(false)
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
