//! A containerd content store and image service, over containerd's gRPC API.
//! Everything written is held by a lease until the image records that
//! reference it exist; see shared notes on containerd's GC. The rooms:
//! `labels` (CRI and GC labels, the pin policy), `content` (blob writes
//! and reads), `leases`, `records` (image records, unpinning,
//! recovery); the [`Sink`] implementation is here.

mod content;
mod labels;
mod leases;
mod records;

pub use labels::{
    children_labels, plan_record, ImageRecord, Labels, PinPolicy, K8S_NAMESPACE, LABEL_KILN_PINNED,
    LABEL_MANAGED, LABEL_PINNED,
};

use std::collections::HashMap;

use anyhow::anyhow;
use bytes::Bytes;
use containerd_client::services::v1::{
    content_client::ContentClient, images_client::ImagesClient, CreateImageRequest, Image,
    ReadContentRequest,
};
use containerd_client::tonic::{transport::Channel, Code, Request};

use super::Sink;
use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::Descriptor;
use labels::GC_REF_CONTENT;

/// containerd accepts messages up to 16 MiB; 1 MiB keeps memory flat.
const WRITE_CHUNK: usize = 1 << 20;

#[derive(Clone)]
pub struct ContainerdStore {
    channel: Channel,
    /// Connections that blob writes are spread over (each its own HTTP/2
    /// connection, so neither side funnels all data through one reader).
    writers: Vec<Channel>,
    namespace: String,
    lease: Option<String>,
    /// What the image records say to kubelet's GC.
    policy: PinPolicy,
    /// The store's backing directory, when kiln runs its daemon: blobs are
    /// written there directly and only their records go through containerd.
    direct: Option<super::blobdir::BlobDir>,
}

impl ContainerdStore {
    pub fn new(channel: Channel, namespace: &str) -> Self {
        ContainerdStore {
            writers: vec![channel.clone()],
            channel,
            namespace: namespace.to_string(),
            lease: None,
            policy: PinPolicy::Unpinned { force: false },
            direct: None,
        }
    }

    /// The blob stamps the backing directory proved (see [`super::blobdir`]).
    pub fn proven(&self) -> Option<super::blobdir::Proven> {
        self.direct.as_ref().map(|d| d.proven())
    }

    /// Writes blobs straight into `dir` (the daemon's own content root,
    /// whose GC kiln controls) and commits only their records.
    pub fn with_direct(mut self, dir: super::blobdir::BlobDir) -> Self {
        self.direct = Some(dir);
        self
    }

    /// How blobs from the cache are taken into the backing directory.
    pub fn with_share(mut self, share: super::cache::Share) -> Self {
        self.direct = self.direct.map(|d| d.with_share(share));
        self
    }

    /// How the records this store writes are labelled.
    pub fn with_policy(mut self, policy: PinPolicy) -> Self {
        self.policy = policy;
        self
    }

    pub fn policy(&self) -> PinPolicy {
        self.policy
    }

    /// The blobs recorded without their bytes ([`Sink::put_absent`]).
    pub fn absent(&self) -> Vec<crate::primitives::digest::Digest> {
        self.direct.as_ref().map(|d| d.absent()).unwrap_or_default()
    }

    /// Spreads blob writes over these connections too.
    pub fn with_writers(mut self, writers: Vec<Channel>) -> Self {
        if !writers.is_empty() {
            self.writers = writers;
        }
        self
    }

    fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        let md = r.metadata_mut();
        md.insert(
            "containerd-namespace",
            self.namespace.parse().expect("namespace is ASCII"),
        );
        if let Some(l) = &self.lease {
            md.insert("containerd-lease", l.parse().expect("lease id is ASCII"));
        }
        r
    }

    fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.channel.clone()).max_decoding_message_size(64 << 20)
    }

    fn images(&self) -> ImagesClient<Channel> {
        ImagesClient::new(self.channel.clone())
    }
}

impl Sink for ContainerdStore {
    async fn has(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        // Lease first, then look: once the lease holds it, no GC can take a
        // blob found present (a dead run's lease dropped, a record replaced).
        self.protect(&desc.digest).await?;
        let recorded = self
            .info(&desc.digest)
            .await?
            .is_some_and(|i| i.size == desc.size as i64);
        // A record is not proof: the file must hold the bytes (a base, or
        // an earlier hand, may have put others there).
        match (&self.direct, recorded) {
            (Some(dir), true) => dir.holds(desc).await,
            _ => Ok(recorded),
        }
    }

    async fn put_stream(&self, desc: &Descriptor, data: BlobStream) -> anyhow::Result<u64> {
        self.write(desc, data, &Labels::new()).await
    }

    async fn put_file(
        &self,
        desc: &Descriptor,
        entry: &crate::sink::cache::Kept,
    ) -> anyhow::Result<u64> {
        self.write_file(desc, entry).await
    }

    async fn put_absent(&self, desc: &Descriptor) -> anyhow::Result<()> {
        self.write_absent(desc).await
    }

    async fn put_document(
        &self,
        desc: &Descriptor,
        bytes: Bytes,
        children: &[Descriptor],
    ) -> anyhow::Result<u64> {
        let labels = children_labels(&bytes, children);
        if self.has(desc).await? {
            self.add_labels(desc, labels).await?;
            Ok(0)
        } else {
            let stream: BlobStream = Box::pin(futures_util::stream::once(async move { Ok(bytes) }));
            self.write(desc, stream, &labels).await
        }
    }

    async fn check_record(&self, name: &str, target: &Descriptor) -> anyhow::Result<()> {
        let existing = self.image_record(name).await?;
        plan_record(name, target, existing.as_ref(), self.policy).map_err(|e| anyhow!(e))?;
        Ok(())
    }

    async fn readable(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        if !self.has(desc).await? {
            return Ok(false);
        }
        // meta.db can list a blob whose file is gone: read its last byte.
        let last = desc.size.saturating_sub(1) as i64;
        let read = self
            .content()
            .read(self.req(ReadContentRequest {
                digest: desc.digest.to_string(),
                offset: last,
                size: desc.size.min(1) as i64,
            }))
            .await;
        match read {
            Ok(r) => {
                let mut stream = r.into_inner();
                Ok(stream.message().await.is_ok())
            }
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(anyhow!("reading {} back: {}", desc.digest, s.message())),
        }
    }

    async fn gc_refs(&self, digest: &Digest) -> anyhow::Result<Option<Vec<Digest>>> {
        let labels = self
            .info(digest)
            .await?
            .map(|i| i.labels)
            .unwrap_or_default();
        Ok(Some(
            labels
                .into_iter()
                .filter(|(k, _)| k.starts_with(GC_REF_CONTENT))
                .filter_map(|(_, v)| Digest::parse(&v).ok())
                .collect(),
        ))
    }

    async fn read(&self, digest: &Digest) -> anyhow::Result<Option<Bytes>> {
        // As in `has`: leased before it is looked at, so it cannot vanish mid-read.
        self.protect(digest).await?;
        let Some(info) = self.info(digest).await? else {
            return Ok(None);
        };
        // A store kiln did not write may hold anything under a digest:
        // refused by its size before a byte is read (and while reading).
        crate::primitives::oci::check_document_size(digest, info.size.max(0) as u64)?;
        Ok(Some(self.read_blob(digest).await?))
    }

    async fn record(&self, name: &str, target: &Descriptor) -> anyhow::Result<()> {
        let existing = self.image_record(name).await?;
        let record =
            plan_record(name, target, existing.as_ref(), self.policy).map_err(|e| anyhow!(e))?;
        if let Some(e) = &existing {
            if e.target.digest == record.target.digest && e.labels == record.labels {
                return Ok(()); // already so: a rebuild writes nothing
            }
        }
        let now = prost_types::Timestamp::from(std::time::SystemTime::now());
        let image = Image {
            name: record.name.clone(),
            labels: record.labels.clone().into_iter().collect(),
            target: Some(containerd_client::types::Descriptor {
                media_type: record.target.media_type.clone(),
                digest: record.target.digest.to_string(),
                size: record.target.size as i64,
                annotations: HashMap::new(),
            }),
            created_at: Some(now),
            updated_at: Some(now),
        };
        match self
            .images()
            .create(self.req(CreateImageRequest {
                image: Some(image.clone()),
                source_date_epoch: None,
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => {
                self.update_image(image, &["target".to_string(), "labels".to_string()])
                    .await
                    .map_err(|s| {
                        anyhow!("updating image record {}: {}", record.name, s.message())
                    })?;
                Ok(())
            }
            Err(s) => Err(anyhow!(
                "creating image record {}: {}",
                record.name,
                s.message()
            )),
        }
    }
}

#[cfg(test)]
mod id_tests {
    use super::*;
    use crate::sink::containerd::leases::lease_pid;

    fn rec(digest: &Digest, pinned: bool) -> ImageRecord {
        let mut labels = Labels::from([(LABEL_MANAGED.to_string(), "managed".to_string())]);
        if pinned {
            labels.insert(LABEL_PINNED.to_string(), "pinned".to_string());
        }
        labels.insert("org.example/keep".into(), "yes".into());
        ImageRecord {
            name: "n".into(),
            target: Descriptor::new(crate::primitives::oci::media::OCI_INDEX, digest.clone(), 1),
            labels,
        }
    }

    #[test]
    fn load_never_unpins_and_needs_force_to_replace_a_bundled_image() {
        let a = Descriptor::new(
            crate::primitives::oci::media::OCI_INDEX,
            Digest::of(b"a"),
            1,
        );
        let b = Descriptor::new(
            crate::primitives::oci::media::OCI_INDEX,
            Digest::of(b"b"),
            1,
        );
        let load = PinPolicy::Unpinned { force: false };
        // New name: managed, not pinned.
        let r = plan_record("n", &a, None, load).unwrap();
        assert_eq!(
            r.labels.get(LABEL_MANAGED).map(String::as_str),
            Some("managed")
        );
        assert!(!r.labels.contains_key(LABEL_PINNED));
        // Same image as a bundled one: stays pinned, other labels kept.
        let r = plan_record("n", &a, Some(&rec(&a.digest, true)), load).unwrap();
        assert_eq!(
            r.labels.get(LABEL_PINNED).map(String::as_str),
            Some("pinned")
        );
        assert_eq!(
            r.labels.get("org.example/keep").map(String::as_str),
            Some("yes")
        );
        // Another image under a bundled name: refused, unless forced (then still pinned).
        let e = plan_record("n", &b, Some(&rec(&a.digest, true)), load).unwrap_err();
        assert!(
            e.contains("--force") && e.contains(a.digest.as_str()) && e.contains(b.digest.as_str()),
            "{e}"
        );
        let r = plan_record(
            "n",
            &b,
            Some(&rec(&a.digest, true)),
            PinPolicy::Unpinned { force: true },
        )
        .unwrap();
        assert_eq!(r.target.digest, b.digest);
        assert!(r.labels.contains_key(LABEL_PINNED));
        // Replacing an unpinned image is fine; build pins.
        assert!(plan_record("n", &b, Some(&rec(&a.digest, false)), load).is_ok());
        assert!(
            plan_record("n", &b, Some(&rec(&a.digest, false)), PinPolicy::Pin)
                .unwrap()
                .labels
                .contains_key(LABEL_PINNED)
        );
    }

    /// Issue 39.6e: `pinned: false` takes back kiln's own pin and leaves
    /// a pin someone else made.
    #[test]
    fn preload_removes_only_kilns_pin() {
        let a = Descriptor::new(
            crate::primitives::oci::media::OCI_INDEX,
            Digest::of(b"a"),
            1,
        );
        let theirs = rec(&a.digest, true);
        let r = plan_record("n", &a, Some(&theirs), PinPolicy::Preload).unwrap();
        assert_eq!(
            r.labels.get(LABEL_PINNED).map(String::as_str),
            Some("pinned")
        );
        let mut ours = rec(&a.digest, true);
        ours.labels
            .insert(LABEL_KILN_PINNED.into(), "pinned".into());
        let r = plan_record("n", &a, Some(&ours), PinPolicy::Preload).unwrap();
        assert!(!r.labels.contains_key(LABEL_PINNED) && !r.labels.contains_key(LABEL_KILN_PINNED));
        assert_eq!(
            r.labels.get("org.example/keep").map(String::as_str),
            Some("yes")
        );
    }

    #[test]
    fn pids_in_ids() {
        assert_eq!(lease_pid("kiln-build-4242-1700000000000"), Some(4242));
        assert_eq!(lease_pid("k8s.io/other"), None);
    }
}
