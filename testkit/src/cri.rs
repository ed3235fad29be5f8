//! The kubelet's view of a rootfs: containerd with its CRI plugin on, asked
//! through CRI v1 `ListImages` / `ImageStatus`, plus `ctr` for GC and checks.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::Context;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{Image, ImageSpec, ImageStatusRequest, ListImagesRequest, RemoveImageRequest};
use kiln::adapters::daemon::{Daemon, DaemonOptions};

pub struct CriNode {
    daemon: Option<Daemon>,
    client: ImageServiceClient<tonic::transport::Channel>,
}

impl CriNode {
    /// Starts `containerd` (default: the one from `make deps`) with CRI on over `rootfs`'s store.
    pub async fn start(rootfs: &Path, containerd: Option<&Path>) -> anyhow::Result<CriNode> {
        let bin = containerd
            .map(Path::to_path_buf)
            .unwrap_or_else(crate::tools::containerd);
        Self::start_with(
            rootfs,
            &bin,
            DaemonOptions {
                cri: true,
                ..Default::default()
            },
        )
        .await
    }

    /// As [`CriNode::start`], able to run the pods a kubelet asks for: runc
    /// from `make deps`, `sandbox` as the node's sandbox image, and no
    /// network but loopback (so nothing can be pulled). Root only.
    pub async fn start_running(rootfs: &Path, sandbox: &str) -> anyhow::Result<CriNode> {
        Self::start_with(
            rootfs,
            &crate::tools::containerd(),
            DaemonOptions {
                cri: true,
                sandbox_image: Some(sandbox.to_string()),
                runc: Some(crate::tools::runc()),
                ..Default::default()
            },
        )
        .await
    }

    async fn start_with(rootfs: &Path, bin: &Path, opts: DaemonOptions) -> anyhow::Result<CriNode> {
        let daemon = Daemon::start(bin, &rootfs.join("var/lib/containerd"), &opts).await?;
        let channel = daemon.channel().await?;
        let mut node = CriNode {
            daemon: Some(daemon),
            client: ImageServiceClient::new(channel),
        };
        // CRI answers only once it has loaded the store's images (before
        // that it says "not initialized"): the first answer is the whole list.
        kiln::ops::verify::wait_for_cri(
            &mut node.client,
            node.daemon.as_ref().expect("running"),
            Duration::from_secs(30),
        )
        .await?;
        Ok(node)
    }

    pub async fn list_images(&mut self) -> anyhow::Result<Vec<Image>> {
        Ok(self
            .client
            .list_images(ListImagesRequest { filter: None })
            .await
            .context("CRI ListImages")?
            .into_inner()
            .images)
    }

    pub async fn image_status(&mut self, image: &str) -> anyhow::Result<Option<Image>> {
        let req = ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            verbose: false,
        };
        Ok(self
            .client
            .image_status(req)
            .await
            .context("CRI ImageStatus")?
            .into_inner()
            .image)
    }

    /// CRI RemoveImage, as kubelet's GC (or `crictl rmi`) removes one.
    pub async fn remove_image(&mut self, image: &str) -> anyhow::Result<()> {
        self.client
            .remove_image(RemoveImageRequest {
                image: Some(ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
            })
            .await
            .context("CRI RemoveImage")?;
        Ok(())
    }

    /// Runs `ctr -n k8s.io ARGS` against this daemon.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<Output> {
        let sock = &self.daemon.as_ref().expect("running").socket;
        Ok(Command::new(crate::tools::ctr())
            .arg("--address")
            .arg(sock)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()?)
    }

    /// A gRPC channel to this containerd (for its content and images APIs).
    pub async fn channel(&self) -> anyhow::Result<tonic::transport::Channel> {
        self.daemon.as_ref().expect("running").channel().await
    }

    pub fn socket(&self) -> &Path {
        &self.daemon.as_ref().expect("running").socket
    }

    pub fn log_tail(&self) -> String {
        self.daemon
            .as_ref()
            .map(|d| d.log_tail())
            .unwrap_or_default()
    }

    pub fn stop(mut self) -> anyhow::Result<()> {
        self.daemon.take().expect("running").stop()
    }
}

/// CRI `ListImages` from the containerd at `socket` (one kiln did not
/// start, e.g. a node's), once its CRI answers (30 s at most).
pub async fn images_at(socket: &Path) -> anyhow::Result<Vec<Image>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let channel = containerd_client::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let mut client = ImageServiceClient::new(channel);
    loop {
        match client.list_images(ListImagesRequest { filter: None }).await {
            Ok(r) => return Ok(r.into_inner().images),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).context("CRI ListImages"),
        }
    }
}

/// crictl (cri-tools, from its Go module) against the CRI socket `socket`,
/// bounded (60 s).
pub fn crictl(socket: &Path, args: &[&str]) -> Output {
    crate::tools::run_bounded(
        Command::new(crate::tools::crictl())
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(args),
        60,
    )
}

/// `crictl ARGS -o json`, asserted to succeed; its JSON.
pub fn crictl_json(socket: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let o = crictl(socket, &all);
    assert!(
        o.status.success(),
        "crictl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// crictl's view of the images: tag -> (pinned, CRI id).
pub fn crictl_images(socket: &Path) -> std::collections::BTreeMap<String, (bool, String)> {
    let v = crictl_json(socket, &["images"]);
    let mut out = std::collections::BTreeMap::new();
    for i in v["images"].as_array().unwrap() {
        for t in i["repoTags"].as_array().unwrap() {
            out.insert(
                t.as_str().unwrap().to_string(),
                (i["pinned"] == true, i["id"].as_str().unwrap().to_string()),
            );
        }
    }
    out
}

/// The containers crictl lists as running: name -> image.
pub fn running_containers(socket: &Path) -> Vec<(String, String)> {
    let v = crictl_json(socket, &["ps"]);
    v["containers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|c| c["state"] == "CONTAINER_RUNNING")
                .map(|c| {
                    (
                        c["metadata"]["name"].as_str().unwrap_or("").to_string(),
                        c["image"]["image"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
