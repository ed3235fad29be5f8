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
//!
//! A node is not trusted to be well behaved: every exec's output is capped
//! and it has a deadline ([`Steps`]: probes, records and labels; an import
//! stream, an idle deadline on each chunk it takes), the engine's process
//! killed when either passes (`primitives::bounded`), the node named in
//! the one line that says so; what a node prints reaches a terminal or
//! `--json` with its control characters escaped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

use crate::primitives::bounded::Bounds;

use crate::adapters::version::Version;
use crate::primitives::error::BadInput;
use crate::primitives::platform::Platform;

pub const CLUSTER_LABEL: &str = "io.x-k8s.kind.cluster";
pub const ROLE_LABEL: &str = "io.x-k8s.kind.role";
/// kind's load balancer container: no containerd in it.
const LOAD_BALANCER_ROLE: &str = "external-load-balancer";

/// What one answer of a node may be: a probe, its records, a label.
const ANSWER_MAX: u64 = 4 << 20;

/// How long a node may take: to answer one step, or to take the next
/// chunk of an import (`--node-timeout`).
#[derive(Debug, Clone, Copy)]
pub struct Steps {
    pub step: Duration,
}

impl Default for Steps {
    fn default() -> Self {
        Steps {
            step: Duration::from_secs(120),
        }
    }
}

impl Steps {
    fn answer(self) -> Bounds {
        Bounds {
            output: ANSWER_MAX,
            within: self.step,
            idle: self.step,
        }
    }

    /// An import: as long as it keeps taking its input (a large image
    /// takes minutes), at most a day.
    fn stream(self) -> Bounds {
        Bounds {
            output: ANSWER_MAX,
            within: Duration::from_secs(24 * 3600),
            idle: self.step,
        }
    }
}

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
        Command::new(self.program())
    }

    /// The cluster's nodes that run containerd, by name, sorted.
    pub async fn nodes(self, cluster: &str, steps: Steps) -> anyhow::Result<Vec<String>> {
        let names = self
            .output(
                self.command().args([
                    "ps",
                    "-a",
                    "--filter",
                    &format!("label={CLUSTER_LABEL}={cluster}"),
                    "--format",
                    "{{.Names}}",
                ]),
                None,
                steps.answer(),
            )
            .await?
            .0;
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
                None,
                steps.answer(),
            )
            .await?
            .0;
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

    /// `exec --privileged NODE ARGS...` (with `-i` when `stdin` is given:
    /// an import stream), as kind runs node commands, within `steps`;
    /// stdout, and the bytes fed in, on success; else an error with the
    /// command's last stderr line.
    pub async fn exec(
        self,
        node: &str,
        args: &[&str],
        stdin: Option<std::fs::File>,
        steps: Steps,
    ) -> anyhow::Result<(String, u64)> {
        let mut cmd = self.command();
        cmd.args(["exec", "--privileged"]);
        if stdin.is_some() {
            cmd.arg("-i");
        }
        cmd.arg(node).args(args);
        let bounds = if stdin.is_some() {
            steps.stream()
        } else {
            steps.answer()
        };
        self.output(&mut cmd, stdin, bounds).await
    }

    /// `save -o OUT -- IMAGE...`: images from the engine's own store (what
    /// `kind load docker-image` starts from). `--` first: no value is read
    /// as an option; each was parsed as a reference by the caller.
    pub async fn save(self, images: &[String], out: &Path) -> anyhow::Result<()> {
        let mut cmd = self.command();
        cmd.arg("save");
        if self == Provider::Podman {
            // One archive of several images, docker-archive as Docker's.
            cmd.arg("--multi-image-archive");
        }
        cmd.arg("-o").arg(out).arg("--").args(images);
        // Saving a large image takes long; it writes, not prints.
        let bounds = Bounds {
            output: ANSWER_MAX,
            within: Duration::from_secs(24 * 3600),
            idle: Duration::from_secs(24 * 3600),
        };
        self.output(&mut cmd, None, bounds).await.map(drop)
    }

    async fn output(
        self,
        cmd: &mut Command,
        stdin: Option<std::fs::File>,
        bounds: Bounds,
    ) -> anyhow::Result<(String, u64)> {
        let shown = crate::primitives::text::one_line(
            &format!("{cmd:?}")
                .replace('"', "")
                .chars()
                .take(160)
                .collect::<String>(),
        );
        let mut cmd = std::mem::replace(cmd, Command::new("true"));
        let program = self.program();
        let ran = tokio::task::spawn_blocking(move || {
            let stdin = stdin.map(|f| Box::new(f) as Box<dyn std::io::Read + Send>);
            crate::primitives::bounded::run(&mut cmd, stdin, bounds)
        })
        .await?;
        let out = match ran {
            Ok(out) => out,
            Err(crate::primitives::bounded::Stopped::Io(e)) => bail!(
                "cannot run {program}: {e}; is it installed and on PATH (or pick another with --provider)?"
            ),
            // Stopped for a signal: the run ends as interrupted (exit
            // 130/143), not as a failure of the provider.
            Err(crate::primitives::bounded::Stopped::Interrupted) => {
                crate::primitives::interrupt::check()?;
                bail!("{shown}: interrupted; stopped")
            }
            Err(why) => bail!("{shown}: {why}"),
        };
        if !out.status.success() {
            let err = crate::primitives::text::one_line(&String::from_utf8_lossy(&out.stderr));
            let code = out.status.code();
            let last = String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(crate::primitives::text::one_line);
            match (code, last) {
                // The shell's and the engines' "not found" / "cannot run".
                (Some(126 | 127), last) => bail!(
                    "{shown}: the node lacks a command kiln runs there ({}; exit {}): a node needs sh, uname, containerd and ctr (docs/kind.md)",
                    last.unwrap_or_else(|| "no message".into()),
                    code.unwrap_or_default()
                ),
                (_, Some(last)) => bail!("{shown}: {last} ({})", out.status),
                // 137: killed, as when its container is removed under it.
                (_, None) if err.is_empty() => bail!(
                    "{shown}: ended with {} and no message; was the container stopped or removed?",
                    out.status
                ),
                (_, None) => bail!("{shown}: {err} ({})", out.status),
            }
        }
        let text = String::from_utf8(out.stdout)
            .with_context(|| format!("{shown}: output is not UTF-8"))?;
        Ok((text, out.fed))
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
pub async fn probe(provider: Provider, node: &str, steps: Steps) -> anyhow::Result<NodeFacts> {
    let (out, _) = provider
        .exec(
            node,
            &[
                "sh",
                "-c",
                "uname -m && containerd --version && containerd config dump",
            ],
            None,
            steps,
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
