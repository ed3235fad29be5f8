//! kind clusters on the tests' private Docker ([`crate::docker`]) or
//! podman ([`crate::podman`]): a base image that runs as a node (this
//! host's C library, a shell, a few coreutils, containerd 2.x from `make
//! deps` started as PID 1 in place of systemd), and node containers
//! started with kind's own flags for that engine ([`Engine`]).
//!
//! The node counts, on its own side, what every import reads: its `ctr`
//! is first a wrapper (`/usr/local/sbin/ctr`, before the real one on the
//! image's PATH) that passes an import's stdin through `dd`, whose count
//! goes to `/var/log/kiln-import-bytes` ([`Cluster::imported_bytes`]).
//!
//! kind's flags, from kubernetes-sigs/kind v0.32.0
//! `pkg/cluster/internal/providers/docker/provision.go` (`runArgsForNode`
//! and `commonArgs`): `--detach --tty --label io.x-k8s.kind.cluster=NAME
//! --hostname NODE --name NODE --label io.x-k8s.kind.role=ROLE --privileged
//! --security-opt seccomp=unconfined --security-opt apparmor=unconfined
//! --tmpfs /tmp --tmpfs /run --volume /var --volume
//! /lib/modules:/lib/modules:ro --restart=on-failure:1 --init=false
//! --cgroupns=private -e KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER`, plus
//! `--net kind`. Here: no network (`--net=none`: the tests' dockerd has no
//! bridge), no apparmor option (the host has none), and `/lib/modules` only
//! where the host has it (this one does not; kind mounts it for kube-proxy).
//!
//! On podman, from kind's `pkg/cluster/internal/providers/podman/provision.go`
//! at commit 0305415e (`commonArgs`, `runArgsForNode`): `--detach --tty
//! --net NETWORK --label io.x-k8s.kind.cluster=NAME -e container=podman
//! --cgroupns=private`, then `--hostname NODE --label
//! io.x-k8s.kind.role=ROLE --privileged --tmpfs /tmp --tmpfs /run --volume
//! VOLUME:/var:suid,exec,dev --volume /lib/modules:/lib/modules:ro -e
//! KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER`, the volume made first by
//! `podman volume create --label NODE=true` (`createAnonymousVolume`), and
//! `podman run --name NODE` (`createContainer`). Here: no network, no
//! `/lib/modules` where the host lacks it, and rlimits at or below this
//! sandbox's (podman asks for more by default, which the sandbox refuses).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::base::{image_running, layer_of, Entry};
use crate::docker::Dockerd;
use crate::image::BuiltImage;

pub const CLUSTER_LABEL: &str = "io.x-k8s.kind.cluster";
pub const ROLE_LABEL: &str = "io.x-k8s.kind.role";

/// The node's containerd config (version 3, as containerd 2.0-2.2 read it):
/// CRI on, the overlayfs snapshotter kindest/base uses, the sandbox pinned.
pub const NODE_CONFIG_TOML: &str = "version = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = 'registry.k8s.io/pause:3.10'\n";

/// What `/sbin/init` does in the node: containerd, as systemd would start it.
const INIT: &str = "#!/bin/sh\nmkdir -p /run/containerd\nexec /usr/local/bin/containerd --config /etc/containerd/config.toml\n";

/// The coreutils the node's shell scripts use (each is its own binary on Debian).
const UTILS: &[&str] = &[
    "uname", "head", "sleep", "touch", "cat", "mkdir", "mv", "rm", "chmod", "dd",
];

/// The node's `ctr` first on its PATH: an import (its last argument `-`)
/// reads its stdin through `dd`, which counts it (module doc).
const COUNTING_CTR: &str = "#!/bin/sh\nfor a; do last=$a; done\nif [ \"$last\" = \"-\" ]; then\n  dd bs=1M 2>>/var/log/kiln-import-bytes | /usr/local/bin/ctr \"$@\"\n  exit $?\nfi\nexec /usr/local/bin/ctr \"$@\"\n";

/// The shared libraries `bin` loads and its interpreter, from `ldd`.
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let o = std::process::Command::new("ldd").arg(bin).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

/// A base image that runs as a kind node on Docker: its entrypoint starts
/// containerd (forky's 2.x) over the image's `/var/lib/containerd`.
pub fn docker_node_base(platform: &str) -> BuiltImage {
    use tar::EntryType::{Directory as D, Regular as F, Symlink as S};
    let forky = crate::tools::containerd2();
    let forky = forky.parent().unwrap();
    let mut bins: Vec<(String, PathBuf)> = vec![("usr/bin/sh".into(), "/bin/dash".into())];
    for u in UTILS {
        bins.push((format!("usr/bin/{u}"), format!("/usr/bin/{u}").into()));
    }
    for b in ["containerd", "ctr", "containerd-shim-runc-v2"] {
        bins.push((format!("usr/local/bin/{b}"), forky.join(b)));
    }
    let mut libs: Vec<PathBuf> = bins.iter().flat_map(|(_, p)| libraries(p)).collect();
    libs.sort();
    libs.dedup();
    // Merged /usr: /lib and /lib64 lead into usr/.
    let files: Vec<(String, Vec<u8>)> = bins
        .iter()
        .map(|(at, from)| (at.clone(), std::fs::read(from).unwrap()))
        .chain(libs.iter().map(|l| {
            let rel = l.to_str().unwrap().trim_start_matches('/');
            let rel = if rel.starts_with("usr/") {
                rel.to_string()
            } else {
                format!("usr/{rel}")
            };
            (rel, std::fs::read(l).unwrap())
        }))
        .collect();
    let mut dirs: Vec<String> = vec![
        "etc/containerd/".into(),
        "sbin/".into(),
        "usr/local/sbin/".into(),
        "var/log/".into(),
    ];
    for (at, _) in &files {
        let mut p = Path::new(at).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.push(format!("{}/", d.display()));
            p = d.parent();
        }
    }
    dirs.extend([
        "etc/".into(),
        "var/".into(),
        "var/lib/".into(),
        "run/".into(),
        "tmp/".into(),
    ]);
    dirs.sort();
    dirs.dedup();
    let mut entries: Vec<Entry> = dirs
        .iter()
        .map(|d| (d.as_str(), D, &b""[..], "", 0o755))
        .collect();
    entries.extend([
        ("bin", S, &b""[..], "usr/bin", 0o777),
        ("lib", S, b"", "usr/lib", 0o777),
        ("lib64", S, b"", "usr/lib64", 0o777),
    ]);
    for (at, bytes) in &files {
        entries.push((at.as_str(), F, bytes.as_slice(), "", 0o755));
    }
    entries.push(("sbin/init", F, INIT.as_bytes(), "", 0o755));
    entries.push(("usr/local/sbin/ctr", F, COUNTING_CTR.as_bytes(), "", 0o755));
    entries.push((
        "etc/containerd/config.toml",
        F,
        NODE_CONFIG_TOML.as_bytes(),
        "",
        0o644,
    ));
    entries.sort_by(|a, b| a.0.cmp(b.0));
    image_running(
        "kiln/docker-node-base",
        "test",
        &[platform],
        vec![layer_of(&entries)],
        &["/sbin/init"],
    )
}

/// The engine a cluster's nodes run in, as kind drives it.
pub trait Engine {
    /// The engine's CLI, talking to this engine only.
    fn cli(&self) -> std::process::Command;
    /// `run`'s arguments for one node (module doc), the image last.
    fn node_args(&self, cluster: &str, node: &str, role: &str, image: &str) -> Vec<String>;
}

pub fn run_on(engine: &dyn Engine, args: &[&str]) -> String {
    let o = crate::tools::run_bounded(engine.cli().args(args), 300);
    assert!(
        o.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

impl Engine for Dockerd {
    fn cli(&self) -> std::process::Command {
        self.docker()
    }

    fn node_args(&self, cluster: &str, node: &str, role: &str, image: &str) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--detach",
            "--tty",
            "--label",
            &format!("{CLUSTER_LABEL}={cluster}"),
            "--hostname",
            node,
            "--name",
            node,
            "--label",
            &format!("{ROLE_LABEL}={role}"),
            "--privileged",
            "--security-opt",
            "seccomp=unconfined",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/run",
            "--volume",
            "/var",
            "--restart=on-failure:1",
            "--init=false",
            "--cgroupns=private",
            "-e",
            "KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER",
            "--net=none",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if Path::new("/lib/modules").is_dir() {
            args.extend(["--volume".into(), "/lib/modules:/lib/modules:ro".into()]);
        }
        args.push(image.into());
        args
    }
}

impl Engine for crate::podman::Podman {
    fn cli(&self) -> std::process::Command {
        self.podman()
    }

    fn node_args(&self, cluster: &str, node: &str, role: &str, image: &str) -> Vec<String> {
        let volume = run_on(
            self,
            &["volume", "create", "--label", &format!("{node}=true")],
        );
        let mut args: Vec<String> = [
            "run",
            "--name",
            node,
            "--detach",
            "--tty",
            "--net",
            "none",
            "--label",
            &format!("{CLUSTER_LABEL}={cluster}"),
            "-e",
            "container=podman",
            "--cgroupns=private",
            "--hostname",
            node,
            "--label",
            &format!("{ROLE_LABEL}={role}"),
            "--privileged",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/run",
            "--volume",
            &format!("{}:/var:suid,exec,dev", volume.trim()),
            "-e",
            "KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER",
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=4096:4096",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if Path::new("/lib/modules").is_dir() {
            args.extend(["--volume".into(), "/lib/modules:/lib/modules:ro".into()]);
        }
        args.push(image.into());
        args
    }
}

/// Node containers of one kind cluster.
pub struct Cluster<'d> {
    pub engine: &'d dyn Engine,
    pub name: String,
    pub nodes: Vec<String>,
}

impl<'d> Cluster<'d> {
    /// Starts `roles.len()` nodes of `image` with kind's flags (module
    /// doc), named as kind names them, and waits until each node's
    /// containerd answers.
    pub fn start(engine: &'d dyn Engine, name: &str, image: &str, roles: &[&str]) -> Cluster<'d> {
        let mut nodes = Vec::new();
        let mut workers = 0;
        for role in roles {
            let node = match *role {
                "control-plane" => format!("{name}-control-plane"),
                _ => {
                    workers += 1;
                    if workers == 1 {
                        format!("{name}-worker")
                    } else {
                        format!("{name}-worker{workers}")
                    }
                }
            };
            let args = engine.node_args(name, &node, role, image);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_on(engine, &args);
            nodes.push(node);
        }
        let c = Cluster {
            engine,
            name: name.into(),
            nodes,
        };
        for n in &c.nodes {
            c.wait_ready(n);
        }
        c
    }

    /// Until `ctr version` in the node reaches its containerd (60 s at most).
    fn wait_ready(&self, node: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let o = crate::tools::run_bounded(
                self.engine.cli().args(["exec", node, "ctr", "version"]),
                30,
            );
            if o.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {node}'s containerd did not answer within 60s: {}\n{}",
                String::from_utf8_lossy(&o.stderr),
                run_on(self.engine, &["logs", node])
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `ENGINE exec NODE ARGS` (stdout; asserted to succeed).
    pub fn exec(&self, node: &str, args: &[&str]) -> String {
        let mut a = vec!["exec", node];
        a.extend(args);
        run_on(self.engine, &a)
    }

    /// The bytes every import into `node` has read so far, counted there.
    pub fn imported_bytes(&self, node: &str) -> u64 {
        let o = crate::tools::run_bounded(
            self.engine
                .cli()
                .args(["exec", node, "cat", "/var/log/kiln-import-bytes"]),
            30,
        );
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
                    .filter(|_| l.contains(" bytes"))
            })
            .sum()
    }

    /// The node's containerd socket, as the host reaches it (through the
    /// node's PID 1: `/run` is a tmpfs inside the node).
    pub fn socket(&self, node: &str) -> PathBuf {
        let pid = run_on(
            self.engine,
            &["inspect", "--format", "{{.State.Pid}}", node],
        )
        .trim()
        .to_string();
        PathBuf::from(format!("/proc/{pid}/root/run/containerd/containerd.sock"))
    }
}

/// kind's own load into `node`, not yet started (its stdin is the
/// `docker save` archive): `docker exec --privileged -i NODE ctr
/// --namespace=k8s.io images import --all-platforms --digests
/// --snapshotter=X -`, as kind v0.32.0's `pkg/cluster/nodeutils/util.go`
/// `LoadImageArchive` runs it through `providers/docker/node.go` (and
/// `providers/podman/node.go` the same, with `podman exec`).
pub fn kind_import(engine: &dyn Engine, node: &str, snapshotter: &str) -> std::process::Command {
    let mut c = engine.cli();
    c.args(["exec", "--privileged", "-i", node])
        .args(["ctr", "--namespace=k8s.io", "images", "import"])
        .args(["--all-platforms", "--digests"])
        .arg(format!("--snapshotter={snapshotter}"))
        .arg("-");
    c
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        let mut args = vec!["rm", "--force", "--volumes"];
        args.extend(self.nodes.iter().map(String::as_str));
        let _ = crate::tools::run_bounded(self.engine.cli().args(&args), 120);
    }
}
