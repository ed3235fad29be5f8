//! `kiln verify` on real nodes: a good node passes every check with its own
//! containerd (1.7 and 2.x); each way to break one is caught and named; the
//! artifact is never changed.

use std::path::Path;

use crate::common::*;
use kiln_testkit::image::{host_platform, sha256};

fn node_image(env: &Env, containerd: &Path, name: &str) -> std::path::PathBuf {
    let base = kiln_testkit::base::kind_base_with(containerd, &[&host_platform()]);
    let repo = format!("kindest/base-{name}");
    let base = kiln_testkit::image::BuiltImage {
        repo: repo.clone(),
        ..base
    };
    env.registry.push(&base).unwrap();
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let out = env.path(&format!("{name}.tar"));
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        &format!("{}/{repo}:test", env.registry.addr),
        "--output",
        &format!("oci-archive:{}", out.display()),
        "--mirror",
        &env.mirror(),
    ]);
    assert_ok(&o);
    out
}

fn verify(args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let mut a = vec!["verify", "--json"];
    a.extend(args);
    let o = kiln(&a);
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o, v)
}

#[track_caller]
fn assert_all_checks_pass(o: &std::process::Output, v: &serde_json::Value, containerd_major: &str) {
    assert_ok(o);
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 5, "{v:#}");
    assert!(checks.iter().all(|c| c["ok"] == true), "{v:#}");
    assert!(
        v["containerd"]
            .as_str()
            .unwrap()
            .starts_with(containerd_major),
        "{v:#}"
    );
    let images = v["images"].as_array().unwrap();
    for name in ALL {
        let i = images
            .iter()
            .find(|i| i["repoTags"].as_array().unwrap().iter().any(|t| t == name))
            .unwrap_or_else(|| panic!("CRI lacks {name}: {v:#}"));
        assert_eq!(i["pinned"], true, "{name}");
        assert_eq!(i["bundled"], true, "{name}");
    }
}

#[test]
fn a_node_image_passes_with_its_own_containerd_1_7_and_2() {
    let env = Env::new();
    for (name, bin, major) in [
        ("one", kiln_testkit::tools::containerd(), "1.7"),
        ("two", kiln_testkit::tools::containerd2(), "2."),
    ] {
        let image = node_image(&env, &bin, name);
        let before = sha256(&std::fs::read(&image).unwrap());
        // The node's own containerd, with consent.
        let (o, v) = verify(&[
            "--trust-node-binaries",
            "--image",
            &format!("oci-archive:{}", image.display()),
        ]);
        assert_all_checks_pass(&o, &v, major);
        assert!(
            v["containerd"]
                .as_str()
                .unwrap()
                .contains("/rootfs/usr/local/bin/containerd"),
            "{v:#}"
        );
        // Without it, kiln's own (containerd on PATH: make deps's 1.7).
        let (o, v) = verify(&["--image", &format!("oci-archive:{}", image.display())]);
        assert_all_checks_pass(&o, &v, "1.7");
        assert!(
            !v["containerd"].as_str().unwrap().contains("/rootfs/"),
            "{v:#}"
        );
        assert_eq!(
            sha256(&std::fs::read(&image).unwrap()),
            before,
            "the archive changed"
        );
    }
}

/// A rootfs built by kiln, with containerd 1.7 as its own.
fn rootfs(env: &Env, name: &str) -> std::path::PathBuf {
    let r = env.path(name);
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    assert_ok(&env.build(&m, &r, &[]));
    let bin = r.join("usr/local/bin/containerd");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(kiln_testkit::tools::containerd(), &bin).unwrap();
    r
}

fn meta_db(r: &Path) -> String {
    sha256(
        &std::fs::read(r.join("var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"))
            .unwrap(),
    )
}

#[test]
fn a_rootfs_passes_and_is_not_touched_and_loaded_images_show_unpinned() {
    let env = Env::new();
    let r = rootfs(&env, "good");
    assert_ok(&kiln(&[
        "load",
        "--rootfs",
        r.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
        "registry.k8s.io/extra/busybox:1.36",
    ]));
    let before = meta_db(&r);
    let (o, v) = verify(&["--rootfs", r.to_str().unwrap()]);
    assert_all_checks_pass(&o, &v, "1.7");
    let loaded = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["bundled"] == false)
        .unwrap_or_else(|| panic!("the loaded image is not listed: {v:#}"));
    assert_eq!(loaded["pinned"], false, "{v:#}");
    assert_eq!(meta_db(&r), before, "verify changed the rootfs's store");
    // The text form: one line per check.
    let o = kiln(&["verify", "--rootfs", r.to_str().unwrap()]);
    assert_ok(&o);
    let err = stderr(&o);
    assert_eq!(err.matches("  ok    ").count(), 5, "{err}");
    assert!(
        err.contains("extra/busybox:1.36 is not bundled (loaded later); pinned: false"),
        "{err}"
    );
}

#[track_caller]
fn assert_caught(r: &Path, check: &str, needle: &str) {
    let (o, v) = verify(&["--rootfs", r.to_str().unwrap()]);
    assert_fails(&o, 1, &["checks failed", check]);
    let failed = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["ok"] == false && c["name"].as_str().unwrap().contains(check))
        .unwrap_or_else(|| panic!("{check} did not fail: {v:#}"));
    assert!(
        failed["details"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d.as_str().unwrap().contains(needle)),
        "{needle} not in {failed:#}"
    );
}

#[test]
fn each_way_to_break_a_node_is_caught_and_named() {
    let env = Env::new();
    // An image recorded unpinned.
    let r = rootfs(&env, "unpinned");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let node = kiln_testkit::cri::CriNode::start(&r, None).await.unwrap();
        for rec in [
            "registry.k8s.io/etcd:3.5.16-0",
            &format!("registry.k8s.io/etcd@{}", env.image("etcd").top.digest),
        ] {
            let o = node
                .ctr(&["images", "label", rec, "io.cri-containerd.pinned="])
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        node.stop().unwrap();
    });
    assert_caught(
        &r,
        "present, complete and pinned",
        "etcd:3.5.16-0: recorded without io.cri-containerd.pinned=pinned",
    );
    assert_caught(
        &r,
        "kubelet sees",
        "etcd:3.5.16-0: CRI reports pinned: false",
    );

    // A layer missing from the store.
    let r = rootfs(&env, "hole");
    let layer = &env.image("kube-apiserver").platforms[0]
        .layers
        .last()
        .unwrap()
        .blob
        .digest;
    std::fs::remove_file(
        r.join("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256")
            .join(&layer[7..]),
    )
    .unwrap();
    assert_caught(
        &r,
        "present, complete and pinned",
        &format!("layer {layer} is missing"),
    );

    // The sandbox image the node's config names is not bundled.
    let r = rootfs(&env, "sandbox");
    let cfg = r.join("etc/containerd/config.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("pause:3.10", "pause:3.9");
    std::fs::write(&cfg, text).unwrap();
    assert_caught(
        &r,
        "kubelet sees",
        "registry.k8s.io/pause:3.9, is not one of the bundled images",
    );
}

#[test]
fn bad_input_is_exit_2() {
    let env = Env::new();
    let o = kiln(&["verify", "--rootfs", env.path("nothing").to_str().unwrap()]);
    assert_fails(&o, 2, &["is not a directory"]);
    std::fs::create_dir(env.path("empty")).unwrap();
    let o = kiln(&["verify", "--rootfs", env.path("empty").to_str().unwrap()]);
    assert_fails(&o, 2, &["holds no containerd store"]);
}

/// A rootfs with runnable stand-ins for the sandbox and the control plane,
/// and `containerd` + its shim from `bin_dir` as the node's own.
fn runnable_rootfs(
    env: &Env,
    name: &str,
    bin_dir: &Path,
    broken_apiserver: bool,
) -> std::path::PathBuf {
    let (r, o) = build_runnable(env, name, bin_dir, broken_apiserver, &[]);
    assert_ok(&o);
    r
}

/// As [`runnable_rootfs`], with extra `kiln build` flags; the build's output.
fn build_runnable(
    env: &Env,
    name: &str,
    bin_dir: &Path,
    broken_apiserver: bool,
    extra: &[&str],
) -> (std::path::PathBuf, std::process::Output) {
    use kiln_testkit::base::runnable;
    let prefix = format!("run-{name}");
    let images = [
        runnable(&format!("{prefix}/pause"), "3.10", "/pause", &[]),
        runnable(
            &format!("{prefix}/etcd"),
            "3.5.16-0",
            "/usr/local/bin/etcd",
            &[],
        ),
        runnable(
            &format!("{prefix}/kube-apiserver"),
            "v1.31.2",
            "/usr/local/bin/kube-apiserver",
            if broken_apiserver { &["exit"] } else { &[] },
        ),
        runnable(
            &format!("{prefix}/kube-controller-manager"),
            "v1.31.2",
            "/usr/local/bin/kube-controller-manager",
            &[],
        ),
        runnable(
            &format!("{prefix}/kube-scheduler"),
            "v1.31.2",
            "/usr/local/bin/kube-scheduler",
            &[],
        ),
    ];
    let mut refs = Vec::new();
    for i in &images {
        env.registry.push(i).unwrap();
        refs.push(format!("registry.k8s.io/{}:{}", i.repo, i.tag));
    }
    let m = env.manifest(
        &format!("{name}.yaml"),
        &refs[0],
        &refs.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let r = env.path(name);
    std::fs::create_dir_all(r.join("usr/local/bin")).unwrap();
    for b in ["containerd", "containerd-shim-runc-v2"] {
        std::fs::copy(bin_dir.join(b), r.join("usr/local/bin").join(b)).unwrap();
    }
    let o = env.build(&m, &r, extra);
    (r, o)
}

#[test]
fn build_verify_runs_the_checks_before_reporting_success() {
    let env = Env::new();
    let one = kiln_testkit::tools::containerd()
        .parent()
        .unwrap()
        .to_path_buf();
    let (_, o) = build_runnable(&env, "good", &one, false, &["--verify"]);
    assert_ok(&o);
    let err = stderr(&o);
    let want = if rustix::process::geteuid().is_root() {
        6
    } else {
        5
    };
    assert_eq!(err.matches("  ok    ").count(), want, "{err}");
    if want == 6 {
        let (_, o) = build_runnable(&env, "bad", &one, true, &["--verify"]);
        assert_fails(&o, 1, &["1 of 6 checks failed"]);
    }
}

#[test]
fn the_control_plane_starts_offline_on_1_7_and_2_and_a_dead_one_is_named() {
    if !rustix::process::geteuid().is_root() {
        // --start needs root; say so in one line.
        let env = Env::new();
        let r = rootfs(&env, "nonroot");
        let o = kiln(&["verify", "--rootfs", r.to_str().unwrap(), "--start"]);
        assert_fails(&o, 1, &["needs root"]);
        return;
    }
    let env = Env::new();
    let one = kiln_testkit::tools::containerd()
        .parent()
        .unwrap()
        .to_path_buf();
    let two = kiln_testkit::tools::containerd2()
        .parent()
        .unwrap()
        .to_path_buf();
    for (name, dir, major) in [("one", &one, "1.7"), ("two", &two, "2.")] {
        let r = runnable_rootfs(&env, name, dir, false);
        let (o, v) = verify(&[
            "--rootfs",
            r.to_str().unwrap(),
            "--start",
            "--trust-node-binaries",
        ]);
        assert_ok(&o);
        let checks = v["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 6, "{v:#}");
        assert!(checks.iter().all(|c| c["ok"] == true), "{v:#}");
        assert!(
            v["containerd"].as_str().unwrap().starts_with(major),
            "{v:#}"
        );
        let running = checks[5]["details"].as_array().unwrap();
        assert_eq!(running.len(), 4, "{v:#}");
    }
    let r = runnable_rootfs(&env, "broken", &one, true);
    let (o, v) = verify(&["--rootfs", r.to_str().unwrap(), "--start"]);
    assert_fails(
        &o,
        1,
        &["1 of 6 checks failed", "control plane start offline"],
    );
    let details = v["checks"][5]["details"].to_string();
    assert!(
        details.contains("kube-apiserver:v1.31.2: not running"),
        "{details}"
    );
}

/// kind issue 2160: users' own images preloaded in the node, yet reclaimable
/// by kubelet's GC. A `pinned: false` entry is bundled, managed, complete
/// and unpinned; `verify` holds it to that; a rebuild keeps it so, and
/// `kiln lock --write` keeps its form.
#[test]
fn a_preloaded_entry_is_bundled_but_reclaimable_and_verify_holds_it_so() {
    let env = Env::new();
    let preload = "registry.k8s.io/kube-proxy:v1.31.2";
    let text = |pinned: bool| {
        let mut t = "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n".to_string();
        for i in ALL {
            if *i == preload && !pinned {
                t.push_str(&format!("  - {{image: {i}, pinned: false}}\n"));
            } else {
                t.push_str(&format!("  - {i}\n"));
            }
        }
        t
    };
    let m = env.write("preload.yaml", &text(false));
    let r = env.path("preload-rootfs");
    assert_ok(&env.build(&m, &r, &[]));
    let bin = r.join("usr/local/bin/containerd");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(kiln_testkit::tools::containerd(), &bin).unwrap();
    let check = |r: &Path| {
        let view = inspect(r);
        for i in ALL {
            let rec = report(&view, i).unwrap_or_else(|| panic!("{i}: {view:#}"));
            assert_eq!(rec["complete"], true, "{i}: {view:#}");
            assert_eq!(rec["pinned"], *i != preload, "{i}: {view:#}");
        }
        let (o, v) = verify(&["--rootfs", r.to_str().unwrap()]);
        assert_ok(&o);
        assert!(
            v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["ok"] == true),
            "{v:#}"
        );
        let cri = v["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| {
                i["repoTags"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t == preload)
            })
            .unwrap_or_else(|| panic!("{v:#}"))
            .clone();
        assert_eq!(cri["bundled"], true);
        assert_eq!(cri["pinned"], false, "CRI: {cri:#}");
    };
    check(&r);
    // Pinned by one build, preloaded again by the next: the pin goes.
    let pinned = env.write("pinned.yaml", &text(true));
    assert_ok(&env.build(&pinned, &r, &[]));
    assert_eq!(report(&inspect(&r), preload).unwrap()["pinned"], true);
    assert_ok(&env.build(&m, &r, &[]));
    check(&r);
    // Held to a manifest that wants it pinned, the node fails, naming it.
    let (o, v) = verify(&[
        "--rootfs",
        r.to_str().unwrap(),
        "--manifest",
        pinned.to_str().unwrap(),
    ]);
    assert_fails(&o, 1, &["checks failed"]);
    assert!(
        v["checks"]
            .to_string()
            .contains("kube-proxy:v1.31.2: recorded without io.cri-containerd.pinned=pinned"),
        "{v:#}"
    );
    // kiln lock --write pins the digest and keeps `pinned: false`.
    assert_ok(&kiln(&[
        "lock",
        "--manifest",
        m.to_str().unwrap(),
        "--write",
        "--mirror",
        &env.mirror(),
    ]));
    let locked = std::fs::read_to_string(&m).unwrap();
    let line = locked.lines().find(|l| l.contains("kube-proxy")).unwrap();
    assert!(
        line.contains("kube-proxy:v1.31.2@sha256:") && line.contains("pinned: false"),
        "{locked}"
    );
}
