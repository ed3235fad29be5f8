//! A containerd content store and image service, over containerd's gRPC API.
//! Everything written is held by a lease until the image records that
//! reference it exist; see shared notes on containerd's GC.

use std::collections::{BTreeMap, HashMap};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use containerd_client::services::v1::{
    content_client::ContentClient, images_client::ImagesClient, leases_client::LeasesClient,
    AbortRequest, CreateImageRequest, DeleteImageRequest, GetImageRequest, Image, InfoRequest,
    ListImagesRequest, ReadContentRequest, UpdateImageRequest, UpdateRequest, WriteAction,
    WriteContentRequest, WriteContentResponse,
};
use containerd_client::services::v1::{
    AddResourceRequest, CreateRequest as LeaseCreate, DeleteRequest as LeaseDelete, Info, Resource,
};
use containerd_client::tonic::{self, transport::Channel, Code, Request};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::Sink;
use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::{Descriptor, Document};

/// The namespace kubelet's images live in (CRI's namespace).
pub const K8S_NAMESPACE: &str = "k8s.io";
pub const LABEL_MANAGED: &str = "io.cri-containerd.image";
pub const LABEL_PINNED: &str = "io.cri-containerd.pinned";
/// kiln's mark on every pin it makes, so it knows its pins from anyone
/// else's (k3s marks its own with `io.cattle.k3s.pinned` the same way).
pub const LABEL_KILN_PINNED: &str = "io.kiln.pinned";
/// Every label key with this prefix keeps the digest it names (containerd's GC).
const GC_REF_CONTENT: &str = "containerd.io/gc.ref.content";
const GC_LABEL_CONFIG: &str = "containerd.io/gc.ref.content.config";
const GC_LABEL_MANIFEST_PREFIX: &str = "containerd.io/gc.ref.content.m.";
const GC_LABEL_LAYER_PREFIX: &str = "containerd.io/gc.ref.content.l.";

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

/// What the image records say to kubelet's GC: kiln's pinning rule, kept
/// with the store that enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinPolicy {
    /// The bundled set (`kiln build`): managed and pinned.
    Pin,
    /// User images (`kiln load`): managed, never pinned by kiln, and never
    /// unpinning a bundled image; replacing one needs `force`.
    Unpinned { force: bool },
    /// Bundled but reclaimable (a manifest entry with `pinned: false`):
    /// managed, and the pin label removed if an earlier build set it.
    Preload,
}

/// An image record as containerd keeps it.
#[derive(Debug, Clone)]
pub struct ImageRecord {
    pub name: String,
    pub target: Descriptor,
    pub labels: Labels,
}

pub type Labels = BTreeMap<String, String>;

/// The record `name` should become, given what the store has under it.
pub fn plan_record(
    name: &str,
    target: &Descriptor,
    existing: Option<&ImageRecord>,
    policy: PinPolicy,
) -> Result<ImageRecord, String> {
    let mut labels = existing.map(|e| e.labels.clone()).unwrap_or_default();
    labels.insert(LABEL_MANAGED.to_string(), "managed".to_string());
    match policy {
        PinPolicy::Pin => {
            labels.insert(LABEL_PINNED.to_string(), "pinned".to_string());
            labels.insert(LABEL_KILN_PINNED.to_string(), "pinned".to_string());
        }
        PinPolicy::Preload => {
            labels.remove(LABEL_PINNED);
            labels.remove(LABEL_KILN_PINNED);
        }
        PinPolicy::Unpinned { force } => {
            if let Some(e) =
                existing.filter(|e| e.labels.get(LABEL_PINNED).is_some_and(|v| v == "pinned"))
            {
                if e.target.digest != target.digest && !force {
                    return Err(format!(
                        "{name} is a bundled (pinned) image at {}; loading {} under its name would replace it. Load it under another name, or pass --force to replace it (it stays pinned)",
                        e.target.digest, target.digest
                    ));
                }
            }
        }
    }
    Ok(ImageRecord {
        name: name.to_string(),
        target: target.clone(),
        labels,
    })
}

/// The GC labels that keep a document's stored children, as containerd's
/// `images.SetChildrenLabels` adds them: a manifest keeps its config and
/// layers; an index keeps the manifests that were stored, each under its
/// position in the index (`m.<i>`), so labels added by a build for another
/// platform never overwrite those of a platform the store already holds.
pub fn children_labels(bytes: &[u8], children: &[Descriptor]) -> Labels {
    match Document::parse(bytes) {
        Ok((_, Document::Index(idx))) => children
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let at = idx
                    .manifests
                    .iter()
                    .position(|m| m.digest == d.digest)
                    .unwrap_or(idx.manifests.len() + i);
                (
                    format!("{GC_LABEL_MANIFEST_PREFIX}{at}"),
                    d.digest.to_string(),
                )
            })
            .collect(),
        Ok((_, Document::Manifest(m))) => {
            let mut labels = Labels::new();
            labels.insert(GC_LABEL_CONFIG.to_string(), m.config.digest.to_string());
            for (i, l) in m.layers.iter().enumerate() {
                labels.insert(format!("{GC_LABEL_LAYER_PREFIX}{i}"), l.digest.to_string());
            }
            labels
        }
        _ => children
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    format!("{GC_LABEL_MANIFEST_PREFIX}{i}"),
                    d.digest.to_string(),
                )
            })
            .collect(),
    }
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

    /// How the records this store writes are labelled.
    pub fn with_policy(mut self, policy: PinPolicy) -> Self {
        self.policy = policy;
        self
    }

    pub fn policy(&self) -> PinPolicy {
        self.policy
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

    /// Cleans up after a kiln that was killed: drops its leases (so GC can
    /// take what no record keeps) and aborts its half-written blobs; with
    /// `all_ingests` (kiln runs the daemon) every kiln ingest. Otherwise only
    /// what belongs to kiln processes that are gone is touched.
    pub async fn recover(&self, all_ingests: bool) -> anyhow::Result<()> {
        let mut leases = LeasesClient::new(self.channel.clone());
        let list = leases
            .list(self.req(containerd_client::services::v1::ListRequest { filters: vec![] }))
            .await
            .map_err(|s| anyhow!("listing leases: {}", s.message()))?
            .into_inner()
            .leases;
        // Synchronously: the GC this triggers is over before anything is
        // checked for presence, so nothing found present vanishes later.
        for l in list
            .into_iter()
            .filter(|l| lease_pid(&l.id).is_some_and(crate::adapters::daemon::process_gone))
        {
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
            let stale = |r: &str| {
                r.starts_with("kiln-")
                    && (all_ingests
                        || ingest_pid(r).is_some_and(crate::adapters::daemon::process_gone))
            };
            for st in statuses.into_iter().filter(|s| stale(&s.r#ref)) {
                tracing::info!(ingest = %st.r#ref, offset = st.offset, "aborting an interrupted ingest");
                self.abort(&st.r#ref).await;
            }
        }
        Ok(())
    }

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

    pub async fn info(&self, digest: &Digest) -> anyhow::Result<Option<Info>> {
        match self
            .content()
            .info(self.req(InfoRequest {
                digest: digest.to_string(),
            }))
            .await
        {
            Ok(r) => Ok(r.into_inner().info),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(anyhow!("containerd content info {digest}: {}", s.message())),
        }
    }

    /// Reads a whole (small) blob: manifests and configs.
    pub async fn read_blob(&self, digest: &Digest) -> anyhow::Result<Bytes> {
        let mut stream = self
            .content()
            .read(self.req(ReadContentRequest {
                digest: digest.to_string(),
                offset: 0,
                size: 0,
            }))
            .await
            .map_err(|s| anyhow!("reading {digest} from containerd: {}", s.message()))?
            .into_inner();
        let mut buf = Vec::new();
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|s| anyhow!("reading {digest}: {}", s.message()))?
        {
            buf.extend_from_slice(&msg.data);
        }
        Ok(Bytes::from(buf))
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
    async fn update_image(&self, image: Image, paths: &[String]) -> Result<(), tonic::Status> {
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

    async fn abort(&self, r#ref: &str) {
        let _ = self
            .content()
            .abort(self.req(AbortRequest {
                r#ref: r#ref.to_string(),
            }))
            .await;
    }

    /// Opens a write stream for `ref`, clearing an ingest an interrupted run left.
    async fn open_ingest(
        &self,
        r#ref: &str,
    ) -> anyhow::Result<(
        mpsc::Sender<WriteContentRequest>,
        tonic::Streaming<WriteContentResponse>,
    )> {
        let mut stale_cleared = false;
        for attempt in 0.. {
            let (tx, rx) = mpsc::channel::<WriteContentRequest>(1);
            let stat = WriteContentRequest {
                action: WriteAction::Stat as i32,
                r#ref: r#ref.to_string(),
                ..Default::default()
            };
            tx.send(stat)
                .await
                .map_err(|_| anyhow!("containerd closed the write stream"))?;
            let pick = r#ref
                .bytes()
                .fold(0usize, |a, b| a.wrapping_mul(31).wrapping_add(b as usize))
                % self.writers.len();
            let mut writer = ContentClient::new(self.writers[pick].clone());
            let mut responses = match writer.write(self.req(ReceiverStream::new(rx))).await {
                Ok(r) => r.into_inner(),
                Err(s) => bail!("containerd refused ingest {ref}: {}", s.message()),
            };
            let offset = match recv_status(&mut responses).await {
                Ok(r) => r.offset,
                // Another writer (a concurrent kiln) holds the ref: wait for it, up to ~30 s.
                Err(s) if s.code() == Code::Unavailable && attempt < 150 => {
                    drop((tx, responses));
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    continue;
                }
                Err(s) => bail!("containerd refused ingest {ref}: {}", s.message()),
            };
            if offset == 0 {
                return Ok((tx, responses));
            }
            if stale_cleared {
                break;
            }
            drop((tx, responses));
            self.abort(r#ref).await;
            stale_cleared = true;
        }
        bail!("containerd keeps a stale ingest {ref}; remove it with `ctr -n k8s.io content active` / `content rm`")
    }

    /// Stores a blob: into the backing directory and then its record, or
    /// (a daemon kiln does not run) through containerd's write API.
    async fn write(
        &self,
        desc: &Descriptor,
        data: BlobStream,
        labels: &Labels,
    ) -> anyhow::Result<u64> {
        let Some(dir) = &self.direct else {
            return self.write_through(desc, data, labels).await;
        };
        let n = dir.put(desc, data).await?;
        crate::primitives::fault::point("blob-renamed");
        self.commit_present(desc, labels).await?;
        Ok(n)
    }

    /// Records a blob already in the backing directory: a writer opened with
    /// its digest and size finds it there (containerd's shared content
    /// policy) and commits without data, labels included.
    async fn commit_present(&self, desc: &Descriptor, labels: &Labels) -> anyhow::Result<()> {
        static COMMITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COMMITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r#ref = format!("kiln-{}-c{n}-{}", std::process::id(), desc.digest.hex());
        let (tx, rx) = mpsc::channel::<WriteContentRequest>(1);
        tx.send(WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: r#ref.clone(),
            total: desc.size as i64,
            offset: desc.size as i64,
            expected: desc.digest.to_string(),
            labels: labels.clone().into_iter().collect(),
            ..Default::default()
        })
        .await
        .map_err(|_| anyhow!("containerd closed the write stream"))?;
        let mut writer = ContentClient::new(self.channel.clone());
        let result = match writer.write(self.req(ReceiverStream::new(rx))).await {
            Ok(r) => recv(&mut r.into_inner()).await.map(|_| ()),
            Err(s) => Err(anyhow!("{}", s.message())),
        };
        drop(tx);
        match result {
            Ok(()) => Ok(()),
            // Already recorded (a concurrent writer, or a record a GC kept): add our labels.
            Err(e) if e.to_string().contains("already exists") => {
                self.add_labels(desc, labels.clone()).await
            }
            Err(e) => {
                self.abort(&r#ref).await;
                Err(e.context(format!("recording {} in containerd", desc.digest)))
            }
        }
    }

    async fn write_through(
        &self,
        desc: &Descriptor,
        mut data: BlobStream,
        labels: &Labels,
    ) -> anyhow::Result<u64> {
        // A ref of its own per write: never one a cancelled writer still holds.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r#ref = format!("kiln-{}-{n}-{}", std::process::id(), desc.digest.hex());
        let (tx, mut responses) = self.open_ingest(&r#ref).await?;
        let result = async {
            let mut offset: u64 = 0;
            let mut buf: Vec<u8> = Vec::with_capacity(WRITE_CHUNK.min(desc.size as usize));
            loop {
                let chunk = data.next().await.transpose()?;
                if let Some(c) = &chunk {
                    buf.extend_from_slice(c);
                }
                if buf.len() >= WRITE_CHUNK || (chunk.is_none() && !buf.is_empty()) {
                    let n = buf.len() as u64;
                    let msg = WriteContentRequest {
                        action: WriteAction::Write as i32,
                        r#ref: r#ref.clone(),
                        total: desc.size as i64,
                        offset: offset as i64,
                        data: std::mem::take(&mut buf),
                        ..Default::default()
                    };
                    tx.send(msg)
                        .await
                        .map_err(|_| anyhow!("containerd closed the write stream"))?;
                    recv(&mut responses)
                        .await
                        .with_context(|| format!("writing {} to containerd", desc.digest))?;
                    offset += n;
                    crate::primitives::fault::point("mid-blob");
                }
                if chunk.is_none() {
                    break;
                }
            }
            // Only now has the verifying stream ended cleanly: commit.
            let commit = WriteContentRequest {
                action: WriteAction::Commit as i32,
                r#ref: r#ref.clone(),
                total: desc.size as i64,
                offset: offset as i64,
                expected: desc.digest.to_string(),
                labels: labels.clone().into_iter().collect(),
                ..Default::default()
            };
            tx.send(commit)
                .await
                .map_err(|_| anyhow!("containerd closed the write stream"))?;
            match recv(&mut responses).await {
                Ok(_) => Ok((offset, false)),
                Err(e) if e.to_string().contains("already exists") => Ok((offset, true)),
                Err(e) => Err(e.context(format!("committing {} to containerd", desc.digest))),
            }
        }
        .await;
        drop((tx, responses));
        match result {
            Ok((n, existed)) => {
                // A concurrent writer won the commit and kept its labels: add ours.
                if existed {
                    self.add_labels(desc, labels.clone()).await?;
                }
                Ok(n)
            }
            Err(e) => {
                self.abort(&r#ref).await;
                Err(e)
            }
        }
    }
}

/// The kiln pid in a lease id `kiln-PURPOSE-PID-MILLIS`.
fn lease_pid(id: &str) -> Option<i32> {
    let rest = id.strip_prefix("kiln-")?;
    rest.rsplit('-').nth(1)?.parse().ok()
}

/// The kiln pid in an ingest ref `kiln-PID-N-HEX`.
fn ingest_pid(r: &str) -> Option<i32> {
    r.strip_prefix("kiln-")?.split('-').next()?.parse().ok()
}

async fn recv_status(
    responses: &mut tonic::Streaming<WriteContentResponse>,
) -> Result<WriteContentResponse, tonic::Status> {
    match responses.message().await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(tonic::Status::aborted(
            "containerd ended the write stream early",
        )),
        Err(s) => Err(s),
    }
}

async fn recv(
    responses: &mut tonic::Streaming<WriteContentResponse>,
) -> anyhow::Result<WriteContentResponse> {
    recv_status(responses)
        .await
        .map_err(|s| anyhow!("{}", s.message()))
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
        if self.info(digest).await?.is_none() {
            return Ok(None);
        }
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

    #[test]
    fn pids_in_ids() {
        assert_eq!(lease_pid("kiln-build-4242-1700000000000"), Some(4242));
        assert_eq!(lease_pid("k8s.io/other"), None);
        assert_eq!(
            ingest_pid(&format!("kiln-4242-7-{}", "a".repeat(64))),
            Some(4242)
        );
        assert_eq!(ingest_pid("kiln-"), None);
    }
}
