//! The mission's own test, with the real kubelet (issue 61): the kubelet of
//! Kubernetes v1.35.4, built from k8s.io/kubernetes (testkit/go/kubernetes),
//! runs standalone (no API server) against a kiln node's containerd with
//! CRI on, configured from `kiln generate kubelet-config` plus only what
//! standalone needs, image GC forced: thresholds of 1 % and 0 % (the first
//! pass at start must free bytes; the disk is this machine's, far over 1 %)
//! and `imageMinimumGCAge: 1s`. Its own log says what it removed; crictl
//! (cri-tools, from its Go module) says what is left. The node's
//! containerd runs pods with runc in a network namespace of its own with
//! only loopback: nothing can be pulled, as on an air-gapped node.
//!
//! kiln's node keeps every bundled image and loses only the images loaded
//! later, and a static pod on the bundled pause and etcd starts after GC;
//! the same images labelled as `kind build node-image` labels them (kind
//! `pkg/build/nodeimage/imageimporter.go`: only the images imported from
//! the release's archives are pinned, so pause, etcd and coredns are not)
//! lose exactly those to the same GC, and the same pod cannot start.
//!
//! The credential checks of kubelet 1.35 (`KubeletEnsureSecretPulledImages`,
//! beta and on from 1.35, `pkg/features/kube_features.go`) are run for real
//! too: `pkg/kubelet/images/image_manager.go` asks the pull manager
//! (`pullmanager/image_pull_manager.go`, `MustAttemptImagePull`) about every
//! present image a pod names with `IfNotPresent`. An image is
//! "kubelet-pulled" when `image_manager/pulled/sha256-<hex of its CRI id>`
//! exists, or an intent `image_manager/pulling/sha256-<hex of the image as
//! the pod names it>`; intents of present images become records with no
//! credentials when the kubelet starts (`initialize`). A record whose
//! `credentialMapping` has only Secrets the pod does not carry makes it
//! pull, and offline the pull fails.
//!
//! What the kubelet needs on these hosts (read in k8s.io/kubernetes
//! v1.35.4): `failCgroupV1: false` (cgroup v1 controllers are mounted here;
//! `pkg/kubelet/cm` refuses v1 unless told), `cgroupsPerQOS: false` and
//! `enforceNodeAllocatable: []` (no QoS cgroup tree), `failSwapOn: false`,
//! no webhook authentication or authorization (no API server), and no
//! server (`enableServer: false`: `port` 0 means the default 10250, so two
//! kubelets at once would collide; `healthzPort` 0 turns healthz off). Image GC runs once at start, then every 5 minutes
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

use std::path::{Path, PathBuf};

use crate::common::*;
use kiln::domain::kubelet::policy::{allowlist_for, Policy};
use kiln::domain::kubelet::state;
use kiln::primitives::inroot::Root;
use kiln::primitives::reference::ImageRef;
use kiln_testkit::cri::{crictl, crictl_images, crictl_json, running_containers, CriNode};
use kiln_testkit::kubelet::Kubelet;

/// The images kiln's manifest bundles (what the real kubeadm of v1.35.4
/// lists: tests/kubernetes.rs), each a runnable stand-in at the given
/// path: the sandbox first.
const BUNDLED: &[(&str, &str, &str)] = &[
    ("pause", "3.10.1", "/pause"),
    ("etcd", "3.6.6-0", "/usr/local/bin/etcd"),
    ("coredns/coredns", "v1.13.1", "/coredns"),
    ("kube-apiserver", "v1.35.4", "/usr/local/bin/kube-apiserver"),
];
/// Loaded later with `kiln load`.
const LOADED: &[&str] = &[
    "registry.k8s.io/extra/busybox:1.36",
    "registry.k8s.io/extra/web:1.0",
];
/// What kind build node-image leaves unpinned of the bundled set.
const KIND_UNPINNED: &[&str] = &["pause", "etcd", "coredns/coredns"];

fn name(repo: &str, tag: &str) -> String {
    format!("registry.k8s.io/{repo}:{tag}")
}

fn bundled() -> Vec<String> {
    BUNDLED.iter().map(|(r, t, _)| name(r, t)).collect()
}

/// The registry seeded with the bundled stand-ins and `extra/web`; the
/// manifest bundling them.
fn seeded(env: &Env) -> PathBuf {
    for (repo, tag, path) in BUNDLED {
        env.registry
            .push(&kiln_testkit::base::runnable(repo, tag, path, &[]))
            .unwrap();
    }
    let web = kiln_testkit::base::image_of(
        "extra/web",
        "1.0",
        &[&kiln_testkit::image::host_platform()],
        vec![kiln_testkit::base::layer_of(&[(
            "srv/index.html",
            tar::EntryType::Regular,
            b"hello\n",
            "",
            0o644,
        )])],
    );
    env.registry.push(&web).unwrap();
    let mut text = format!(
        "apiVersion: kiln/v1\nkind: NodeImageManifest\nkubernetesVersion: v1.35.4\nsandboxImage: {}\nimages:\n",
        bundled()[0]
    );
    for i in bundled() {
        text.push_str(&format!("  - {i}\n"));
    }
    env.write("kiln.yaml", &text)
}

/// The KubeletConfiguration `kiln generate kubelet-config` writes for
/// `manifest` (its kind patch) with `extra` flags, plus what standalone
/// needs; with `gc`, image GC forced.
fn kubelet_config(manifest: &Path, dir: &Path, socket: &Path, gc: bool, extra: &[&str]) -> PathBuf {
    let mut args = vec![
        "generate",
        "kubelet-config",
        "--manifest",
        manifest.to_str().unwrap(),
        "--kubelet-version",
        "v1.35.4",
    ];
    if gc {
        // 1s, not 0s: the kubelet reads 0 as unset and defaults it to 2m
        // (v1beta1/defaults.go), which kiln refuses.
        args.extend(["--disk-high", "1", "--disk-low", "0", "--min-age", "1s"]);
    }
    args.extend(extra);
    let o = kiln(&args);
    assert_ok(&o);
    let cluster: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&o.stdout).unwrap();
    let patch = cluster["kubeadmConfigPatches"][0].as_str().unwrap();
    let mut config: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(patch).unwrap();
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    let mut standalone = format!(
        "containerRuntimeEndpoint: unix://{}\nstaticPodPath: {}\npodLogsDir: {}\ncgroupDriver: cgroupfs\nfailCgroupV1: false\ncgroupsPerQOS: false\nenforceNodeAllocatable: []\nfailSwapOn: false\nenableServer: false\nreadOnlyPort: 0\nhealthzPort: 0\nauthentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
        socket.display(),
        dir.join("manifests").display(),
        dir.join("pod-logs").display()
    );
    if gc {
        standalone
            .push_str("evictionHard:\n  imagefs.available: \"99%\"\n  nodefs.available: \"99%\"\n");
    }
    let extra: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(&standalone).unwrap();
    for (k, v) in extra {
        config.insert(k, v);
    }
    let path = dir.join("kubelet.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    path
}

/// Starts the kubelet for `rootfs` (its state in the rootfs's own
/// `var/lib/kubelet`, where a node keeps it).
fn kubelet(rootfs: &Path, dir: &Path, config: &Path) -> Kubelet {
    Kubelet::start(
        config,
        &rootfs.join("var/lib/kubelet"),
        &dir.join("manifests"),
        &dir.join("pki"),
    )
}

/// Whether the image GC manager's second reclaim has ended one way or the
/// other: the first runs as the kubelet starts, before any image is
/// `imageMinimumGCAge` old; the second is driven by the eviction manager.
fn second_reclaim_ended(log: &str) -> bool {
    let Some((i, _)) = log
        .match_indices("Attempting to delete unused images")
        .nth(1)
    else {
        return false;
    };
    let after = &log[i..];
    [
        "Eviction manager: able to reduce resource pressure",
        "Eviction manager: must evict pod(s)",
        "Eviction manager: unable to evict any pods",
        "Eviction manager: unexpected error",
    ]
    .iter()
    .any(|l| after.contains(l))
}

/// The static pod `etcd` on this node: its pod name as the kubelet logs it.
const POD: &str = "kube-system/etcd-kiln-node";

/// Waits until crictl lists `container` running; the kubelet's log lines
/// about the pod otherwise.
fn wait_running(k: &Kubelet, socket: &Path, pod: &str, container: &str) -> Result<(), String> {
    // The kubelet's PLEG reports each container it saw start (the
    // sandbox's, then the container's): each such line is a moment to ask
    // crictl, and the test never sleeps.
    let started = |log: &str| {
        log.lines()
            .filter(|l| l.contains(&format!("pod=\"{pod}\"")) && l.contains("ContainerStarted"))
            .count()
    };
    let mut seen = 0;
    loop {
        let log = k
            .wait_for(120, |log| started(log) > seen)
            .map_err(|e| lines_about(&e, pod))?;
        seen = started(&log);
        if running_containers(socket)
            .iter()
            .any(|(n, _)| n == container)
        {
            return Ok(());
        }
    }
}

/// The lines of `log` that name `pod`.
fn lines_about(log: &str, pod: &str) -> String {
    log.lines()
        .filter(|l| l.contains(pod))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits for the kubelet to report that `pod` failed with `what`; the line.
fn wait_failed(k: &Kubelet, pod: &str, what: &str) -> String {
    let hit = |log: &str| {
        log.lines()
            .find(|l| l.contains("Error syncing pod") && l.contains(pod) && l.contains(what))
            .map(str::to_string)
    };
    let log = k
        .wait_for(120, |log| hit(log).is_some())
        .unwrap_or_else(|e| panic!("{pod} did not fail with {what}: {}", lines_about(&e, pod)));
    hit(&log).unwrap()
}

/// Stops the kubelet, then every pod it started (their shims outlive
/// containerd), then containerd.
fn stop(k: Kubelet, cri: CriNode) {
    stop_pods(k, &cri);
    cri.stop().unwrap();
}

/// The node: `manifest` built into a rootfs, `LOADED` loaded after.
fn node(env: &Env, manifest: &Path, name: &str) -> PathBuf {
    let r = env.path(name);
    assert_ok(&env.build(manifest, &r, &[]));
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
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: the kubelet runs pods as root only");
        return;
    }
    let env = Env::new();
    let manifest = seeded(&env);
    let mut removed_counts = Vec::new();
    for (what, unpin) in [
        ("kiln's node", &[][..]),
        ("kind-labelled node", KIND_UNPINNED),
    ] {
        let r = node(&env, &manifest, &what.replace(' ', "-").replace('\'', ""));
        let rt = tokio::runtime::Runtime::new().unwrap();
        let cri = rt
            .block_on(CriNode::start_running(&r, &bundled()[0]))
            .unwrap();
        // As kind build node-image labels them: its importer pins only the
        // images of the release's archives, so pause, etcd and coredns
        // carry no pinned label (kiln refuses to build that: its sandbox
        // image is always pinned, so the label goes here), on every record
        // of the image (kiln records its tag and its digest).
        let names = cri.ctr(&["images", "ls", "-q"]).unwrap();
        let names = String::from_utf8_lossy(&names.stdout).into_owned();
        for repo in unpin {
            let repo = format!("registry.k8s.io/{repo}");
            for name in names.lines().filter(|n| {
                n.starts_with(&format!("{repo}:")) || n.starts_with(&format!("{repo}@"))
            }) {
                let o = cri
                    .ctr(&["images", "label", name, "io.cri-containerd.pinned="])
                    .unwrap();
                assert!(o.status.success(), "{}", stderr(&o));
            }
        }
        let keep: Vec<String> = bundled()
            .into_iter()
            .zip(BUNDLED)
            .filter(|(_, (repo, _, _))| !unpin.contains(repo))
            .map(|(n, _)| n)
            .collect();
        let before = crictl_images(cri.socket());
        let dir = env.path(&format!("kubelet-{}", removed_counts.len()));
        let config = kubelet_config(&manifest, &dir, cri.socket(), true, &[]);
        let k = kubelet(&r, &dir, &config);
        let log = k.wait_for(180, second_reclaim_ended).unwrap_or_else(|e| {
            panic!(
                "{what}: no image GC reclaim: {e}\ncontainerd: {}",
                cri.log_tail()
            )
        });
        let after = crictl_images(cri.socket());
        let removed: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("Removing image to free bytes"))
            .collect();
        eprintln!(
            "{what}: before GC (crictl, tag -> pinned): {:?}\n{what}: the kubelet's log:\n  {}\n{what}: after GC: {:?}",
            before.iter().map(|(t, (p, _))| (t, p)).collect::<Vec<_>>(),
            removed.join("\n  "),
            after.keys().collect::<Vec<_>>(),
        );
        let left: Vec<&String> = after.keys().collect();
        let mut want: Vec<&String> = keep.iter().collect();
        want.sort();
        assert_eq!(left, want, "{what}: {log}");
        removed_counts.push((what, removed.len()));

        // After GC, offline: a static pod on the node's sandbox image with
        // a container of the bundled etcd.
        k.static_pod("etcd", "etcd", &bundled()[1]);
        if unpin.is_empty() {
            wait_running(&k, cri.socket(), POD, "etcd").unwrap_or_else(|e| {
                panic!(
                    "{what}: the static pod did not start: {e}\n{}",
                    cri.log_tail()
                )
            });
            let pods = crictl_json(cri.socket(), &["pods"]);
            eprintln!(
                "{what}: after GC, crictl ps: {:?}; pods: {}",
                running_containers(cri.socket()),
                pods["items"]
            );
        } else {
            let line = wait_failed(&k, POD, "CreatePodSandbox");
            eprintln!("{what}: after GC the static pod cannot start:\n  {line}");
            assert!(line.contains("pause"), "{line}");
        }
        stop(k, cri);
    }
    eprintln!("images the kubelet removed: {removed_counts:?}");
    assert_eq!(removed_counts[0].1, LOADED.len());
    assert_eq!(removed_counts[1].1, LOADED.len() + KIND_UNPINNED.len());
}

/// The kubelet's file name for a record or intent about `key` (its CRI id,
/// or the image as a pod names it): `fs_pullrecords.go`'s `cacheFilename`.
fn state_file(key: &str) -> String {
    use sha2::Digest;
    format!(
        "sha256-{}",
        hex::encode(sha2::Sha256::digest(key.as_bytes()))
    )
}

/// The static pods of the credential test: pod, container, image.
fn credential_pods() -> Vec<(&'static str, &'static str, String)> {
    let b = bundled();
    vec![
        ("etcd", "etcd", b[1].clone()),
        ("coredns", "coredns", b[2].clone()),
        ("apiserver", "kube-apiserver", b[3].clone()),
    ]
}

/// One kubelet lifetime on `r` under `policy` (with kiln's allowlist):
/// which of the credential pods start (crictl), and the kubelet's line for
/// each that cannot (it must fail to pull: the node is offline). kiln's
/// restated rule (`domain::kubelet::policy`), read on the same files, must
/// say the same of each.
fn credential_run(
    env: &Env,
    r: &Path,
    cri: &CriNode,
    manifest: &Path,
    (label, policy): (&str, Policy),
    want_running: &[&str],
) -> Vec<String> {
    let run = format!("{label}-{}", policy.name());
    let found = state::read(&Root::open(r).unwrap()).unwrap();
    let images: Vec<ImageRef> = bundled()
        .iter()
        .map(|i| ImageRef::parse(i).unwrap())
        .collect();
    let allowlist = allowlist_for(&images);
    let ids = crictl_images(cri.socket());
    let dir = env.path(&run);
    let config = kubelet_config(
        manifest,
        &dir,
        cri.socket(),
        false,
        &["--credential-policy", policy.name()],
    );
    let k = kubelet(r, &dir, &config);
    let mut failed = Vec::new();
    for (pod, container, image) in credential_pods() {
        k.static_pod(pod, container, &image);
    }
    for (pod, container, image) in credential_pods() {
        let full = format!("kube-system/{pod}-kiln-node");
        let runs = want_running.contains(&pod);
        assert_eq!(
            policy.runs_offline(&image, Some(&ids[&image].1), found.as_ref(), &allowlist),
            runs,
            "{run}: kiln's rule disagrees with the kubelet about {image} (state {found:?})"
        );
        if runs {
            wait_running(&k, cri.socket(), &full, container)
                .unwrap_or_else(|e| panic!("{run}: {pod} did not start: {e}\n{}", cri.log_tail()));
        } else {
            failed.push(wait_failed(&k, &full, "ErrImagePull"));
        }
    }
    let running: Vec<String> = running_containers(cri.socket())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    eprintln!("{run}: crictl ps (running): {running:?}");
    for f in &failed {
        eprintln!(
            "{run}: cannot start:\n  {}",
            f.chars().take(700).collect::<String>()
        );
    }
    stop_pods(k, cri);
    failed
}

/// Stops the kubelet and every pod it started; containerd stays.
fn stop_pods(k: Kubelet, cri: &CriNode) {
    drop(k);
    let o = crictl(cri.socket(), &["rmp", "--force", "--all"]);
    assert!(o.status.success(), "crictl rmp: {}", stderr(&o));
}

/// kubelet 1.35's credential checks, for real, on a kiln node with no
/// registry: a base's image-manager state is removed by kiln build, and
/// every bundled image then starts under the default policy; the same
/// state put back shows what the kubelet does with it, policy by policy.
#[test]
fn the_kubelets_credential_checks_on_kilns_node() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: the kubelet runs pods as root only");
        return;
    }
    let env = Env::new();
    let manifest = seeded(&env);
    let r = env.path("node");
    // A base that ran a kubelet: an intent left by a pull in flight.
    let base_intent = r
        .join("var/lib/kubelet/image_manager/pulling")
        .join(state_file(&bundled()[1]));
    std::fs::create_dir_all(base_intent.parent().unwrap()).unwrap();
    std::fs::write(
        &base_intent,
        format!(
            "{{\"kind\":\"ImagePullIntent\",\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"image\":\"{}\"}}",
            bundled()[1]
        ),
    )
    .unwrap();
    let o = env.build(&manifest, &r, &[]);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("removed the kubelet's image-manager state"),
        "{}",
        stderr(&o)
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = rt
        .block_on(CriNode::start_running(&r, &bundled()[0]))
        .unwrap();
    let all = ["etcd", "coredns", "apiserver"];
    // 1. kiln's node, the default policy: every bundled image starts.
    let failed = credential_run(
        &env,
        &r,
        &cri,
        &manifest,
        ("clean", Policy::NeverVerifyPreloadedImages),
        &all,
    );
    assert!(failed.is_empty());

    // 2. The state a base that ran a kubelet carries, put back: the intent
    // for etcd (the kubelet turns it into a record with no credentials as
    // it starts); records for kube-apiserver and for the sandbox's pause
    // pulled with a Secret; a record for coredns pulled with no
    // credentials (`nodePodsAccessible`).
    let ids = crictl_images(cri.socket());
    let id = |image: &str| ids[image].1.clone();
    let state = r.join("var/lib/kubelet/image_manager");
    std::fs::create_dir_all(state.join("pulling")).unwrap();
    std::fs::create_dir_all(state.join("pulled")).unwrap();
    std::fs::write(
        state.join("pulling").join(state_file(&bundled()[1])),
        format!(
            "{{\"kind\":\"ImagePullIntent\",\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"image\":\"{}\"}}",
            bundled()[1]
        ),
    )
    .unwrap();
    let record = |image: &str, mapping: &str| {
        std::fs::write(
            state.join("pulled").join(state_file(&id(image))),
            format!(
                "{{\"kind\":\"ImagePulledRecord\",\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"lastUpdatedTime\":\"2026-11-30T12:00:00Z\",\"imageRef\":\"{}\",\"credentialMapping\":{{{mapping}}}}}",
                id(image)
            ),
        )
        .unwrap();
    };
    for (image, repo) in [(3, "kube-apiserver"), (0, "pause")] {
        record(
            &bundled()[image],
            &format!("\"registry.k8s.io/{repo}\":{{\"kubernetesSecrets\":[{{\"uid\":\"0d6c1f2e\",\"namespace\":\"kube-system\",\"name\":\"mirror-credentials\",\"credentialHash\":\"9f2c\"}}]}}"),
        );
    }
    record(
        &bundled()[2],
        "\"registry.k8s.io/coredns/coredns\":{\"nodePodsAccessible\":true}",
    );
    // kiln verify reads the same files (its own containerd, on a copy of
    // the store: the node's containerd stopped first, as it would still be
    // removing the pods' snapshots while the copy ran).
    cri.stop().unwrap();
    let verify = kiln(&["verify", "--rootfs", r.to_str().unwrap()]);
    let cri = rt
        .block_on(CriNode::start_running(&r, &bundled()[0]))
        .unwrap();
    let said = stderr(&verify);
    eprintln!("kiln verify with the base's state:\n{said}");
    assert!(
        said.contains("NeverVerifyPreloadedImages (the default from 1.35) 2/4")
            && said.contains(
                "NeverVerifyAllowlistedImages (kiln generate kubelet-config's allowlist) 4/4"
            ),
        "{said}"
    );

    // Under the default policy the kubelet-pulled ones must be verified;
    // coredns (no credentials) and the sandbox (never asked about) start.
    let failed = credential_run(
        &env,
        &r,
        &cri,
        &manifest,
        ("state", Policy::NeverVerifyPreloadedImages),
        &["coredns"],
    );
    assert_eq!(failed.len(), 2);
    // Under kiln's allowlist nothing bundled is verified, state or not.
    let failed = credential_run(
        &env,
        &r,
        &cri,
        &manifest,
        ("state", Policy::NeverVerifyAllowlistedImages),
        &all,
    );
    assert!(failed.is_empty());
    // AlwaysVerify: the sandbox, and coredns: a record saying it was
    // pulled with no credentials spares it under every policy.
    let failed = credential_run(
        &env,
        &r,
        &cri,
        &manifest,
        ("state", Policy::AlwaysVerify),
        &["coredns"],
    );
    assert_eq!(failed.len(), 2);
    cri.stop().unwrap();
}
