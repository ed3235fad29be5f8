//! kind node images from a Kubernetes release (`--kubernetes`): the release's
//! binaries in `/usr/bin`, its control-plane images under their unsuffixed
//! names, kind's layout, and every image pinned as the node's own containerd
//! (1.7 and 2.x, with version-2 and version-3 configs) reports through CRI.
//! Also: `{arch}` over loopback HTTPS, tampered releases, kubeadm's image set,
//! `--pin-existing`, and `kiln index`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::common::*;
use kiln_testkit::base::{
    image_of, kind_base_custom, layer_digests, layer_of, read_tar, unpack_layers, BASE_CONFIG_TOML,
    BASE_CONFIG_TOML_V3,
};
use kiln_testkit::image::{host_platform, BuiltImage};
use kiln_testkit::registry::Registry;
use kiln_testkit::release::{binary, release_files, release_tarball, HttpsFiles};

const VERSION: &str = "v1.32.5";
/// kubeadm v1.32's images besides the control plane, and what kind adds.
const OTHERS: &[(&str, &str)] = &[
    ("pause", "3.10"),
    ("etcd", "3.5.16-0"),
    ("coredns/coredns", "v1.11.3"),
    ("kindest/kindnetd", "v20250512-test"),
    ("kindest/local-path-provisioner", "v20250214-test"),
    ("kindest/local-path-helper", "v20250214-test"),
];

struct K {
    registry: Registry,
    dir: tempfile::TempDir,
}

fn full_name(repo: &str, tag: &str) -> String {
    if repo.starts_with("kindest/") {
        format!("docker.io/{repo}:{tag}")
    } else {
        format!("registry.k8s.io/{repo}:{tag}")
    }
}

impl K {
    /// A registry holding kubeadm's other images and kind's, for `platforms`.
    fn new(platforms: &[&str]) -> K {
        let registry = Registry::start().unwrap();
        for (repo, tag) in OTHERS {
            let file = format!("etc/{}", repo.replace('/', "-"));
            let layer = layer_of(&[(&file, tar::EntryType::Regular, tag.as_bytes(), "", 0o644)]);
            registry
                .push(&image_of(repo, tag, platforms, vec![layer]))
                .unwrap();
        }
        K {
            registry,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The kind-style manifest: kubeadm's others and kind's, no kube-*.
    fn manifest(&self, name: &str, skip: &[&str], extra: &str) -> PathBuf {
        let mut text = format!(
            "apiVersion: kiln/v1\nkind: NodeImageManifest\n{extra}sandboxImage: registry.k8s.io/pause:3.10\nimages:\n"
        );
        for (repo, tag) in OTHERS.iter().filter(|(r, _)| !skip.contains(r)) {
            text.push_str(&format!("  - {}\n", full_name(repo, tag)));
        }
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn push_base(&self, name: &str, base: BuiltImage) -> String {
        let repo = format!("kindest/base-{name}");
        self.registry
            .push(&BuiltImage {
                repo: repo.clone(),
                ..base
            })
            .unwrap();
        format!("{}/{repo}:test", self.registry.addr)
    }

    fn mirrors(&self) -> Vec<String> {
        let url = self.registry.url();
        vec![
            "--mirror".into(),
            format!("registry.k8s.io={url}"),
            "--mirror".into(),
            format!("docker.io={url}"),
        ]
    }

    /// `kiln build --json --manifest M --base B --output oci-archive:OUT` + `extra`.
    fn build(
        &self,
        manifest: &Path,
        base: &str,
        out: &Path,
        extra: &[&str],
    ) -> std::process::Output {
        let mut args: Vec<String> = vec![
            "build".into(),
            "--json".into(),
            "--manifest".into(),
            manifest.display().to_string(),
            "--base".into(),
            base.into(),
            "--output".into(),
            format!("oci-archive:{}", out.display()),
        ];
        args.extend(self.mirrors());
        args.extend(extra.iter().map(|s| s.to_string()));
        kiln(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }
}

fn arch_of(platform: &str) -> &str {
    platform.split('/').nth(1).unwrap()
}

/// The archive's per-platform manifests: (platform, manifest JSON).
fn manifests(files: &BTreeMap<String, Vec<u8>>) -> Vec<(String, serde_json::Value)> {
    let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let top = &index["manifests"][0];
    let top_doc: serde_json::Value = serde_json::from_slice(kiln_testkit::base::blob(
        files,
        top["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let entries: Vec<serde_json::Value> = match top_doc["manifests"].as_array() {
        Some(m) => m.clone(),
        None => vec![top.clone()],
    };
    entries
        .iter()
        .map(|e| {
            let m: serde_json::Value = serde_json::from_slice(kiln_testkit::base::blob(
                files,
                e["digest"].as_str().unwrap(),
            ))
            .unwrap();
            let p = e["platform"]
                .as_object()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p["os"].as_str().unwrap(),
                        p["architecture"].as_str().unwrap()
                    )
                })
                .unwrap_or_else(host_platform);
            (p, m)
        })
        .collect()
}

/// kiln's layer (the last), as tar headers: path -> (uid, gid, mode, bytes).
/// kiln's layers of a node manifest, merged (a later entry wins): the last
/// as many layers as the config's history has entries by kiln.
fn kiln_layer(
    files: &BTreeMap<String, Vec<u8>>,
    m: &serde_json::Value,
) -> BTreeMap<String, (u64, u64, u32, Vec<u8>)> {
    let config: serde_json::Value = serde_json::from_slice(kiln_testkit::base::blob(
        files,
        m["config"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let mine = config["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["comment"] == "kiln")
        .count();
    let layers = layer_digests(m);
    let mut out = BTreeMap::new();
    for l in &layers[layers.len() - mine..] {
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(kiln_testkit::base::blob(
            files, l,
        )));
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let h = e.header().clone();
            let mut v = Vec::new();
            e.read_to_end(&mut v).unwrap();
            out.insert(
                e.path().unwrap().to_string_lossy().into_owned(),
                (h.uid().unwrap(), h.gid().unwrap(), h.mode().unwrap(), v),
            );
        }
    }
    out
}

/// Every image the node should hold, as CRI names them.
fn expected_names() -> Vec<String> {
    let mut names: Vec<String> = OTHERS.iter().map(|(r, t)| full_name(r, t)).collect();
    for i in kiln_testkit::release::IMAGES {
        names.push(format!("registry.k8s.io/{i}:{VERSION}"));
    }
    names
}

/// The node's binaries, kind's layout and config, and (for the host
/// platform) CRI on the node's own `containerd` showing every image pinned.
fn check_node(archive: &Path, containerd: &Path, platforms: &[&str]) {
    let files = read_tar(archive);
    let ms = manifests(&files);
    assert_eq!(ms.len(), platforms.len());
    for (platform, m) in &ms {
        let arch = arch_of(platform);
        let layer = kiln_layer(&files, m);
        for b in kiln_testkit::release::BINARIES {
            let (uid, gid, mode, bytes) = layer.get(&format!("usr/bin/{b}")).unwrap_or_else(|| {
                panic!(
                    "{platform}: kiln's layer lacks usr/bin/{b}: {:?}",
                    layer.keys()
                )
            });
            assert_eq!(
                (*uid, *gid, *mode & 0o7777),
                (0, 0, 0o755),
                "{platform}: usr/bin/{b}"
            );
            assert!(
                *bytes == binary(b, arch, VERSION),
                "{platform}: usr/bin/{b} differs from the release's"
            );
        }
        let config: serde_json::Value = serde_json::from_slice(kiln_testkit::base::blob(
            &files,
            m["config"]["digest"].as_str().unwrap(),
        ))
        .unwrap();
        let c = &config["config"];
        assert_eq!(
            c["Entrypoint"],
            serde_json::json!(["/usr/local/bin/entrypoint", "/sbin/init"])
        );
        assert_eq!(
            c["StopSignal"], "SIGRTMIN+3",
            "the base's STOPSIGNAL is kept"
        );
        let env: Vec<&str> = c["Env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for v in [
            "HTTP_PROXY=",
            "HTTPS_PROXY=",
            "NO_PROXY=",
            "container=docker",
        ] {
            assert!(env.contains(&v), "{platform}: Env lacks {v}: {env:?}");
        }
        // An independent unpacker; then the node's own containerd.
        let rootfs = tempfile::tempdir().unwrap();
        unpack_layers(&files, &layer_digests(m), rootfs.path());
        let r = rootfs.path();
        assert_eq!(
            std::fs::read_to_string(r.join("kind/version")).unwrap(),
            format!("{VERSION}\n")
        );
        let cni = std::fs::read_to_string(r.join("kind/manifests/default-cni.yaml")).unwrap();
        assert!(
            cni.contains("image: docker.io/kindest/kindnetd:v20250512-test"),
            "{cni}"
        );
        assert!(
            cni.contains("{{ .PodSubnet }}"),
            "kind fills in the pod subnet"
        );
        let storage =
            std::fs::read_to_string(r.join("kind/manifests/default-storage.yaml")).unwrap();
        assert!(storage.contains("docker.io/kindest/local-path-provisioner:v20250214-test"));
        assert!(storage.contains("docker.io/kindest/local-path-helper:v20250214-test"));
        if *platform != host_platform() {
            continue;
        }
        // What the closing notes quote: the layers, the binaries, the version.
        for l in m["layers"].as_array().unwrap() {
            eprintln!(
                "layer {} {} {}",
                l["mediaType"].as_str().unwrap(),
                l["digest"].as_str().unwrap(),
                l["size"]
            );
        }
        for b in kiln_testkit::release::BINARIES {
            let (uid, gid, mode, bytes) = &layer[&format!("usr/bin/{b}")];
            eprintln!("/usr/bin/{b} {uid}:{gid} {mode:o} {} bytes", bytes.len());
        }
        eprintln!(
            "/kind/version {:?}",
            std::fs::read_to_string(r.join("kind/version")).unwrap()
        );
        let bin = r.join("usr/local/bin/containerd");
        assert_eq!(
            std::fs::read(&bin).unwrap(),
            std::fs::read(containerd).unwrap()
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut cri = kiln_testkit::cri::CriNode::start(r, Some(&bin))
                .await
                .unwrap();
            let images = cri.list_images().await.unwrap();
            for name in expected_names() {
                let i = images
                    .iter()
                    .find(|i| i.repo_tags.contains(&name))
                    .unwrap_or_else(|| panic!("CRI lacks {name}: {images:#?}"));
                assert!(i.pinned, "{name} is not pinned");
                eprintln!("CRI ({}): {name} pinned={}", containerd.display(), i.pinned);
            }
            assert!(
                !images
                    .iter()
                    .flat_map(|i| &i.repo_tags)
                    .any(|t| t.contains(&format!("-{}:", arch_of(platform)))),
                "an -ARCH name leaked: {images:#?}"
            );
            cri.stop().unwrap();
        });
    }
}

#[test]
fn a_release_node_image_has_kubernetes_inside_and_every_image_pinned_on_1_7_and_2() {
    let host = host_platform();
    let arch = arch_of(&host).to_string();
    let k = K::new(&[&host]);
    let tarball = release_tarball(k.dir.path(), VERSION, &arch);
    // A local build's output: the same files in a directory.
    let tree = k.path("build-output");
    for (p, b) in release_files(VERSION, &arch) {
        let to = tree.join(p);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, b).unwrap();
    }
    // A Kubernetes checkout after `make quick-release-images`, as kind's
    // source build reads it: no kubernetes/version, no .docker_tag files.
    let checkout = k.path("kubernetes-checkout");
    for (p, b) in release_files(VERSION, &arch) {
        let name = p.rsplit('/').next().unwrap();
        let to = if kiln_testkit::release::BINARIES.contains(&name) {
            checkout.join(format!("_output/dockerized/bin/linux/{arch}/{name}"))
        } else if name.ends_with(".tar") {
            checkout.join(format!("_output/release-images/{arch}/{name}"))
        } else {
            continue;
        };
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, b).unwrap();
    }
    let m = k.manifest("kind.yaml", &[], "");
    // A signature policy wanting a key nobody signed with on the release's
    // own images: they come from the release, trusted by its SHA-512, so
    // the build still admits them (the rest may be unsigned).
    let keys = k.path("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let o = kiln_testkit::tools::run_bounded(
        kiln_testkit::tools::cosign(&keys).args([
            "generate-key-pair",
            "--output-key-prefix",
            "nobody",
        ]),
        120,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut policy = String::from(
        "apiVersion: kiln/v1\nkind: SignaturePolicy\nimages:\n- match: \"*\"\n  unsigned: true\n",
    );
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
    ] {
        policy.push_str(&format!(
            "- match: registry.k8s.io/{c}\n  keys: [keys/nobody.pub]\n"
        ));
    }
    std::fs::write(k.path("policy.yaml"), policy).unwrap();
    let policy = k.path("policy.yaml");
    let c17 = kiln_testkit::tools::containerd();
    let c2 = kiln_testkit::tools::containerd2();
    for (name, bin, config, src) in [
        ("one-v2", &c17, BASE_CONFIG_TOML, &tarball),
        ("two-v2", &c2, BASE_CONFIG_TOML, &tarball),
        ("two-v3", &c2, BASE_CONFIG_TOML_V3, &tree),
        ("one-source", &c17, BASE_CONFIG_TOML, &checkout),
    ] {
        let base = k.push_base(name, kind_base_custom(bin, &[&host], config, true));
        let out = k.path(&format!("{name}.tar"));
        let sbom = k.path(&format!("{name}.spdx.json"));
        let o = k.build(
            &m,
            &base,
            &out,
            &[
                "--kubernetes",
                src.to_str().unwrap(),
                "--tag",
                &format!("kindest/node:{VERSION}"),
                "--sbom",
                sbom.to_str().unwrap(),
                "--verify-signatures",
                policy.to_str().unwrap(),
            ],
        );
        assert_ok(&o);
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["kubernetes"][0]["version"], VERSION, "{report:#}");
        // The SBOM names the release and each binary with its SHA-256, and
        // the SPDX project's validator accepts it.
        let v = kiln_testkit::tools::run_bounded(
            kiln_testkit::tools::pyspdxtools().args(["--infile", sbom.to_str().unwrap()]),
            120,
        );
        assert!(v.status.success(), "pyspdxtools: {}", stderr(&v));
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&sbom).unwrap()).unwrap();
        let packages = doc["packages"].as_array().unwrap();
        for (p, bytes) in release_files(VERSION, &arch) {
            let Some(b) = kiln_testkit::release::BINARIES
                .iter()
                .find(|b| p.ends_with(&format!("/{b}")))
            else {
                continue;
            };
            let sha = kiln::primitives::digest::Digest::of(&bytes);
            let pkg = packages
                .iter()
                .find(|x| x["name"] == *b)
                .unwrap_or_else(|| panic!("{name}: no package {b} in the SBOM"));
            assert_eq!(pkg["checksums"][0]["checksumValue"], sha.hex(), "{pkg:#}");
            assert_eq!(pkg["versionInfo"], VERSION, "{pkg:#}");
            assert_eq!(pkg["packageFileName"], format!("/usr/bin/{b}"), "{pkg:#}");
        }
        let release = packages
            .iter()
            .find(|x| x["name"] == "kubernetes-server")
            .unwrap();
        assert_eq!(release["versionInfo"], VERSION);
        check_node(&out, bin, &[&host]);
        // kiln verify agrees, with the node's containerd and config, and
        // reads the node as kind create cluster does.
        let v = kiln(&[
            "verify",
            "--kind",
            "--image",
            &format!("oci-archive:{}", out.display()),
        ]);
        assert_ok(&v);
        let err = stderr(&v);
        assert!(
            err.contains("ok    kind create cluster reads the node as kind's own"),
            "{err}"
        );
        eprintln!("{name}: kiln verify --kind:\n{err}");
    }
}

#[test]
fn two_platforms_from_arch_urls_over_loopback_https() {
    let platforms = ["linux/amd64", "linux/arm64"];
    let k = K::new(&platforms);
    let site = k.path("site");
    let rel = site.join(VERSION);
    std::fs::create_dir_all(&rel).unwrap();
    for p in platforms {
        release_tarball(&rel, VERSION, arch_of(p));
    }
    let ca = kiln_testkit::tls::make_ca();
    let https = HttpsFiles::start(&site, &ca.cert_pem, &ca.key_pem);
    let src = https.url(&format!(
        "{VERSION}/kubernetes-server-linux-{{arch}}.tar.gz"
    ));
    let c = kiln_testkit::tools::containerd();
    let base = k.push_base(
        "multi",
        kind_base_custom(&c, &platforms, BASE_CONFIG_TOML, true),
    );
    let m = k.manifest("kind.yaml", &[], "");
    let out = k.path("multi.tar");
    let cache = k.path("cache");
    let flags = [
        "--kubernetes",
        &src,
        "--ca-cert",
        ca.ca_pem.to_str().unwrap(),
        "--platform",
        platforms[0],
        "--platform",
        platforms[1],
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    let o = k.build(&m, &base, &out, &flags);
    assert_ok(&o);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for (i, p) in platforms.iter().enumerate() {
        let sums = std::fs::read_to_string(rel.join(format!(
            "kubernetes-server-linux-{}.tar.gz.sha512",
            arch_of(p)
        )))
        .unwrap();
        assert_eq!(
            report["kubernetes"][i]["sha512"],
            sums.split_whitespace().next().unwrap(),
            "{report:#}"
        );
    }
    check_node(&out, &c, &platforms);

    // The tarballs were cached by their published SHA-512: with them gone
    // from the site (their .sha512 files still there), the build again.
    let mut sums = Vec::new();
    for p in platforms {
        let tarball = rel.join(format!("kubernetes-server-linux-{}.tar.gz", arch_of(p)));
        let sum = std::fs::read_to_string(tarball.with_extension("gz.sha512")).unwrap();
        sums.push(sum.split_whitespace().next().unwrap().to_string());
        std::fs::remove_file(tarball).unwrap();
    }
    for sum in &sums {
        assert!(
            cache.join("blobs/sha512").join(sum).is_file(),
            "{sum} not cached"
        );
    }
    let again = k.build(&m, &base, &k.path("again.tar"), &flags);
    assert_ok(&again);
    check_node(&k.path("again.tar"), &c, &platforms);

    // Locked (the releases' sources and published sums in the lock), then
    // one tarball replaced on the site, its .sha512 too: a locked build
    // without the cache refuses it, naming the locked sum.
    let lock = k.path("kiln.lock");
    let mut args = vec![
        "lock".to_string(),
        "--manifest".into(),
        m.display().to_string(),
        "--base".into(),
        base.clone(),
        "--lock-file".into(),
        lock.display().to_string(),
    ];
    args.extend(k.mirrors());
    // With the cache: the releases are opened for their binaries' sums.
    args.extend(flags.iter().map(|s| s.to_string()));
    assert_ok(&kiln(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    // A locked build, and verify --lock holding it to the lock; then the
    // lock says another kubelet and another base, and verify names both.
    let locked_ok = k.path("locked-ok.tar");
    let o = k.build(
        &m,
        &base,
        &locked_ok,
        &[&["--lock", lock.to_str().unwrap()], &flags[..]].concat(),
    );
    assert_ok(&o);
    let image = format!("oci-archive:{}", locked_ok.display());
    // This machine's platform: the other one's CRI checks cannot run here
    // (verify --image checks every platform unless told which).
    let host = host_platform();
    let v = kiln(&[
        "verify",
        "--image",
        &image,
        "--platform",
        &host,
        "--lock",
        lock.to_str().unwrap(),
    ]);
    assert_ok(&v);
    assert!(
        stderr(&v).contains("ok    the node holds what the lock holds"),
        "{}",
        stderr(&v)
    );
    let mut doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&lock).unwrap()).unwrap();
    let host_release = doc["kubernetes"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["platform"].as_str() == Some(host_platform().as_str()))
        .unwrap();
    let kubelet = host_release["binaries"]["/usr/bin/kubelet"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(kubelet.len(), 128, "{kubelet}");
    host_release["binaries"]["/usr/bin/kubelet"] = "0".repeat(128).into();
    let built_on = doc["base"]["digest"].as_str().unwrap().to_string();
    let other_base = format!("sha256:{}", "1".repeat(64));
    doc["base"]["digest"] = other_base.clone().into();
    let edited = k.path("edited.lock");
    std::fs::write(&edited, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    let v = kiln(&[
        "verify",
        "--image",
        &image,
        "--platform",
        &host,
        "--lock",
        edited.to_str().unwrap(),
    ]);
    assert_fails(
        &v,
        1,
        &["checks failed: the node holds what the lock holds"],
    );
    for needle in [
        format!(
            "/usr/bin/kubelet: the node has sha512:{kubelet}, the lock holds sha512:{}",
            "0".repeat(128)
        ),
        format!("the base: the node image was built on {built_on}, the lock holds {other_base}"),
    ] {
        assert!(stderr(&v).contains(&needle), "{needle}\n{}", stderr(&v));
    }
    let amd64 = rel.join("kubernetes-server-linux-amd64.tar.gz");
    release_tarball(&rel, VERSION, "amd64");
    let mut bytes = std::fs::read(&amd64).unwrap();
    bytes.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&amd64, &bytes).unwrap();
    let replaced = hex::encode(<sha2::Sha512 as sha2::Digest>::digest(&bytes));
    std::fs::write(amd64.with_extension("gz.sha512"), format!("{replaced}\n")).unwrap();
    let locked = &sums[platforms.iter().position(|p| *p == "linux/amd64").unwrap()];
    let o = k.build(
        &m,
        &base,
        &k.path("locked.tar"),
        &[&["--lock", lock.to_str().unwrap()], &flags[..8]].concat(),
    );
    assert_fails(
        &o,
        2,
        &["SHA-512 mismatch", &format!("expected {locked}"), &replaced],
    );

    // Without {arch}, two platforms cannot share one tarball.
    let o = k.build(
        &m,
        &base,
        &k.path("x.tar"),
        &[
            "--kubernetes",
            &https.url("v/kubernetes-server-linux-amd64.tar.gz"),
            "--platform",
            platforms[0],
            "--platform",
            platforms[1],
        ],
    );
    assert_fails(&o, 2, &["{arch}"]);
}

#[test]
fn a_tampered_or_unchecked_release_is_refused_and_nothing_is_written() {
    let host = host_platform();
    let k = K::new(&[&host]);
    let tarball = release_tarball(k.dir.path(), VERSION, arch_of(&host));
    let want = std::fs::read_to_string(format!("{}.sha512", tarball.display())).unwrap();
    let want = want.split_whitespace().next().unwrap().to_string();
    let mut bytes = std::fs::read(&tarball).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&tarball, &bytes).unwrap();
    let got = {
        use sha2::Digest;
        hex::encode(sha2::Sha512::digest(&bytes))
    };
    let base = k.push_base(
        "t",
        kind_base_custom(
            &kiln_testkit::tools::containerd(),
            &[&host],
            BASE_CONFIG_TOML,
            true,
        ),
    );
    let m = k.manifest("kind.yaml", &[], "");
    let out = k.path("t.tar");
    let o = k.build(
        &m,
        &base,
        &out,
        &["--kubernetes", tarball.to_str().unwrap()],
    );
    assert_fails(&o, 2, &["SHA-512 mismatch", &want, &got]);
    assert!(!out.exists(), "an archive was written");

    // A wrong --kubernetes-sha512 is the same refusal; no checksum at all is refused too.
    let o = k.build(
        &m,
        &base,
        &out,
        &[
            "--kubernetes",
            tarball.to_str().unwrap(),
            "--kubernetes-sha512",
            &"0".repeat(128),
        ],
    );
    assert_fails(&o, 2, &["SHA-512 mismatch"]);
    std::fs::remove_file(format!("{}.sha512", tarball.display())).unwrap();
    let o = k.build(
        &m,
        &base,
        &out,
        &["--kubernetes", tarball.to_str().unwrap()],
    );
    assert_fails(&o, 2, &["no checksum", "--kubernetes-sha512"]);
    assert!(!out.exists());
}

/// kiln's table of kubeadm's images (`manifests/kubeadm-images.yaml`), read
/// by the real kubeadm of v1.35.4 (built from k8s.io/kubernetes by `make
/// deps`): `kubeadm config images list` for its own version (no network
/// with the version given) names exactly what `domain::kubeadm` says.
#[test]
fn the_real_kubeadm_lists_the_images_kilns_table_names() {
    let version = "v1.35.4";
    let o = kiln_testkit::tools::run_bounded(
        std::process::Command::new(kiln_testkit::tools::kubeadm()).args([
            "config",
            "images",
            "list",
            "--kubernetes-version",
            version,
        ]),
        60,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut real: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    real.sort();
    let mut ours: Vec<String> = kiln::domain::kubeadm::images(version)
        .unwrap()
        .expect("kiln's table knows v1.35")
        .iter()
        .map(|i| i.tagged_name().unwrap())
        .collect();
    ours.sort();
    eprintln!("kubeadm {version} config images list: {real:?}");
    assert_eq!(real, ours);
}

#[test]
fn kubeadm_images_versions_and_kind_manifests_are_checked() {
    let host = host_platform();
    let k = K::new(&[&host]);
    let tarball = release_tarball(k.dir.path(), VERSION, arch_of(&host));
    let base = k.push_base(
        "k",
        kind_base_custom(
            &kiln_testkit::tools::containerd(),
            &[&host],
            BASE_CONFIG_TOML,
            true,
        ),
    );
    let out = k.path("k.tar");
    let m = k.manifest("no-etcd.yaml", &["etcd"], "");
    let o = k.build(
        &m,
        &base,
        &out,
        &["--kubernetes", tarball.to_str().unwrap()],
    );
    assert_fails(
        &o,
        2,
        &[
            "registry.k8s.io/etcd:3.5.16-0",
            "kubeadm v1.32.5",
            "no-etcd.yaml",
        ],
    );
    assert!(!out.exists());
    // --kind-manifests: the user's CNI manifest replaces kiln's; kiln's
    // storage manifest stays where the directory has none.
    let dir = k.path("my-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("default-cni.yaml"), "# my own CNI\n").unwrap();
    let m = k.manifest("kind.yaml", &[], "");
    let mine = k.path("mine.tar");
    let o = k.build(
        &m,
        &base,
        &mine,
        &[
            "--kubernetes",
            tarball.to_str().unwrap(),
            "--kind-manifests",
            dir.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    let files = read_tar(&mine);
    let (_, man) = &manifests(&files)[0];
    let layer = kiln_layer(&files, man);
    assert_eq!(
        layer["kind/manifests/default-cni.yaml"].3,
        b"# my own CNI\n"
    );
    let storage =
        String::from_utf8(layer["kind/manifests/default-storage.yaml"].3.clone()).unwrap();
    assert!(storage.contains("local-path-provisioner:v20250214-test"));
    let m = k.manifest("old.yaml", &[], "kubernetesVersion: v1.31.0\n");
    let o = k.build(
        &m,
        &base,
        &out,
        &["--kubernetes", tarball.to_str().unwrap()],
    );
    assert_fails(&o, 2, &["old.yaml:3", "v1.31.0", VERSION]);
    assert!(!out.exists());
}

/// Issue 38.6: a minor kiln's table does not know is checked against the
/// release's own kubeadm, asked as kind asks it, when the user consents to
/// running node binaries; without consent, the warning names the flag.
#[test]
fn a_minor_the_table_does_not_know_is_asked_of_the_release_kubeadm() {
    let host = host_platform();
    let arch = arch_of(&host);
    let k = K::new(&[&host]);
    let version = "v1.99.0";
    let mut files = release_files(version, arch);
    files.insert(
        "kubernetes/server/bin/kubeadm".into(),
        std::fs::read(kiln_testkit::tools::kubeadm_standin()).unwrap(),
    );
    let dir = k.path("rel-99");
    std::fs::create_dir_all(&dir).unwrap();
    let tarball = kiln_testkit::release::release_tarball_of(&dir, arch, &files);
    let base = k.push_base(
        "k99",
        kind_base_custom(
            &kiln_testkit::tools::containerd(),
            &[&host],
            BASE_CONFIG_TOML,
            true,
        ),
    );
    let m = k.manifest("node.yaml", &[], "");
    let out = k.path("k99.tar");
    let release = ["--kubernetes", tarball.to_str().unwrap()];
    // No consent: built, with the old warning and the flag that would answer it.
    let o = k.build(&m, &base, &out, &release);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains("not v1.99.0") && err.contains("--trust-node-binaries"),
        "{err}"
    );
    std::fs::remove_file(&out).unwrap();
    // Consent: the release's kubeadm lists etcd 3.99.0-0, pause 3.99 and
    // coredns v1.99.0, which the manifest lacks: refused before writing.
    let mut asked = release.to_vec();
    asked.push("--trust-node-binaries");
    let o = k.build(&m, &base, &out, &asked);
    assert_fails(
        &o,
        2,
        &[
            "registry.k8s.io/etcd:3.99.0-0",
            "registry.k8s.io/pause:3.99",
            "registry.k8s.io/coredns/coredns:v1.99.0",
            "kubeadm v1.99.0",
            "node.yaml",
        ],
    );
    assert!(!out.exists());
}

#[test]
fn pin_existing_pins_what_a_node_base_already_holds() {
    let host = host_platform();
    let k = K::new(&[&host]);
    // A kindest/node-like base: its store holds images kind left unpinned.
    let old = k.path("old-node");
    std::fs::create_dir(&old).unwrap();
    let mut args = vec![
        "load".to_string(),
        "--rootfs".into(),
        old.display().to_string(),
    ];
    args.extend(k.mirrors());
    args.push("docker.io/kindest/kindnetd:v20250512-test".into());
    args.push("registry.k8s.io/coredns/coredns:v1.11.3".into());
    assert_ok(&kiln(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    let c = kiln_testkit::tools::containerd();
    // A kindest/node carries /kind/version (else kiln refuses a kind base
    // without Kubernetes).
    let base = kiln_testkit::base::kind_node(&c, &[&host], VERSION, &[], Some(&old));
    let base = k.push_base(
        "node",
        BuiltImage {
            tag: "test".into(),
            ..base
        },
    );
    let manifest = k.path("small.yaml");
    std::fs::write(&manifest, "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n  - registry.k8s.io/pause:3.10\n").unwrap();
    for (flag, want) in [(None, false), (Some("--pin-existing"), true)] {
        let out = k.path(&format!("pinned-{want}.tar"));
        let o = k.build(&manifest, &base, &out, flag.as_slice());
        assert_ok(&o);
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if want {
            let pinned = report["pinnedExisting"][0].as_array().unwrap();
            assert!(
                pinned
                    .iter()
                    .any(|p| p == "docker.io/kindest/kindnetd:v20250512-test"),
                "{report:#}"
            );
        }
        let files = read_tar(&out);
        let (_, m) = &manifests(&files)[0];
        let rootfs = tempfile::tempdir().unwrap();
        unpack_layers(&files, &layer_digests(m), rootfs.path());
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut cri = kiln_testkit::cri::CriNode::start(rootfs.path(), Some(&c))
                .await
                .unwrap();
            let images = cri.list_images().await.unwrap();
            for name in [
                "docker.io/kindest/kindnetd:v20250512-test",
                "registry.k8s.io/coredns/coredns:v1.11.3",
            ] {
                let i = images
                    .iter()
                    .find(|i| i.repo_tags.iter().any(|t| t == name))
                    .unwrap_or_else(|| panic!("{name}: {images:#?}"));
                assert_eq!(i.pinned, want, "{name} with {flag:?}");
            }
            let pause = images
                .iter()
                .find(|i| {
                    i.repo_tags
                        .iter()
                        .any(|t| t == "registry.k8s.io/pause:3.10")
                })
                .unwrap();
            assert!(pause.pinned);
            cri.stop().unwrap();
        });
    }
}

/// A single-platform image (a manifest, no index) for `platform`.
fn single(repo: &str, platform: &str) -> BuiltImage {
    let layer = layer_of(&[(
        "etc/node",
        tar::EntryType::Regular,
        platform.as_bytes(),
        "",
        0o644,
    )]);
    let mut img = image_of(repo, "v1", &[platform], vec![layer]);
    img.top = img.platforms[0].manifest.clone();
    img
}

#[test]
fn kiln_index_joins_single_platform_images_and_ctr_fetches_them_all() {
    let k = K::new(&[&host_platform()]);
    let addr = k.registry.addr.to_string();
    let amd = single("ci/node-amd64", "linux/amd64");
    let arm = single("kindest/node", "linux/arm64");
    k.registry.push(&amd).unwrap();
    k.registry.push(&arm).unwrap();
    let target = format!("{addr}/kindest/node:{VERSION}");
    let o = kiln(&[
        "index",
        "--json",
        "--push",
        &target,
        &format!("{addr}/ci/node-amd64:v1"),
        &format!("{addr}/kindest/node:v1"),
    ]);
    assert_ok(&o);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let members = report["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "{report:#}");
    assert_eq!(members[0]["platform"], "linux/amd64");
    assert_eq!(members[0]["copied"], true);
    assert_eq!(members[1]["platform"], "linux/arm64");
    assert_eq!(members[1]["copied"], false);

    // containerd's own client pulls every platform back.
    let scratch = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cri = kiln_testkit::cri::CriNode::start(scratch.path(), None)
            .await
            .unwrap();
        let f = cri
            .ctr(&[
                "content",
                "fetch",
                "--plain-http",
                "--all-platforms",
                &target,
            ])
            .unwrap();
        assert!(
            f.status.success(),
            "ctr content fetch: {}",
            String::from_utf8_lossy(&f.stderr)
        );
        let ls = cri.ctr(&["content", "ls", "-q"]).unwrap();
        let ls = String::from_utf8_lossy(&ls.stdout).into_owned();
        for img in [&amd, &arm] {
            let p = &img.platforms[0];
            for d in [
                &p.manifest.digest,
                &p.config.digest,
                &p.layers[0].blob.digest,
            ] {
                assert!(ls.contains(d.as_str()), "{d} not fetched: {ls}");
            }
        }
        assert!(ls.contains(report["digest"].as_str().unwrap()));
        cri.stop().unwrap();
    });

    // The same platform twice is refused.
    let o = kiln(&[
        "index",
        "--push",
        &target,
        &format!("{addr}/ci/node-amd64:v1"),
        &format!("{addr}/ci/node-amd64:v1"),
    ]);
    assert_fails(&o, 2, &["linux/amd64", "once"]);
}

/// The kind addons' names in the registry `K` seeds.
const KINDNETD: &str = "docker.io/kindest/kindnetd:v20250512-test";
const PROVISIONER: &str = "docker.io/kindest/local-path-provisioner:v20250214-test";
const HELPER: &str = "docker.io/kindest/local-path-helper:v20250214-test";

/// A stand-in kind release's `/kind/manifests`, shaped as kind's own
/// (markers, kind's template field, the helper named in a ConfigMap too).
fn kinds_manifests() -> (String, String) {
    let cni = format!(
        "# kindnetd networking manifest\n# would you kindly template this file\n# would you kindly patch this file\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: kindnet\n  namespace: kube-system\nspec:\n  template:\n    spec:\n      priorityClassName: system-node-critical\n      containers:\n      - name: kindnet-cni\n        image: {KINDNETD}\n        env:\n        - name: POD_SUBNET\n          value: {{{{ .PodSubnet }}}}\n"
    );
    let storage = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: local-path-provisioner\n  namespace: local-path-storage\nspec:\n  template:\n    spec:\n      containers:\n        - name: local-path-provisioner\n          image: {PROVISIONER}\n          command: [local-path-provisioner, --debug, start, --helper-image, {HELPER}]\n---\napiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: standard\n  annotations:\n    storageclass.kubernetes.io/is-default-class: \"true\"\nprovisioner: rancher.io/local-path\n---\nkind: ConfigMap\napiVersion: v1\nmetadata:\n  name: local-path-config\n  namespace: local-path-storage\ndata:\n  helperPod.yaml: |-\n    apiVersion: v1\n    kind: Pod\n    spec:\n      containers:\n      - name: helper-pod\n        image: {HELPER}\n"
    );
    (cni, storage)
}

#[test]
fn kind_node_gives_its_manifests_byte_for_byte_and_its_addon_images_pinned() {
    let host = host_platform();
    let k = K::new(&[&host]);
    let tarball = release_tarball(k.dir.path(), VERSION, arch_of(&host));
    // A published kindest/node of "your kind release": its own manifests,
    // and a store holding (unpinned) what kind bundled.
    let store = k.path("kind-store");
    std::fs::create_dir(&store).unwrap();
    let mut args = vec![
        "load".to_string(),
        "--rootfs".into(),
        store.display().to_string(),
    ];
    args.extend(k.mirrors());
    args.push(KINDNETD.into());
    assert_ok(&kiln(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    let (cni, storage) = kinds_manifests();
    let c = kiln_testkit::tools::containerd();
    let node = kiln_testkit::base::kind_node(
        &c,
        &[&host],
        VERSION,
        &[
            ("default-cni.yaml", cni.as_bytes()),
            ("default-storage.yaml", storage.as_bytes()),
        ],
        Some(&store),
    );
    k.registry.push(&node).unwrap();
    let kind_node = format!("{}/kindest/node:{VERSION}", k.registry.addr);
    let base = k.push_base(
        "for-kind-node",
        kind_base_custom(&c, &[&host], BASE_CONFIG_TOML, true),
    );
    // The manifest names none of kind's addons: --kind-node brings them.
    let m = k.manifest(
        "core.yaml",
        &[
            "kindest/kindnetd",
            "kindest/local-path-provisioner",
            "kindest/local-path-helper",
        ],
        "",
    );
    let out = k.path("parity.tar");
    let o = k.build(
        &m,
        &base,
        &out,
        &[
            "--kubernetes",
            tarball.to_str().unwrap(),
            "--kind-node",
            &kind_node,
        ],
    );
    assert_ok(&o);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let written = report["kind"][0]["manifests"].to_string();
    assert!(written.contains("--kind-node"), "{report:#}");
    let files = read_tar(&out);
    let (_, man) = &manifests(&files)[0];
    let layer = kiln_layer(&files, man);
    assert_eq!(layer["kind/manifests/default-cni.yaml"].3, cni.as_bytes());
    assert_eq!(
        layer["kind/manifests/default-storage.yaml"].3,
        storage.as_bytes()
    );
    // What kind reads, and every addon pinned as CRI reports it.
    let image = format!("oci-archive:{}", out.display());
    let v = kiln(&["verify", "--kind", "--image", &image]);
    assert_ok(&v);
    eprintln!("kiln verify --kind --image {image}:\n{}", stderr(&v));
    let v = kiln(&["verify", "--kind", "--json", "--image", &image]);
    assert_ok(&v);
    let vr: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    for name in [KINDNETD, PROVISIONER, HELPER] {
        let i = vr["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["repoTags"].as_array().unwrap().iter().any(|t| t == name))
            .unwrap_or_else(|| panic!("{name}: {vr:#}"));
        assert_eq!(i["pinned"], true, "{name}");
        assert_eq!(i["bundled"], true, "{name}");
    }
    assert_eq!(
        vr["kind"]["addonImages"],
        serde_json::json!([KINDNETD, HELPER, PROVISIONER])
    );
}

/// `kiln verify --kind --rootfs DIR`: exit 1 and the stderr.
fn verify_kind_rootfs(dir: &Path) -> String {
    let o = kiln(&["verify", "--kind", "--rootfs", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"));
    stderr(&o)
}

#[test]
fn verify_kind_names_what_kind_would_trip_on() {
    let host = host_platform();
    let arch = arch_of(&host).to_string();
    let other = if arch == "amd64" { "arm64" } else { "amd64" };
    let k = K::new(&[&host]);
    let tarball = release_tarball(k.dir.path(), VERSION, &arch);
    let c = kiln_testkit::tools::containerd();
    let base = k.push_base("v", kind_base_custom(&c, &[&host], BASE_CONFIG_TOML, true));
    let m = k.manifest("kind.yaml", &[], "");
    let out = k.path("good.tar");
    let o = k.build(
        &m,
        &base,
        &out,
        &["--kubernetes", tarball.to_str().unwrap()],
    );
    assert_ok(&o);
    let files = read_tar(&out);
    let (_, man) = &manifests(&files)[0];
    let good = k.path("good-rootfs");
    std::fs::create_dir(&good).unwrap();
    unpack_layers(&files, &layer_digests(man), &good);
    let ok = kiln(&["verify", "--kind", "--rootfs", good.to_str().unwrap()]);
    assert_ok(&ok);
    let cni = good.join("kind/manifests/default-cni.yaml");
    let storage = good.join("kind/manifests/default-storage.yaml");
    let version = good.join("kind/version");
    let kubelet = good.join("usr/bin/kubelet");
    let keep = |p: &Path| std::fs::read(p).unwrap();
    let (cni0, storage0, version0, kubelet0) =
        (keep(&cni), keep(&storage), keep(&version), keep(&kubelet));

    // A CNI manifest without kind's markers: applied verbatim, field and all.
    let text = String::from_utf8(cni0.clone()).unwrap();
    let unmarked: String = text
        .lines()
        .filter(|l| !l.contains("would you kindly"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&cni, unmarked).unwrap();
    let err = verify_kind_rootfs(&good);
    for want in [
        "/kind/manifests/default-cni.yaml: lacks the line \"# would you kindly template this file\"",
        "/kind/manifests/default-cni.yaml: lacks the line \"# would you kindly patch this file\"",
        "/kind/manifests/default-cni.yaml: a template field is left after kind's step: value: {{ .PodSubnet }}",
    ] {
        assert!(err.contains(want), "want {want:?}:\n{err}");
    }
    std::fs::write(&cni, &cni0).unwrap();

    // A template field kind does not fill.
    std::fs::write(&cni, format!("{text}# {{{{ .ServiceSubnet }}}}\n")).unwrap();
    let err = verify_kind_rootfs(&good);
    assert!(
        err.contains("/kind/manifests/default-cni.yaml: template action {{ .ServiceSubnet }}: kind's data has only .PodSubnet"),
        "{err}"
    );
    std::fs::write(&cni, &cni0).unwrap();

    // An addon image the node does not hold.
    let s = String::from_utf8(storage0.clone()).unwrap();
    std::fs::write(
        &storage,
        s.replace(
            "local-path-helper:v20250214-test",
            "local-path-helper:v-not-bundled",
        ),
    )
    .unwrap();
    let err = verify_kind_rootfs(&good);
    assert!(
        err.contains("docker.io/kindest/local-path-helper:v-not-bundled: not bundled (kind's manifests run it"),
        "{err}"
    );
    let j = kiln(&[
        "verify",
        "--kind",
        "--json",
        "--rootfs",
        good.to_str().unwrap(),
    ]);
    let jr: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert!(
        jr["checks"]
            .to_string()
            .contains("local-path-helper:v-not-bundled: not bundled"),
        "{jr:#}"
    );
    std::fs::write(&storage, &storage0).unwrap();

    // No /kind/version.
    std::fs::remove_file(&version).unwrap();
    let err = verify_kind_rootfs(&good);
    assert!(err.contains("/kind/version: missing"), "{err}");
    std::fs::write(&version, &version0).unwrap();

    // A kubelet of another architecture.
    std::fs::write(&kubelet, binary("kubelet", other, VERSION)).unwrap();
    let err = verify_kind_rootfs(&good);
    assert!(
        err.contains(&format!(
            "/usr/bin/kubelet: built for {other}, the node is {host}"
        )),
        "{err}"
    );
    std::fs::write(&kubelet, &kubelet0).unwrap();
    assert_ok(&kiln(&[
        "verify",
        "--kind",
        "--rootfs",
        good.to_str().unwrap(),
    ]));
}

#[test]
fn a_kind_base_without_kubernetes_and_a_release_of_another_arch_are_refused() {
    let host = host_platform();
    let arch = arch_of(&host).to_string();
    let other = if arch == "amd64" { "arm64" } else { "amd64" };
    let k = K::new(&[&host]);
    let c = kiln_testkit::tools::containerd();
    let base = k.push_base(
        "bare",
        kind_base_custom(&c, &[&host], BASE_CONFIG_TOML, true),
    );
    let m = k.manifest("kind.yaml", &[], "");
    let out = k.path("refused.tar");
    let o = k.build(&m, &base, &out, &[]);
    assert_fails(
        &o,
        2,
        &[
            "is a kind base",
            "without Kubernetes",
            "add --kubernetes SRC",
        ],
    );
    assert!(!out.exists());
    // An arm64 release in an amd64 node (or the other way round).
    let wrong = k.path("wrong");
    std::fs::create_dir(&wrong).unwrap();
    let tarball = release_tarball(&wrong, VERSION, other);
    let o = k.build(
        &m,
        &base,
        &out,
        &["--kubernetes", tarball.to_str().unwrap()],
    );
    assert_fails(
        &o,
        2,
        &[
            "kubernetes/server/bin/kubeadm is built for",
            other,
            &format!("the node is {host}"),
        ],
    );
    assert!(!out.exists());
}

/// The kind/kiln-manifest.yaml kiln recorded in a node image's layer for
/// `platform`.
fn recorded_manifest(archive: &Path, platform: &str) -> String {
    let files = read_tar(archive);
    let all = manifests(&files);
    let (_, m) = match all.len() {
        // A single-platform archive names no platform beside its manifest.
        1 => all.into_iter().next().unwrap(),
        _ => all.into_iter().find(|(p, _)| p == platform).unwrap(),
    };
    let layer = m["layers"].as_array().unwrap().last().unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let tar = kiln_testkit::base::decompress(kiln_testkit::base::blob(&files, &layer));
    let entries = kiln_testkit::base::tar_entries(tar.as_slice());
    String::from_utf8(entries["kind/kiln-manifest.yaml"].clone()).unwrap()
}

/// Issue 28: a node for the platform that is not this machine's (arm64 on
/// an amd64 host), from a base holding Debian's containerd and libc for it.
/// Without consent or without an emulator the CRI checks say why they did
/// not run (exit 3, no FAIL); with both, the node's own containerd runs
/// under qemu user-mode emulation and every check runs and passes; an
/// image recorded unpinned fails, named, in the kubelet's view too.
#[test]
fn a_foreign_platform_node_is_verified_under_emulation() {
    let (other, arch) = kiln_testkit::tools::other_platform();
    let host = host_platform();
    let k = K::new(&[&host, &other]);
    let tarball = release_tarball(k.dir.path(), VERSION, arch);
    let base = k.push_base("foreign", kiln_testkit::base::foreign_kind_base());
    let m = k.manifest("kind.yaml", &[], "");
    let out = k.path("foreign.tar");
    let (qemu_name, qemu) = kiln_testkit::tools::qemu(&other);
    let qemu = qemu.to_str().unwrap();
    // build --verify: the node's containerd under emulation (no --start:
    // runc here runs only this machine's binaries).
    let o = k.build(
        &m,
        &base,
        &out,
        &[
            "--kubernetes",
            tarball.to_str().unwrap(),
            "--platform",
            &other,
            "--verify",
            "--trust-node-binaries",
            "--qemu",
            qemu,
        ],
    );
    // Exit 0: every check ran and passed (a check not run would be exit 3).
    assert_ok(&o);
    let image = format!("oci-archive:{}", out.display());
    let not_run = |o: &std::process::Output, why: &str| {
        let err = stderr(o);
        assert_eq!(o.status.code(), Some(3), "want exit 3:\n{err}");
        assert!(!err.contains("FAIL"), "{err}");
        assert!(
            err.contains("  ok    every bundled image is present, complete and pinned"),
            "{err}"
        );
        assert!(err.contains("  ok    survives a synchronous GC"), "{err}");
        assert!(
            err.contains("  --    the kubelet sees every bundled image"),
            "{err}"
        );
        assert!(err.contains(&format!("not run for {other}: ")), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(
            err.contains("kiln: error: verified except 1 of 5 checks that could not run here"),
            "{err}"
        );
    };
    // No consent: the node's binary is not run.
    let o = kiln(&["verify", "--image", &image, "--platform", &other]);
    not_run(&o, "pass --trust-node-binaries");
    // Consent, but no emulator on PATH and none given.
    let o = kiln_env(
        &[
            "verify",
            "--image",
            &image,
            "--platform",
            &other,
            "--trust-node-binaries",
        ],
        &[(
            "PATH",
            kiln_testkit::tools::containerd()
                .parent()
                .unwrap()
                .to_str()
                .unwrap(),
        )],
    );
    not_run(&o, &format!("no {qemu_name} on PATH"));
    // Both: everything runs, under emulation.
    let t = std::time::Instant::now();
    let o = kiln(&[
        "verify",
        "--image",
        &image,
        "--platform",
        &other,
        "--trust-node-binaries",
        "--qemu",
        qemu,
        "--kind",
    ]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(!err.contains("  --  "), "{err}");
    assert!(err.contains(&format!("under {qemu}")), "{err}");
    assert!(
        err.contains(
            "  ok    the kubelet sees every bundled image, pinned as the manifest says (CRI v1)"
        ),
        "{err}"
    );
    eprintln!("emulated verify of {other} in {:?}:\n{err}", t.elapsed());
    // One image recorded unpinned (preloaded: pinned: false), held to the
    // manifest that pins it: both the store and the kubelet's view fail,
    // naming it.
    let etcd = "registry.k8s.io/etcd:3.5.16-0";
    let mut text = std::fs::read_to_string(&m).unwrap();
    text = text.replace(
        &format!("  - {etcd}\n"),
        &format!("  - image: {etcd}\n    pinned: false\n"),
    );
    let m2 = k.path("preload-etcd.yaml");
    std::fs::write(&m2, &text).unwrap();
    let out2 = k.path("foreign-etcd.tar");
    let o = k.build(
        &m2,
        &base,
        &out2,
        &[
            "--kubernetes",
            tarball.to_str().unwrap(),
            "--platform",
            &other,
        ],
    );
    assert_ok(&o);
    let held = k.path("held.yaml");
    let recorded = recorded_manifest(&out2, &other);
    let pinned_again = recorded.replace(&format!("{{image: {etcd}, pinned: false}}"), etcd);
    assert_ne!(recorded, pinned_again, "{recorded}");
    std::fs::write(&held, pinned_again).unwrap();
    let o = kiln(&[
        "verify",
        "--image",
        &format!("oci-archive:{}", out2.display()),
        "--platform",
        &other,
        "--trust-node-binaries",
        "--qemu",
        qemu,
        "--manifest",
        held.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{etcd}: CRI reports pinned: false (kubelet's GC may delete it)"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{etcd}: recorded without io.cri-containerd.pinned=pinned"
        )),
        "{err}"
    );
}

/// Issue 28: a node image for this machine's platform and the other one,
/// in one run, verified per platform by `verify` (each line naming its
/// platform; the other under emulation, the emulator found on PATH) and by
/// `verify --json` (one report per platform). (`build --verify` would add
/// `--start` for the host's platform, which these stand-in images cannot
/// run; `a_foreign_platform_node_is_verified_under_emulation` covers it.)
#[test]
fn two_platforms_are_verified_each_on_its_own() {
    let (other, arch) = kiln_testkit::tools::other_platform();
    let host = host_platform();
    let k = K::new(&[&host, &other]);
    let rel = k.path("release");
    std::fs::create_dir_all(&rel).unwrap();
    release_tarball(&rel, VERSION, arch_of(&host));
    release_tarball(&rel, VERSION, arch);
    let c = kiln_testkit::tools::containerd();
    let both = kiln_testkit::base::index_of(
        "kindest/base",
        "test",
        vec![
            kind_base_custom(&c, &[&host], BASE_CONFIG_TOML, true),
            kiln_testkit::base::foreign_kind_base(),
        ],
    );
    let base = k.push_base("both", both);
    let m = k.manifest("kind.yaml", &[], "");
    let out = k.path("both.tar");
    let qemu_dir = kiln_testkit::tools::qemu_dir();
    let path = format!(
        "{}:{}",
        qemu_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let src = format!("{}/kubernetes-server-linux-{{arch}}.tar.gz", rel.display());
    let mut args: Vec<String> = [
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        &base,
        "--output",
        &format!("oci-archive:{}", out.display()),
        "--kubernetes",
        &src,
        "--platform",
        &host,
        "--platform",
        &other,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(k.mirrors());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_ok(&kiln(&args));
    let o = kiln_env(
        &[
            "verify",
            "--image",
            &format!("oci-archive:{}", out.display()),
            "--platform",
            &host,
            "--platform",
            &other,
            "--trust-node-binaries",
            "--kind",
        ],
        &[("PATH", &path)],
    );
    assert_ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains(&format!("kiln: verify {host} with containerd")),
        "{err}"
    );
    assert!(
        err.contains(&format!("kiln: verify {other} with containerd")),
        "{err}"
    );
    assert!(
        err.contains(&format!("under {}/qemu-", qemu_dir.display())),
        "{err}"
    );
    for p in [&host, &other] {
        assert!(
            err.contains(&format!("  ok    {p} the kubelet sees every bundled image")),
            "{err}"
        );
    }
    assert!(!err.contains("FAIL") && !err.contains("  --  "), "{err}");

    let o = kiln_env(
        &[
            "verify",
            "--image",
            &format!("oci-archive:{}", out.display()),
            "--platform",
            &host,
            "--platform",
            &other,
            "--trust-node-binaries",
            "--json",
        ],
        &[("PATH", &path)],
    );
    assert_ok(&o);
    let reports: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let reports = reports.as_array().expect("one report per platform");
    assert_eq!(reports.len(), 2);
    for (r, p) in reports.iter().zip([&host, &other]) {
        assert_eq!(r["platform"], p.as_str());
        let checks = r["checks"].as_array().unwrap();
        assert!(
            checks.iter().all(|c| c["ok"] == true && c["ran"] == true),
            "{r:#}"
        );
        let images = r["images"].as_array().unwrap();
        assert_eq!(images.len(), 10, "{r:#}");
        assert!(images.iter().all(|i| i["pinned"] == true), "{r:#}");
    }
    // Without emulation the other platform's CRI view is not run: exit 3,
    // the host's platform verified in full.
    let o = kiln(&[
        "verify",
        "--image",
        &format!("oci-archive:{}", out.display()),
        "--platform",
        &host,
        "--platform",
        &other,
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!(
            "  ok    {host} the kubelet sees every bundled image"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "  --    {other} the kubelet sees every bundled image"
        )),
        "{err}"
    );
}

/// Issue 60: a push goes up by digest, then the verify, then the
/// signature, then the tag. A node for the other platform whose verify
/// cannot run every check (no consent to run its binaries: exit 3) is in
/// the registry by digest only: neither its tag nor a signature is there,
/// and the build says so. (The landed main pushed the tag, then verified.)
#[test]
fn a_push_is_signed_and_tagged_only_after_its_verify_holds() {
    let (other, arch) = kiln_testkit::tools::other_platform();
    let host = host_platform();
    let k = K::new(&[&host, &other]);
    let reg = k.registry.addr.clone();
    let keys = kiln_testkit::sigstore::node_signing(&k.path("keys"), &format!("{reg}/kiln/node"));
    let tarball = release_tarball(k.dir.path(), VERSION, arch);
    let base = k.push_base("foreign", kiln_testkit::base::foreign_kind_base());
    let m = k.manifest("kind.yaml", &[], "");
    let o = k.build(
        &m,
        &base,
        &k.path("foreign.tar"),
        &[
            "--kubernetes",
            tarball.to_str().unwrap(),
            "--platform",
            &other,
            "--verify",
            "--sign-key",
            keys.key.to_str().unwrap(),
            "--push",
            &format!("{reg}/kiln/node:v1.31.2-{arch}"),
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("not signed, not tagged"), "{err}");
    let tags: serde_json::Value = k
        .registry
        .get("/v2/kiln/node/tags/list", "application/json")
        .unwrap()
        .json()
        .unwrap();
    let tags: Vec<&str> = tags["tags"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t.as_str()).collect())
        .unwrap_or_default();
    assert!(
        !tags
            .iter()
            .any(|t| t.starts_with("v1.31.2") || t.ends_with(".sig")),
        "tagged or signed before its verify held: {tags:?}"
    );
    // The image itself is there, by digest.
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let digest = report["digest"].as_str().unwrap();
    let r = k
        .registry
        .get(
            &format!("/v2/kiln/node/manifests/{digest}"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .unwrap();
    assert!(r.status().is_success(), "{digest}: {}", r.status());
}

/// Issue 56.2: a pre-signed `--kubernetes` URL's query and userinfo are
/// secrets. Built with one (pushed, so the SBOM and provenance are in the
/// registry) and locked with it: neither the terminal, `--json`, the
/// archive, the registry's files nor the lock holds them; each records the
/// release as scheme, host and path. (The landed main printed and recorded
/// the whole URL.)
#[test]
fn a_pre_signed_release_url_is_recorded_without_its_secrets() {
    let platform = host_platform();
    let k = K::new(&[&platform]);
    let site = k.path("site");
    let rel = site.join(VERSION);
    std::fs::create_dir_all(&rel).unwrap();
    let tarball = release_tarball(&rel, VERSION, arch_of(&platform));
    let sum = std::fs::read_to_string(tarball.with_extension("gz.sha512")).unwrap();
    let sum = sum.split_whitespace().next().unwrap().to_string();
    let ca = kiln_testkit::tls::make_ca();
    let https = HttpsFiles::start(&site, &ca.cert_pem, &ca.key_pem);
    let plain = https.url(&format!(
        "{VERSION}/kubernetes-server-linux-{}.tar.gz",
        arch_of(&platform)
    ));
    let (sig, token) = ("SIGNATURE0c0ffee", "SESSIONTOKEN5ec2e7");
    let signed = format!(
        "{plain}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature={sig}&X-Amz-Security-Token={token}"
    );
    let c = kiln_testkit::tools::containerd();
    let base = k.push_base(
        "signed",
        kind_base_custom(&c, &[&platform], BASE_CONFIG_TOML, true),
    );
    let m = k.manifest("kind.yaml", &[], "");
    let out = k.path("node.tar");
    let push = format!("{}/kind/node:signed", k.registry.addr);
    let flags = [
        "--kubernetes",
        &signed,
        "--kubernetes-sha512",
        &sum,
        "--ca-cert",
        ca.ca_pem.to_str().unwrap(),
        "--push",
        &push,
    ];
    let text = k.build(&m, &base, &k.path("text.tar"), &flags[..]);
    assert_ok(&text);
    let json = k.build(&m, &base, &out, &flags);
    assert_ok(&json);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        report["kubernetes"][0]["source"],
        plain.as_str(),
        "{report:#}"
    );
    let lock = k.path("kiln.lock");
    let mut args = vec![
        "lock".to_string(),
        "--manifest".into(),
        m.display().to_string(),
        "--base".into(),
        base.clone(),
        "--lock-file".into(),
        lock.display().to_string(),
        "--kubernetes".into(),
        signed.clone(),
        "--kubernetes-sha512".into(),
        sum.clone(),
        "--ca-cert".into(),
        ca.ca_pem.display().to_string(),
    ];
    args.extend(k.mirrors());
    let locked = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ok(&locked);
    let lock_text = std::fs::read_to_string(&lock).unwrap();
    assert!(lock_text.contains(&plain), "{lock_text}");
    // A build from the lock with another signature of the same release.
    let resigned = signed.replace(sig, "SIGNATURE0another");
    let again = k.build(
        &m,
        &base,
        &k.path("again.tar"),
        &[
            "--kubernetes",
            &resigned,
            "--lock",
            lock.to_str().unwrap(),
            "--ca-cert",
            ca.ca_pem.to_str().unwrap(),
        ],
    );
    assert_ok(&again);
    let mut places: Vec<(String, Vec<u8>)> = vec![];
    for (what, o) in [
        ("build", &text),
        ("build --json", &json),
        ("lock", &locked),
        ("locked build", &again),
    ] {
        places.push((format!("{what}'s stdout"), o.stdout.clone()));
        places.push((format!("{what}'s stderr"), o.stderr.clone()));
    }
    places.push(("the lock file".into(), lock_text.into_bytes()));
    places.push(("the archive".into(), std::fs::read(&out).unwrap()));
    let mut files = vec![k.registry.storage().to_path_buf()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.is_file() {
            places.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
    let mut seen = 0;
    for (what, bytes) in &places {
        let hay = String::from_utf8_lossy(bytes);
        seen += hay.matches(plain.as_str()).count();
        for secret in [sig, token, "SIGNATURE0another"] {
            assert!(!hay.contains(secret), "{what} holds {secret}");
        }
    }
    // The release's source was recorded (terminal, report, SBOM,
    // provenance, lock), just not its secrets.
    assert!(seen >= 5, "the release's source appears {seen} times");
}
