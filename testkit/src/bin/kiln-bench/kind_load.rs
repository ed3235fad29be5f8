//! `make bench` (p): an image loaded into a running two-node kind cluster
//! on Docker 28 (its containerd image store, the default of new installs),
//! kiln straight from the registry (`kiln load --kind-cluster`) beside the
//! kind way (`kind load docker-image`: `docker pull`, `docker save`, then
//! `docker exec -i NODE ctr --namespace=k8s.io images import
//! --all-platforms --digests --snapshotter=X -` on every node at once, as
//! kind's `LoadImageArchive` runs it). Each run starts from fresh nodes and
//! an image Docker does not hold.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use kiln_testkit::docker::{docker_cli, Dockerd, Store};
use kiln_testkit::image::host_platform;
use kiln_testkit::kind::{docker_node_base, kind_import, Cluster};
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
    eprintln!("bench: (p) loading into a two-node kind cluster on Docker...");
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
    let d = Dockerd::start(Store::Containerd, &[reg])?;
    d.run(&["pull", &node]);
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
    let path = format!("{}:{deps_path}", docker_cli().parent().unwrap().display());
    let host = format!("unix://{}", d.socket.display());
    let (mut kiln, mut kind, mut imports) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        {
            let cluster = Cluster::start(&d, "bench", &node, &["control-plane", "worker"]);
            let t = Instant::now();
            let out = run(Command::new(kiln_bin())
                .args([
                    "load",
                    "--kind-cluster",
                    "bench",
                    "--no-cache",
                    "--json",
                    &image,
                ])
                .env("PATH", &path)
                .env("DOCKER_HOST", &host));
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
            let cluster = Cluster::start(&d, "bench", &node, &["control-plane", "worker"]);
            let tar = work.join("p-saved.tar");
            let t = Instant::now();
            d.run(&["pull", &image]);
            d.run(&["save", "-o", tar.to_str().unwrap(), &image]);
            let children: Vec<_> = cluster
                .nodes
                .iter()
                .map(|n| {
                    kind_import(&d, n, "overlayfs")
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
            d.run(&["rmi", &image]);
            std::fs::remove_file(&tar)?;
            drop(cluster);
        }
    }
    let (k, w, i) = (median(kiln), median(kind), median(imports));
    Ok(format!(
        "\n(p) {IMAGE} ({:.0} MiB of layers) loaded into a two-node kind cluster on Docker 28 (containerd image store), median of {runs}:\n\n| run | time | / the kind way |\n|---|---|---|\n| kiln load --kind-cluster, from the registry | {k:.2} s | {:.2} |\n| the kind way: docker pull, docker save, ctr import in each node at once | {w:.2} s | 1.00 |\n\nOf kiln's {k:.2} s, the slower node's import took {i:.2} s; the rest is listing the nodes, fetching and verifying the image and writing its archive once.\n",
        size as f64 / (1 << 20) as f64,
        k / w
    ))
}
