//! The kubelet's view over CRI v1 from the node's containerd: each bundled
//! image listed, pinned as the manifest says, with its repo digests; the
//! images kind's manifests and kubeadm run; and what `--start` needs.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{ImageSpec, ImageStatusRequest, ListImagesRequest};

use super::{Check, CriImage, Node, KIND_IMAGES, KUBELET_VIEW};
use crate::adapters::daemon::Daemon;
use crate::domain::manifest::NodeManifest;
use crate::primitives::reference::ImageRef;
use crate::sink::containerd::ContainerdStore;

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

/// Check 2: what kubelet sees over CRI v1.
/// The CRI id of each bundled image CRI reports, by its tagged name (what
/// the kubelet's pull records are keyed by).
pub(super) type CriIds = std::collections::BTreeMap<String, String>;

/// The kubelet's view of the bundled images; with the CRI ids it read.
pub(super) async fn kubelet_view(
    cri: &mut ImageServiceClient<tonic::transport::Channel>,
    store: &ContainerdStore,
    node: &Node,
) -> anyhow::Result<(Check, CriIds)> {
    let mut details = Vec::new();
    let mut ids = CriIds::new();
    for (image, pin) in node.manifest.images.iter().zip(&node.manifest.pinned) {
        let name = image.tagged_name().unwrap_or_else(|| image.to_string());
        let status = cri_status(cri, &name).await?;
        let Some(status) = status else {
            details.push(format!(
                "{image}: CRI does not report it (kubelet would pull it)"
            ));
            continue;
        };
        ids.insert(name.clone(), status.id.clone());
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
    Ok((Check::new(KUBELET_VIEW, details), ids))
}

pub(super) async fn cri_images(
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
pub(super) async fn kind_images_pinned(
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
        match crate::domain::kubeadm::images(v)? {
            Some(set) => wanted.extend(
                set.iter()
                    .filter_map(|i| i.tagged_name())
                    .map(|n| (n, "kubeadm init pulls it")),
            ),
            None => {
                // Unknown minor: the four the release ships are still certain.
                wanted.extend(
                    crate::domain::kubeadm::control_plane(v)?
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
pub(super) fn start_prerequisites() -> anyhow::Result<PathBuf> {
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
