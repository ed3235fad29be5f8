//! Node images without Docker: base image in, pinned node image out.

use std::collections::BTreeMap;

use crate::common::*;
use kiln_testkit::base::{
    blob, image_of, kind_base, layer_of, read_tar, tar_entries, unpack_layers,
};
use kiln_testkit::cri::CriNode;
use kiln_testkit::image::host_platform;

const EPOCH: &str = "1700000000";

fn other_platform() -> String {
    if host_platform() == "linux/amd64" {
        "linux/arm64".into()
    } else {
        "linux/amd64".into()
    }
}

fn push_base(env: &Env) -> String {
    let base = kind_base(&[&host_platform(), &other_platform()]);
    env.registry.push(&base).unwrap();
    format!("{}/kindest/base:test", env.registry.addr)
}

fn json(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).unwrap()
}

/// index.json -> the node image's manifest (single platform) and its config.
fn node_manifest(files: &BTreeMap<String, Vec<u8>>) -> (serde_json::Value, serde_json::Value) {
    let index = json(&files["index.json"]);
    let top = &index["manifests"][0];
    let m = json(blob(files, top["digest"].as_str().unwrap()));
    let c = json(blob(files, m["config"]["digest"].as_str().unwrap()));
    (m, c)
}

fn layer_entries(files: &BTreeMap<String, Vec<u8>>, digest: &str) -> BTreeMap<String, Vec<u8>> {
    tar_entries(flate2::read::GzDecoder::new(blob(files, digest)))
}

fn build_node(env: &Env, base: &str, refs: &[&str], extra: &[&str]) -> std::process::Output {
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", refs);
    let mut args = vec!["build", "--manifest", m.to_str().unwrap(), "--base", base];
    let mirror = env.mirror();
    args.extend(["--mirror", &mirror]);
    args.extend(extra);
    kiln_env(&args, &[("SOURCE_DATE_EPOCH", EPOCH)])
}

#[test]
fn node_image_archive_boots_its_own_containerd_with_every_image_pinned() {
    let env = Env::new();
    let base_ref = push_base(&env);
    let base = kind_base(&[&host_platform(), &other_platform()]);
    let out = env.path("node.tar");
    let o = build_node(
        &env,
        &base_ref,
        ALL,
        &[
            "--output",
            &format!("oci-archive:{}", out.display()),
            "--tag",
            "kindest/node:v1.31.2",
        ],
    );
    assert_ok(&o);
    let files = read_tar(&out);
    let index = json(&files["index.json"]);
    assert_eq!(
        index["manifests"][0]["annotations"]["io.containerd.image.name"],
        "docker.io/kindest/node:v1.31.2"
    );
    let (m, c) = node_manifest(&files);

    // Base layers are the same blobs, byte for byte; kiln's on top.
    let layers = kiln_testkit::base::layer_digests(&m);
    let base_layers: Vec<String> = base.platforms[0]
        .layers
        .iter()
        .map(|l| l.blob.digest.clone())
        .collect();
    assert!(layers.len() > 3, "{layers:?}");
    assert_eq!(layers[..2], base_layers[..]);
    // Config: the base's entrypoint, env, labels and history kept, extended.
    assert_eq!(c["config"]["Entrypoint"], serde_json::json!(["/sbin/init"]));
    assert_eq!(c["config"]["Labels"]["org.example.base"], "kiln-test");
    assert_eq!(c["config"]["StopSignal"], "SIGRTMIN+3");
    assert_eq!(
        c["rootfs"]["diff_ids"].as_array().unwrap().len(),
        layers.len()
    );
    assert_eq!(c["history"].as_array().unwrap().len(), layers.len());
    assert_eq!(c["created"], "2023-11-14T22:13:20Z");
    let ann = &m["annotations"];
    assert_eq!(
        ann["org.opencontainers.image.created"],
        "2023-11-14T22:13:20Z"
    );
    assert_eq!(ann["org.opencontainers.image.version"], "v1.31.2");
    assert_eq!(ann["org.opencontainers.image.base.digest"], base.top.digest);
    // kiln's layers hold only what kiln owns; every one but the last
    // holds content blobs (with their parents) and has mtime 0.
    let blobs = "var/lib/containerd/io.containerd.content.v1.content/blobs/sha256";
    for (i, l) in layers[2..].iter().enumerate() {
        let last = i == layers.len() - 3;
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(blob(&files, l)));
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            let n = name.trim_end_matches('/');
            assert!(
                ["var", "var/lib", "etc", "kind"].contains(&n)
                    || n.starts_with("var/lib/containerd")
                    || n.starts_with("etc/containerd")
                    || n.starts_with("kind/"),
                "kiln layer holds {name}"
            );
            if !last {
                assert!(blobs.starts_with(n) || n.starts_with(blobs), "{name}");
                assert_eq!(e.header().mtime().unwrap(), 0, "{name}");
            }
        }
    }
    // The same tree a single layer gave: every file, link or whiteout in
    // exactly one of kiln's layers, and every directory again in the last
    // with the build's mtime (so the last word on it is the same).
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut dirs_last: BTreeMap<String, u64> = BTreeMap::new();
    for (i, l) in layers[2..].iter().enumerate() {
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(blob(&files, l)));
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            if e.header().entry_type().is_dir() {
                dirs_last.insert(name, e.header().mtime().unwrap());
            } else {
                assert!(seen.insert(name.clone(), i).is_none(), "{name} twice");
            }
        }
    }
    assert!(seen.len() > 10, "{seen:?}");
    for (d, mtime) in &dirs_last {
        assert_eq!(*mtime, EPOCH.parse::<u64>().unwrap(), "{d}");
    }
    let kiln_layer = layer_entries(&files, layers.last().unwrap());
    assert!(kiln_layer.contains_key("kind/kiln-manifest.yaml"));
    assert!(kiln_layer.contains_key("var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"));
    assert!(!kiln_layer.contains_key("usr/local/bin/containerd"));

    // Unpack with an independent unpacker and check the base's files.
    let rootfs = env.path("unpacked");
    std::fs::create_dir_all(&rootfs).unwrap();
    unpack_layers(&files, &layers, &rootfs);
    assert!(
        !rootfs.join("etc/old-file").exists(),
        "whiteout not honoured"
    );
    let mut opq: Vec<String> = std::fs::read_dir(rootfs.join("opq"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    opq.sort();
    assert_eq!(opq, ["c"]);
    assert_eq!(
        std::fs::read(rootfs.join("etc/keep-hard")).unwrap(),
        b"kept\n"
    );
    let cfg = std::fs::read_to_string(rootfs.join("etc/containerd/config.toml")).unwrap();
    assert!(
        cfg.starts_with("# kindest/base-style settings that must survive"),
        "{cfg}"
    );
    assert!(
        cfg.contains("max_container_log_line_size = 12345")
            && cfg.contains("snapshotter = \"native\""),
        "{cfg}"
    );
    assert!(
        cfg.contains("sandbox_image = \"registry.k8s.io/pause:3.10\""),
        "{cfg}"
    );

    // The image's OWN containerd, CRI on, sees every bundled image pinned.
    let own = rootfs.join("usr/local/bin/containerd");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut node = CriNode::start(&rootfs, Some(&own)).await.unwrap();
        for name in ALL {
            let img = node
                .image_status(name)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("CRI lacks {name}: {}", node.log_tail()));
            assert!(img.pinned, "{name} not pinned");
            eprintln!(
                "node image CRI: {name} pinned={} repoDigests={:?}",
                img.pinned, img.repo_digests
            );
        }
        node.stop().unwrap();
    });

    // docker-archive: what `docker load` reads.
    let d = env.path("node-docker.tar");
    assert_ok(&build_node(
        &env,
        &base_ref,
        ALL,
        &[
            "--output",
            &format!("docker-archive:{}", d.display()),
            "--tag",
            "kindest/node:v1.31.2",
        ],
    ));
    let files = read_tar(&d);
    let dm = json(&files["manifest.json"]);
    assert_eq!(
        dm[0]["RepoTags"],
        serde_json::json!(["kindest/node:v1.31.2"])
    );
    // The base's two layers and kiln's (small image layers, those only
    // kube-proxy:v1.31.2 holds, documents, the node's records: the test
    // images have no blob of 1 MiB).
    assert_eq!(dm[0]["Layers"].as_array().unwrap().len(), 6);
    for l in dm[0]["Layers"].as_array().unwrap() {
        assert!(files.contains_key(l.as_str().unwrap()));
    }
}

#[test]
fn two_platform_node_image_is_pushed_and_pulls_back_with_ctr() {
    let env = Env::new();
    let base_ref = push_base(&env);
    let target = format!("{}/kiln/node:v1", env.registry.addr);
    let refs = &[
        "registry.k8s.io/pause:3.10",
        "registry.k8s.io/etcd:3.5.16-0",
        "registry.k8s.io/kube-proxy:v1.31.2",
    ];
    let out = env.path("node.tar");
    let o = build_node(
        &env,
        &base_ref,
        refs,
        &[
            "--platform",
            &host_platform(),
            "--platform",
            &other_platform(),
            "--output",
            &format!("oci-archive:{}", out.display()),
            "--push",
            &target,
            "--json",
        ],
    );
    assert_ok(&o);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        report["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(report["platforms"].as_array().unwrap().len(), 2);
    // kiln's layers were written once, straight into the archive, as its
    // first entries (platform order, a layer two platforms share once);
    // the push read them from there.
    let mut layers: Vec<String> = Vec::new();
    for l in report["kilnLayers"].as_array().unwrap() {
        let name = format!(
            "blobs/sha256/{}",
            l["digest"].as_str().unwrap().trim_start_matches("sha256:")
        );
        if !layers.contains(&name) {
            layers.push(name);
        }
    }
    let mut ar = tar::Archive::new(std::fs::File::open(&out).unwrap());
    let first: Vec<String> = ar
        .entries()
        .unwrap()
        .take(layers.len())
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(first, layers);
    let files = read_tar(&out);
    for l in &layers {
        let bytes = &files[l];
        assert_eq!(
            format!(
                "blobs/sha256/{}",
                kiln::primitives::digest::Digest::of(bytes).hex()
            ),
            *l
        );
    }
    assert_eq!(
        json(&files["index.json"])["manifests"][0]["digest"],
        report["digest"]
    );
    // verify of the two-platform archive, no --platform: both are verified,
    // each on its own; the other platform's CRI checks cannot run here
    // without consent to run the node's containerd, so the exit is 3, never
    // 0 (it was 0, the host's platform alone checked: issue 63).
    let archive = format!("oci-archive:{}", out.display());
    let v = kiln(&["verify", "--image", &archive]);
    let said = stderr(&v);
    assert_eq!(v.status.code(), Some(3), "{said}");
    assert!(
        said.contains(&format!(
            "holds {}, {}: each is verified on its own",
            host_platform(),
            other_platform()
        )) || said.contains(&format!(
            "holds {}, {}: each is verified on its own",
            other_platform(),
            host_platform()
        )),
        "{said}"
    );
    assert!(!said.contains("FAIL"), "{said}");
    assert!(
        said.contains(&format!("not run for {}", other_platform())),
        "{said}"
    );
    // The same, named as a comma list (as docker buildx and skopeo take it).
    let both = format!("{},{}", host_platform(), other_platform());
    let v = kiln(&["verify", "--image", &archive, "--json", "--platform", &both]);
    let reports: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    let mut checked: Vec<&str> = reports
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["platform"].as_str().unwrap())
        .collect();
    checked.sort();
    let mut want = vec![host_platform(), other_platform()];
    want.sort();
    assert_eq!(checked, want);
    // Told one platform, it checks that one.
    let v = kiln(&[
        "verify",
        "--image",
        &archive,
        "--platform",
        &host_platform(),
    ]);
    assert_ok(&v);
    // An independent client: containerd's ctr fetches every platform.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let root = env.path("ctr-root");
        let d = kiln::adapters::daemon::Daemon::start(
            &kiln_testkit::tools::containerd(),
            &root,
            &Default::default(),
        )
        .await
        .unwrap();
        ctr_fetch(&d.socket, &target, &["--all-platforms"]);
        let ls = std::process::Command::new(kiln_testkit::tools::ctr())
            .args(["--address", d.socket.to_str().unwrap(), "images", "check"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&ls.stdout);
        assert!(out.contains(&target) && out.contains("complete"), "{out}");
        d.stop().unwrap();
    });
    // Pushing again skips what the registry has: with SOURCE_DATE_EPOCH the
    // rebuild is the same image, so every blob (two shared base layers, and
    // per platform a config and kiln's three layers) is there: none
    // uploaded; only the two platform manifests go again, and the tag is
    // set again.
    let o = build_node(
        &env,
        &base_ref,
        refs,
        &[
            "--platform",
            &host_platform(),
            "--platform",
            &other_platform(),
            "--push",
            &target,
        ],
    );
    assert_ok(&o);
    assert!(
        // Every blob of both platforms (each once), kiln's four layers each among them.
        stderr(&o).contains("(0 blobs uploaded (0 B), 0 mounted (0 B), 12 already there"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn hostile_base_layers_change_nothing_outside_the_rootfs() {
    use tar::EntryType::{Regular as F, Symlink as S};
    let env = Env::new();
    let outside = tempfile::Builder::new()
        .prefix("kiln-outside-")
        .tempdir()
        .unwrap();
    let o = outside.path().display().to_string();
    let dotdot = format!("../../../../../../../../..{o}/dotdot");
    let abs = format!("{o}/absolute");
    let rel_up = format!("../../../../../../../..{o}");
    let l1 = layer_of(&[
        (&dotdot, F, b"x", "", 0o644),
        (&abs, F, b"x", "", 0o644),
        ("escape", S, b"", &o, 0o777),
        ("up", S, b"", &rel_up, 0o777),
    ]);
    let l2 = layer_of(&[
        ("escape/pwned", F, b"x", "", 0o644),
        ("up/pwned2", F, b"x", "", 0o644),
    ]);
    let base = image_of("hostile/base", "1", &[&host_platform()], vec![l1, l2]);
    env.registry.push(&base).unwrap();
    let out = env.path("node.tar");
    let r = build_node(
        &env,
        &format!("{}/hostile/base:1", env.registry.addr),
        &["registry.k8s.io/pause:3.10"],
        &["--output", &format!("oci-archive:{}", out.display())],
    );
    assert!(!stderr(&r).contains("panicked"), "{}", stderr(&r));
    let left: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "the base wrote outside the rootfs: {left:?}"
    );
    assert_ok(&r);
}

/// `--layer-compression zstd|none`: kiln's layer in that form, named by its
/// media type; the image unpacks with an independent unpacker and the
/// node's containerd sees every image pinned; `kiln verify` agrees. The
/// JSON report says where the time went.
#[test]
fn layer_compression_zstd_and_none_give_working_node_images() {
    let env = Env::new();
    let base_ref = push_base(&env);
    for (kind, media_type, magic) in [
        (
            "zstd",
            "application/vnd.oci.image.layer.v1.tar+zstd",
            &[0x28u8, 0xb5, 0x2f, 0xfd][..],
        ),
        ("none", "application/vnd.oci.image.layer.v1.tar", &b""[..]),
    ] {
        let out = env.path(&format!("{kind}.tar"));
        let o = build_node(
            &env,
            &base_ref,
            ALL,
            &[
                "--json",
                "--layer-compression",
                kind,
                "--output",
                &format!("oci-archive:{}", out.display()),
            ],
        );
        assert_ok(&o);
        let report = json(&o.stdout);
        for phase in ["pullBase", "extract", "bake", "pack"] {
            assert!(
                report["phases"][phase].as_f64().unwrap() >= 0.0,
                "{report:#}"
            );
        }
        let files = read_tar(&out);
        let (m, _) = node_manifest(&files);
        let kiln_layer = m["layers"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(kiln_layer["mediaType"], media_type);
        let bytes = blob(&files, kiln_layer["digest"].as_str().unwrap());
        assert!(bytes.starts_with(magic), "{kind}: not {kind}-compressed");
        if kind == "none" {
            assert!(tar_entries(bytes).contains_key("kind/kiln-manifest.yaml"));
        }
        let rootfs = tempfile::tempdir().unwrap();
        let digests: Vec<String> = m["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect();
        unpack_layers(&files, &digests, rootfs.path());
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let mut node = CriNode::start(rootfs.path(), None).await.unwrap();
            for name in ALL {
                let img = node
                    .image_status(name)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{kind}: {name}"));
                assert!(img.pinned, "{kind}: {name}");
            }
            node.stop().unwrap();
        });
        assert_ok(&kiln(&[
            "verify",
            "--image",
            &format!("oci-archive:{}", out.display()),
        ]));
    }
}

/// Issue 44.3: a base too deep for kiln's layers and the 5 left for what
/// goes on top is refused from its manifest, in one line naming the limit,
/// before any blob of it (or any image) is fetched.
#[test]
fn a_base_too_deep_is_refused_before_anything_is_fetched() {
    use kiln_testkit::image::{Format, ImageDef, ImageSet, LayerDef};
    let env = Env::new();
    let layer = |i: usize| LayerDef {
        files: std::collections::BTreeMap::from([(format!("layer-{i}"), format!("{i}"))]),
        random_bytes: 0,
        seed: 0,
    };
    let names: Vec<String> = (0..115).map(|i| format!("l{i}")).collect();
    let set = ImageSet {
        layers: names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), layer(i)))
            .collect(),
        images: vec![ImageDef {
            repo: "deep/base".into(),
            tag: "1".into(),
            format: Format::Oci,
            platforms: vec![kiln_testkit::image::host_platform()],
            attestations: false,
            layers: names.clone(),
            runnable: false,
        }],
    };
    env.registry.seed(&set).unwrap();
    let proxy = kiln_testkit::proxy::counting_proxy(env.registry.url());
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let base = format!("{}/deep/base:1", proxy.addr());
    let mirror = format!("registry.k8s.io={}", proxy.server.url());
    let out = env.path("node.tar");
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        &base,
        "--mirror",
        &mirror,
        "--output",
        &format!("oci-archive:{}", out.display()),
    ]);
    assert_fails(&o, 2, &["the base has 116 layers", "at most 114 layers"]);
    let blobs: Vec<String> = proxy
        .take()
        .into_iter()
        .filter(|c| c.target.contains("/blobs/"))
        .map(|c| c.target)
        .collect();
    assert!(blobs.is_empty(), "fetched before refusing: {blobs:?}");
    assert!(!out.exists());
}

/// Issue 63, finding 3: a push registry that is down is a network error
/// (exit 1) found before anything is built, with or without --previous;
/// it was exit 2 advising --previous, and with --previous the whole build
/// ran and failed at the push.
#[test]
fn a_push_registry_that_is_down_is_found_before_the_build() {
    let env = Env::new();
    let base_ref = push_base(&env);
    // Nothing listens on port 9 of loopback (discard): refused at once.
    let down = "127.0.0.1:9/kiln/node:v1";
    for extra in [
        vec!["--push", down],
        vec!["--push", down, "--previous", "registry.k8s.io/kiln/node:v0"],
    ] {
        let o = build_node(&env, &base_ref, &["registry.k8s.io/pause:3.10"], &extra);
        let err = stderr(&o);
        eprintln!("{extra:?}:\n{err}");
        assert_fails(
            &o,
            1,
            &["the --push registry cannot be reached", "nothing was built"],
        );
        assert!(!err.contains("kiln: stored"), "{err}");
        assert!(!err.contains("REF@sha256"), "{err}");
    }
}

/// Issue 63, finding 3: a base that lacks this machine's platform, built
/// without --platform, names the platform it has and the flag to pass,
/// exit 2 (it said "drop --platform linux/amd64", a flag never given, exit 1).
#[test]
fn a_base_without_this_machines_platform_names_the_one_it_has() {
    let env = Env::new();
    let base = kind_base(&[&other_platform()]);
    env.registry.push(&base).unwrap();
    let base_ref = format!("{}/kindest/base:test", env.registry.addr);
    let out = env.path("node.tar");
    let o = build_node(
        &env,
        &base_ref,
        &["registry.k8s.io/pause:3.10"],
        &["--output", &format!("oci-archive:{}", out.display())],
    );
    let err = stderr(&o);
    eprintln!("{err}");
    assert_fails(&o, 2, &[&host_platform(), &other_platform(), "--platform"]);
    assert!(!err.contains("drop --platform"), "{err}");
    assert!(!out.exists());
}
