//! Image records: reading, writing and unpinning them, the pins the
//! manifest no longer names, and recovery from a killed run (its leases
//! and half-written ingests, found by kiln's own names for them).

use anyhow::anyhow;
use containerd_client::services::v1::DeleteRequest as LeaseDelete;
use containerd_client::services::v1::{
    leases_client::LeasesClient, GetImageRequest, Image, ListImagesRequest, UpdateImageRequest,
};
use containerd_client::tonic::{self, Code};

use super::leases::lease_pid;
use super::{ContainerdStore, ImageRecord, LABEL_KILN_PINNED, LABEL_MANAGED, LABEL_PINNED};
use crate::primitives::digest::Digest;
use crate::primitives::oci::Descriptor;

impl ContainerdStore {
    /// Cleans up after a kiln that was killed: drops its leases (so GC can
    /// take what no record keeps) and aborts its half-written blobs. Only
    /// on kiln's own private daemon (`own_daemon`), whose store kiln has
    /// locked: there every `kiln-*` lease and ingest is a dead run's. On a
    /// containerd kiln does not own (`load --address`), a pid in a lease
    /// may be another PID namespace's or host's, alive: nothing is touched
    /// there, and a dead run's leases expire by themselves (24 h).
    pub async fn recover(&self, own_daemon: bool) -> anyhow::Result<()> {
        if !own_daemon {
            return Ok(());
        }
        let mut leases = LeasesClient::new(self.channel.clone());
        let list = leases
            .list(self.req(containerd_client::services::v1::ListRequest { filters: vec![] }))
            .await
            .map_err(|s| anyhow!("listing leases: {}", s.message()))?
            .into_inner()
            .leases;
        // Synchronously: the GC this triggers is over before anything is
        // checked for presence, so nothing found present vanishes later.
        for l in list.into_iter().filter(|l| lease_pid(&l.id).is_some()) {
            tracing::info!(lease = %l.id, "dropping the lease of an interrupted kiln run");
            leases
                .delete(self.req(LeaseDelete {
                    id: l.id.clone(),
                    sync: true,
                }))
                .await
                .map_err(|s| anyhow!("dropping stale lease {}: {}", l.id, s.message()))?;
        }
        {
            let statuses = self
                .content()
                .list_statuses(
                    self.req(containerd_client::services::v1::ListStatusesRequest {
                        filters: vec![],
                    }),
                )
                .await
                .map_err(|s| anyhow!("listing ingests: {}", s.message()))?
                .into_inner()
                .statuses;
            for st in statuses
                .into_iter()
                .filter(|s| s.r#ref.starts_with("kiln-"))
            {
                tracing::info!(ingest = %st.r#ref, offset = st.offset, "aborting an interrupted ingest");
                self.abort(&st.r#ref).await;
            }
        }
        Ok(())
    }

    /// The image record of that name, if any.
    pub async fn image_record(&self, name: &str) -> anyhow::Result<Option<ImageRecord>> {
        let Some(img) = self.get_image(name).await? else {
            return Ok(None);
        };
        let Some(t) = img.target else { return Ok(None) };
        let digest = Digest::parse(&t.digest).map_err(|e| anyhow!("image record {name}: {e}"))?;
        Ok(Some(ImageRecord {
            name: img.name,
            target: Descriptor::new(&t.media_type, digest, t.size.max(0) as u64),
            labels: img.labels.into_iter().collect(),
        }))
    }

    pub async fn list_images(&self) -> anyhow::Result<Vec<Image>> {
        Ok(self
            .images()
            .list(self.req(ListImagesRequest { filters: vec![] }))
            .await
            .map_err(|s| anyhow!("listing images: {}", s.message()))?
            .into_inner()
            .images)
    }

    /// Pins every image record in the namespace that is not pinned yet
    /// (`--pin-existing`: a node image's images came with it, kind left most
    /// unpinned); the labels change, nothing else. Records `except` names
    /// (the manifest's preloaded, reclaimable images) stay as they are.
    /// Returns their names.
    pub async fn pin_existing(&self, except: impl Fn(&str) -> bool) -> anyhow::Result<Vec<String>> {
        let mut pinned = Vec::new();
        for mut image in self.list_images().await? {
            if except(&image.name)
                || image
                    .labels
                    .get(LABEL_PINNED)
                    .is_some_and(|v| v == "pinned")
            {
                continue;
            }
            image
                .labels
                .insert(LABEL_PINNED.to_string(), "pinned".to_string());
            image
                .labels
                .insert(LABEL_KILN_PINNED.to_string(), "pinned".to_string());
            image
                .labels
                .insert(LABEL_MANAGED.to_string(), "managed".to_string());
            let name = image.name.clone();
            let paths =
                [LABEL_PINNED, LABEL_KILN_PINNED, LABEL_MANAGED].map(|l| format!("labels.{l}"));
            self.update_image(image, &paths)
                .await
                .map_err(|s| anyhow!("pinning {name}: {}", s.message()))?;
            pinned.push(name);
        }
        Ok(pinned)
    }

    /// The pinned records `keep` does not name, split into kiln's own pins
    /// (`io.kiln.pinned`) and pins made by someone else.
    pub async fn stale_pins(
        &self,
        keep: impl Fn(&str) -> bool,
    ) -> anyhow::Result<(Vec<ImageRecord>, Vec<String>)> {
        let (mut ours, mut others) = (Vec::new(), Vec::new());
        for image in self.list_images().await? {
            let pinned = image
                .labels
                .get(LABEL_PINNED)
                .is_some_and(|v| v == "pinned");
            if !pinned || keep(&image.name) {
                continue;
            }
            if image.labels.contains_key(LABEL_KILN_PINNED) {
                if let Some(r) = self.image_record(&image.name).await? {
                    ours.push(r);
                }
            } else {
                others.push(image.name);
            }
        }
        Ok((ours, others))
    }

    /// Removes the pin (and kiln's mark) from a record kiln pinned; keeps
    /// `managed`, the target and every other label. Nothing is deleted.
    pub async fn unpin(&self, record: &ImageRecord) -> anyhow::Result<()> {
        let mut image = self
            .get_image(&record.name)
            .await?
            .ok_or_else(|| anyhow!("unpinning {}: the record is gone", record.name))?;
        image.labels.remove(LABEL_PINNED);
        image.labels.remove(LABEL_KILN_PINNED);
        self.update_image(image, &["labels".to_string()])
            .await
            .map_err(|s| anyhow!("unpinning {}: {}", record.name, s.message()))
    }

    /// Changes the `paths` (`target`, `labels.KEY`...) of an existing record.
    pub(super) async fn update_image(
        &self,
        image: Image,
        paths: &[String],
    ) -> Result<(), tonic::Status> {
        self.images()
            .update(self.req(UpdateImageRequest {
                image: Some(image),
                update_mask: Some(prost_types::FieldMask {
                    paths: paths.to_vec(),
                }),
                source_date_epoch: None,
            }))
            .await
            .map(|_| ())
    }

    pub async fn get_image(&self, name: &str) -> anyhow::Result<Option<Image>> {
        match self
            .images()
            .get(self.req(GetImageRequest {
                name: name.to_string(),
            }))
            .await
        {
            Ok(r) => Ok(r.into_inner().image),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(anyhow!("getting image {name}: {}", s.message())),
        }
    }
}
