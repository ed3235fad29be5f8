//! The mission's own test, with the real kubelet (issue 61): the kubelet of
//! Kubernetes v1.35.4, built from k8s.io/kubernetes (testkit/go/kubernetes),
//! runs standalone (no API server) against a kiln node's containerd with
//! CRI on, configured from `kiln generate kubelet-config` plus only what
//! standalone needs, image GC forced: thresholds of 1 % and 0 % (the first
//! pass at start must free bytes; the disk is this machine's, far over 1 %)
//! and `imageMinimumGCAge: 1s`. Its own log says what it removed; crictl
//! (cri-tools, from its Go module) says what is left.
//!
//! kiln's node keeps every bundled image and loses only the images loaded
//! later; the same images labelled as `kind build node-image` labels them
//! (kind `pkg/build/nodeimage/imageimporter.go`: only the images imported
//! from the release's archives are pinned, so pause, etcd and coredns are
//! not) lose exactly those to the same GC.
//!
//! What the kubelet needs on these hosts (read in k8s.io/kubernetes
//! v1.35.4): `failCgroupV1: false` (cgroup v1 controllers are mounted here;
//! `pkg/kubelet/cm` refuses v1 unless told), `cgroupsPerQOS: false` and
//! `enforceNodeAllocatable: []` (no QoS cgroup tree), `failSwapOn: false`,
//! no webhook authentication or authorization (no API server), its server
//! on 127.0.0.1 only. Image GC runs once at start, then every 5 minutes
//! (`ImageGCPeriod`), and here the pass at start ends before cAdvisor has
//! its filesystem stats ("Image garbage collection failed once. Stats
//! initialization may not have completed yet": the next pass would be 5
//! minutes on, past a test's time). So the test also sets `evictionHard`
//! on `imagefs.available` and `nodefs.available` at 99 %: the eviction
//! manager (every 10 s, once stats exist) asks the same image GC manager
//! to reclaim (`DeleteUnusedImages`: every unused image, pinned ones
//! skipped by the same `imagesInEvictionOrder`), logging "Removing image to
//! free bytes" for each, and then whether pressure fell; that line ends
//! the wait.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use crate::common::*;
use kiln_testkit::image::host_platform;

/// The images kiln's manifest bundles, and the two loaded later.
const BUNDLED: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/etcd:3.5.16-0",
    "registry.k8s.io/coredns/coredns:v1.11.3",
    "registry.k8s.io/kube-apiserver:v1.31.2",
];
const LOADED: &[&str] = &[
    "registry.k8s.io/extra/busybox:1.36",
    "registry.k8s.io/extra/web:1.0",
];
/// What kind build node-image leaves unpinned of the bundled set.
const KIND_UNPINNED: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/etcd:3.5.16-0",
    "registry.k8s.io/coredns/coredns:v1.11.3",
];

/// crictl's view: tag -> pinned.
fn crictl_images(socket: &Path) -> BTreeMap<String, bool> {
    let o = kiln_testkit::tools::run_bounded(
        std::process::Command::new(kiln_testkit::tools::crictl())
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(["images", "-o", "json"]),
        60,
    );
    assert!(o.status.success(), "crictl: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut out = BTreeMap::new();
    for i in v["images"].as_array().unwrap() {
        for t in i["repoTags"].as_array().unwrap() {
            out.insert(t.as_str().unwrap().to_string(), i["pinned"] == true);
        }
    }
    out
}

/// The KubeletConfiguration `kiln generate kubelet-config` writes for
/// `manifest` (its kind patch), GC forced, plus what standalone needs.
fn kubelet_config(env: &Env, manifest: &Path, dir: &Path, socket: &Path) -> std::path::PathBuf {
    let o = kiln(&[
        "generate",
        "kubelet-config",
        "--manifest",
        manifest.to_str().unwrap(),
        "--kubelet-version",
        "v1.35.4",
        "--disk-high",
        "1",
        "--disk-low",
        "0",
        // 1s, not 0s: the kubelet reads 0 as unset and defaults it to 2m
        // (v1beta1/defaults.go), which kiln now refuses.
        "--min-age",
        "1s",
    ]);
    assert_ok(&o);
    let cluster: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&o.stdout).unwrap();
    let patch = cluster["kubeadmConfigPatches"][0].as_str().unwrap();
    let mut config: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(patch).unwrap();
    let pods = dir.join("manifests");
    std::fs::create_dir_all(&pods).unwrap();
    let standalone = format!(
        "containerRuntimeEndpoint: unix://{}\nstaticPodPath: {}\npodLogsDir: {}\ncgroupDriver: cgroupfs\nfailCgroupV1: false\ncgroupsPerQOS: false\nenforceNodeAllocatable: []\nfailSwapOn: false\naddress: 127.0.0.1\nport: 0\nreadOnlyPort: 0\nhealthzPort: 0\nauthentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\nevictionHard:\n  imagefs.available: \"99%\"\n  nodefs.available: \"99%\"\n",
        socket.display(),
        pods.display(),
        dir.join("pod-logs").display()
    );
    let extra: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(&standalone).unwrap();
    for (k, v) in extra {
        config.insert(k, v);
    }
    let path = dir.join("kubelet.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let _ = env;
    path
}

/// Runs the kubelet against `socket` until its first image GC pass has
/// ended (its log says so), then stops it; its log.
fn kubelet_gc_pass(config: &Path, dir: &Path) -> String {
    let mut child = std::process::Command::new(kiln_testkit::tools::kubelet())
        .arg(format!("--config={}", config.display()))
        .arg(format!("--root-dir={}", dir.join("root").display()))
        .arg(format!("--cert-dir={}", dir.join("pki").display()))
        .args(["--hostname-override=kiln-node", "--v=2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = log.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let mut log = shared.lock().unwrap();
            // The image GC manager's second reclaim, driven by the
            // eviction manager (every 10 s), has ended one way or the
            // other: the first runs as the kubelet starts, before any image
            // is `imageMinimumGCAge` old.
            let done = log.matches("Attempting to delete unused images").count() >= 2
                && (line.contains("Eviction manager: able to reduce resource pressure")
                    || line.contains("Eviction manager: must evict pod(s)")
                    || line.contains("Eviction manager: unable to evict any pods")
                    || line.contains("Eviction manager: unexpected error"));
            log.push_str(&line);
            log.push('\n');
            if done {
                let _ = tx.send(true);
            }
        }
        let _ = tx.send(false);
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(180));
    let _ = child.kill();
    let _ = child.wait();
    let log = log.lock().unwrap().clone();
    match got {
        Ok(true) => log,
        Ok(false) => panic!("the kubelet ended before its image GC reclaimed:\n{log}"),
        Err(_) => panic!("no image GC reclaim within 180 s:\n{log}"),
    }
}

/// The node: `manifest` built into a rootfs, `LOADED` loaded after.
fn node(env: &Env, manifest: &Path, name: &str) -> std::path::PathBuf {
    let r = env.path(name);
    let o = env.build(manifest, &r, &[]);
    assert_ok(&o);
    for i in LOADED {
        assert_ok(&kiln(&[
            "load",
            "--rootfs",
            r.to_str().unwrap(),
            "--mirror",
            &env.mirror(),
            i,
        ]));
    }
    r
}

#[test]
fn the_kubelets_own_image_gc_keeps_kilns_bundled_set() {
    let env = Env::new();
    let web = kiln_testkit::base::image_of(
        "extra/web",
        "1.0",
        &[&host_platform()],
        vec![kiln_testkit::base::layer_of(&[(
            "srv/index.html",
            tar::EntryType::Regular,
            b"hello\n",
            "",
            0o644,
        )])],
    );
    env.registry.push(&web).unwrap();
    let manifest = env.manifest("kiln.yaml", BUNDLED[0], BUNDLED);
    let mut removed_counts = Vec::new();
    for (what, unpin, keep) in [
        ("kiln's node", &[][..], BUNDLED.to_vec()),
        (
            "kind-labelled node",
            KIND_UNPINNED,
            BUNDLED
                .iter()
                .copied()
                .filter(|i| !KIND_UNPINNED.contains(i))
                .collect(),
        ),
    ] {
        let r = node(&env, &manifest, &what.replace(' ', "-").replace('\'', ""));
        let rt = tokio::runtime::Runtime::new().unwrap();
        let cri = rt
            .block_on(kiln_testkit::cri::CriNode::start(&r, None))
            .unwrap();
        // As kind build node-image labels them: its importer pins only the
        // images of the release's archives, so pause, etcd and coredns
        // carry no pinned label (kiln refuses to build that: its sandbox
        // image is always pinned, so the label goes here).
        // Every record of the image (kiln records its tag and its digest).
        let names = cri.ctr(&["images", "ls", "-q"]).unwrap();
        let names = String::from_utf8_lossy(&names.stdout).into_owned();
        for i in unpin {
            let repo = i.rsplit_once(':').unwrap().0;
            for name in names.lines().filter(|n| {
                n.starts_with(&format!("{repo}:")) || n.starts_with(&format!("{repo}@"))
            }) {
                let o = cri
                    .ctr(&["images", "label", name, "io.cri-containerd.pinned="])
                    .unwrap();
                assert!(o.status.success(), "{}", stderr(&o));
            }
        }
        let before = crictl_images(cri.socket());
        let dir = env.path(&format!("kubelet-{}", removed_counts.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = kubelet_config(&env, &manifest, &dir, cri.socket());
        let log = kubelet_gc_pass(&config, &dir);
        let after = crictl_images(cri.socket());
        let removed: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("Removing image to free bytes"))
            .collect();
        eprintln!(
            "{what}: before GC (crictl, tag -> pinned): {before:?}\n{what}: the kubelet's log:\n  {}\n{what}: after GC: {after:?}",
            removed.join("\n  ")
        );
        let left: Vec<&String> = after.keys().collect();
        let mut want: Vec<&str> = keep.clone();
        want.sort();
        assert_eq!(left, want, "{what}: {log}");
        removed_counts.push((what, removed.len()));
        cri.stop().unwrap();
    }
    eprintln!("images the kubelet removed: {removed_counts:?}");
    assert_eq!(removed_counts[0].1, LOADED.len());
    assert_eq!(removed_counts[1].1, LOADED.len() + KIND_UNPINNED.len());
}
