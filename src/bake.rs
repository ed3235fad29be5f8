//! Baking a node manifest into a rootfs: the private containerd, a lease,
//! the copy engine, a synchronous GC, and CRI's sandbox image in the node's
//! config. `kiln build --rootfs` is this; node-image builds run it per platform.

use std::path::Path;

use anyhow::Context;

use crate::copy::{CopiedImage, CopyOptions, Engine, Pinning, Stats};
use crate::daemon::{Daemon, DaemonOptions};
use crate::manifest::NodeManifest;
use crate::platform::Platform;
use crate::progress::Progress;
use crate::rootfs::{self, NodeContainerd};
use crate::sink::containerd::{ContainerdStore, K8S_NAMESPACE};
use crate::source::Source;

/// A rootfs's store opened through a private containerd, stopped on drop.
/// Connections to the private daemon that blob writes are spread over.
const WRITE_CONNECTIONS: usize = 4;

pub struct NodeStore {
    pub daemon: Daemon,
    pub store: ContainerdStore,
    pub node: Option<NodeContainerd>,
}

impl NodeStore {
    pub async fn open(rootfs: &Path, containerd: Option<&Path>) -> anyhow::Result<NodeStore> {
        let node = rootfs::node_containerd(rootfs);
        let binary = rootfs::daemon_binary(containerd, node.as_ref())?;
        let daemon = Daemon::start(
            &binary,
            &rootfs.join(rootfs::STORE_DIR),
            &DaemonOptions::default(),
        )
        .await?;
        if let Some(nv) = node.as_ref().and_then(|n| n.version) {
            // containerd 2.x migrates a 1.x store on open; 1.x cannot read a 2.x one.
            if daemon.version.major > nv.major {
                anyhow::bail!(
                    "{} is containerd {}, but the rootfs's containerd is {nv} and could not read a store it writes; pass --containerd with a {}.x binary",
                    binary.display(),
                    daemon.version,
                    nv.major
                );
            }
        }
        let mut writers = Vec::new();
        for _ in 0..WRITE_CONNECTIONS {
            writers.push(daemon.channel().await?);
        }
        let store =
            ContainerdStore::new(daemon.channel().await?, K8S_NAMESPACE).with_writers(writers);
        Ok(NodeStore {
            daemon,
            store,
            node,
        })
    }

    pub fn close(self) -> anyhow::Result<()> {
        self.daemon.stop()
    }
}

pub struct Baked {
    /// One result per manifest image, in order.
    pub results: Vec<anyhow::Result<CopiedImage>>,
    pub stats: Stats,
}

/// Copies `manifest`'s images for `platforms` into `rootfs`'s store, pinned,
/// and points CRI's sandbox image at the manifest's when that image made it.
pub async fn bake_rootfs<S: Source>(
    rootfs: &Path,
    containerd: Option<&Path>,
    source: &S,
    manifest: &NodeManifest,
    platforms: Vec<Platform>,
    jobs: usize,
    progress: Progress,
) -> anyhow::Result<Baked> {
    std::fs::create_dir_all(rootfs).with_context(|| format!("creating {}", rootfs.display()))?;
    let mut node = NodeStore::open(rootfs, containerd).await?;
    if let Some(w) = rootfs::pinning_warning(node.node.as_ref()) {
        tracing::warn!("{w}");
    }
    let opts = CopyOptions {
        platforms,
        pinning: Pinning::Pin,
        jobs,
    };
    // We own this daemon: whatever a killed run left is ours to clear.
    node.store.recover(true).await?;
    node.store.begin_lease("build").await?;
    let (results, stats) = {
        let engine = Engine::new(source, &node.store, jobs, progress);
        (
            engine.copy_all(&manifest.images, &opts).await,
            engine.stats(),
        )
    };
    // GC now, synchronously: what survives is exactly what the records keep.
    node.store.end_lease().await?;
    let node_version = node.node.as_ref().and_then(|n| n.version);
    let daemon_version = node.daemon.version;
    node.close()?;
    let sandbox_ok = manifest
        .images
        .iter()
        .zip(&results)
        .any(|(r, res)| *r == manifest.sandbox_image && res.is_ok());
    if sandbox_ok {
        let name = manifest
            .sandbox_image
            .tagged_name()
            .unwrap_or_else(|| manifest.sandbox_image.to_string());
        crate::node_config::write_sandbox_image(
            rootfs,
            &name,
            node_version.or(Some(daemon_version)),
        )?;
    }
    Ok(Baked { results, stats })
}
