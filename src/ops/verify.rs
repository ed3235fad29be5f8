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

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{ImageSpec, ImageStatusRequest, ListImagesRequest};
use serde::Serialize;

use crate::adapters::daemon::{Daemon, DaemonOptions};
use crate::adapters::rootfs;
use crate::domain::manifest::NodeManifest;
use crate::engine::closure::{self, Select};
use crate::engine::copy::{CopyOptions, Engine};
use crate::primitives::inroot::Root;
use crate::primitives::oci::{Descriptor, Document};
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::containerd::{ContainerdStore, K8S_NAMESPACE, LABEL_MANAGED, LABEL_PINNED};
use crate::sink::layout::OciLayout;
use crate::sink::Sink;
use crate::source::Source;

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
    rootfs: PathBuf,
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
        (Some(c), _) => kubelet_view(c, &store, node).await?,
        (None, why) => Check::not_run(KUBELET_VIEW, why.map(String::as_str).unwrap_or_default()),
    };
    let mut checks = vec![first, view, exact];
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
                Some(c) => after.push(kubelet_view(c, &store, node).await?),
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

/// CRI answers only once it has loaded the store (before, "not initialized").
pub async fn wait_for_cri(
    cri: &mut ImageServiceClient<tonic::transport::Channel>,
    daemon: &Daemon,
    within: std::time::Duration,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + within;
    loop {
        match cri.list_images(ListImagesRequest { filter: None }).await {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => bail!(
                "containerd did not answer over CRI: {}; its log: {}",
                e.message(),
                daemon.log_tail()
            ),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

/// Exactly the manifest pinned: no pin of kiln's (`io.kiln.pinned`) on a
/// record the manifest's images do not own; pins by others are returned.
async fn exactly_the_manifest(
    store: &ContainerdStore,
    manifest: &NodeManifest,
) -> anyhow::Result<(Check, Vec<String>)> {
    let mut owned = Vec::new();
    for image in &manifest.images {
        if let Some(n) = image.tagged_name() {
            if let Some(rec) = store.image_record(&n).await? {
                owned.push(image.digest_name(&rec.target.digest));
            }
            owned.push(n);
        }
        if let Some(d) = &image.digest {
            owned.push(image.digest_name(d));
        }
    }
    let (stale, others) = store.stale_pins(|n| owned.iter().any(|o| o == n)).await?;
    let details: Vec<String> = stale
        .iter()
        .map(|r| {
            format!(
                "{}: pinned by kiln but not in the manifest (a stale pin; rebuild to unpin it)",
                r.name
            )
        })
        .collect();
    Ok((
        Check {
            ran: true,
            name: "nothing but the manifest is pinned by kiln".into(),
            ok: details.is_empty(),
            details,
        },
        others,
    ))
}

/// What re-hashing the store's blob files found.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rehashed {
    pub blobs: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// One line per file whose bytes do not hash to its name.
    pub mismatched: Vec<String>,
}

/// Hashes every file under `blobs/sha256/` of the store against its name:
/// a store is trusted by its bytes, never by its records.
fn rehash_store(store_dir: &Path) -> anyhow::Result<Rehashed> {
    let started = std::time::Instant::now();
    let mut r = Rehashed::default();
    let dir = store_dir
        .join(crate::domain::store::CONTENT_DIR)
        .join("blobs/sha256");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(r),
        Err(e) => return Err(e.into()),
    };
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        r.bytes += e.metadata()?.len();
        let got = crate::sink::blobdir::hash_file(&e.path())?;
        r.blobs += 1;
        if got.hex() != name {
            r.mismatched.push(format!(
                "blob sha256:{name} ({}) holds bytes that hash to {got}",
                e.path().display()
            ));
        }
    }
    r.seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

/// What CRI's ImageStatus says of `name`, as kubelet asks it.
async fn cri_status(
    cri: &mut ImageServiceClient<tonic::transport::Channel>,
    name: &str,
) -> anyhow::Result<Option<k8s_cri::v1::Image>> {
    Ok(cri
        .image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: name.to_string(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .map_err(|s| anyhow!("CRI ImageStatus {name}: {}", s.message()))?
        .into_inner()
        .image)
}

/// Check 1: every image present, complete for the platform, managed and pinned.
async fn stored(
    store: &ContainerdStore,
    manifest: &NodeManifest,
    platform: &Platform,
) -> anyhow::Result<Check> {
    let mut details = Vec::new();
    for (image, pin) in manifest.images.iter().zip(&manifest.pinned) {
        let name = image.tagged_name().unwrap_or_else(|| image.to_string());
        let Some(rec) = store.image_record(&name).await? else {
            details.push(format!("{image}: no image record {name}"));
            continue;
        };
        let label = |l: &str| rec.labels.get(l).map(String::as_str);
        if label(LABEL_MANAGED) != Some("managed") {
            details.push(format!("{image}: recorded without {LABEL_MANAGED}=managed"));
        }
        match (pin, label(LABEL_PINNED)) {
            (true, Some("pinned")) | (false, None) => {}
            (true, _) => details.push(format!("{image}: recorded without {LABEL_PINNED}=pinned")),
            (false, Some(v)) => details.push(format!(
                "{image}: recorded with {LABEL_PINNED}={v}, but the manifest preloads it reclaimable (pinned: false)"
            )),
        }
        if let Some(pin) = &image.digest {
            if *pin != rec.target.digest {
                details.push(format!(
                    "{image}: recorded at {}, the manifest pins {pin}",
                    rec.target.digest
                ));
            }
        }
        let chosen = match platform_manifest(store, &rec.target, platform).await? {
            Ok(d) => d,
            Err(why) => {
                details.push(format!("{image}: {why}"));
                continue;
            }
        };
        let walk = closure::walk(store, &rec.target, Select::Only(&[chosen])).await?;
        details.extend(walk.holes.iter().map(|h| format!("{image}: {h}")));
    }
    Ok(Check::new(
        "every bundled image is present, complete and pinned (preloaded ones unpinned)",
        details,
    ))
}

/// The manifest `top` has for `platform` (itself for a single manifest).
async fn platform_manifest(
    store: &ContainerdStore,
    top: &Descriptor,
    platform: &Platform,
) -> anyhow::Result<Result<crate::primitives::digest::Digest, String>> {
    let Some(bytes) = store.read(&top.digest).await? else {
        return Ok(Err(format!(
            "its top-level document {} is missing",
            top.digest
        )));
    };
    Ok(match Document::parse(&bytes) {
        Ok((_, Document::Index(idx))) => {
            match crate::primitives::oci::select_platform(&idx.manifests, platform) {
                Some(i) => Ok(idx.manifests[i].digest.clone()),
                None => Err(format!("no {platform} manifest in its index")),
            }
        }
        Ok((_, Document::Manifest(_))) => Ok(top.digest.clone()),
        Err(e) => Err(format!("unreadable top-level document: {e}")),
    })
}

/// Check 2: what kubelet sees over CRI v1.
async fn kubelet_view(
    cri: &mut ImageServiceClient<tonic::transport::Channel>,
    store: &ContainerdStore,
    node: &Node,
) -> anyhow::Result<Check> {
    let mut details = Vec::new();
    for (image, pin) in node.manifest.images.iter().zip(&node.manifest.pinned) {
        let name = image.tagged_name().unwrap_or_else(|| image.to_string());
        let status = cri_status(cri, &name).await?;
        let Some(status) = status else {
            details.push(format!(
                "{image}: CRI does not report it (kubelet would pull it)"
            ));
            continue;
        };
        match (pin, status.pinned) {
            (true, false) => details.push(format!(
                "{image}: CRI reports pinned: false (kubelet's GC may delete it)"
            )),
            (false, true) => details.push(format!(
                "{image}: CRI reports pinned: true, but the manifest preloads it reclaimable (pinned: false; a pinned image sharing its config pins it too)"
            )),
            _ => {}
        }
        if let Some(rec) = store.image_record(&name).await? {
            let want = image.digest_name(&rec.target.digest);
            if !status.repo_digests.contains(&want) {
                details.push(format!(
                    "{image}: repoDigests {:?} lack {want}",
                    status.repo_digests
                ));
            }
        }
    }
    match &node.sandbox {
        None => details.push("the node's config.toml names no sandbox image".into()),
        Some(s) => {
            let bundled = ImageRef::parse(s).ok().is_some_and(|r| {
                node.manifest
                    .images
                    .iter()
                    .any(|i| i.name() == r.name() && (r.tag.is_none() || i.tag == r.tag))
            });
            if !bundled {
                details.push(format!(
                    "the sandbox image in config.toml, {s}, is not one of the bundled images: kubelet's first pod would pull it"
                ));
            }
        }
    }
    Ok(Check::new(KUBELET_VIEW, details))
}

async fn cri_images(
    cri: &mut ImageServiceClient<tonic::transport::Channel>,
    manifest: &NodeManifest,
) -> anyhow::Result<Vec<CriImage>> {
    let list = cri
        .list_images(ListImagesRequest { filter: None })
        .await
        .map_err(|s| anyhow!("CRI ListImages: {}", s.message()))?
        .into_inner()
        .images;
    let names: Vec<String> = manifest
        .images
        .iter()
        .filter_map(|i| i.tagged_name())
        .collect();
    Ok(list
        .into_iter()
        .map(|i| CriImage {
            bundled: i.repo_tags.iter().any(|t| names.contains(t)),
            repo_tags: i.repo_tags,
            repo_digests: i.repo_digests,
            pinned: i.pinned,
        })
        .collect())
}

/// `--kind`: every image kind's two manifests run, and kubeadm's image set
/// for `/kind/version`, reported pinned by CRI (after the GC above): what
/// kind's `kubectl create` and `kubeadm init` would otherwise pull.
async fn kind_images_pinned(
    cri: &mut ImageServiceClient<tonic::transport::Channel>,
    view: &crate::domain::kind::contract::KindView,
) -> anyhow::Result<Check> {
    let mut details = Vec::new();
    let mut wanted: Vec<(String, &str)> = view
        .addon_images
        .iter()
        .map(|i| (i.clone(), "kind's manifests run it"))
        .collect();
    if let Some(v) = &view.version {
        match crate::domain::kubeadm::images(v) {
            Some(set) => wanted.extend(
                set.iter()
                    .filter_map(|i| i.tagged_name())
                    .map(|n| (n, "kubeadm init pulls it")),
            ),
            None => {
                // Unknown minor: the four the release ships are still certain.
                wanted.extend(
                    crate::domain::kubeadm::control_plane(v)
                        .iter()
                        .filter_map(|i| i.tagged_name())
                        .map(|n| (n, "kubeadm init pulls it")),
                );
                details.push(format!(
                    "note: kiln's kubeadm table does not know {v}; pause, etcd and coredns were not checked (known: {})",
                    crate::domain::kubeadm::known().join(", ")
                ));
            }
        }
    }
    let mut failed = false;
    for (name, why) in wanted {
        let status = cri_status(cri, &name).await?;
        match status {
            None => {
                failed = true;
                details.push(format!(
                    "{name}: not bundled ({why}; the node would pull it)"
                ));
            }
            Some(s) if !s.pinned => {
                failed = true;
                details.push(format!("{name}: bundled but not pinned ({why})"));
            }
            Some(_) => {}
        }
    }
    Ok(Check {
        name: KIND_IMAGES.into(),
        ok: !failed,
        ran: true,
        details,
    })
}

/// `--start` runs containers: root and runc, or one line saying what is missing.
fn start_prerequisites() -> anyhow::Result<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        bail!("--start runs containers and needs root; run as root or drop --start");
    }
    runc().ok_or_else(|| {
        anyhow!("--start needs runc (e.g. apt-get install runc); none at /usr/sbin or /usr/bin")
    })
}

/// The system's runc, if installed where Debian puts it.
pub fn runc() -> Option<PathBuf> {
    ["/usr/sbin/runc", "/usr/bin/runc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Whether `--start` can run here: root, and runc installed.
pub fn can_start() -> bool {
    rustix::process::geteuid().is_root() && runc().is_some()
}

impl Node {
    fn work_dir(&self) -> &Path {
        self._work.path()
    }
}

/// Copies (or unpacks) what verifying needs into a private directory.
async fn prepare<S: Source>(
    target: NodeTarget<'_, S>,
    opts: &VerifyOptions,
) -> anyhow::Result<Node> {
    let work = tempfile::Builder::new().prefix("kiln-verify-").tempdir()?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs)?;
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
            let config = unpack_image(source, &image, opts, work.path(), &rootfs).await?;
            // Before containerd opens it: directories and regular files only.
            rootfs::check_store_tree(&rootfs.join(rootfs::STORE_DIR))?;
            let root = Root::open(&rootfs)?;
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
    let rehashed = tokio::task::block_in_place(|| rehash_store(&rootfs.join(rootfs::STORE_DIR)))?;
    Ok(Node {
        _work: work,
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
/// config.
async fn unpack_image<S: Source>(
    source: &S,
    image: &ImageRef,
    opts: &VerifyOptions,
    work: &Path,
    rootfs: &Path,
) -> anyhow::Result<serde_json::Value> {
    let platform = &opts.platform;
    let mut budget =
        crate::primitives::unpack::Budget::new(opts.limits, crate::domain::node_image::tracked);
    let layout = OciLayout::open(&work.join("layout"))?;
    let copied = Engine::new(source, &layout, 4, Progress::hidden())
        .copy(
            image,
            &CopyOptions {
                platforms: vec![platform.clone()],
                jobs: 4,
            },
        )
        .await?;
    let manifest = copied
        .manifests
        .first()
        .ok_or_else(|| anyhow!("{image}: no {platform} manifest"))?;
    let bytes = std::fs::read(layout.blob_path(manifest))?;
    let Ok((_, Document::Manifest(m))) = Document::parse(&bytes) else {
        bail!("{image}: its {platform} manifest is unreadable");
    };
    for l in &m.layers {
        crate::primitives::unpack::apply_layer_guarded(
            rootfs,
            &layout.blob_path(&l.digest),
            crate::domain::node_image::tracked,
            &mut budget,
        )
        .with_context(|| format!("unpacking layer {}", l.digest))?;
    }
    let config = std::fs::read(layout.blob_path(&m.config.digest))?;
    serde_json::from_slice(&config).with_context(|| format!("{image}: its config is not JSON"))
}
