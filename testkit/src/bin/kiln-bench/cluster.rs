//! `make bench` (r): a real kind cluster on kiln's node image (the parts
//! and config of tests/kind_cluster.rs, testkit's `cluster`): what kiln's
//! build of the node costs beside its floor (its inputs read once: the
//! base's and the add-ons' blobs over HTTP, hashed, and the release's
//! files), then `docker pull` of the node image by Docker 28 (networked,
//! classic store) and `kind create cluster` (v0.33.0) to control-plane
//! Ready, then to every pod Ready (CoreDNS needs kube-proxy's rules).
//! BENCH_ONLY=r runs it alone.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kiln_testkit::cluster::{self, kind, NodeInputs};
use kiln_testkit::docker::{Dockerd, Store};
use kiln_testkit::registry::Registry;
use sha2::Digest as _;

use super::{floor, kiln_bin, median, run, settle, timed};

/// The files under `dir`, read once and hashed: the release's floor.
fn read_once(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            n += read_once(&p);
        } else {
            let mut h = sha2::Sha256::new();
            let mut f = std::fs::File::open(&p).unwrap();
            n += std::io::copy(&mut f, &mut h).unwrap();
        }
    }
    n
}

pub fn kind_cluster(work: &Path, deps_path: &str, runs: usize) -> anyhow::Result<String> {
    eprintln!("bench: (r) kind create cluster on kiln's node image...");
    let registry = Registry::start()?;
    let dir = work.join("r");
    std::fs::create_dir_all(&dir)?;
    let inputs = NodeInputs::push(&dir, &registry);
    let blobs: Vec<(String, String)> = registry_blobs(&registry);
    let rt = tokio::runtime::Runtime::new()?;
    let (mut build, mut floors, mut pull, mut ready, mut all_ready) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut release_bytes = 0;
    for n in 0..runs {
        eprintln!("bench: (r) run {}/{runs}", n + 1);
        settle();
        let t = Instant::now();
        rt.block_on(floor(&registry.addr, &blobs));
        release_bytes = read_once(&inputs.release);
        floors.push(t.elapsed().as_secs_f64());
        let cache = dir.join(format!("cache-{n}"));
        let mut args = inputs.build_args();
        args.extend(["--cache-dir".to_string(), cache.display().to_string()]);
        build.push(timed(&kiln_bin(), &args, deps_path).0);

        let d = Dockerd::start_networked(Store::Classic, &[&registry.addr])?;
        let t = Instant::now();
        d.run(&["pull", &inputs.node_image]);
        pull.push(t.elapsed().as_secs_f64());
        let gen = run(Command::new(kiln_bin())
            .args(cluster::generate_args(&inputs.manifest))
            .env("PATH", deps_path));
        let config = cluster::kind_config(&gen.stdout, &dir);
        let home = dir.join(format!("home-{n}"));
        std::fs::create_dir_all(&home)?;
        let t = Instant::now();
        run(kind(&d, &home).args([
            "create",
            "cluster",
            "--name",
            "bench",
            "--image",
            &inputs.node_image,
            "--config",
            config.to_str().unwrap(),
            "--wait",
            "5m",
        ]));
        ready.push(t.elapsed().as_secs_f64());
        run(d.docker().args([
            "exec",
            "bench-control-plane",
            "kubectl",
            "--kubeconfig=/etc/kubernetes/admin.conf",
            "wait",
            "--for=condition=Ready",
            "pods",
            "--all",
            "-A",
            "--timeout=300s",
        ]));
        all_ready.push(t.elapsed().as_secs_f64());
        run(kind(&d, &home).args(["delete", "cluster", "--name", "bench"]));
    }
    let inputs_mib = (blobs_bytes(&registry, &blobs) + release_bytes) as f64 / (1 << 20) as f64;
    let (b, f) = (median(build), median(floors));
    Ok(format!(
        "\n\n## (r) a real kind cluster on kiln's node image\n\n\
         Kubernetes v1.35.4 built here, a control plane and a worker, kind v0.33.0 on Docker 28 \
         (tests/kind_cluster.rs's parts and config); median of {runs}.\n\n\
         | run | time | time / floor |\n|---|---|---|\n\
         | (r) kiln build of the node image, pushed (fresh cache) | {b:.2} s | {:.2} |\n\
         | (r) floor: its inputs read once ({inputs_mib:.0} MiB: the base's and add-ons' blobs over HTTP, hashed; the release's files) | {f:.2} s | 1.00 |\n\
         | (r) docker pull of the node image | {:.2} s | |\n\
         | (r) kind create cluster to control-plane Ready (`--wait`) | {:.2} s | |\n\
         | (r) ... to every pod Ready | {:.2} s | |\n",
        b / f,
        median(pull),
        median(ready),
        median(all_ready),
    ))
}

/// Every blob the registry holds, by (repository, digest).
fn registry_blobs(registry: &Registry) -> Vec<(String, String)> {
    let root = registry.storage().join("docker/registry/v2/repositories");
    let mut out = Vec::new();
    for repo in walk_repos(&root, &root) {
        let layers = root.join(&repo).join("_layers/sha256");
        for e in std::fs::read_dir(layers).into_iter().flatten() {
            let hex = e.unwrap().file_name().to_string_lossy().into_owned();
            out.push((repo.clone(), format!("sha256:{hex}")));
        }
    }
    out
}

fn walk_repos(root: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten() {
        let p = e.unwrap().path();
        if p.join("_layers").is_dir() {
            out.push(p.strip_prefix(root).unwrap().display().to_string());
        } else if p.is_dir() {
            out.extend(walk_repos(root, &p));
        }
    }
    out
}

fn blobs_bytes(registry: &Registry, blobs: &[(String, String)]) -> u64 {
    blobs
        .iter()
        .map(|(_, d)| std::fs::metadata(registry.blob_data_path(d)).map_or(0, |m| m.len()))
        .sum()
}
