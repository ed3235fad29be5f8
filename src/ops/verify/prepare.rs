//! The private copy a verify runs on, never the artifact: a rootfs's store
//! copied (or a node image unpacked, within the limits) into a work
//! directory, with the manifest the node recorded; kind's layout is read
//! there too (`--kind`).

use std::path::Path;

use anyhow::{bail, Context};

use super::store::rehash_store;
use super::{Node, NodeTarget, VerifyOptions};
use crate::adapters::rootfs;
use crate::domain::manifest::NodeManifest;
use crate::primitives::inroot::Root;
use crate::primitives::reference::ImageRef;
use crate::source::Source;

impl Node {
    pub(super) fn work_dir(&self) -> &Path {
        self._work.path()
    }
}

/// Copies (or unpacks) what verifying needs into a private directory.
pub(super) async fn prepare<S: Source>(
    target: NodeTarget<'_, S>,
    opts: &VerifyOptions,
) -> anyhow::Result<Node> {
    let work = crate::primitives::owned::work_dir("kiln-verify-")?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs)?;
    let mut base = None;
    let (node_containerd, kind, sysroot) = match target {
        NodeTarget::Rootfs(dir) => {
            let c = copy_rootfs(&dir, &rootfs)?;
            let kind = opts
                .kind
                .then(|| {
                    Root::open(&dir)
                        .map(|r| crate::domain::kind::contract::check(&r, &opts.platform, None))
                })
                .transpose()?;
            (c, kind, dir)
        }
        NodeTarget::Image { source, image } => {
            let (config, annotations) =
                unpack_image(source, &image, opts, work.path(), &rootfs).await?;
            base = annotations
                .get(crate::domain::node_image::BASE_DIGEST)
                .and_then(|d| crate::primitives::digest::Digest::parse(d).ok());
            // Before containerd opens it: a real directory at a path of real
            // directories (a symlinked /var would lead out of the copy), and
            // in it directories and regular files only.
            let root = Root::open(&rootfs)?;
            rootfs::check_store_tree(&root.owned_dir(Path::new(rootfs::STORE_DIR))?)?;
            let kind = opts.kind.then(|| {
                crate::domain::kind::contract::check(&root, &opts.platform, Some(&config))
            });
            (rootfs::node_containerd(&root), kind, rootfs.clone())
        }
    };
    let root = Root::open(&rootfs)?;
    let manifest = match &opts.manifest {
        Some(p) => {
            NodeManifest::load(p).map_err(|e| crate::primitives::error::BadInput(e.to_string()))?
        }
        None => {
            let rel = Path::new(crate::domain::manifest::MANIFEST_RECORD);
            let text = root.read(rel)?.ok_or_else(|| {
                crate::primitives::error::BadInput(format!(
                    "the node has no /{} (it was not built by kiln); pass --manifest FILE",
                    rel.display()
                ))
            })?;
            NodeManifest::parse(rel, &String::from_utf8_lossy(&text))
                .map_err(|e| crate::primitives::error::BadInput(e.to_string()))?
        }
    };
    let sandbox = match root.read(Path::new(rootfs::CONFIG_FILE))? {
        Some(t) => crate::domain::node_config::sandbox_image(&String::from_utf8_lossy(&t))
            .context("the node's config.toml")?,
        None => None,
    };
    // kiln's own containerd (--containerd, else on PATH); the node's own
    // binary only with --trust-node-binaries: it is code from the image.
    let containerd = rootfs::daemon_binary(&opts.daemon, node_containerd.as_ref())?;
    let store = Root::open(&rootfs)?.owned_dir(Path::new(rootfs::STORE_DIR))?;
    let rehashed = tokio::task::block_in_place(|| rehash_store(&store))?;
    Ok(Node {
        _work: work,
        files: sysroot.clone(),
        base,
        rootfs,
        containerd,
        own: node_containerd.map(|c| (c.path, sysroot)),
        manifest,
        sandbox,
        rehashed,
        kind,
    })
}

/// The store and the files verify reads, copied from a rootfs; returns the
/// host path of the node's own containerd binary.
fn copy_rootfs(dir: &Path, to: &Path) -> anyhow::Result<Option<rootfs::NodeContainerd>> {
    if !dir.is_dir() {
        return Err(crate::primitives::error::BadInput(format!(
            "--rootfs {} is not a directory",
            dir.display()
        ))
        .into());
    }
    let root = Root::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let store = Path::new(rootfs::STORE_DIR);
    root.check_owned(store)?;
    let from = dir.join(store);
    if !from.join(crate::domain::store::META_DB).is_file() {
        return Err(crate::primitives::error::BadInput(format!(
            "{} holds no containerd store ({}); build it first",
            dir.display(),
            from.display()
        ))
        .into());
    }
    rootfs::check_store_tree(&from)?;
    let dest = to.join(store);
    std::fs::create_dir_all(dest.parent().expect("has a parent"))?;
    let cp = std::process::Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(&from)
        .arg(&dest)
        .output()
        .context("running cp")?;
    if !cp.status.success() {
        bail!(
            "copying the store: {}",
            String::from_utf8_lossy(&cp.stderr).trim()
        );
    }
    let private = Root::open(to)?;
    for rel in [
        rootfs::CONFIG_FILE,
        crate::domain::manifest::MANIFEST_RECORD,
    ] {
        if let Some(bytes) = root.read(Path::new(rel))? {
            private.write(Path::new(rel), &bytes, 0o644)?;
        }
    }
    Ok(rootfs::node_containerd(&root))
}

/// The node image's layers for `platform`, applied in `rootfs`; returns its
/// config and its manifest's annotations.
async fn unpack_image<S: Source>(
    source: &S,
    image: &ImageRef,
    opts: &VerifyOptions,
    work: &Path,
    rootfs: &Path,
) -> anyhow::Result<(
    serde_json::Value,
    std::collections::BTreeMap<String, String>,
)> {
    // Verify unpacks the whole image, so the budget counts every path it
    // writes, not only the store and config a node-image build reads.
    fn everything(_: &Path) -> bool {
        true
    }
    let mut budget = crate::primitives::unpack::Budget::new(opts.limits, everything);
    let label = image.to_string();
    let (layout, m) =
        crate::ops::unpack::unpack_image(source, image, &opts.platform, 4, work, &label, |layer| {
            crate::primitives::unpack::apply_layer_guarded(
                rootfs,
                layer,
                crate::domain::node_image::tracked,
                &mut budget,
            )
        })
        .await?;
    let config = std::fs::read(layout.blob_path(&m.config.digest))?;
    let config = serde_json::from_slice(&config)
        .with_context(|| format!("{image}: its config is not JSON"))?;
    Ok((config, m.annotations))
}
