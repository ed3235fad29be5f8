//! kind clusters on podman (issue 55): kiln's node image pulled by a
//! private podman (Debian 12's 4.3.1) and run with kind's podman flags
//! (`testkit::kind`: kind's `providers/podman/provision.go`, its /var an
//! anonymous volume made first and filled from the image), two nodes; then
//! `kiln load --kind-cluster` through podman from a registry, from
//! podman's own store (`--from-podman`), from an OCI layout directory and
//! an `oci-archive:`, each checked in every node through its CRI and `ctr`.
//! A second identical load streams no byte into any node, counted on the
//! node's side (its `ctr` counts what an import reads).

use crate::common::kind::{assert_nodes_hold, ctr_view, node_image, CLUSTER};
use crate::common::*;
use kiln_testkit::image::host_platform;
use kiln_testkit::kind::Cluster;
use kiln_testkit::podman::Podman;

/// kiln driving `p` (podman first on PATH, its configuration), plus `extra`.
fn kiln_on(p: &Podman, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
    let env = p.env();
    let mut envs: Vec<(&str, &str)> = env
        .iter()
        .map(|(k, v)| match k.as_str() {
            "PATH" => ("PATH+", v.split(':').next().unwrap()),
            k => (k, v.as_str()),
        })
        .collect();
    envs.extend(extra);
    kiln_testkit::tools::run_bounded(&mut kiln_cmd(args, &envs), 300)
}

fn report(o: &std::process::Output) -> serde_json::Value {
    assert_ok(o);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn kind_nodes_on_podman() {
    let env = Env::new();
    let (addr, node_image) = node_image(&env);
    let p = Podman::new(&[&addr]).unwrap();
    p.run(&["pull", &node_image]);
    let cluster = Cluster::start(&p, CLUSTER, &node_image, &["control-plane", "worker"]);
    // kind itself (v0.33.0, from its Go module), told to use podman as its
    // docs say, finds the nodes the tests start with its podman flags.
    let mut kind = std::process::Command::new(kiln_testkit::tools::kind());
    kind.args(["get", "nodes", "--name", CLUSTER]).env_clear();
    for (k, v) in p.env() {
        kind.env(k, v);
    }
    kind.env("KIND_EXPERIMENTAL_PROVIDER", "podman");
    let o = kiln_testkit::tools::run_bounded(&mut kind, 60);
    let mut got: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    got.sort();
    eprintln!(
        "kind get nodes --name {CLUSTER} (podman): {got:?} {}",
        stderr(&o)
    );
    assert_eq!(got, cluster.nodes, "kind get nodes: {}", stderr(&o));
    // The bundled set survives podman's copy of the image's /var into each
    // node's volume: every image pinned, as CRI reports it.
    assert_nodes_hold(&cluster, &[]);

    // From the registry, through podman (--provider).
    let busybox = "registry.k8s.io/extra/busybox:1.36";
    let args = [
        "load",
        "--kind-cluster",
        CLUSTER,
        "--mirror",
        &env.mirror(),
        busybox,
        "--json",
    ];
    let mut with_provider = args.to_vec();
    with_provider.extend(["--provider", "podman"]);
    let r = report(&kiln_on(&p, &with_provider, &[]));
    for n in r["nodes"].as_array().unwrap() {
        assert!(n["error"].is_null(), "{n}");
        assert_eq!(n["loaded"][0], busybox, "{n}");
        assert_eq!(n["snapshotter"], "overlayfs", "{n}");
        assert_eq!(n["platform"], host_platform(), "{n}");
    }
    assert_nodes_hold(&cluster, &[busybox]);

    // The same load again, podman from KIND_EXPERIMENTAL_PROVIDER as kind
    // reads it: every node holds it complete, so nothing is streamed,
    // counted on the nodes' side.
    let before: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| cluster.imported_bytes(n))
        .collect();
    assert!(before.iter().all(|b| *b > 0), "{before:?}");
    let r = report(&kiln_on(
        &p,
        &args,
        &[("KIND_EXPERIMENTAL_PROVIDER", "podman")],
    ));
    let after: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| cluster.imported_bytes(n))
        .collect();
    eprintln!("a second identical load: the nodes read {before:?} bytes, then {after:?}");
    assert_eq!(
        after, before,
        "a second identical load streamed bytes into the nodes"
    );
    for n in r["nodes"].as_array().unwrap() {
        assert_eq!(n["alreadyThere"][0], busybox, "{n}");
        assert_eq!(n["streamed"], 0, "{n}");
    }
    assert_nodes_hold(&cluster, &[busybox]);

    // From podman's own store: a multi-platform image with attestations,
    // pulled by podman for this platform.
    let web = format!("{addr}/app/web:1.0");
    p.run(&["pull", &web]);
    assert_ok(&kiln_on(
        &p,
        &[
            "load",
            "--kind-cluster",
            CLUSTER,
            "--provider",
            "podman",
            "--from-podman",
            &web,
        ],
        &[],
    ));
    assert_nodes_hold(&cluster, &[busybox, &web]);

    // From an OCI layout, as skopeo writes one and names it: a directory
    // (`oci:DIR:NAME`), and an archive (`oci-archive:FILE:NAME`).
    let api = format!("{addr}/app/api:1.0");
    let (dir, file) = (env.path("api-layout"), env.path("api.tar"));
    let layouts = [
        format!("oci:{}:example.com/app/api:1.0", dir.display()),
        format!(
            "oci-archive:{}:example.com/app/api-archived:1.0",
            file.display()
        ),
    ];
    for to in &layouts {
        let o = kiln_testkit::tools::skopeo()
            .args(["--insecure-policy", "copy", "--src-tls-verify=false"])
            .arg(format!("docker://{api}"))
            .arg(to)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    for from in &layouts {
        assert_ok(&kiln_on(
            &p,
            &[
                "load",
                "--kind-cluster",
                CLUSTER,
                "--provider",
                "podman",
                from,
            ],
            &[],
        ));
    }
    assert_nodes_hold(
        &cluster,
        &[
            busybox,
            &web,
            "example.com/app/api:1.0",
            "example.com/app/api-archived:1.0",
        ],
    );
    // A name the layout does not hold is refused, naming what it holds.
    let o = kiln_on(
        &p,
        &[
            "load",
            "--kind-cluster",
            CLUSTER,
            &format!("oci:{}:nope", dir.display()),
        ],
        &[],
    );
    assert_fails(
        &o,
        2,
        &["names no image \"nope\"", "example.com/app/api:1.0"],
    );
    assert!(ctr_view(&cluster, &cluster.nodes[0]).contains_key("example.com/app/api:1.0"));
}
