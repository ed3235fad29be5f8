//! A rootfs's containerd store, opened through a private containerd, and
//! the one way images are copied into a containerd store: under a lease,
//! ended by a synchronous GC, then walked for completeness.

use std::path::Path;

use anyhow::Context;

use crate::adapters::daemon::{Daemon, DaemonOptions};
use crate::adapters::rootfs::{self, DaemonChoice, NodeContainerd};
use crate::engine::closure::{self, Select};
use crate::engine::copy::{CopyOptions, Engine};
use crate::engine::report::{CopiedImage, Stats};
use crate::primitives::inroot::Root;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::containerd::{
    ContainerdStore, PinPolicy, K8S_NAMESPACE, LABEL_MANAGED, LABEL_PINNED,
};

use crate::source::Source;

pub use crate::adapters::rootfs::META_DB;
/// containerd's content store directory, under the store directory.
pub const CONTENT_DIR: &str = "io.containerd.content.v1.content";
/// The stamps of blob files whose bytes kiln proved (rootfs-relative; beside
/// the store, never in it nor in a node image's layer). A base cannot forge
/// one: a stamp holds the file's inode and change time.
pub const PROVEN_RECORD: &str = "var/lib/.kiln-proven-blobs.json";

/// A rootfs's store opened through a private containerd, stopped on drop.
/// Connections to the private daemon that blob writes are spread over.
const WRITE_CONNECTIONS: usize = 4;

pub struct NodeStore {
    pub daemon: Daemon,
    pub store: ContainerdStore,
    pub node: Option<NodeContainerd>,
    /// The store's directory (`var/lib/containerd`), checked.
    store_dir: std::path::PathBuf,
    /// One kiln per store, until this is dropped.
    _lock: crate::adapters::storelock::StoreLock,
    rootfs: std::path::PathBuf,
}

impl NodeStore {
    /// Opens `rootfs`'s store: its own paths checked (no symlinks where kiln
    /// or containerd write), the daemon chosen without running anything from
    /// the rootfs unless trusted, and never a newer major than the node's.
    pub async fn open(rootfs: &Path, choice: &DaemonChoice) -> anyhow::Result<NodeStore> {
        NodeStore::open_as(rootfs, choice, None).await
    }

    /// [`NodeStore::open`], with the node's containerd as already known
    /// (`known`: a node-image extract that left its binary out, noting its
    /// version), not read from the rootfs.
    pub async fn open_as(
        rootfs: &Path,
        choice: &DaemonChoice,
        known: Option<NodeContainerd>,
    ) -> anyhow::Result<NodeStore> {
        let root = Root::open(rootfs).with_context(|| format!("opening {}", rootfs.display()))?;
        let node = known.or_else(|| rootfs::node_containerd(&root));
        let store_dir = root.owned_dir(Path::new(rootfs::STORE_DIR))?;
        rootfs::check_store_tree(&store_dir)?;
        let lock = crate::adapters::storelock::StoreLock::take(&store_dir, rootfs, choice.no_wait)?;
        let binary = rootfs::daemon_binary(choice, node.as_ref())?;
        if let Some(nv) = node.as_ref().and_then(|n| n.version.as_ref().ok()) {
            let dv = crate::adapters::version::Version::of_binary(&binary)?;
            // containerd 2.x migrates a 1.x store on open; 1.x cannot read a 2.x one.
            if dv.major > nv.major {
                anyhow::bail!(
                    "{} is containerd {dv}, but the rootfs's containerd is {nv} and could not read a store it writes; pass --containerd with a {}.x binary",
                    binary.display(),
                    nv.major
                );
            }
        }
        let daemon = Daemon::start(&binary, &store_dir, &DaemonOptions::default()).await?;
        crate::primitives::fault::set_daemon(daemon.pid().map_or(0, |p| p as i32));
        let mut writers = Vec::new();
        for _ in 0..WRITE_CONNECTIONS {
            writers.push(daemon.channel().await?);
        }
        // Blobs go straight into the store's directory: this daemon is
        // kiln's, with GC on request only. What a killed run left there is
        // cleared first.
        let proven = root
            .read(Path::new(PROVEN_RECORD))
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let blobs =
            crate::sink::blobdir::BlobDir::new(&store_dir.join(CONTENT_DIR)).with_proven(proven);
        blobs.clear()?;
        let store = ContainerdStore::new(daemon.channel().await?, K8S_NAMESPACE)
            .with_writers(writers)
            .with_direct(blobs);
        Ok(NodeStore {
            daemon,
            store,
            node,
            store_dir,
            _lock: lock,
            rootfs: rootfs.to_path_buf(),
        })
    }

    pub fn close(self) -> anyhow::Result<()> {
        self.daemon.stop()?;
        crate::sink::blobdir::BlobDir::new(&self.store_dir.join(CONTENT_DIR)).clear()?;
        Ok(())
    }

    /// Closes a store kiln wrote to. With SOURCE_DATE_EPOCH set, containerd's
    /// metadata database is then made canonical (record times from it, a
    /// layout that depends only on the contents), so the same inputs give
    /// the same bytes: see [`crate::adapters::bolt`].
    pub fn close_written(self) -> anyhow::Result<()> {
        let meta = self.store_dir.join(META_DB);
        let proven = self.store.proven();
        let rootfs = self.rootfs.clone();
        self.close()?;
        if let Some(p) = proven {
            // For the next run's no-op check; losing it only costs a re-hash.
            let root = Root::open(&rootfs)?;
            root.write(Path::new(PROVEN_RECORD), &serde_json::to_vec(&p)?, 0o644)?;
        }
        if let Some(epoch) = crate::primitives::epoch::source_date_epoch()? {
            crate::adapters::bolt::canonicalize(&meta, epoch)
                .context("making containerd's metadata database canonical")?;
        }
        Ok(())
    }
}

/// Copies `images` into a containerd store under a lease, runs the final
/// synchronous GC, then walks every record it wrote: an image with a hole
/// is copied once more, and fails naming the blob if the hole stays. So an
/// `Ok` result is an image whose records exist and whose whole closure is
/// present and kept by GC labels. `own_daemon`: kiln runs this daemon, so
/// every kiln ingest left in it is stale.
pub async fn copy_into_store<S: Source>(
    store: &mut ContainerdStore,
    own_daemon: bool,
    source: &S,
    images: &[ImageRef],
    opts: &CopyOptions,
    progress: Progress,
) -> anyhow::Result<(Vec<anyhow::Result<CopiedImage>>, Stats)> {
    store.recover(own_daemon).await?;
    let purpose = match store.policy() {
        PinPolicy::Pin | PinPolicy::Preload => "build",
        PinPolicy::Unpinned { .. } => "load",
    };
    let (mut results, mut stats) =
        copy_leased(store, purpose, source, images, opts, progress.clone()).await?;
    crate::primitives::fault::point("after-gc");
    let mut holes = Vec::new();
    for (i, r) in results.iter().enumerate() {
        if let Ok(c) = r {
            if let Some(h) = check_stored(store, c).await? {
                tracing::warn!(image = %images[i], "{h}; copying it again");
                holes.push(i);
            }
        }
    }
    if !holes.is_empty() {
        let again: Vec<ImageRef> = holes.iter().map(|&i| images[i].clone()).collect();
        let (retried, more) = copy_leased(store, purpose, source, &again, opts, progress).await?;
        stats.add(&more);
        for (i, r) in holes.into_iter().zip(retried) {
            results[i] = match r {
                Ok(c) => match check_stored(store, &c).await? {
                    None => Ok(c),
                    Some(h) => Err(anyhow::anyhow!(
                        "{}: incomplete in the store even after copying it again: {h}",
                        images[i]
                    )),
                },
                Err(e) => Err(e),
            };
        }
    }
    Ok((results, stats))
}

/// One leased pass of the copy engine, ended by a synchronous GC.
async fn copy_leased<S: Source>(
    store: &mut ContainerdStore,
    purpose: &str,
    source: &S,
    images: &[ImageRef],
    opts: &CopyOptions,
    progress: Progress,
) -> anyhow::Result<(Vec<anyhow::Result<CopiedImage>>, Stats)> {
    store.begin_lease(purpose).await?;
    let (results, stats) = {
        let engine = Engine::new(source, &*store, opts.jobs, progress);
        (engine.copy_all(images, opts).await, engine.stats())
    };
    crate::primitives::fault::point("before-gc");
    // GC now, synchronously: what survives is exactly what the records keep.
    store.end_lease().await?;
    Ok((results, stats))
}

/// What is wrong with a copied image as the store now holds it, if anything:
/// each record present, aimed at the image, labelled as `pinning` says, and
/// the closure of the copied platforms whole and kept.
async fn check_stored(store: &ContainerdStore, c: &CopiedImage) -> anyhow::Result<Option<String>> {
    for name in &c.records {
        let Some(rec) = store.image_record(name).await? else {
            return Ok(Some(format!("record {name} is missing")));
        };
        if rec.target.digest != c.digest {
            return Ok(Some(format!(
                "record {name} points at {}, not {}",
                rec.target.digest, c.digest
            )));
        }
        let label = |k: &str, v: &str| rec.labels.get(k).is_some_and(|x| x == v);
        if !label(LABEL_MANAGED, "managed") {
            return Ok(Some(format!("record {name} lacks {LABEL_MANAGED}=managed")));
        }
        if store.policy() == PinPolicy::Pin && !label(LABEL_PINNED, "pinned") {
            return Ok(Some(format!("record {name} lacks {LABEL_PINNED}=pinned")));
        }
    }
    let walk = closure::walk(store, &c.top, Select::Only(&c.manifests)).await?;
    Ok(walk.holes.first().map(|h| h.to_string()))
}
