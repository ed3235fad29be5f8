//! Air-gapped work: bundle, then build with the registry gone; lock; digests.

use crate::common::*;
use kiln_testkit::cri::CriNode;
use kiln_testkit::image::host_platform;

#[test]
fn bundle_then_build_offline_pins_everything_for_the_kubelet() {
    let mut env = Env::new();
    let manifest = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let bundle = env.path("bundle.tar");
    let mirror = env.mirror();
    let o = kiln(&[
        "bundle",
        "--manifest",
        manifest.to_str().unwrap(),
        "--output",
        bundle.to_str().unwrap(),
        "--mirror",
        &mirror,
    ]);
    assert_ok(&o);
    assert!(
        !env.path("bundle.tar.kiln-staging").exists(),
        "staging left behind"
    );
    // Each blob once: no duplicate entries, and the manifest travels along.
    let mut names = Vec::new();
    let mut ar = tar::Archive::new(std::fs::File::open(&bundle).unwrap());
    for e in ar.entries().unwrap() {
        names.push(e.unwrap().path().unwrap().to_string_lossy().into_owned());
    }
    let mut dedup = names.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(names.len(), dedup.len(), "duplicate entries in {names:?}");
    assert!(
        names.contains(&"kiln/manifest.yaml".to_string())
            && names.contains(&"index.json".to_string())
    );
    // Shared layer `base` is stored once although three images use it.
    let base = &env.image("etcd").platforms[0].layers[0].blob.digest;
    assert_eq!(
        names
            .iter()
            .filter(|n| n.ends_with(base.trim_start_matches("sha256:")))
            .count(),
        1
    );

    // Registry gone: the build must not touch the network at all.
    env.registry.stop();
    let rootfs = env.path("rootfs");
    let o = kiln(&[
        "build",
        "--manifest",
        manifest.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--from",
        bundle.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let view = inspect(&rootfs);
    for name in ALL {
        let r = report(&view, name).unwrap_or_else(|| panic!("{name}: {view:#}"));
        assert_eq!(
            (r["pinned"].as_bool(), r["complete"].as_bool()),
            (Some(true), Some(true)),
            "{r}"
        );
        let built = env.image(
            name.trim_start_matches("registry.k8s.io/")
                .rsplit_once(':')
                .unwrap()
                .0,
        );
        assert_eq!(
            r["digest"], built.top.digest,
            "{name} keeps its registry digest"
        );
    }
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut node = CriNode::start(&rootfs, None).await.unwrap();
        for name in ALL {
            let img = node
                .image_status(name)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("CRI lacks {name}"));
            assert!(img.pinned, "{name} not pinned via CRI");
        }
        // The bundle imports with containerd's own tool too.
        let o = node
            .ctr(&[
                "images",
                "import",
                "--no-unpack",
                "--platform",
                &host_platform(),
                bundle.to_str().unwrap(),
            ])
            .unwrap();
        assert!(
            o.status.success(),
            "ctr import: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let ls = String::from_utf8(node.ctr(&["images", "ls", "-q"]).unwrap().stdout).unwrap();
        for name in ALL {
            assert!(
                ls.lines().any(|l| l == *name),
                "{name} not in ctr images ls after import:\n{ls}"
            );
        }
        node.stop().unwrap();
    });
}

#[test]
fn a_bundle_missing_an_image_or_platform_is_refused_before_writing() {
    let env = Env::new();
    let small = env.manifest(
        "small.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let bundle = env.path("small.tar");
    assert_ok(&kiln(&[
        "bundle",
        "--manifest",
        small.to_str().unwrap(),
        "--output",
        bundle.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]));
    let rootfs = env.path("rootfs");
    let full = env.manifest(
        "full.yaml",
        "registry.k8s.io/pause:3.10",
        &[
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/etcd:3.5.16-0",
        ],
    );
    let o = kiln(&[
        "build",
        "--manifest",
        full.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--from",
        bundle.to_str().unwrap(),
    ]);
    assert_fails(
        &o,
        2,
        &[
            "the bundle lacks",
            "registry.k8s.io/etcd:3.5.16-0 (not in the bundle)",
        ],
    );
    let other = if host_platform() == "linux/amd64" {
        "linux/arm64"
    } else {
        "linux/amd64"
    };
    let o = kiln(&[
        "build",
        "--manifest",
        small.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--from",
        bundle.to_str().unwrap(),
        "--platform",
        other,
    ]);
    assert_fails(
        &o,
        2,
        &[
            "the bundle lacks",
            &format!("registry.k8s.io/pause:3.10 {other}"),
        ],
    );
    assert!(
        !rootfs.join("var/lib/containerd").exists(),
        "nothing may be written"
    );
}

/// Issue 39.6a: an image named by digest alone (`repo@sha256:...`, no
/// tag) travels in a bundle under that digest name, and `build --from`
/// finds it there (the bundle's index dropped it: "not in the bundle").
#[test]
fn a_digest_only_image_travels_in_a_bundle() {
    let env = Env::new();
    let etcd = format!("registry.k8s.io/etcd@{}", env.image("etcd").top.digest);
    let m = env.manifest(
        "digest.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10", &etcd],
    );
    let bundle = env.path("digest.tar");
    assert_ok(&kiln(&[
        "bundle",
        "--manifest",
        m.to_str().unwrap(),
        "--output",
        bundle.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]));
    let rootfs = env.path("rootfs");
    assert_ok(&kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--from",
        bundle.to_str().unwrap(),
    ]));
    let images = inspect(&rootfs);
    let text = images.to_string();
    assert!(text.contains(&etcd), "{etcd} not stored: {text}");
}

#[test]
fn lock_pins_the_registry_digests_and_require_digests_enforces_them() {
    let env = Env::new();
    let text = "# release manifest\napiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n  - registry.k8s.io/pause:3.10   # the sandbox\n  - registry.k8s.io/etcd:3.5.16-0\n  - \"registry.k8s.io/coredns/coredns:v1.11.3\"\n";
    let m = env.write("node.yaml", text);
    let rootfs = env.path("rootfs");
    let o = env.build(&m, &rootfs, &["--require-digests"]);
    assert_fails(
        &o,
        2,
        &[
            "--require-digests",
            "line 6: registry.k8s.io/pause:3.10",
            "kiln lock --write",
        ],
    );

    let o = kiln(&[
        "lock",
        "--manifest",
        m.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]);
    assert_ok(&o);
    let printed = stdout(&o);
    for (repo, line) in [
        ("pause", "  - registry.k8s.io/pause:3.10@"),
        ("etcd", "  - registry.k8s.io/etcd:3.5.16-0@"),
        (
            "coredns/coredns",
            "  - \"registry.k8s.io/coredns/coredns:v1.11.3@",
        ),
    ] {
        let want = format!("{line}{}", env.image(repo).top.digest);
        assert!(
            printed.contains(&want),
            "lock output lacks {want}:\n{printed}"
        );
    }
    assert!(
        printed.starts_with("# release manifest\n") && printed.contains("# the sandbox"),
        "{printed}"
    );
    assert_eq!(
        std::fs::read_to_string(&m).unwrap(),
        text,
        "without --write the file is unchanged"
    );

    assert_ok(&kiln(&[
        "lock",
        "--manifest",
        m.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
        "--write",
    ]));
    assert_eq!(std::fs::read_to_string(&m).unwrap(), printed);
    assert_ok(&env.build(&m, &rootfs, &["--require-digests"]));
}
