//! `make bench` (p): an image loaded into a running two-node kind cluster
//! on Docker 28 (its containerd image store, the default of new installs)
//! and on podman 4.3 (kind's podman provider's flags),
//! kiln straight from the registry (`kiln load --kind-cluster`) beside the
//! kind way, run by kind itself (v0.33.0, built from its Go module by `make
//! deps`): `docker pull`, then `kind load docker-image`, which runs `docker
//! save` and imports the archive into every node at once through `docker
//! exec -i NODE ctr --namespace=k8s.io images import --all-platforms
//! --digests --snapshotter=X -` (kind `pkg/cmd/kind/load/docker-image`,
//! `pkg/cluster/nodeutils/util.go`). kind runs the `docker` binary whatever
//! the provider; on podman it is podman under that name, as Debian's
//! podman-docker installs it, with `KIND_EXPERIMENTAL_PROVIDER=podman`.
//! Each run starts from fresh nodes and an image the engine does not hold.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kiln_testkit::docker::{docker_cli, Dockerd, Store};
use kiln_testkit::image::host_platform;
use kiln_testkit::kind::{docker_node_base, run_on, Cluster, Engine};
use kiln_testkit::podman::Podman;
use kiln_testkit::registry::Registry;

use super::{kiln_bin, median, run};
use kiln_testkit::tools;

const IMAGE: &str = "bench/etcd:1";

pub fn kind_load(
    registry: &Registry,
    work: &Path,
    deps_path: &str,
    runs: usize,
) -> anyhow::Result<String> {
    let reg = &registry.addr;
    eprintln!("bench: (p) loading into a two-node kind cluster on Docker and on podman...");
    registry.push(&docker_node_base(&host_platform()))?;
    let manifest = work.join("p-node.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: bench.local/bench/coredns:1\nimages:\n  - bench.local/bench/coredns:1\n",
    )?;
    let node = format!("{reg}/bench/docker-node:1");
    run(Command::new(kiln_bin())
        .args(["build", "--manifest"])
        .arg(&manifest)
        .args(["--base", &format!("{reg}/kiln/docker-node-base:test")])
        .args(["--mirror", &format!("bench.local=http://{reg}")])
        .args(["--push", &node])
        .env("PATH", deps_path));
    let image = format!("{reg}/{IMAGE}");
    let size: u64 = {
        let m: serde_json::Value = registry
            .get(
                "/v2/bench/etcd/manifests/1",
                "application/vnd.oci.image.manifest.v1+json",
            )?
            .json()?;
        m["layers"]
            .as_array()
            .map(|ls| ls.iter().filter_map(|l| l["size"].as_u64()).sum())
            .unwrap_or(0)
    };
    let mut out = format!(
        "\n(p) {IMAGE} ({:.0} MiB of layers) loaded into a two-node kind cluster, median of {runs}:\n\n| provider | run | time | / the kind way |\n|---|---|---|---|\n",
        size as f64 / (1 << 20) as f64
    );
    let mut notes = String::new();
    {
        let d = Dockerd::start(Store::Containerd, &[reg])?;
        let path = format!("{}:{deps_path}", docker_cli().parent().unwrap().display());
        let host = format!("unix://{}", d.socket.display());
        let env = [
            ("PATH".to_string(), path),
            ("DOCKER_HOST".to_string(), host),
        ];
        let mut kind_env = env.to_vec();
        kind_env[0].1 = format!(
            "{}:/usr/sbin:/usr/bin:/sbin:/bin",
            docker_cli().parent().unwrap().display()
        );
        kind_env.push((
            "HOME".into(),
            work.join("p-kind-home").display().to_string(),
        ));
        kind_env.push(("TMPDIR".into(), work.display().to_string()));
        let r = measure(&d, &node, &image, &env, &[], &kind_env, runs)?;
        out += &r.rows("Docker 28 (containerd image store)", "docker");
        notes += &r.note("Docker");
    }
    {
        let p = Podman::new(&[reg])?;
        let mut env = p.env();
        for (k, v) in env.iter_mut() {
            if k == "PATH" {
                *v = format!("{v}:{deps_path}");
            }
        }
        // podman as `docker`, as podman-docker installs it.
        let shim = work.join("p-podman-docker");
        std::fs::create_dir_all(&shim)?;
        let _ = std::fs::remove_file(shim.join("docker"));
        std::os::unix::fs::symlink(p_bin(), shim.join("docker"))?;
        let mut kind_env = p.env();
        for (k, v) in kind_env.iter_mut() {
            if k == "PATH" {
                *v = format!("{}:{v}", shim.display());
            }
        }
        kind_env.push(("KIND_EXPERIMENTAL_PROVIDER".into(), "podman".into()));
        kind_env.push(("TMPDIR".into(), work.display().to_string()));
        let r = measure(
            &p,
            &node,
            &image,
            &env,
            &["--provider", "podman"],
            &kind_env,
            runs,
        )?;
        out += &r.rows("podman 4.3", "podman");
        notes += &r.note("podman");
    }
    Ok(format!("{out}\n{notes}"))
}

/// Medians of one provider's runs.
struct Measured {
    kiln: f64,
    kind: f64,
    import: f64,
}

impl Measured {
    fn rows(&self, provider: &str, cli: &str) -> String {
        format!(
            "| {provider} | kiln load --kind-cluster, from the registry | {:.2} s | {:.2} |\n| {provider} | the kind way: {cli} pull, then kind load docker-image (kind v0.33.0 itself) | {:.2} s | 1.00 |\n",
            self.kiln,
            self.kiln / self.kind,
            self.kind
        )
    }

    fn note(&self, provider: &str) -> String {
        format!(
            "On {provider}, of kiln's {:.2} s the slower node's import took {:.2} s; the rest is listing the nodes, fetching and verifying the image and writing its archive once.\n",
            self.kiln, self.import
        )
    }
}

/// kiln and the kind way on fresh nodes of `engine`, `runs` times each:
/// kiln with `env` and `extra` flags, kind with `kind_env` only.
fn measure(
    engine: &dyn Engine,
    node: &str,
    image: &str,
    env: &[(String, String)],
    extra: &[&str],
    kind_env: &[(String, String)],
    runs: usize,
) -> anyhow::Result<Measured> {
    run_on(engine, &["pull", node]);
    let (mut kiln, mut kind, mut imports) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        {
            let cluster = Cluster::start(engine, "bench", node, &["control-plane", "worker"]);
            let t = Instant::now();
            let mut cmd = Command::new(kiln_bin());
            cmd.args([
                "load",
                "--kind-cluster",
                "bench",
                "--no-cache",
                "--json",
                image,
            ])
            .args(extra);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let out = run(&mut cmd);
            kiln.push(t.elapsed().as_secs_f64());
            let r: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            imports.push(
                r["nodes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n["seconds"].as_f64())
                    .fold(0.0, f64::max),
            );
            drop(cluster);
        }
        {
            let cluster = Cluster::start(engine, "bench", node, &["control-plane", "worker"]);
            let t = Instant::now();
            run_on(engine, &["pull", image]);
            let mut cmd = Command::new(tools::kind());
            cmd.env_clear()
                .args(["load", "docker-image", "--name", "bench", image]);
            for (k, v) in kind_env {
                cmd.env(k, v);
            }
            let o = tools::run_bounded(&mut cmd, 600);
            anyhow::ensure!(
                o.status.success(),
                "kind load docker-image failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            // kind's own word that every node holds it.
            for n in &cluster.nodes {
                anyhow::ensure!(
                    String::from_utf8_lossy(&o.stderr).contains(n)
                        || String::from_utf8_lossy(&o.stdout).contains(n),
                    "kind did not name {n}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            kind.push(t.elapsed().as_secs_f64());
            run_on(engine, &["rmi", image]);
            drop(cluster);
        }
    }
    Ok(Measured {
        kiln: median(kiln),
        kind: median(kind),
        import: median(imports),
    })
}

/// The podman binary `Podman` runs.
fn p_bin() -> std::path::PathBuf {
    tools::workspace().join(".deps/podman/usr/bin/podman")
}
