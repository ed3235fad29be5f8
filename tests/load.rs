//! `kiln load` end to end: user images are managed but unpinned, bundled ones
//! stay pinned, bad archives change nothing.

use crate::common::*;
use kiln_testkit::archive::{docker_save_legacy, docker_save_v25, oci_layout, raw_tar};
use kiln_testkit::cri::CriNode;
use kiln_testkit::image::{build, host_platform, Format, ImageDef};

const BUNDLED: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/etcd:3.5.16-0",
];

/// A user image no registry has: `myapp:dev`, as the test builds it.
fn myapp(tag: &str, seed: &str) -> kiln_testkit::image::BuiltImage {
    let def = ImageDef {
        repo: "myapp".into(),
        tag: tag.into(),
        format: Format::Docker,
        platforms: vec![host_platform()],
        attestations: false,
        layers: vec![seed.into()],
        runnable: false,
    };
    build(&def, &fixture_set().layers).unwrap()
}

fn built_node(env: &Env) -> std::path::PathBuf {
    let rootfs = env.path("rootfs");
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", BUNDLED);
    assert_ok(&env.build(&m, &rootfs, &[]));
    rootfs
}

fn load(env: &Env, rootfs: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["load", "--rootfs", rootfs.to_str().unwrap()];
    let mirror = env.mirror();
    if !extra.contains(&"--archive") {
        args.extend(["--mirror", mirror.as_str()]);
    }
    args.extend(extra);
    kiln(&args)
}

#[test]
fn loaded_images_are_unpinned_and_bundled_ones_stay_pinned_for_the_kubelet() {
    let env = Env::new();
    let rootfs = built_node(&env);
    let app = myapp("dev", "base");
    let archive = env.path("myapp.tar");
    std::fs::write(
        &archive,
        docker_save_legacy(&[(&app.platforms[0], &["myapp:dev"])]),
    )
    .unwrap();

    let o = load(
        &env,
        &rootfs,
        &[
            "registry.k8s.io/extra/busybox:1.36",
            "registry.k8s.io/kube-proxy:v1.31.2",
        ],
    );
    assert_ok(&o);
    assert_ok(&load(
        &env,
        &rootfs,
        &["--archive", archive.to_str().unwrap()],
    ));
    // Re-loading a bundled image keeps it pinned.
    assert_ok(&load(&env, &rootfs, &["registry.k8s.io/pause:3.10"]));

    let loaded = [
        "registry.k8s.io/extra/busybox:1.36",
        "registry.k8s.io/kube-proxy:v1.31.2",
        "docker.io/library/myapp:dev",
    ];
    let view = inspect(&rootfs);
    for name in loaded {
        let r = report(&view, name).unwrap_or_else(|| panic!("{name} missing: {view:#}"));
        assert_eq!(
            (
                r["pinned"].as_bool(),
                r["managed"].as_bool(),
                r["complete"].as_bool()
            ),
            (Some(false), Some(true), Some(true)),
            "{r}"
        );
    }
    for name in BUNDLED {
        assert_eq!(report(&view, name).unwrap()["pinned"], true);
    }

    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut node = CriNode::start(&rootfs, None).await.unwrap();
        let images = node.list_images().await.unwrap();
        let find = |name: &str| {
            images
                .iter()
                .find(|i| i.repo_tags.iter().any(|t| t == name))
                .unwrap_or_else(|| panic!("CRI lacks {name}: {images:#?}"))
                .clone()
        };
        for name in loaded {
            let img = find(name);
            assert!(!img.pinned, "CRI reports loaded {name} pinned");
            eprintln!(
                "CRI loaded: {name} pinned={} repoDigests={:?}",
                img.pinned, img.repo_digests
            );
        }
        for name in BUNDLED {
            let img = find(name);
            assert!(img.pinned, "CRI reports bundled {name} unpinned");
            eprintln!(
                "CRI bundled: {name} pinned={} repoDigests={:?}",
                img.pinned, img.repo_digests
            );
        }
        // Forced GC, then every image, loaded or bundled, is still whole.
        assert!(node
            .ctr(&[
                "images",
                "tag",
                "docker.io/library/myapp:dev",
                "scratch.local/gc:1"
            ])
            .unwrap()
            .status
            .success());
        assert!(node
            .ctr(&["images", "rm", "--sync", "scratch.local/gc:1"])
            .unwrap()
            .status
            .success());
        let check = String::from_utf8(node.ctr(&["images", "check"]).unwrap().stdout).unwrap();
        for name in loaded.iter().chain(BUNDLED) {
            let line = check
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} not in:\n{check}"));
            assert!(line.contains("complete"), "{line}");
        }
        node.stop().unwrap();
    });
}

#[test]
fn a_different_image_under_a_bundled_name_needs_force() {
    let env = Env::new();
    let rootfs = built_node(&env);
    let before = inspect(&rootfs);
    let impostor = myapp("x", "bin");
    let archive = env.path("pause.tar");
    std::fs::write(
        &archive,
        docker_save_legacy(&[(&impostor.platforms[0], &["registry.k8s.io/pause:3.10"])]),
    )
    .unwrap();
    let o = load(&env, &rootfs, &["--archive", archive.to_str().unwrap()]);
    assert_fails(&o, 1, &["1 of 1 images failed"]);
    assert!(
        stderr(&o).contains("registry.k8s.io/pause:3.10 is a bundled (pinned) image")
            && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    assert_eq!(inspect(&rootfs), before);

    assert_ok(&load(
        &env,
        &rootfs,
        &["--archive", archive.to_str().unwrap(), "--force"],
    ));
    let after = inspect(&rootfs);
    let pause = report(&after, "registry.k8s.io/pause:3.10").unwrap();
    assert_ne!(
        pause["digest"],
        report(&before, "registry.k8s.io/pause:3.10").unwrap()["digest"]
    );
    assert_eq!(
        pause["pinned"], true,
        "a forced replacement stays pinned: {pause}"
    );
}

#[test]
fn every_archive_layout_loads_with_its_names() {
    let env = Env::new();
    let rootfs = built_node(&env);
    let a = myapp("legacy", "base");
    let b = myapp("v25", "bin");
    let proxy = env.image("kube-proxy");
    let legacy = env.write("legacy.tar", "");
    std::fs::write(
        &legacy,
        docker_save_legacy(&[
            (&a.platforms[0], &["myapp:legacy", "example.com/team/app:1"]),
            (&b.platforms[0], &["myapp:v25-legacy"]),
        ]),
    )
    .unwrap();
    let v25 = env.path("v25.tar");
    std::fs::write(
        &v25,
        docker_save_v25(&b.platforms[0], "docker.io/library/myapp:v25"),
    )
    .unwrap();
    // A multi-platform OCI layout that holds only the host platform's blobs (kind #4224), gzipped.
    let oci = env.path("oci.tar.gz");
    let host = host_platform();
    std::fs::write(
        &oci,
        kiln_testkit::image::gzip(&oci_layout(
            proxy,
            "example.com/proxy:v1",
            Some(&[host.as_str()]),
        )),
    )
    .unwrap();
    let o = load(
        &env,
        &rootfs,
        &[
            "--archive",
            legacy.to_str().unwrap(),
            v25.to_str().unwrap(),
            oci.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    let view = inspect(&rootfs);
    for name in [
        "docker.io/library/myapp:legacy",
        "example.com/team/app:1",
        "docker.io/library/myapp:v25-legacy",
        "docker.io/library/myapp:v25",
        "example.com/proxy:v1",
    ] {
        let r = report(&view, name).unwrap_or_else(|| panic!("{name} missing: {view:#}"));
        assert_eq!(
            (r["pinned"].as_bool(), r["complete"].as_bool()),
            (Some(false), Some(true)),
            "{r}"
        );
    }
    // Asking the partial archive for a platform it lacks names what is missing.
    let other = if host == "linux/amd64" {
        "linux/arm64"
    } else {
        "linux/amd64"
    };
    let o = load(
        &env,
        &rootfs,
        &["--archive", oci.to_str().unwrap(), "--platform", other],
    );
    assert_fails(&o, 1, &["1 of 1 images failed"]);
    assert!(
        stderr(&o).contains("is not in the archive"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_archives_are_refused_and_change_nothing() {
    let env = Env::new();
    let rootfs = built_node(&env);
    let before = inspect(&rootfs);
    let app = myapp("dev", "base");
    let p = &app.platforms[0];
    let good = docker_save_legacy(&[(p, &["myapp:dev"])]);
    let cfg_name = format!("{}.json", p.config.digest.trim_start_matches("sha256:"));
    let layer_name = format!(
        "{}/layer.tar",
        p.layers[0].diff_id.trim_start_matches("sha256:")
    );
    let manifest = serde_json::to_vec(&serde_json::json!([{"Config": cfg_name, "RepoTags": ["myapp:dev"], "Layers": [layer_name]}])).unwrap();
    let mut tampered = p.layers[0].tar.clone();
    let n = tampered.len();
    tampered[n / 3] ^= 1;
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "random.tar",
            b"this is not a tar archive at all, not even close".repeat(20),
            &["is not a tar archive"],
        ),
        (
            "empty.tar",
            vec![0u8; 1024],
            &["is not a tar archive, or is empty"],
        ),
        (
            "nomanifest.tar",
            raw_tar(&[("hello.txt", b"hi")]),
            &["neither index.json", "manifest.json"],
        ),
        (
            "missing-layer.tar",
            raw_tar(&[("manifest.json", &manifest), (&cfg_name, &p.config.bytes)]),
            &["lists layer", "lacks it"],
        ),
        (
            "mismatch.tar",
            raw_tar(&[
                ("manifest.json", &manifest),
                (&cfg_name, &p.config.bytes),
                (&layer_name, &tampered),
            ]),
            &["does not match the config"],
        ),
        (
            "badconfig.tar",
            raw_tar(&[
                ("manifest.json", &manifest),
                (&cfg_name, b"{\"rootfs\":{}}  "),
                (&layer_name, &p.layers[0].tar),
            ]),
            &["does not match its name"],
        ),
        (
            "dotdot.tar",
            raw_tar(&[("../evil", b"x"), ("manifest.json", &manifest)]),
            &["\"../evil\" points outside the archive"],
        ),
        (
            "absolute.tar",
            raw_tar(&[("/etc/evil", b"x")]),
            &["\"/etc/evil\" points outside the archive"],
        ),
        (
            "truncated.tar",
            good[..good.len() / 2].to_vec(),
            &["truncated"],
        ),
    ];
    for (name, bytes, needles) in cases {
        let path = env.path(name);
        std::fs::write(&path, &bytes).unwrap();
        let o = load(&env, &rootfs, &["--archive", path.to_str().unwrap()]);
        let mut all = vec![name];
        all.extend(needles);
        assert_fails(&o, 2, &all);
        assert_eq!(stderr(&o).lines().count(), 1, "{name}: {}", stderr(&o));
    }
    let o = load(
        &env,
        &rootfs,
        &["--archive", env.path("nope.tar").to_str().unwrap()],
    );
    assert_fails(&o, 2, &["nope.tar", "cannot open"]);
    assert_eq!(inspect(&rootfs), before);
}

#[test]
fn loads_into_a_running_containerd_by_address() {
    let env = Env::new();
    let rootfs = built_node(&env);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut node = CriNode::start(&rootfs, None).await.unwrap();
        let sock = node.socket().to_str().unwrap().to_string();
        // Issue 39.6c: a kiln lease whose pid this namespace cannot see
        // (another host's or container's kiln on the same socket) is not
        // kiln's to reap on a containerd it does not own.
        let lease = "kiln-load-4194000-1700000000000";
        let o = node.ctr(&["leases", "create", "--id", lease]).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mirror = env.mirror();
        let o = tokio::task::spawn_blocking(move || {
            kiln(&[
                "load",
                "--address",
                &sock,
                "--mirror",
                &mirror,
                "registry.k8s.io/extra/busybox:1.36",
            ])
        })
        .await
        .unwrap();
        assert_ok(&o);
        let o = node.ctr(&["leases", "ls"]).unwrap();
        let leases = String::from_utf8_lossy(&o.stdout);
        assert!(
            leases.contains(lease),
            "the other kiln's lease was reaped:\n{leases}"
        );
        let img = node
            .image_status("registry.k8s.io/extra/busybox:1.36")
            .await
            .unwrap()
            .expect("CRI sees the loaded image");
        assert!(!img.pinned);
        assert!(
            node.image_status("registry.k8s.io/pause:3.10")
                .await
                .unwrap()
                .unwrap()
                .pinned
        );
        node.stop().unwrap();
    });
    let o = kiln(&[
        "load",
        "--address",
        env.path("no.sock").to_str().unwrap(),
        "x:1",
    ]);
    assert_fails(&o, 1, &["cannot reach containerd"]);
}
