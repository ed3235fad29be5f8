//! `kiln load`: user images into a node's store (a rootfs, or a running
//! containerd), managed but never pinned.

use std::path::PathBuf;

use anyhow::anyhow;
use serde::Serialize;

use crate::adapters::rootfs::DaemonChoice;
use crate::domain::store::{copy_into_store, NodeStore};
use crate::engine::copy::CopyOptions;
use crate::engine::report::Failed;
use crate::engine::report::{CopiedImage, Stats};
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::containerd::{ContainerdStore, PinPolicy};
use crate::source::Source;

/// Whose store receives the images.
pub enum LoadTarget {
    /// A rootfs, through a private containerd kiln runs.
    Rootfs(PathBuf, DaemonChoice),
    /// A running containerd's socket, in this namespace.
    Address(PathBuf, String),
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadReport {
    pub images: Vec<CopiedImage>,
    pub failed: Vec<Failed>,
    pub stats: Stats,
}

/// Loads `refs` from `source`: managed, unpinned; a bundled image's name is
/// taken over only with `force` (and then stays pinned).
pub async fn load<S: Source>(
    target: &LoadTarget,
    source: &S,
    refs: &[ImageRef],
    opts: &CopyOptions,
    force: bool,
    progress: Progress,
) -> anyhow::Result<LoadReport> {
    let (store, node) = match target {
        LoadTarget::Rootfs(rootfs, choice) => {
            let node = NodeStore::open(rootfs, choice).await?;
            (node.store.clone(), Some(node))
        }
        LoadTarget::Address(socket, namespace) => {
            let channel = containerd_client::connect(socket).await.map_err(|e| {
                anyhow!(
                    "cannot reach containerd at {}: {e}; is it running, and may you use its socket?",
                    socket.display()
                )
            })?;
            (ContainerdStore::new(channel, namespace), None)
        }
    };
    let mut store = store.with_policy(PinPolicy::Unpinned { force });
    // Ingests are only ours to abort when we run the daemon.
    let outcome = copy_into_store(&mut store, node.is_some(), source, refs, opts, progress).await;
    if let Some(node) = node {
        node.close_written()?;
    }
    let (results, stats) = outcome?;
    let (images, failed) = crate::engine::report::split(refs, results);
    Ok(LoadReport {
        images,
        failed,
        stats,
    })
}
