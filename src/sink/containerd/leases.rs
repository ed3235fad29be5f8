//! Leases: everything kiln writes is held by one until the image records
//! that reference it exist, then released, and a synchronous GC run.

use std::collections::HashMap;

use anyhow::anyhow;
use containerd_client::services::v1::{
    leases_client::LeasesClient, CreateImageRequest, DeleteImageRequest, Image, UpdateRequest,
};
use containerd_client::services::v1::{
    AddResourceRequest, CreateRequest as LeaseCreate, DeleteRequest as LeaseDelete, Info, Resource,
};

use super::{ContainerdStore, Labels};
use crate::primitives::digest::Digest;
use crate::primitives::oci::Descriptor;

impl ContainerdStore {
    /// Takes a lease that expires by itself, so a crash cannot keep garbage forever.
    pub async fn begin_lease(&mut self, purpose: &str) -> anyhow::Result<()> {
        let id = format!(
            "kiln-{purpose}-{}-{}",
            std::process::id(),
            chrono::Utc::now().timestamp_millis()
        );
        let expire = (chrono::Utc::now() + chrono::Duration::hours(24))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let labels = HashMap::from([("containerd.io/gc.expire".to_string(), expire)]);
        LeasesClient::new(self.channel.clone())
            .create(self.req(LeaseCreate {
                id: id.clone(),
                labels,
            }))
            .await
            .map_err(|s| anyhow!("creating a containerd lease: {}", s.message()))?;
        self.lease = Some(id);
        Ok(())
    }

    /// Adds labels to a blob that is already present.
    pub async fn add_labels(&self, desc: &Descriptor, labels: Labels) -> anyhow::Result<()> {
        if labels.is_empty() {
            return Ok(());
        }
        // Already labelled so (a rebuild): no write, no metadata transaction.
        if let Some(have) = self.info(&desc.digest).await? {
            if labels.iter().all(|(k, v)| have.labels.get(k) == Some(v)) {
                return Ok(());
            }
        }
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let info = Info {
            digest: desc.digest.to_string(),
            labels: labels.into_iter().collect(),
            ..Default::default()
        };
        self.content()
            .update(self.req(UpdateRequest {
                info: Some(info),
                update_mask: Some(prost_types::FieldMask { paths }),
            }))
            .await
            .map_err(|s| anyhow!("labelling {} in containerd: {}", desc.digest, s.message()))?;
        Ok(())
    }

    /// Adds a blob to the run's lease (whether or not it exists yet), so that
    /// no GC removes it before the records that reference it are written.
    pub async fn protect(&self, digest: &Digest) -> anyhow::Result<()> {
        let Some(id) = &self.lease else {
            return Ok(());
        };
        LeasesClient::new(self.channel.clone())
            .add_resource(self.req(AddResourceRequest {
                id: id.clone(),
                resource: Some(Resource {
                    id: digest.to_string(),
                    r#type: "content".to_string(),
                }),
            }))
            .await
            .map_err(|s| anyhow!("adding {digest} to the containerd lease: {}", s.message()))?;
        Ok(())
    }

    /// Drops the lease and runs GC synchronously: whatever no record
    /// references is deleted now, and what remains is what survives.
    pub async fn end_lease(&mut self) -> anyhow::Result<()> {
        if let Some(id) = self.lease.take() {
            let mut leases = LeasesClient::new(self.channel.clone());
            let call = self.req(LeaseDelete { id, sync: true });
            let gc = tokio::spawn(async move { leases.delete(call).await });
            tokio::task::yield_now().await;
            crate::primitives::fault::point("during-gc");
            gc.await
                .map_err(|e| anyhow!("releasing the containerd lease (GC): {e}"))?
                .map_err(|s| anyhow!("releasing the containerd lease (GC): {}", s.message()))?;
        }
        Ok(())
    }

    /// Runs containerd's GC now, synchronously, the way removing an image
    /// with `ctr images rm --sync` does: a throwaway record (at `target`) is
    /// created and deleted with `sync`.
    pub async fn gc_now(&self, target: &Descriptor) -> anyhow::Result<()> {
        let name = format!("kiln.gc/probe-{}:now", std::process::id());
        let image = Image {
            name: name.clone(),
            target: Some(containerd_client::types::Descriptor {
                media_type: target.media_type.clone(),
                digest: target.digest.to_string(),
                size: target.size as i64,
                annotations: HashMap::new(),
            }),
            ..Default::default()
        };
        self.images()
            .create(self.req(CreateImageRequest {
                image: Some(image),
                source_date_epoch: None,
            }))
            .await
            .map_err(|s| anyhow!("creating the GC probe record: {}", s.message()))?;
        self.images()
            .delete(self.req(DeleteImageRequest {
                name,
                sync: true,
                target: None,
            }))
            .await
            .map_err(|s| anyhow!("deleting the GC probe record (GC): {}", s.message()))?;
        Ok(())
    }
}

/// The kiln pid in a lease id `kiln-PURPOSE-PID-MILLIS`.
pub(super) fn lease_pid(id: &str) -> Option<i32> {
    let rest = id.strip_prefix("kiln-")?;
    rest.rsplit('-').nth(1)?.parse().ok()
}
