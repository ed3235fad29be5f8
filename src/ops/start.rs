//! What kubelet does for static pods, offline: a host-network pod sandbox
//! (its image must be local: the daemon runs in a network namespace with
//! only loopback, so nothing can be pulled), then one container per
//! control-plane image with the image's own entrypoint; each must still be
//! running a few seconds later. Everything is stopped and removed after.

use std::path::Path;
use std::time::Duration;

use anyhow::anyhow;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};

use super::check::{Check, START};
use crate::adapters::daemon::Daemon;
use crate::domain::manifest::NodeManifest;

/// The images kubelet runs as static pods on a control-plane node.
const CONTROL_PLANE: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// How long a started container must stay up to count as running.
const SETTLE: Duration = Duration::from_secs(3);

fn host_network() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        ..Default::default()
    }
}

/// Check 4: the sandbox and the control plane start with no network.
pub async fn control_plane(
    daemon: &Daemon,
    work: &Path,
    manifest: &NodeManifest,
) -> anyhow::Result<Check> {
    let mut cri = RuntimeServiceClient::new(daemon.channel().await?);
    let logs = work.join("pod-logs");
    std::fs::create_dir_all(&logs)?;
    // A host-network sandbox sets no hostname (runc refuses one without a UTS namespace).
    let sandbox = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "kiln-verify".into(),
            uid: format!("kiln-verify-{}", std::process::id()),
            namespace: "kube-system".into(),
            attempt: 0,
        }),
        log_directory: logs.display().to_string(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(host_network()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut details = Vec::new();
    let pod = match cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
    {
        Ok(r) => r.into_inner().pod_sandbox_id,
        Err(s) => {
            details.push(format!(
                "the pod sandbox did not start (kubelet's first step): {}; containerd: {}",
                s.message(),
                daemon.log_tail()
            ));
            return Ok(check(details, vec![]));
        }
    };
    let mut started = Vec::new();
    let mut seen = Vec::new();
    for image in manifest
        .images
        .iter()
        .filter(|i| CONTROL_PLANE.contains(&i.path.rsplit('/').next().unwrap_or("")))
    {
        let name = image.tagged_name().unwrap_or_else(|| image.to_string());
        let short = image.path.rsplit('/').next().unwrap_or("").to_string();
        seen.push(short.clone());
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: short.clone(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: name.clone(),
                ..Default::default()
            }),
            log_path: format!("{short}.log"),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = cri
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox.clone()),
            })
            .await;
        let id = match created {
            Ok(r) => r.into_inner().container_id,
            Err(s) => {
                details.push(format!("{name}: not created: {}", s.message()));
                continue;
            }
        };
        started.push((name.clone(), id.clone()));
        if let Err(s) = cri
            .start_container(StartContainerRequest { container_id: id })
            .await
        {
            details.push(format!("{name}: did not start: {}", s.message()));
        }
    }
    if seen.is_empty() {
        details.push(format!(
            "the manifest has no control-plane image ({})",
            CONTROL_PLANE.join(", ")
        ));
    }
    // A daemon that dies at once is not running a few seconds on.
    tokio::time::sleep(SETTLE).await;
    let mut running = Vec::new();
    for (name, id) in &started {
        let status = cri
            .container_status(ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
            .map_err(|s| anyhow!("CRI ContainerStatus {name}: {}", s.message()))?
            .into_inner()
            .status;
        match status {
            Some(s) if s.state == ContainerState::ContainerRunning as i32 => {
                running.push(format!("{name} running"))
            }
            Some(s) => details.push(format!(
                "{name}: not running {}s after start (state {}, exit code {})",
                SETTLE.as_secs(),
                ContainerState::try_from(s.state)
                    .map(|x| x.as_str_name().to_string())
                    .unwrap_or_else(|_| s.state.to_string()),
                s.exit_code
            )),
            None => details.push(format!("{name}: CRI has no status for it")),
        }
    }
    for (_, id) in &started {
        let _ = cri
            .stop_container(StopContainerRequest {
                container_id: id.clone(),
                timeout: 5,
            })
            .await;
        let _ = cri
            .remove_container(RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await;
    }
    let _ = cri
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await;
    let _ = cri
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod,
        })
        .await;
    Ok(check(details, running))
}

fn check(details: Vec<String>, running: Vec<String>) -> Check {
    let ok = details.is_empty();
    let mut c = Check::new(START, details);
    if ok {
        c.details = running;
    }
    c
}
