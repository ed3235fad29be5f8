//! The copy engine: moves images from a [`Source`] to a [`Sink`], selecting
//! platforms, verifying every byte as it streams, and fetching each blob
//! once even when images share it. It knows no protocol: what a store adds
//! (GC labels, CRI labels, tags) is the sink's. Nothing is recorded for an
//! image until all of its content is stored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::primitives::error::BadInput;
use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures_util::{stream, StreamExt, TryStreamExt};
use tokio::sync::{OnceCell, Semaphore};

use super::report::{CopiedImage, Stats};
use crate::primitives::digest::{verify_bytes, Digest};
use crate::primitives::oci::{Descriptor, Document, ImageConfigPlatform, ImageManifest};
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::Sink;
use crate::source::Source;

/// Configs are small JSON documents; anything larger is not an image config.
const MAX_CONFIG_BYTES: u64 = crate::primitives::oci::MAX_DOCUMENT_BYTES;

mod options;
pub use options::CopyOptions;

pub struct Engine<'a, S, K> {
    source: &'a S,
    sink: &'a K,
    progress: Progress,
    permits: Semaphore,
    inflight: Mutex<HashMap<Digest, Arc<OnceCell<()>>>>,
    blobs_fetched: AtomicU64,
    bytes_fetched: AtomicU64,
    blobs_present: AtomicU64,
    blobs_cached: AtomicU64,
    bytes_cached: AtomicU64,
}

impl<'a, S: Source, K: Sink> Engine<'a, S, K> {
    pub fn new(source: &'a S, sink: &'a K, jobs: usize, progress: Progress) -> Self {
        Engine {
            source,
            sink,
            progress,
            permits: Semaphore::new(jobs.max(1)),
            inflight: Mutex::new(HashMap::new()),
            blobs_fetched: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            blobs_present: AtomicU64::new(0),
            blobs_cached: AtomicU64::new(0),
            bytes_cached: AtomicU64::new(0),
        }
    }

    pub fn stats(&self) -> Stats {
        Stats {
            blobs_fetched: self.blobs_fetched.load(Ordering::Relaxed),
            bytes_fetched: self.bytes_fetched.load(Ordering::Relaxed),
            blobs_present: self.blobs_present.load(Ordering::Relaxed),
            blobs_cached: self.blobs_cached.load(Ordering::Relaxed),
            bytes_cached: self.bytes_cached.load(Ordering::Relaxed),
        }
    }

    /// Copies every image, `jobs` at a time; results come back in input order.
    pub async fn copy_all(
        &self,
        images: &[ImageRef],
        opts: &CopyOptions,
    ) -> Vec<anyhow::Result<CopiedImage>> {
        let done = AtomicU64::new(0);
        let total = images.len();
        stream::iter(images)
            .map(|image| {
                let done = &done;
                async move {
                    let progress = self.progress.for_image(&image.to_string());
                    let r = self.copy_with(image, opts, &progress).await;
                    match &r {
                        Ok(c) => progress.image_done(&format!(
                            "stored {} {} ({})",
                            c.reference,
                            c.digest.short(),
                            c.platforms.join(",")
                        )),
                        Err(_) => progress.image_done(&format!("failed {image}")),
                    }
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    self.progress.set_message(format!("{n}/{total} images"));
                    r
                }
            })
            .buffered(opts.jobs.max(1))
            .collect()
            .await
    }

    /// Copies one image and records it; on error nothing is recorded for it.
    pub async fn copy(&self, image: &ImageRef, opts: &CopyOptions) -> anyhow::Result<CopiedImage> {
        self.copy_with(image, opts, &self.progress).await
    }

    /// Copies one layer blob of `image` (verified, through the cache)
    /// unless the sink has it: a layer taken alone, as a node image keeps
    /// one of the image it follows (`domain::node_image::kept`).
    pub async fn copy_layer(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        opts: &CopyOptions,
    ) -> anyhow::Result<()> {
        self.copy_blob(image, desc, opts, &self.progress).await
    }

    async fn copy_with(
        &self,
        image: &ImageRef,
        opts: &CopyOptions,
        progress: &Progress,
    ) -> anyhow::Result<CopiedImage> {
        let (top, bytes) = self
            .resolve(image, opts)
            .await
            .with_context(|| format!("{image}: resolving from {}", self.source.describe(image)))?;
        if let Some(pin) = &image.digest {
            if *pin != top.digest {
                bail!("{image}: the registry serves {} but the manifest pins {pin}; update the pin (kiln lock) or fix the mirror", top.digest);
            }
        }
        let admitted_by = match &opts.gate {
            Some(gate) => gate
                .admit(self.source, image, &top)
                .await
                .map_err(|e| anyhow!("{image}: {e:#}"))?,
            None => None,
        };
        // Decide the records before writing anything, so a refusal changes nothing.
        let mut names = Vec::new();
        if let Some(tagged) = image.tagged_name() {
            names.push(tagged);
        }
        names.push(image.digest_name(&top.digest));
        for name in &names {
            self.sink
                .check_record(name, &top)
                .await
                .map_err(|e| anyhow!("{image}: {e:#}"))?;
        }
        let (_, doc) = Document::parse(&bytes).map_err(|e| anyhow!("{image}: {e}"))?;
        let (platforms, size, manifests) = match doc {
            Document::Index(index) => {
                self.copy_index(image, &top, bytes, &index, opts, progress)
                    .await?
            }
            Document::Manifest(_) => {
                let (platform, size) = self
                    .copy_manifest(image, &top, bytes, opts, progress)
                    .await?;
                if let Some(missing) = opts.platforms.iter().find(|want| !want.matches(&platform)) {
                    // The input's fault (exit 2), said without guessing
                    // whether --platform was given or defaulted.
                    return Err(BadInput(format!("{image}: no {missing} image: it is a single-platform {platform} image; build for the platform it has (--platform {platform}) or use a multi-platform image")).into());
                }
                (vec![platform.to_string()], size, vec![top.digest.clone()])
            }
        };
        crate::primitives::fault::point("before-records");
        for name in &names {
            self.sink
                .record(name, &top)
                .await
                .with_context(|| format!("{image}: recording {name}"))?;
        }
        let records = names;
        Ok(CopiedImage {
            reference: image.to_string(),
            digest: top.digest.clone(),
            media_type: top.media_type.clone(),
            platforms,
            size,
            records,
            manifests,
            admitted_by,
            top,
        })
    }

    /// Stores the platforms `opts` asks for from an index, then the index
    /// itself; returns (platforms, bytes stored, platform manifests).
    async fn copy_index(
        &self,
        image: &ImageRef,
        top: &Descriptor,
        bytes: Bytes,
        index: &crate::primitives::oci::ImageIndex,
        opts: &CopyOptions,
        progress: &Progress,
    ) -> anyhow::Result<(Vec<String>, u64, Vec<Digest>)> {
        let chosen = choose_platforms(image, index, &opts.platforms)?;
        let results: Vec<(Platform, u64)> = settle(
            stream::iter(chosen.iter())
                .map(|d| async move {
                    let bytes = self.fetch_manifest(image, d, opts).await?;
                    self.copy_manifest(image, d, bytes, opts, progress).await
                })
                .buffer_unordered(chosen.len().max(1))
                .collect()
                .await,
        )?;
        self.put_document(top, bytes, &chosen)
            .await
            .with_context(|| format!("{image}: storing index"))?;
        let size = top.size + results.iter().map(|(_, s)| s).sum::<u64>();
        Ok((
            results.into_iter().map(|(p, _)| p.to_string()).collect(),
            size,
            chosen.iter().map(|d| d.digest.clone()).collect(),
        ))
    }

    /// The top-level document; a digest-pinned image already stored costs no network.
    async fn resolve(
        &self,
        image: &ImageRef,
        opts: &CopyOptions,
    ) -> anyhow::Result<(Descriptor, Bytes)> {
        if let Some(pin) = &image.digest {
            let kept = match self.sink.read(pin).await? {
                Some(b) => Some(b),
                None => opts.cache.as_ref().and_then(|c| c.read(pin)),
            };
            if let Some(stored) = kept {
                if Digest::of(&stored) == *pin {
                    let (media_type, _) = Document::parse(&stored).map_err(|e| anyhow!("{e}"))?;
                    return Ok((
                        Descriptor::new(&media_type, pin.clone(), stored.len() as u64),
                        stored,
                    ));
                }
            }
        }
        let resolved = self.source.resolve(image).await?;
        let actual = Digest::of(&resolved.bytes);
        if actual != resolved.descriptor.digest {
            bail!(
                "manifest digest mismatch: registry says {}, content is {actual}",
                resolved.descriptor.digest
            );
        }
        keep(opts, &resolved.descriptor, &resolved.bytes).await;
        Ok((resolved.descriptor, resolved.bytes))
    }

    async fn fetch_manifest(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        opts: &CopyOptions,
    ) -> anyhow::Result<Bytes> {
        if let Some(b) = self.sink.read(&desc.digest).await? {
            if verify_bytes(&desc.digest, desc.size, &b).is_ok() {
                return Ok(b);
            }
        }
        if let Some(b) = opts.cache.as_ref().and_then(|c| c.read(&desc.digest)) {
            if b.len() as u64 == desc.size {
                return Ok(b);
            }
        }
        let b = self
            .source
            .manifest(image, desc)
            .await
            .with_context(|| format!("{image}: fetching manifest {}", desc.digest))?;
        verify_bytes(&desc.digest, desc.size, &b)
            .map_err(|e| anyhow!("{image}: manifest {}: {e}", desc.digest))?;
        self.count_fetch(b.len() as u64);
        keep(opts, desc, &b).await;
        Ok(b)
    }

    /// Stores one platform's manifest with its config and layers; returns its platform and total size.
    async fn copy_manifest(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        bytes: Bytes,
        opts: &CopyOptions,
        progress: &Progress,
    ) -> anyhow::Result<(Platform, u64)> {
        let (_, doc) = Document::parse(&bytes)
            .map_err(|e| anyhow!("{image}: manifest {}: {e}", desc.digest))?;
        let Document::Manifest(manifest) = doc else {
            bail!(
                "{image}: {} is a nested index, which kiln does not support",
                desc.digest
            );
        };
        let platform = self.copy_config(image, &manifest, opts).await?;
        if let Some(p) = &desc.platform {
            if !p.matches(&platform) && !platform.matches(p) {
                bail!(
                    "{image}: index says {} is {p} but its config says {platform}",
                    desc.digest
                );
            }
        }
        settle(
            stream::iter(manifest.layers.iter())
                .map(|layer| self.copy_blob(image, layer, opts, progress))
                .buffer_unordered(manifest.layers.len().max(1))
                .collect()
                .await,
        )?;
        let children: Vec<Descriptor> = std::iter::once(manifest.config.clone())
            .chain(manifest.layers.iter().cloned())
            .collect();
        self.put_document(desc, bytes, &children)
            .await
            .with_context(|| format!("{image}: storing manifest {}", desc.digest))?;
        let size =
            desc.size + manifest.config.size + manifest.layers.iter().map(|l| l.size).sum::<u64>();
        Ok((platform, size))
    }

    /// Stores the config (from the sink if present) and reads its platform.
    async fn copy_config(
        &self,
        image: &ImageRef,
        manifest: &ImageManifest,
        opts: &CopyOptions,
    ) -> anyhow::Result<Platform> {
        let desc = &manifest.config;
        if desc.size > MAX_CONFIG_BYTES {
            bail!(
                "{image}: config {} is {} bytes, over the {MAX_CONFIG_BYTES}-byte limit",
                desc.digest,
                desc.size
            );
        }
        let (kept, cached) = match self.sink.read(&desc.digest).await? {
            Some(b) => (Some(b), false),
            None => (opts.cache.as_ref().and_then(|c| c.read(&desc.digest)), true),
        };
        let (bytes, cached) = match kept {
            Some(b) if verify_bytes(&desc.digest, desc.size, &b).is_ok() => (b, cached),
            _ => {
                let _permit = self.permits.acquire().await.expect("semaphore open");
                let chunks: Vec<Bytes> = verified(
                    self.source.blob(image, desc).await?,
                    desc,
                    Progress::hidden(),
                )
                .try_collect()
                .await
                .map_err(|e| anyhow!("{image}: config {}: {e:#}", desc.digest))?;
                let b = Bytes::from(chunks.concat());
                keep(opts, desc, &b).await;
                (b, false)
            }
        };
        // Counted as fetched only when the sink lacked it and took it.
        self.once(&desc.digest, || async {
            if self.sink.has(desc).await? {
                self.blobs_present.fetch_add(1, Ordering::Relaxed);
            } else {
                let n = twice(|| self.sink.put_bytes(desc, bytes.clone())).await?;
                if cached {
                    self.blobs_cached.fetch_add(1, Ordering::Relaxed);
                    self.bytes_cached.fetch_add(n, Ordering::Relaxed);
                } else {
                    self.count_fetch(n);
                }
            }
            Ok(())
        })
        .await
        .with_context(|| format!("{image}: storing config {}", desc.digest))?;
        let cfg: ImageConfigPlatform = serde_json::from_slice(&bytes).map_err(|e| {
            anyhow!(
                "{image}: config {} is not an image config: {e}",
                desc.digest
            )
        })?;
        Ok(cfg.platform())
    }

    /// Streams a layer into the sink unless present; each digest once per run.
    async fn copy_blob(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        opts: &CopyOptions,
        progress: &Progress,
    ) -> anyhow::Result<()> {
        self.once(&desc.digest, || async {
            if self.sink.has(desc).await? {
                self.blobs_present.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            let failed = |e: anyhow::Error| anyhow!("{image}: layer {}: {e:#}", desc.digest);
            if opts
                .absent
                .as_ref()
                .is_some_and(|a| a.contains(&desc.digest))
            {
                return self.sink.put_absent(desc).await.map_err(failed);
            }
            if let Some(entry) = opts.cache.as_ref().and_then(|c| c.get(desc)) {
                twice(|| self.sink.put_file(desc, &entry))
                    .await
                    .map_err(failed)?;
                self.blobs_cached.fetch_add(1, Ordering::Relaxed);
                self.bytes_cached.fetch_add(desc.size, Ordering::Relaxed);
                return Ok(());
            }
            let _permit = self.permits.acquire().await.expect("semaphore open");
            // Right before the bytes would be read: a sink that can take
            // the blob without them (a registry mounting it from another
            // repository) does, and none is read (a node image's reused
            // layers are not in its staging layout).
            if self.sink.take_without_bytes(desc).await? {
                return Ok(());
            }
            progress.add_total(desc.size);
            let open = || async {
                let stream = self
                    .source
                    .blob(image, desc)
                    .await
                    .with_context(|| format!("{image}: fetching layer {}", desc.digest))?;
                Ok::<_, anyhow::Error>(verified(stream, desc, progress.clone()))
            };
            // With a cache the bytes land there once, then are shared
            // into the sink (a link where it can).
            let n = match &opts.cache {
                Some(cache) => {
                    let entry = cache
                        .put_stream(desc, open().await?)
                        .await
                        .map_err(failed)?;
                    twice(|| self.sink.put_file(desc, &entry))
                        .await
                        .map_err(failed)?;
                    desc.size
                }
                None => twice(|| async { self.sink.put_stream(desc, open().await?).await })
                    .await
                    .map_err(failed)?,
            };
            self.count_fetch(n);
            crate::primitives::fault::point("blob-committed");
            Ok(())
        })
        .await
    }

    /// Runs `work` once per digest per run; concurrent callers for the same
    /// digest wait for the first, so shared blobs are written once.
    async fn once<F, Fut>(&self, digest: &Digest, work: F) -> anyhow::Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let cell = self
            .inflight
            .lock()
            .unwrap()
            .entry(digest.clone())
            .or_default()
            .clone();
        cell.get_or_try_init(work).await.map(|_| ())
    }

    async fn put_document(
        &self,
        desc: &Descriptor,
        bytes: Bytes,
        children: &[Descriptor],
    ) -> anyhow::Result<()> {
        self.once(&desc.digest, || async {
            self.sink
                .put_document(desc, bytes, children)
                .await
                .map(|_| ())
        })
        .await
    }

    fn count_fetch(&self, bytes: u64) {
        self.blobs_fetched.fetch_add(1, Ordering::Relaxed);
        self.bytes_fetched.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// The index entries that serve `platforms` (each once), or an error naming
/// the platform the index lacks and what it has.
fn choose_platforms(
    image: &ImageRef,
    index: &crate::primitives::oci::ImageIndex,
    platforms: &[Platform],
) -> anyhow::Result<Vec<Descriptor>> {
    let mut chosen: Vec<usize> = Vec::new();
    for want in platforms {
        match crate::primitives::oci::select_platform(&index.manifests, want) {
            Some(i) if !chosen.contains(&i) => chosen.push(i),
            Some(_) => {}
            None => {
                // An index whose entry for the platform is another index:
                // kiln does not follow nested indexes (no registry serves
                // them for images kubelet runs, and a chain of them is a
                // way to hold kiln), and says so rather than "none".
                if let Some(nested) = index.manifests.iter().find(|d| {
                    crate::primitives::oci::media::is_index(&d.media_type)
                        && d.platform.as_ref().is_none_or(|p| want.matches(p))
                }) {
                    bail!(
                        "{image}: its index names another index ({}) for {want}; nested indexes are not followed: name an image whose index lists manifests",
                        nested.digest
                    );
                }
                let have: Vec<String> = index.platforms().iter().map(ToString::to_string).collect();
                return Err(BadInput(format!("{image}: no {want} image in its index (it has: {}); build for platforms it has (--platform OS/ARCH, repeatable; default: this machine's) or use another image", have.join(", "))).into());
            }
        }
    }
    Ok(chosen
        .into_iter()
        .map(|i| index.manifests[i].clone())
        .collect())
}

/// Waits for every transfer before reporting the first failure: a blob that
/// fails for one image may be one another image is sharing and still needs,
/// so siblings are never cancelled halfway.
fn settle<T>(results: Vec<anyhow::Result<T>>) -> anyhow::Result<Vec<T>> {
    results.into_iter().collect()
}

/// Keeps a small verified blob (a manifest, a config) in the cache; a
/// cache that cannot take it costs only the next run a fetch.
/// Its fsyncs run on a blocking thread, not the runtime's.
async fn keep(opts: &CopyOptions, desc: &Descriptor, bytes: &Bytes) {
    if let Some(cache) = &opts.cache {
        let (cache, d, b) = (cache.clone(), desc.clone(), bytes.clone());
        let kept = tokio::task::spawn_blocking(move || cache.put_bytes(&d, &b)).await;
        if let Err(e) = kept.map_err(anyhow::Error::from).and_then(|r| r) {
            tracing::warn!(blob = %desc.digest, "not kept in the cache: {e:#}");
        }
    }
}

/// Runs `send`, and once more if the sink asks for the bytes again
/// ([`crate::primitives::error::SendAgain`]: it renewed what had expired).
async fn twice<F, Fut, T>(send: F) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    match send().await {
        Err(e) if e.is::<crate::primitives::error::SendAgain>() => {
            tracing::debug!("{e:#}");
            send().await.map_err(
                |e| match e.downcast::<crate::primitives::error::SendAgain>() {
                    Ok(again) => anyhow::anyhow!("{}: refused again after that", again.0),
                    Err(e) => e,
                },
            )
        }
        r => r,
    }
}

mod verified;
pub use verified::verified;
