//! The container engine a kind cluster's nodes run in (docker, podman or
//! nerdctl), driven through its own CLI as kind drives it, so a remote
//! `DOCKER_HOST`, a Docker context or Docker Desktop work as they do for kind
//! and no node socket is needed on this machine.
//!
//! The contract, from kubernetes-sigs/kind v0.32.0:
//! - nodes are the containers labelled `io.x-k8s.kind.cluster=<name>`, listed
//!   with `ps -a --filter label=... --format {{.Names}}` (stopped ones too;
//!   `pkg/cluster/internal/providers/{docker,podman,nerdctl}/provider.go`
//!   `ListNodes`); `io.x-k8s.kind.role` is `control-plane`, `worker` or
//!   `external-load-balancer`, and the last holds no containerd
//!   (`ListInternalNodes`);
//! - a command runs in a node as `exec --privileged [-i] NODE CMD ARGS`
//!   (`providers/docker/node.go` `nodeCmd.Run`);
//! - the provider is `KIND_EXPERIMENTAL_PROVIDER` (docker by default;
//!   `pkg/cluster/provider.go`);
//! - the node's snapshotter is read from `containerd config dump`: config
//!   version 2 at `plugins."io.containerd.grpc.v1.cri".containerd.snapshotter`,
//!   versions 3 and 4 at `plugins."io.containerd.cri.v1.images".snapshotter`
//!   (`pkg/cluster/nodeutils/util.go` `parseSnapshotter`).

use std::path::Path;
use std::process::Stdio;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;
use tokio::process::Command;

use crate::adapters::version::Version;
use crate::primitives::error::BadInput;
use crate::primitives::platform::Platform;

pub const CLUSTER_LABEL: &str = "io.x-k8s.kind.cluster";
pub const ROLE_LABEL: &str = "io.x-k8s.kind.role";
/// kind's load balancer container: no containerd in it.
const LOAD_BALANCER_ROLE: &str = "external-load-balancer";

/// Which engine's CLI runs the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Docker,
    Podman,
    Nerdctl,
}

impl Provider {
    /// `KIND_EXPERIMENTAL_PROVIDER` as kind reads it, docker when unset.
    pub fn from_env() -> Result<Provider, BadInput> {
        match std::env::var("KIND_EXPERIMENTAL_PROVIDER").ok().as_deref() {
            None | Some("") | Some("docker") => Ok(Provider::Docker),
            Some("podman") => Ok(Provider::Podman),
            Some("nerdctl") => Ok(Provider::Nerdctl),
            Some(other) => Err(BadInput(format!(
                "KIND_EXPERIMENTAL_PROVIDER={other:?}: kiln knows docker, podman and nerdctl"
            ))),
        }
    }

    /// The CLI's name (found on PATH).
    pub fn program(self) -> &'static str {
        match self {
            Provider::Docker => "docker",
            Provider::Podman => "podman",
            Provider::Nerdctl => "nerdctl",
        }
    }

    fn command(self) -> Command {
        let mut c = Command::new(self.program());
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// The cluster's nodes that run containerd, by name, sorted.
    pub async fn nodes(self, cluster: &str) -> anyhow::Result<Vec<String>> {
        let names = self
            .output(self.command().args([
                "ps",
                "-a",
                "--filter",
                &format!("label={CLUSTER_LABEL}={cluster}"),
                "--format",
                "{{.Names}}",
            ]))
            .await?;
        let names: Vec<String> = names
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Ok(names);
        }
        // One inspect for every role: `{{index .Config.Labels ...}}` reads
        // the same on docker, podman and nerdctl.
        let roles = self
            .output(
                self.command()
                    .args([
                        "inspect",
                        "--format",
                        &format!("{{{{index .Config.Labels \"{ROLE_LABEL}\"}}}}"),
                    ])
                    .args(&names),
            )
            .await?;
        let roles: Vec<&str> = roles.lines().map(str::trim).collect();
        if roles.len() != names.len() {
            bail!(
                "{} inspect gave {} roles for {} nodes of kind cluster {cluster}",
                self.program(),
                roles.len(),
                names.len()
            );
        }
        let mut nodes: Vec<String> = names
            .into_iter()
            .zip(roles)
            .filter(|(_, role)| *role != LOAD_BALANCER_ROLE)
            .map(|(n, _)| n)
            .collect();
        nodes.sort();
        Ok(nodes)
    }

    /// `exec --privileged NODE ARGS...` (with `-i` when `stdin` is given),
    /// as kind runs node commands; stdout on success, else an error with
    /// the command's last stderr line.
    pub async fn exec(
        self,
        node: &str,
        args: &[&str],
        stdin: Option<std::fs::File>,
    ) -> anyhow::Result<String> {
        let mut cmd = self.command();
        cmd.args(["exec", "--privileged"]);
        if stdin.is_some() {
            cmd.arg("-i");
        }
        cmd.arg(node).args(args);
        if let Some(f) = stdin {
            cmd.stdin(Stdio::from(f));
        }
        self.output(&mut cmd).await
    }

    /// `save -o OUT IMAGE...`: images from the engine's own store (what
    /// `kind load docker-image` starts from).
    pub async fn save(self, images: &[String], out: &Path) -> anyhow::Result<()> {
        self.output(self.command().arg("save").arg("-o").arg(out).args(images))
            .await
            .map(drop)
    }

    async fn output(self, cmd: &mut Command) -> anyhow::Result<String> {
        let shown = format!("{:?}", cmd.as_std())
            .replace('"', "")
            .chars()
            .take(160)
            .collect::<String>();
        let out = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .map_err(|e| {
                anyhow!(
                    "cannot run {}: {e}; is it installed and on PATH (or pick another with --provider)?",
                    self.program()
                )
            })?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            match err.lines().rev().find(|l| !l.trim().is_empty()) {
                Some(last) => bail!("{shown}: {} ({})", last.trim(), out.status),
                // 137: killed, as when its container is removed under it.
                None => bail!(
                    "{shown}: ended with {} and no message; was the container stopped or removed?",
                    out.status
                ),
            }
        }
        String::from_utf8(out.stdout).with_context(|| format!("{shown}: output is not UTF-8"))
    }
}

/// What kiln learns from a node before loading into it.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub platform: Platform,
    pub snapshotter: String,
    pub containerd: Version,
}

/// Asks `node` for its architecture, its containerd's version and
/// snapshotter, in one exec (`uname -m`, `containerd --version`, then
/// `containerd config dump`).
pub async fn probe(provider: Provider, node: &str) -> anyhow::Result<NodeFacts> {
    let out = provider
        .exec(
            node,
            &[
                "sh",
                "-c",
                "uname -m && containerd --version && containerd config dump",
            ],
            None,
        )
        .await?;
    let mut lines = out.splitn(3, '\n');
    let (Some(arch), Some(version), Some(config)) = (lines.next(), lines.next(), lines.next())
    else {
        bail!("{node}: no answer from uname -m and containerd --version");
    };
    let containerd = Version::parse_output(version)
        .ok_or_else(|| anyhow!("{node}: containerd --version said {version:?}"))?;
    let platform = Platform::parse(&format!("linux/{}", arch.trim()))
        .map_err(|e| anyhow!("{node}: uname -m said {arch:?}: {e}"))?;
    let snapshotter = parse_snapshotter(config).map_err(|e| anyhow!("{node}: {e}"))?;
    Ok(NodeFacts {
        platform: arm_variant(platform),
        snapshotter,
        containerd,
    })
}

/// `uname -m` says `armv7l`/`armv6l`; images say `arm` with a variant.
fn arm_variant(p: Platform) -> Platform {
    match p.architecture.as_str() {
        a if a.starts_with("armv") => Platform {
            variant: Some(format!("v{}", &a[4..5])),
            architecture: "arm".into(),
            ..p
        },
        _ => p,
    }
}

/// The snapshotter a node's CRI unpacks into, from `containerd config
/// dump` (the module doc says where kind reads it).
pub fn parse_snapshotter(config: &str) -> anyhow::Result<String> {
    let doc: toml_edit::DocumentMut = config
        .parse()
        .map_err(|e| anyhow!("containerd config dump is not TOML: {e}"))?;
    let version = doc
        .get("version")
        .and_then(|v| v.as_integer())
        .ok_or_else(|| anyhow!("containerd config dump names no config version"))?;
    let path: &[&str] = match version {
        2 => &[
            "plugins",
            "io.containerd.grpc.v1.cri",
            "containerd",
            "snapshotter",
        ],
        3 | 4 => &["plugins", "io.containerd.cri.v1.images", "snapshotter"],
        v => bail!("containerd config version {v}: kiln knows versions 2, 3 and 4"),
    };
    let mut item = doc.as_item();
    for key in path {
        item = item.get(key).ok_or_else(|| {
            anyhow!(
                "containerd config (version {version}) sets no snapshotter at {}",
                path.join(".")
            )
        })?;
    }
    item.as_str()
        .map(String::from)
        .ok_or_else(|| anyhow!("containerd config: {} is not a string", path.join(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshotter_is_read_where_kind_reads_it() {
        let v2 = "version = 2\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n      snapshotter = \"overlayfs\"\n";
        assert_eq!(parse_snapshotter(v2).unwrap(), "overlayfs");
        let v3 = "version = 3\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'native'\n";
        assert_eq!(parse_snapshotter(v3).unwrap(), "native");
        assert!(parse_snapshotter("version = 5\n").is_err());
        assert!(parse_snapshotter("version = 2\n").is_err());
    }

    #[test]
    fn arm_machines_name_their_variant() {
        let p = arm_variant(Platform::parse("linux/armv7l").unwrap());
        assert_eq!(p.to_string(), "linux/arm/v7");
        let p = arm_variant(Platform::parse("linux/aarch64").unwrap());
        assert_eq!(p.to_string(), "linux/arm64");
    }
}
