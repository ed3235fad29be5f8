//! kind clusters on a real Docker (issue 46): kiln's node image pulled by a
//! private dockerd and run as kind runs it (kind's flags, `/var` a fresh
//! volume Docker fills from the image), two nodes labelled as kind labels
//! them; then `kiln load --kind-cluster` from a registry, an archive and
//! Docker's own store, checked inside each node through its CRI and `ctr`.
//! Both of Docker's image stores.

use std::collections::BTreeMap;
use std::process::Stdio;

use crate::common::kind::{assert_nodes_hold, cri_view, ctr_view, node_image, BUNDLED, CLUSTER};
use crate::common::*;
use kiln_testkit::docker::{docker_cli, Dockerd, Store};
use kiln_testkit::image::host_platform;
use kiln_testkit::kind::{kind_import, Cluster};

/// kiln with the test's docker CLI first on PATH, talking to `d`.
fn kiln_on(d: &Dockerd, args: &[&str]) -> std::process::Command {
    let cli = docker_cli();
    let host = format!("unix://{}", d.socket.display());
    kiln_cmd(
        args,
        &[
            ("PATH+", cli.parent().unwrap().to_str().unwrap()),
            ("DOCKER_HOST", &host),
        ],
    )
}

/// kind itself (testkit's `cluster::kind`), its HOME a directory of `env`'s.
fn kind_on(d: &Dockerd, env: &Env) -> std::process::Command {
    let mut c = kiln_testkit::cluster::kind(d, &env.path("kind-home"));
    c.env("TMPDIR", env.path(""));
    c
}

fn run_kiln_on(d: &Dockerd, args: &[&str]) -> std::process::Output {
    kiln_testkit::tools::run_bounded(&mut kiln_on(d, args), 300)
}

fn node_lines(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(o), stderr(o)))
}

/// Runs `cmd` with `file` on its stdin (bounded, 120 s).
fn with_stdin(cmd: &mut std::process::Command, file: &std::path::Path) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::from(std::fs::File::open(file).unwrap()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = kiln_testkit::tools::wait_bounded(&mut child, 120);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    std::io::Read::read_to_end(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}

fn kind_on_docker(store: Store) {
    let env = Env::new();
    let (addr, node_image) = node_image(&env);
    let d = Dockerd::start(store, &[&addr]).unwrap();
    d.run(&["pull", &node_image]);
    let cluster = Cluster::start(&d, CLUSTER, &node_image, &["control-plane", "worker"]);
    // kind itself (v0.33.0, from its Go module) finds the nodes the tests
    // start with its flags and labels: they are kind's nodes to kind.
    let o = kiln_testkit::tools::run_bounded(
        kind_on(&d, &env).args(["get", "nodes", "--name", CLUSTER]),
        60,
    );
    let mut got: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    got.sort();
    eprintln!("kind get nodes --name {CLUSTER}: {got:?} {}", stderr(&o));
    assert_eq!(got, cluster.nodes, "kind get nodes: {}", stderr(&o));
    // kiln's bundled set survives Docker's copy of the image's /var into
    // each node's fresh volume: every image pinned, as CRI reports it.
    assert_nodes_hold(&cluster, &[]);

    // From the registry, no Docker pull: both nodes, one line each.
    let busybox = "registry.k8s.io/extra/busybox:1.36";
    let o = run_kiln_on(
        &d,
        &[
            "load",
            "--kind-cluster",
            CLUSTER,
            "--mirror",
            &env.mirror(),
            busybox,
            "--json",
        ],
    );
    assert_ok(&o);
    let r = node_lines(&o);
    assert_eq!(r["nodes"].as_array().unwrap().len(), 2, "{r}");
    for n in r["nodes"].as_array().unwrap() {
        assert!(n["error"].is_null(), "{n}");
        assert_eq!(n["loaded"][0], busybox, "{n}");
        assert_eq!(n["snapshotter"], "overlayfs", "{n}");
        assert_eq!(n["platform"], host_platform(), "{n}");
    }
    assert_nodes_hold(&cluster, &[busybox]);

    // From an archive (`docker save` of a single image), into one node.
    let coredns = env.image("coredns/coredns");
    let archive = env.path("saved.tar");
    let archived = "example.com/kiln/archived:1";
    std::fs::write(
        &archive,
        kiln_testkit::archive::docker_save_legacy(&[(&coredns.platforms[0], &[archived])]),
    )
    .unwrap();
    let worker = format!("{CLUSTER}-worker");
    let o = run_kiln_on(
        &d,
        &[
            "load",
            "--kind-cluster",
            CLUSTER,
            "--nodes",
            &worker,
            "--archive",
            archive.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    assert!(
        stderr(&o).contains(&format!("kiln: {worker}: loaded 1 images")),
        "{}",
        stderr(&o)
    );
    assert!(ctr_view(&cluster, &worker).contains_key(archived));
    assert!(!ctr_view(&cluster, &format!("{CLUSTER}-control-plane")).contains_key(archived));

    // From Docker's own store: a multi-platform image with attestations,
    // pulled for this platform. kind's way first (kind
    // pkg/cluster/nodeutils/util.go LoadImageArchive: `docker save`, then
    // `ctr --namespace=k8s.io images import --all-platforms --digests
    // --snapshotter=X -` through `docker exec -i`).
    let web = format!("{addr}/app/web:1.0");
    d.run(&["pull", &web]);
    let saved = env.path("web.tar");
    d.run(&["save", "-o", saved.to_str().unwrap(), &web]);
    let kind_way = with_stdin(&mut kind_import(&d, &worker, "overlayfs"), &saved);
    eprintln!(
        "kind's import of `docker save {web}` ({store:?} store): {}; {}{}",
        kind_way.status,
        String::from_utf8_lossy(&kind_way.stdout).trim(),
        String::from_utf8_lossy(&kind_way.stderr).trim()
    );
    if store == Store::Containerd {
        // kind #3795: the saved index names the other platform's manifest,
        // whose content Docker never pulled.
        assert!(!kind_way.status.success());
        assert!(
            String::from_utf8_lossy(&kind_way.stderr).contains("not found"),
            "{}",
            String::from_utf8_lossy(&kind_way.stderr)
        );
    } else {
        assert!(kind_way.status.success());
    }
    // The same with kind itself: `kind load docker-image` into the worker.
    let real = kiln_testkit::tools::run_bounded(
        kind_on(&d, &env).args([
            "load",
            "docker-image",
            "--name",
            CLUSTER,
            "--nodes",
            &worker,
            &web,
        ]),
        300,
    );
    eprintln!(
        "kind load docker-image {web} ({store:?} store): {}; {}",
        real.status,
        stderr(&real).trim()
    );
    if store == Store::Containerd {
        // kind #3795, by kind itself.
        assert!(!real.status.success(), "{}", stderr(&real));
        assert!(stderr(&real).contains("not found"), "{}", stderr(&real));
    } else {
        assert!(real.status.success(), "{}", stderr(&real));
        assert!(ctr_view(&cluster, &worker).contains_key(&web));
    }
    let o = run_kiln_on(
        &d,
        &["load", "--kind-cluster", CLUSTER, "--from-docker", &web],
    );
    eprintln!(
        "kiln load --from-docker ({store:?} store): {}",
        stderr(&o).trim()
    );
    assert_ok(&o);
    assert_nodes_hold(&cluster, &[busybox, &web]);

    if store == Store::Containerd {
        a_bundled_name_is_not_taken_over(&d, &cluster, &env);
        a_node_that_vanishes_fails_alone(&d, &cluster, &env, &addr);
    }
}

/// load's rule in a cluster: a different image under a bundled name is
/// refused in every node (nothing imported), the pin and content unchanged.
fn a_bundled_name_is_not_taken_over(d: &Dockerd, cluster: &Cluster, env: &Env) {
    let coredns = env.image("coredns/coredns");
    let archive = env.path("impostor.tar");
    std::fs::write(
        &archive,
        kiln_testkit::archive::docker_save_legacy(&[(&coredns.platforms[0], &[BUNDLED[0]])]),
    )
    .unwrap();
    let before: Vec<BTreeMap<String, String>> =
        cluster.nodes.iter().map(|n| ctr_view(cluster, n)).collect();
    let o = run_kiln_on(
        d,
        &[
            "load",
            "--kind-cluster",
            CLUSTER,
            "--archive",
            archive.to_str().unwrap(),
        ],
    );
    assert_fails(&o, 1, &["2 of 2 nodes failed"]);
    assert!(
        stderr(&o).contains("registry.k8s.io/pause:3.10 is bundled (pinned) there as")
            && stderr(&o).contains("give --force to replace it"),
        "{}",
        stderr(&o)
    );
    for n in &cluster.nodes {
        assert!(stderr(&o).contains(&format!("node {n}:")), "{}", stderr(&o));
    }
    let after: Vec<BTreeMap<String, String>> =
        cluster.nodes.iter().map(|n| ctr_view(cluster, n)).collect();
    assert_eq!(before, after);
    assert_nodes_hold(cluster, &[]);
    // With --force it is taken over, and stays pinned (CRI says so).
    let o = run_kiln_on(
        d,
        &[
            "load",
            "--kind-cluster",
            CLUSTER,
            "--force",
            "--json",
            "--archive",
            archive.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    let loaded = node_lines(&o)["images"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(loaded, env.image("pause").top.digest);
    for n in &cluster.nodes {
        let digest = |v: &str| -> String {
            v.lines()
                .find(|l| l.starts_with(&format!("{} ", BUNDLED[0])))
                .and_then(|l| l.split_whitespace().nth(2))
                .unwrap_or_default()
                .to_string()
        };
        let ls = cluster.exec(n, &["ctr", "--namespace=k8s.io", "images", "ls"]);
        assert_eq!(digest(&ls), loaded, "{n}: {ls}");
        assert_eq!(cri_view(cluster, n).get(BUNDLED[0]), Some(&true), "{n}");
    }
}

/// A node removed while its import streams fails alone, named; the other
/// node completes; exit 1.
fn a_node_that_vanishes_fails_alone(d: &Dockerd, cluster: &Cluster, env: &Env, addr: &str) {
    let _ = env;
    let worker = format!("{CLUSTER}-worker");
    let plane = format!("{CLUSTER}-control-plane");
    // The worker's ctr takes the first 64 KiB of an import, says so, and
    // stalls: the test removes the node at that point, not after a delay.
    cluster.exec(
        &worker,
        &[
            "sh",
            "-c",
            "mv /usr/local/bin/ctr /usr/local/bin/ctr.real && printf '%s\\n' '#!/bin/sh' \
             'case \"$*\" in *import*) head -c 65536 >/dev/null; touch /tmp/import-began; exec sleep 600;; esac' \
             'exec /usr/local/bin/ctr.real \"$@\"' > /usr/local/bin/ctr && chmod 755 /usr/local/bin/ctr",
        ],
    );
    let api = format!("{addr}/app/api:1.0");
    let mut child = kiln_on(d, &["load", "--kind-cluster", CLUSTER, &api])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let o = kiln_testkit::tools::run_bounded(
            d.docker()
                .args(["exec", &worker, "sh", "-c", "test -e /tmp/import-began"]),
            30,
        );
        if o.status.success() {
            break;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("kiln ended ({st}) before the worker's import began");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the worker's import never began"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    d.run(&["rm", "--force", &worker]);
    let status = kiln_testkit::tools::wait_bounded(&mut child, 120);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    eprintln!("{err}");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("kiln: failed: node {worker}:")),
        "{err}"
    );
    assert!(
        err.contains(&format!("kiln: {plane}: loaded 1 images")),
        "{err}"
    );
    assert!(err.contains("1 of 2 nodes failed"), "{err}");
    let cri = cri_view(cluster, &plane);
    assert_eq!(cri.get(&api), Some(&false), "{cri:?}");
}

#[test]
fn kind_nodes_on_docker_with_its_classic_store() {
    kind_on_docker(Store::Classic);
}

#[test]
fn kind_nodes_on_docker_with_its_containerd_store() {
    kind_on_docker(Store::Containerd);
}
