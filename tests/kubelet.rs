//! Node images for the kubelet of 1.35 (issue 56): a base's image-manager
//! state never reaches the node (whited out, reported), `kiln verify`
//! names a node that carries it and says per credential policy what
//! starts offline, and `kiln generate kubelet-config` is read as kind and
//! the kubelet read it.

use std::path::Path;

use crate::common::*;
use kiln_testkit::base::{kind_base_plus, layer_from_tar, read_tar, unpack_layers};
use kiln_testkit::image::host_platform;

/// sha256-HEX of `s`, as the kubelet names its files (`cacheFilename`).
fn kubelet_file(s: &str) -> String {
    use sha2::Digest;
    format!("sha256-{:x}", sha2::Sha256::digest(s.as_bytes()))
}

/// What a kubelet that pulled the sandbox image leaves (a record in the
/// form `fs_pullrecords.go` writes, and an intent).
fn stray_state(rootfs: &Path) {
    let dir = rootfs.join("var/lib/kubelet/image_manager");
    std::fs::create_dir_all(dir.join("pulled")).unwrap();
    std::fs::create_dir_all(dir.join("pulling")).unwrap();
    std::fs::write(
        dir.join("pulled").join(kubelet_file("sha256:0123")),
        r#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","imageRef":"sha256:0123","credentialMapping":{}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("pulling")
            .join(kubelet_file("registry.k8s.io/pause:3.10")),
        r#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1","image":"registry.k8s.io/pause:3.10"}"#,
    )
    .unwrap();
}

#[test]
fn a_bases_kubelet_state_is_whited_out_and_verify_names_a_node_that_carries_it() {
    use tar::EntryType::{Directory as D, Regular as F};
    let env = Env::new();
    let platform = host_platform();
    let (rec, intent) = (
        format!(
            "var/lib/kubelet/image_manager/pulled/{}",
            kubelet_file("sha256:0123")
        ),
        format!(
            "var/lib/kubelet/image_manager/pulling/{}",
            kubelet_file("registry.k8s.io/pause:3.10")
        ),
    );
    // The kubelet's names are longer than a ustar name: GNU long names,
    // as a snapshot of a node would carry them.
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, data) in [
        ("var/lib/kubelet/", D, &b""[..]),
        ("var/lib/kubelet/image_manager/", D, b""),
        ("var/lib/kubelet/image_manager/pulled/", D, b""),
        (rec.as_str(), F, b"{}"),
        ("var/lib/kubelet/image_manager/pulling/", D, b""),
        (intent.as_str(), F, b"{}"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(if kind == D { 0o700 } else { 0o600 });
        h.set_mtime(1_600_000_000);
        b.append_data(&mut h, path, data).unwrap();
    }
    let base = kind_base_plus(&[&platform], layer_from_tar(b.into_inner().unwrap()));
    env.registry.push(&base).unwrap();
    let base_ref = format!("{}/kindest/base:test", env.registry.addr);
    let pause = "registry.k8s.io/pause:3.10";
    let m = env.manifest("m.yaml", pause, &[pause]);
    let out = env.path("node.tar");
    let mirror = env.mirror();
    let args = [
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        &base_ref,
        "--mirror",
        &mirror,
        "--output",
    ];
    let text_out = format!("oci-archive:{}", env.path("text.tar").display());
    let mut text_args = args.to_vec();
    text_args.push(&text_out);
    let o = kiln(&text_args);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("kubelet image-manager state is whited out (/var/lib/kubelet/image_manager: 1 pull record(s), 1 pull intent(s)"),
        "{}",
        stderr(&o)
    );
    let archive = format!("oci-archive:{}", out.display());
    let mut json_args = args.to_vec();
    json_args.extend([archive.as_str(), "--json"]);
    let o = kiln(&json_args);
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &r["removedKubeletState"][0];
    assert_eq!(s["platform"], platform.as_str(), "{r:#}");
    assert_eq!(s["pulled"][0], kubelet_file("sha256:0123"), "{r:#}");
    assert_eq!(s["pulling"].as_array().unwrap().len(), 1, "{r:#}");
    // Every layer applied in order, whiteouts too, as an unpacker does.
    let files = read_tar(&out);
    let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let man: serde_json::Value = serde_json::from_slice(kiln_testkit::base::blob(
        &files,
        index["manifests"][0]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let tree = env.path("tree");
    std::fs::create_dir_all(&tree).unwrap();
    unpack_layers(&files, &kiln_testkit::base::layer_digests(&man), &tree);
    assert!(tree.join("var/lib/kubelet").is_dir());
    assert!(!tree.join("var/lib/kubelet/image_manager").exists());
    // kiln verify of the node image: the check passes, per policy.
    let v = kiln(&["verify", "--image", &archive]);
    assert_ok(&v);
    let said = stdout(&v) + &stderr(&v);
    assert!(
        said.contains("ok    no kubelet image-manager state"),
        "{said}"
    );
    let line = "bundled images that start offline, per credential policy: NeverVerify 1/1, NeverVerifyPreloadedImages (the default from 1.35) 1/1, NeverVerifyAllowlistedImages (kiln generate kubelet-config's allowlist) 1/1, AlwaysVerify 1/1 (the sandbox image counts under each";
    assert!(said.contains(line), "{said}");

    // A rootfs that carries the state, as a kubelet leaves it: verify
    // fails naming the directory; a build into it removes it, said.
    let rootfs = env.path("rootfs");
    let build = [
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--mirror",
        &mirror,
    ];
    assert_ok(&kiln(&build));
    stray_state(&rootfs);
    let verify = ["verify", "--rootfs", rootfs.to_str().unwrap()];
    let v = kiln(&verify);
    assert_eq!(v.status.code(), Some(1), "{}", stderr(&v));
    let said = stdout(&v) + &stderr(&v);
    assert!(
        said.contains("FAIL  no kubelet image-manager state")
            && said.contains("/var/lib/kubelet/image_manager is on the node (/var/lib/kubelet/image_manager: 1 pull record(s), 1 pull intent(s)")
            // pause is the sandbox, which the kubelet never checks
            // (tests/kubelet_gc.rs shows it with the real kubelet).
            && said.contains("NeverVerifyPreloadedImages (the default from 1.35) 1/1"),
        "{said}"
    );
    let o = kiln(&build);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("removed the kubelet's image-manager state"),
        "{}",
        stderr(&o)
    );
    assert!(!rootfs.join("var/lib/kubelet/image_manager").exists());
    assert_ok(&kiln(&verify));
}

/// The fields each kubelet knows, from KubeletConfiguration v1beta1
/// (kubernetes/kubernetes `staging/src/k8s.io/kubelet/config/v1beta1/types.go`)
/// and the first release each came in: (field, since minor, kind).
const FIELDS: &[(&str, u32, &str)] = &[
    ("kind", 0, "string"),
    ("apiVersion", 0, "string"),
    ("featureGates", 0, "map"),
    ("imageMinimumGCAge", 0, "duration"),
    ("imageGCHighThresholdPercent", 0, "percent"),
    ("imageGCLowThresholdPercent", 0, "percent"),
    ("imageMaximumGCAge", 29, "duration"),
    ("imagePullCredentialsVerificationPolicy", 33, "policy"),
    ("preloadedImagesVerificationAllowlist", 33, "list"),
];

/// A Go duration of h, m, s (what metav1.Duration parses), in seconds.
fn go_seconds(s: &str) -> u64 {
    let (mut total, mut n) = (0, String::new());
    for c in s.chars() {
        if c.is_ascii_digit() {
            n.push(c);
        } else {
            let unit = match c {
                'h' => 3600,
                'm' => 60,
                's' => 1,
                _ => panic!("{s:?} is not a Go duration"),
            };
            total += n.parse::<u64>().unwrap() * unit;
            n.clear();
        }
    }
    assert!(n.is_empty(), "{s:?}");
    total
}

/// The kubelet's allowlist entry check (`getAllowlistImagePattern`) and
/// match (`imageMatches`), written from its source for this test.
fn kubelet_accepts(entry: &str) -> bool {
    let trimmed = entry.strip_suffix('*').filter(|_| entry.ends_with("/*"));
    match trimmed {
        Some(t) => t.len() > 1 && !t.contains('*'),
        None => {
            let last = entry.rsplit('/').next().unwrap();
            entry.contains('.')
                && entry.contains('/')
                && !entry.contains('*')
                && !last.contains(':')
                && !entry.contains('@')
                && entry == entry.trim()
        }
    }
}

fn kubelet_matches(list: &[String], image: &str) -> bool {
    list.iter().any(|e| match e.strip_suffix('*') {
        Some(prefix) if e.ends_with("/*") => image.starts_with(prefix),
        _ => e == image,
    })
}

#[test]
fn generated_kubelet_config_is_read_as_kind_and_the_kubelet_read_it() {
    let env = Env::new();
    let images = [
        "registry.k8s.io/pause:3.10",
        "registry.k8s.io/coredns/coredns:v1.11.3",
        "registry.k8s.io/kube-apiserver:v1.31.2",
    ];
    let m = env.manifest("m.yaml", images[0], &images);
    for minor in [29, 30, 33, 34, 35, 36] {
        let v = format!("v1.{minor}.0");
        let o = kiln(&[
            "generate",
            "kubelet-config",
            "--manifest",
            m.to_str().unwrap(),
            "--kubelet-version",
            &v,
        ]);
        assert_ok(&o);
        // kind's v1alpha4 Cluster: kubeadmConfigPatches is a list of
        // strings, each a merge patch for the document of its kind (and
        // apiVersion, if it names one).
        let cluster: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&o.stdout).unwrap();
        assert_eq!(cluster["kind"], "Cluster");
        assert_eq!(cluster["apiVersion"], "kind.x-k8s.io/v1alpha4");
        let patch = cluster["kubeadmConfigPatches"][0].as_str().unwrap();
        let c: serde_json::Value = serde_yaml_ng::from_str(patch).unwrap();
        assert_eq!(c["kind"], "KubeletConfiguration", "{v}: {c}");
        assert_eq!(c["apiVersion"], "kubelet.config.k8s.io/v1beta1", "{v}");
        for (k, val) in c.as_object().unwrap() {
            let (_, since, kind) = FIELDS
                .iter()
                .find(|(f, ..)| f == k)
                .unwrap_or_else(|| panic!("{v}: {k} is no KubeletConfiguration field kiln checks"));
            assert!(minor >= *since, "{v}: {k} came in v1.{since}");
            match *kind {
                "duration" => {
                    go_seconds(val.as_str().unwrap());
                }
                "percent" => assert!(val.as_u64().unwrap() <= 100, "{v}: {k}"),
                "policy" => assert!(
                    [
                        "NeverVerify",
                        "NeverVerifyPreloadedImages",
                        "NeverVerifyAllowlistedImages",
                        "AlwaysVerify"
                    ]
                    .contains(&val.as_str().unwrap()),
                    "{v}: {val}"
                ),
                "list" => assert!(val.is_array()),
                _ => {}
            }
        }
        // validation.go's rules for these fields.
        let gate = |g: &str, on_from: u32| {
            minor >= on_from || c["featureGates"][g].as_bool() == Some(true)
        };
        let max = go_seconds(c["imageMaximumGCAge"].as_str().unwrap());
        assert!(max > go_seconds(c["imageMinimumGCAge"].as_str().unwrap()));
        assert!(
            gate("ImageMaximumGCAge", 30),
            "{v}: imageMaximumGCAge without its gate"
        );
        assert!(
            c["imageGCLowThresholdPercent"].as_u64() < c["imageGCHighThresholdPercent"].as_u64()
        );
        let policy = c["imagePullCredentialsVerificationPolicy"].as_str();
        let list: Vec<String> =
            serde_json::from_value(c["preloadedImagesVerificationAllowlist"].clone())
                .unwrap_or_default();
        if !gate("KubeletEnsureSecretPulledImages", 35) {
            assert!(policy.is_none() && list.is_empty(), "{v}: {c}");
            continue;
        }
        assert_eq!(policy, Some("NeverVerifyAllowlistedImages"), "{v}");
        for e in &list {
            assert!(kubelet_accepts(e), "{v}: the kubelet refuses {e:?}");
        }
        // Pods name the bundled images with their tags (kubeadm's static
        // pods do): each one is admitted, so none is re-verified offline.
        for i in images {
            assert!(
                kubelet_matches(&list, i),
                "{v}: {i} not admitted by {list:?}"
            );
        }
    }
    let o = kiln(&[
        "generate",
        "kubelet-config",
        "--manifest",
        m.to_str().unwrap(),
        "--kubelet-version",
        "v1.28.9",
    ]);
    assert_fails(&o, 2, &["no age-based image GC"]);
    // The manifest's kubernetesVersion (v1.31.2) is the default.
    let o = kiln(&[
        "generate",
        "kubelet-config",
        "--manifest",
        m.to_str().unwrap(),
        "--json",
    ]);
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["kubeletVersion"], "v1.31");
}
