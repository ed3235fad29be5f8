//! `kiln verify`: does a node keep its images the way kubelet needs, with no
//! network? Runs on a private copy (never the artifact): every bundled image
//! present, complete for the platform and labelled; the kubelet's view over
//! CRI v1 from the node's own containerd (pinned, repoDigests, the sandbox
//! image the node's config names); and all of it again after a synchronous
//! GC. It runs kiln's containerd (`--containerd`, else on PATH); the node's
//! own binary only with `--trust-node-binaries`, as code from an image.
//!
//! CRI lists only images of its own platform, so a host's containerd cannot
//! show the kubelet's view of another platform's node. For a foreign
//! platform the node's own containerd runs under user-mode emulation
//! (`qemu-ARCH -L ROOTFS`, no binfmt, nothing system-wide) when the user
//! consents (`--trust-node-binaries`) and qemu is there; otherwise the
//! store-level checks run with kiln's containerd and the CRI checks are
//! reported as not run, with the reason: never a false FAIL, never a
//! plain ok for what was not checked.
//!
//! The rooms: `prepare` (the private copy), `store` (the store's view),
//! `cri` (the kubelet's view), `kubelet` (what the kubelet itself keeps of
//! images: no image-manager state); the order of the checks is here.

mod cri;
mod kubelet;
mod prepare;
mod store;

pub use cri::{can_start, runc, wait_for_cri};
pub use store::Rehashed;

use std::path::PathBuf;

use k8s_cri::v1::image_service_client::ImageServiceClient;
use serde::Serialize;

use crate::adapters::daemon::{Daemon, DaemonOptions};
use crate::adapters::rootfs;
use crate::domain::manifest::NodeManifest;
use crate::primitives::platform::Platform;
use crate::primitives::reference::ImageRef;
use crate::sink::containerd::{ContainerdStore, K8S_NAMESPACE};
use crate::source::Source;
use cri::{cri_images, kind_images_pinned, kubelet_view, start_prerequisites};
use prepare::prepare;
use store::{exactly_the_manifest, holds_the_lock, stored};

/// The node to verify.
pub enum NodeTarget<'a, S> {
    /// An unpacked node rootfs (its store is copied, never touched).
    Rootfs(PathBuf),
    /// A node image, from an archive or a registry: unpacked privately.
    Image { source: &'a S, image: ImageRef },
}

// By hand: `S` is only borrowed, so no `S: Clone` is needed.
impl<S> Clone for NodeTarget<'_, S> {
    fn clone(&self) -> Self {
        match self {
            NodeTarget::Rootfs(p) => NodeTarget::Rootfs(p.clone()),
            NodeTarget::Image { source, image } => NodeTarget::Image {
                source,
                image: image.clone(),
            },
        }
    }
}

pub struct VerifyOptions {
    /// The manifest to hold the node to; default: the one kiln recorded in it.
    pub manifest: Option<PathBuf>,
    pub platform: Platform,
    /// The containerd that reads the private copy: `--containerd`, else the
    /// node's own with `--trust-node-binaries`, else `containerd` on PATH.
    pub daemon: rootfs::DaemonChoice,
    /// Also start the control plane the way kubelet does for static pods,
    /// offline (root and runc needed).
    pub start: bool,
    /// Also read the node the way `kind create cluster` does
    /// ([`crate::domain::kind::contract`]).
    pub kind: bool,
    /// What an image may put under what kiln unpacks from it.
    pub limits: crate::primitives::unpack::Limits,
    /// `--qemu PATH`: the user-mode emulator for a foreign platform
    /// (default: `qemu-ARCH`, then `qemu-ARCH-static`, on PATH).
    pub qemu: Option<PathBuf>,
    /// `--lock FILE`: also hold the node to the lock it was built from.
    pub lock: Option<crate::domain::lockfile::Lock>,
}

pub use super::check::Check;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub containerd: String,
    pub platform: String,
    pub checks: Vec<Check>,
    /// The kubelet's view of every image the node holds.
    pub images: Vec<CriImage>,
    /// Every blob file of the store re-hashed against its name.
    pub rehashed: Rehashed,
    /// What the reader must know to read the checks (a containerd that
    /// predates pinning).
    pub warnings: Vec<String>,
    /// Pins someone other than kiln made on images the manifest does not
    /// name (a note, not a failure).
    pub pinned_by_others: Vec<String>,
    /// What kind would read (`--kind`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<crate::domain::kind::contract::KindView>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// Checks that ran and failed.
    pub fn failed(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.ran && !c.ok)
    }

    /// Checks that could not run here.
    pub fn not_run(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.ran)
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CriImage {
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub pinned: bool,
    /// Named by the manifest (else: loaded later, e.g. with `kiln load`).
    pub bundled: bool,
}

/// The node's files kiln needs, copied into a private work directory.
struct Node {
    _work: tempfile::TempDir,
    /// The private copy containerd runs on.
    rootfs: PathBuf,
    /// Where the node's other files are read: the rootfs given, or the
    /// image unpacked.
    files: PathBuf,
    /// The base a node image says it was built on
    /// (`org.opencontainers.image.base.digest`).
    base: Option<crate::primitives::digest::Digest>,
    containerd: PathBuf,
    /// The node's own containerd, and the root its libraries are found in
    /// (for emulation).
    own: Option<(PathBuf, PathBuf)>,
    manifest: NodeManifest,
    sandbox: Option<String>,
    /// The store's blob files, re-hashed before containerd starts.
    rehashed: Rehashed,
    /// kind's view of the node, read before anything runs (`--kind`).
    kind: Option<crate::domain::kind::contract::KindView>,
}

/// The platforms a node image holds, each to be verified on its own: an
/// index's entries (attestations aside), or `None` for a single manifest
/// (its one platform is whatever `--platform` says, the host's by default).
pub async fn image_platforms<S: Source>(
    source: &S,
    image: &ImageRef,
) -> anyhow::Result<Option<Vec<Platform>>> {
    let top = source.resolve(image).await?;
    let (_, doc) = crate::primitives::oci::Document::parse(&top.bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", source.describe(image)))?;
    Ok(match doc {
        crate::primitives::oci::Document::Index(i) => Some(i.platforms()),
        crate::primitives::oci::Document::Manifest(_) => None,
    })
}

pub async fn verify<S: Source>(
    target: NodeTarget<'_, S>,
    opts: &VerifyOptions,
) -> anyhow::Result<VerifyReport> {
    let runc = if opts.start {
        Some(start_prerequisites()?)
    } else {
        None
    };
    let node = prepare(target, opts).await?;
    let (binary, emulator, cri) = if opts.platform.runs_on_host() {
        (node.containerd.clone(), None, Ok(()))
    } else {
        match emulation(&node, opts) {
            Ok(e) => (node.own.clone().expect("checked").0, Some(e), Ok(())),
            Err(why) => (node.containerd.clone(), None, Err(why)),
        }
    };
    let daemon = Daemon::start(
        &binary,
        &node.rootfs.join(rootfs::STORE_DIR),
        &DaemonOptions {
            cri: cri.is_ok(),
            sandbox_image: node.sandbox.clone(),
            runc: runc.filter(|_| opts.platform.runs_on_host()),
            emulator: emulator.clone(),
        },
    )
    .await?;
    let result = run_checks(&node, &daemon, opts, cri.as_ref().err()).await;
    let version = daemon.version;
    daemon.stop()?;
    let (checks, images, pinned_by_others) = result?;
    let mut warnings = Vec::new();
    if !version.honours_pinned_label() {
        // Its CRI reports no image as pinned whatever the labels say: the
        // kubelet-view failures that follow are about it, not the node.
        warnings.push(format!(
            "containerd {version} predates pinning (1.6.22+, 1.7.3+): its CRI reports every image as unpinned; verify with a newer one (--containerd PATH)"
        ));
    } else if !version.pins_reliably() {
        warnings.push(format!(
            "containerd {version} pins by label only unreliably (fixed in 1.6.25, 1.7.10)"
        ));
    }
    let containerd = match &emulator {
        Some(e) => format!(
            "{} (the node's /{}, under {})",
            version,
            binary.strip_prefix(&e.sysroot).unwrap_or(&binary).display(),
            e.qemu.display()
        ),
        None => format!("{} ({})", version, binary.display()),
    };
    Ok(VerifyReport {
        containerd,
        platform: opts.platform.to_string(),
        checks,
        images,
        pinned_by_others,
        rehashed: node.rehashed.clone(),
        warnings,
        kind: node.kind,
    })
}

/// The node's own containerd for a foreign platform under user-mode
/// emulation, or why it cannot run (and what to pass).
fn emulation(
    node: &Node,
    opts: &VerifyOptions,
) -> Result<crate::adapters::daemon::Emulator, String> {
    let platform = &opts.platform;
    let not_run = |why: String| format!("not run for {platform}: {why}");
    if !opts.daemon.trust_node_binaries {
        return Err(not_run(
            "this machine's containerd lists only its own platform's images over CRI; \
             pass --trust-node-binaries to run the node's own containerd under user-mode \
             emulation (code from the image, run as you)"
                .into(),
        ));
    }
    let Some((own, sysroot)) = &node.own else {
        return Err(not_run("the node has no containerd binary to run".into()));
    };
    // Its header only (a containerd binary is tens of MiB).
    let arch = std::fs::File::open(own)
        .and_then(|mut f| crate::primitives::platform::read_architecture(&mut f))
        .ok()
        .flatten();
    if arch.as_deref() != Some(platform.architecture.as_str()) {
        return Err(not_run(format!(
            "the node's containerd ({}) is built for {}, not {}",
            own.display(),
            arch.as_deref().unwrap_or("no known architecture"),
            platform.architecture
        )));
    }
    let qemu =
        crate::adapters::daemon::find_qemu(platform, opts.qemu.as_deref()).map_err(not_run)?;
    Ok(crate::adapters::daemon::Emulator {
        qemu,
        sysroot: sysroot.clone(),
    })
}

const KUBELET_VIEW: &str =
    "the kubelet sees every bundled image, pinned as the manifest says (CRI v1)";
const KIND_IMAGES: &str =
    "every image kind's manifests and kubeadm run is bundled and pinned (CRI v1)";
use super::check::START;

/// `no_cri`: why the kubelet's view cannot be read here (those checks are
/// reported as not run).
async fn run_checks(
    node: &Node,
    daemon: &Daemon,
    opts: &VerifyOptions,
    no_cri: Option<&String>,
) -> anyhow::Result<(Vec<Check>, Vec<CriImage>, Vec<String>)> {
    let store = ContainerdStore::new(daemon.channel().await?, K8S_NAMESPACE);
    let mut cri = match no_cri {
        None => {
            let mut c = ImageServiceClient::new(daemon.channel().await?);
            // Under emulation CRI loads the store several times slower.
            let within = if daemon.emulated() { 300 } else { 60 };
            wait_for_cri(&mut c, daemon, std::time::Duration::from_secs(within)).await?;
            Some(c)
        }
        Some(_) => None,
    };
    let (exact, pinned_by_others) = exactly_the_manifest(&store, &node.manifest).await?;
    let mut first = stored(&store, &node.manifest, &opts.platform).await?;
    if !node.rehashed.mismatched.is_empty() {
        first.ok = false;
        first
            .details
            .extend(node.rehashed.mismatched.iter().cloned());
    }
    let view = match (&mut cri, no_cri) {
        (Some(c), _) => {
            let (check, ids) = kubelet_view(c, &store, node).await?;
            (check, Some(ids))
        }
        (None, why) => (
            Check::not_run(KUBELET_VIEW, why.map(String::as_str).unwrap_or_default()),
            None,
        ),
    };
    let (view, ids) = view;
    let mut checks = vec![
        first,
        view,
        exact,
        kubelet::check(
            &node.files,
            &node.manifest,
            ids.as_ref(),
            node.sandbox.as_deref(),
        )?,
    ];
    if let Some(lock) = &opts.lock {
        checks.push(holds_the_lock(&store, node, lock, &opts.platform).await?);
    }
    // GC safety: a synchronous GC, then everything above again.
    let sandbox_target = node
        .manifest
        .images
        .iter()
        .find(|i| **i == node.manifest.sandbox_image)
        .and_then(|i| i.tagged_name());
    let probe = match sandbox_target {
        Some(n) => store.image_record(&n).await?.map(|r| r.target),
        None => None,
    };
    let mut gc = Check::new("survives a synchronous GC", vec![]);
    match probe {
        Some(target) => {
            store.gc_now(&target).await?;
            let mut after = vec![stored(&store, &node.manifest, &opts.platform).await?];
            match &mut cri {
                Some(c) => after.push(kubelet_view(c, &store, node).await?.0),
                // The store after GC is checked in full; only CRI's view of
                // it is not (said, so the ok is not read as more).
                None => gc.details.push(
                    "the store checked after GC; the kubelet's view not (CRI not run)".into(),
                ),
            }
            for c in after {
                if !c.ok {
                    gc.ok = false;
                    gc.details
                        .extend(c.details.iter().map(|d| format!("after GC: {d}")));
                }
            }
        }
        None => {
            gc.ok = false;
            gc.details
                .push("no sandbox image record to run GC against".into());
        }
    }
    checks.push(gc);
    if let Some(view) = &node.kind {
        checks.push(Check::new(
            "kind create cluster reads the node as kind's own (--kind)",
            view.problems.iter().map(|p| p.to_string()).collect(),
        ));
        checks.push(match (&mut cri, no_cri) {
            (Some(c), _) => kind_images_pinned(c, view).await?,
            (None, why) => Check::not_run(KIND_IMAGES, why.map(String::as_str).unwrap_or_default()),
        });
    }
    if opts.start {
        checks.push(match &mut cri {
            Some(_) if opts.platform.runs_on_host() => {
                crate::ops::start::control_plane(daemon, node.work_dir(), &node.manifest).await?
            }
            _ => Check::not_run(
                START,
                &format!(
                    "not run for {}: runc here runs only {} binaries",
                    opts.platform,
                    Platform::host()
                ),
            ),
        });
    }
    let images = match &mut cri {
        Some(c) => cri_images(c, &node.manifest).await?,
        None => vec![],
    };
    Ok((checks, images, pinned_by_others))
}
