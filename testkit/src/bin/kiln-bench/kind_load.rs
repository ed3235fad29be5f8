//! `make bench` (p): an image loaded into a running two-node kind cluster
//! on Docker 28 (its containerd image store, the default of new installs)
//! and on podman 4.3 (kind's podman provider's flags),
//! kiln straight from the registry (`kiln load --kind-cluster`) beside the
//! kind way (`kind load docker-image`: `docker pull`, `docker save`, then
//! `docker exec -i NODE ctr --namespace=k8s.io images import
//! --all-platforms --digests --snapshotter=X -` on every node at once, as
//! kind's `LoadImageArchive` runs it; on podman, `podman pull`, `podman
//! save` and `kind load image-archive`'s same import through `podman
//! exec`, since kind's `load docker-image` runs docker whatever the
//! provider). Each run starts from fresh nodes and an image the engine
//! does not hold.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use kiln_testkit::docker::{docker_cli, Dockerd, Store};
use kiln_testkit::image::host_platform;
use kiln_testkit::kind::{docker_node_base, kind_import, run_on, Cluster, Engine};
use kiln_testkit::podman::Podman;
use kiln_testkit::registry::Registry;

use super::{kiln_bin, median, run};

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
        let r = measure(&d, &node, &image, work, &env, &[], runs)?;
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
        let r = measure(
            &p,
            &node,
            &image,
            work,
            &env,
            &["--provider", "podman"],
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
            "| {provider} | kiln load --kind-cluster, from the registry | {:.2} s | {:.2} |\n| {provider} | the kind way: {cli} pull, {cli} save, ctr import in each node at once | {:.2} s | 1.00 |\n",
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

/// kiln and the kind way on fresh nodes of `engine`, `runs` times each.
fn measure(
    engine: &dyn Engine,
    node: &str,
    image: &str,
    work: &Path,
    env: &[(String, String)],
    extra: &[&str],
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
            let tar = work.join("p-saved.tar");
            let t = Instant::now();
            run_on(engine, &["pull", image]);
            run_on(engine, &["save", "-o", tar.to_str().unwrap(), image]);
            let children: Vec<_> = cluster
                .nodes
                .iter()
                .map(|n| {
                    kind_import(engine, n, "overlayfs")
                        .stdin(Stdio::from(std::fs::File::open(&tar).unwrap()))
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect();
            for mut c in children {
                anyhow::ensure!(c.wait()?.success(), "the kind way's import failed");
            }
            kind.push(t.elapsed().as_secs_f64());
            run_on(engine, &["rmi", image]);
            std::fs::remove_file(&tar)?;
            drop(cluster);
        }
    }
    Ok(Measured {
        kiln: median(kiln),
        kind: median(kind),
        import: median(imports),
    })
}
