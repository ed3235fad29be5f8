//! A real cluster on kiln's node image (issue 62): `kind create cluster`
//! (kind v0.33.0, from its Go module) boots a control plane and a worker
//! from a node image kiln built out of parts made here, with no registry
//! reachable and the kubelet's image GC switched on by kiln's own config.
//!
//! The parts (docs/kind-cluster.md says where each fact comes from):
//! - the Kubernetes v1.35.4 release, built from k8s.io/kubernetes by
//!   `make deps` and laid out as the release tarball is (kubelet, kubeadm,
//!   kubectl; the four control-plane programs as `docker save` archives);
//! - etcd 3.6.6 and CoreDNS v1.13.1 from their Go modules, under the names
//!   kubeadm v1.35.4 lists; the pause image runs the tests' static
//!   stand-in (it waits for SIGTERM, which is all pause does);
//! - kind's storage provisioner from rancher's module (v0.0.33: kind's
//!   v0.0.34 is not served here), and a stand-in for kindnetd (its module
//!   is not served here), in kind's manifest contract;
//! - the node base from Debian 12's packages (scripts/kind-base.sh), with
//!   containerd 2.1 and kiln's own entrypoint and units.
//!
//! The node image is built and pushed by kiln, pulled by a private Docker
//! 28 with its networking on (kind's nodes find each other through
//! Docker's DNS), and then the registry is stopped: nothing the cluster
//! does can pull. The control plane keeps kiln's labels; the worker is
//! relabelled as `kind build node-image` labels (only the release's
//! images pinned). The kubelet's image GC (every 5 minutes from its start,
//! `ImageGCPeriod`; by disk use, thresholds 1 % and 0 %, so one pass
//! removes every unused image it may) then judges both.

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use kiln_testkit::cluster;
use kiln_testkit::docker::{docker_cli, Dockerd, Store};
use kiln_testkit::registry::Registry;

const NAME: &str = "kiln";
const CP: &str = "kiln-control-plane";
const WORKER: &str = "kiln-worker";
/// kind's and kubeadm's names for the images kiln bundles besides the release's.
use cluster::{kind, HELPER, KINDNETD, PROVISIONER};
const USER_IMAGE: &str = "example.com/team/app:1.0";

/// `docker exec NODE ARGS` (bounded, 300 s): its output, whatever the status.
fn exec(d: &Dockerd, node: &str, args: &[&str]) -> std::process::Output {
    let mut c = d.docker();
    c.args(["exec", node]).args(args);
    kiln_testkit::tools::run_bounded(&mut c, 300)
}

/// The node's own kubectl, as cluster admin; asserted to succeed.
fn kubectl(d: &Dockerd, args: &[&str]) -> String {
    let mut all = vec!["kubectl", "--kubeconfig=/etc/kubernetes/admin.conf"];
    all.extend(args);
    let o = exec(d, CP, &all);
    assert!(
        o.status.success(),
        "kubectl {}: {}{}",
        args.join(" "),
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// `kubectl apply -f -` of `yaml`.
fn apply(d: &Dockerd, yaml: &str) {
    let mut c = d.docker();
    c.args([
        "exec",
        "-i",
        CP,
        "kubectl",
        "--kubeconfig=/etc/kubernetes/admin.conf",
        "apply",
        "-f",
        "-",
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), yaml.as_bytes()).unwrap();
    let status = kiln_testkit::tools::wait_bounded(&mut child, 60);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "kubectl apply: {err}\n{yaml}");
}

/// One image as crictl lists it: (tag or digest, pinned, CRI id).
type CriImage = (String, bool, String);

/// crictl's image list on `node`.
fn images(d: &Dockerd, node: &str) -> Vec<CriImage> {
    let o = exec(d, node, &["crictl", "images", "-o", "json"]);
    assert!(
        o.status.success(),
        "crictl images on {node}: {}",
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut out: Vec<CriImage> = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let name = i["repoTags"]
                .as_array()
                .and_then(|t| t.first())
                .or_else(|| i["repoDigests"].as_array().and_then(|t| t.first()))
                .and_then(|t| t.as_str())
                .unwrap_or("?")
                .to_string();
            (
                name,
                i["pinned"].as_bool().unwrap_or(false),
                i["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Follows the kubelet's journal on `node` until `done` holds for a line
/// (each new line wakes it), at most `secs`; every line read either way.
fn follow_kubelet(
    d: &Dockerd,
    node: &str,
    secs: u64,
    done: impl Fn(&str) -> bool,
) -> Result<Vec<String>, Vec<String>> {
    let mut c = d.docker();
    c.args([
        "exec",
        node,
        "journalctl",
        "-u",
        "kubelet",
        "-f",
        "-n",
        "all",
        "-o",
        "cat",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut lines = Vec::new();
    let result = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let hit = done(&line);
                lines.push(line);
                if hit {
                    break Ok(());
                }
            }
            Err(_) => break Err(()),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    result.map(|_| lines.clone()).map_err(|_| lines)
}

/// A pod on `node` (by name: no scheduler, as a static placement) running
/// `image` once, never pulled (`IfNotPresent` on a node with no registry).
fn once_pod(name: &str, node: &str, image: &str, command: &[&str]) -> String {
    let cmd: Vec<String> = command.iter().map(|c| format!("\"{c}\"")).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: {node}\n  restartPolicy: Never\n  tolerations:\n  - operator: Exists\n  containers:\n  - name: main\n    image: {image}\n    imagePullPolicy: IfNotPresent\n    command: [{}]\n",
        cmd.join(", ")
    )
}

/// Waits (the API server's own watch, bounded) until pod `name` is in
/// `phase`; its description if it never is.
fn wait_phase(d: &Dockerd, name: &str, phase: &str) {
    let cond = format!("--for=jsonpath={{.status.phase}}={phase}");
    let o = exec(
        d,
        CP,
        &[
            "kubectl",
            "--kubeconfig=/etc/kubernetes/admin.conf",
            "wait",
            &cond,
            &format!("pod/{name}"),
            "--timeout=120s",
        ],
    );
    if !o.status.success() {
        panic!(
            "pod {name} never {phase}: {}",
            kubectl(d, &["describe", "pod", name])
        );
    }
}

/// The reason pod `name`'s container is waiting, once it has one that is
/// not `ContainerCreating` (watched by kubectl, bounded).
fn waiting_reason(d: &Dockerd, name: &str) -> String {
    let o = exec(
        d,
        CP,
        &[
            "kubectl",
            "--kubeconfig=/etc/kubernetes/admin.conf",
            "wait",
            "--for=jsonpath={.status.containerStatuses[0].state.waiting.reason}=ErrImagePull",
            &format!("pod/{name}"),
            "--timeout=120s",
        ],
    );
    let reason = kubectl(
        d,
        &[
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ],
    );
    if !o.status.success() && reason.is_empty() {
        panic!(
            "pod {name} never waited: {}",
            kubectl(d, &["describe", "pod", name])
        );
    }
    reason
}

/// The images kind's own labelling leaves unpinned on a node built from
/// these parts (`kind build node-image` pins only the release's archives).
fn kind_unpinned() -> Vec<&'static str> {
    vec![
        "registry.k8s.io/pause:3.10.1",
        "registry.k8s.io/etcd:3.6.6-0",
        "registry.k8s.io/coredns/coredns:v1.13.1",
        KINDNETD,
        PROVISIONER,
        HELPER,
    ]
}

/// Every part pushed to `registry`, and kiln's node image built from them.
fn build_node(dir: &Path, registry: &Registry) -> cluster::NodeInputs {
    let inputs = cluster::NodeInputs::push(dir, registry);
    let args = inputs.build_args();
    let o = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ok(&o);
    eprintln!("kiln build: {}", stderr(&o).lines().last().unwrap_or(""));
    inputs
}

/// kind's cluster config from `kiln generate kubelet-config` (module doc
/// of testkit's cluster: what is added and why).
fn cluster_config(dir: &Path, manifest: &Path) -> std::path::PathBuf {
    let args = cluster::generate_args(manifest);
    let o = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ok(&o);
    let path = cluster::kind_config(&o.stdout, dir);
    eprintln!(
        "kind cluster config:\n{}",
        std::fs::read_to_string(&path).unwrap()
    );
    path
}

/// Deletes the cluster when dropped (a failing test leaves no nodes).
struct Delete<'a> {
    d: &'a Dockerd,
    home: std::path::PathBuf,
}

impl Drop for Delete<'_> {
    fn drop(&mut self) {
        let _ = kiln_testkit::tools::run_bounded(
            kind(self.d, &self.home).args(["delete", "cluster", "--name", NAME]),
            120,
        );
    }
}

#[test]
fn kind_create_cluster_boots_kilns_node_offline_and_gc_keeps_the_bundled_set() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: Docker's nodes run as root only");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let registry = Registry::start().unwrap();
    let built = build_node(dir.path(), &registry);
    let config = cluster_config(dir.path(), &built.manifest);

    let d = Dockerd::start_networked(Store::Classic, &[&registry.addr]).unwrap();
    d.run(&["pull", &built.node_image]);
    // From here on no registry exists: the node image is in Docker's store,
    // every image the cluster runs must be in the node's.
    drop(registry);

    let _delete = Delete {
        d: &d,
        home: home.clone(),
    };
    let t0 = Instant::now();
    let o = kiln_testkit::tools::run_bounded(
        kind(&d, &home).args([
            "create",
            "cluster",
            "--name",
            NAME,
            "--image",
            &built.node_image,
            "--config",
            config.to_str().unwrap(),
            "--wait",
            "5m",
            "--retain",
        ]),
        600,
    );
    let created = t0.elapsed();
    if !o.status.success() {
        for node in [CP, WORKER] {
            let j = exec(&d, node, &["journalctl", "-n", "80", "--no-pager"]);
            eprintln!("{node}'s journal:\n{}", stdout(&j));
        }
        panic!("kind create cluster: {}{}", stdout(&o), stderr(&o));
    }
    eprintln!(
        "kind create cluster ({:.0?}):\n{}{}",
        created,
        stdout(&o),
        stderr(&o)
    );
    kubectl(
        &d,
        &[
            "wait",
            "--for=condition=Ready",
            "nodes",
            "--all",
            "--timeout=300s",
        ],
    );
    // CoreDNS is Ready only once it reaches the API server through the
    // service address, which kube-proxy's rules route.
    kubectl(
        &d,
        &[
            "wait",
            "--for=condition=Ready",
            "pods",
            "--all",
            "-A",
            "--timeout=300s",
        ],
    );
    eprintln!(
        "kubectl get nodes,pods -A -o wide:\n{}",
        kubectl(&d, &["get", "nodes,pods", "-A", "-o", "wide"])
    );

    // Every image the cluster runs is one kiln bundled, pinned, on its node.
    let bundled: Vec<String> = cluster::addon_images()
        .into_iter()
        .map(|(n, _)| n)
        .chain(cluster::release_images())
        .collect();
    for node in [CP, WORKER] {
        let imgs = images(&d, node);
        for b in &bundled {
            assert!(
                imgs.iter().any(|(n, pinned, _)| n == b && *pinned),
                "{node}: {b} not bundled and pinned: {imgs:?}"
            );
        }
        let ps = exec(&d, node, &["crictl", "ps", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
        for c in v["containers"].as_array().unwrap() {
            let id = c["imageRef"].as_str().unwrap();
            let name = c["metadata"]["name"].as_str().unwrap();
            let (img, _, _) = imgs
                .iter()
                .find(|(_, _, i)| i == id)
                .unwrap_or_else(|| panic!("{node}: {name} runs {id}, not in {imgs:?}"));
            assert!(
                bundled.contains(img),
                "{node}: {name} runs {img}, not a bundled image"
            );
        }
    }

    // The worker labelled as `kind build node-image` labels: only the
    // release's archives pinned (kind's imageimporter.go). CRI reports an
    // image pinned if any of its records is, so every record of each
    // (kiln writes its tag and its digest) loses the label.
    let records = exec(&d, WORKER, &["ctr", "-n", "k8s.io", "images", "ls", "-q"]);
    let records = stdout(&records);
    for name in kind_unpinned() {
        let repo = name.rsplit_once(':').unwrap().0;
        for record in records
            .lines()
            .filter(|r| r.starts_with(&format!("{repo}:")) || r.starts_with(&format!("{repo}@")))
        {
            let o = exec(
                &d,
                WORKER,
                &[
                    "ctr",
                    "-n",
                    "k8s.io",
                    "images",
                    "label",
                    record,
                    "io.cri-containerd.pinned=",
                ],
            );
            assert!(o.status.success(), "{}", stderr(&o));
        }
    }
    let relabelled = images(&d, WORKER);
    for name in kind_unpinned() {
        let pinned = relabelled
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, p, _)| *p);
        eprintln!("{WORKER}: {name} relabelled as kind labels: CRI says pinned = {pinned:?}");
    }

    // A user's image, loaded by kiln into both nodes from an archive (no
    // registry exists now); it runs once on each, then its pods go.
    let user = kiln_testkit::base::runnable("team/app", "1.0", "/app", &["exit"]);
    let archive = dir.path().join("app.tar");
    std::fs::write(
        &archive,
        kiln_testkit::archive::docker_save_legacy(&[(&user.platforms[0], &[USER_IMAGE])]),
    )
    .unwrap();
    let cli = docker_cli();
    let host = format!("unix://{}", d.socket.display());
    let mut load = kiln_cmd(
        &[
            "load",
            "--kind-cluster",
            NAME,
            "--archive",
            archive.to_str().unwrap(),
        ],
        &[
            ("PATH+", cli.parent().unwrap().to_str().unwrap()),
            ("DOCKER_HOST", &host),
        ],
    );
    let o = kiln_testkit::tools::run_bounded(&mut load, 300);
    assert_ok(&o);
    eprintln!("kiln load --kind-cluster {NAME}: {}", stderr(&o).trim());
    for node in [CP, WORKER] {
        let pod = format!("app-{}", if node == CP { "cp" } else { "worker" });
        // The stand-in exits 1 with `exit`: the pod fails, having run.
        apply(&d, &once_pod(&pod, node, USER_IMAGE, &["/app", "exit"]));
        wait_phase(&d, &pod, "Failed");
        let code = kubectl(
            &d,
            &[
                "get",
                "pod",
                &pod,
                "-o",
                "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}",
            ],
        );
        assert_eq!(code, "1", "{pod}: the user's program did not run");
        kubectl(&d, &["delete", "pod", &pod, "--wait=true"]);
    }
    let before: Vec<(String, Vec<CriImage>)> = [CP, WORKER]
        .iter()
        .map(|n| (n.to_string(), images(&d, n)))
        .collect();
    for (node, imgs) in &before {
        eprintln!(
            "{node}: before GC (crictl: tag, pinned): {:?}",
            imgs.iter().map(|(n, p, _)| (n, p)).collect::<Vec<_>>()
        );
    }
    let id_of = |node: &str, name: &str| -> String {
        before
            .iter()
            .find(|(n, _)| n == node)
            .unwrap()
            .1
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("{node}: no {name}"))
            .2
            .clone()
    };

    // The kubelet's own GC (pkg/kubelet/images/image_gc_manager.go): a
    // pass every 5 minutes from the kubelet's start, and an image is
    // removable only once a pass or the 5-minutely detection has seen it
    // (an image first seen by the pass itself is younger than
    // imageMinimumGCAge). So the user's image, loaded after the start,
    // goes at the second pass, about 10 minutes in; the images kind's
    // labels leave unpinned go at the first. Waited for in each node's
    // journal (both at once), each new line read as it comes.
    let etcd = "registry.k8s.io/etcd:3.6.6-0";
    let waits = [(CP, vec![USER_IMAGE]), (WORKER, vec![USER_IMAGE, etcd])];
    std::thread::scope(|scope| {
        let handles: Vec<_> = waits
            .iter()
            .map(|(node, gone)| {
                let ids: Vec<String> = gone.iter().map(|g| id_of(node, g)).collect();
                let d = &d;
                scope.spawn(move || {
                    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
                    let r = follow_kubelet(d, node, 780, |line| {
                        if line.contains("Removing image to free bytes") {
                            if let Some(id) = ids.iter().find(|id| line.contains(id.as_str())) {
                                seen.lock().unwrap().insert(id.clone());
                            }
                        }
                        seen.lock().unwrap().len() == ids.len()
                    });
                    (node, gone, r)
                })
            })
            .collect();
        for h in handles {
            let (node, gone, r) = h.join().unwrap();
            let lines = r.unwrap_or_else(|l| {
                panic!(
                    "{node}: the kubelet removed not all of {gone:?}: {}",
                    l[l.len().saturating_sub(30)..].join("\n")
                )
            });
            // Each line with the name crictl gave its image before GC.
            let named = |l: &String| -> String {
                let imgs = &before.iter().find(|(n, _)| n == node).unwrap().1;
                match imgs.iter().find(|(_, _, id)| l.contains(id.as_str())) {
                    Some((name, _, _)) => format!("{l}  <- {name}"),
                    None => l.clone(),
                }
            };
            let gc: Vec<String> = lines
                .iter()
                .filter(|l| l.contains("image_gc_manager"))
                .map(named)
                .collect();
            eprintln!("{node}: the kubelet's image GC:\n  {}", gc.join("\n  "));
        }
    });
    let after_cp = images(&d, CP);
    let after_worker = images(&d, WORKER);
    eprintln!(
        "{CP}: after GC (crictl): {:?}",
        after_cp.iter().map(|(n, p, _)| (n, p)).collect::<Vec<_>>()
    );
    eprintln!(
        "{WORKER}: after GC (crictl): {:?}",
        after_worker
            .iter()
            .map(|(n, p, _)| (n, p))
            .collect::<Vec<_>>()
    );
    // kiln's labels: every bundled image still there, pinned; the user's gone.
    for b in &bundled {
        assert!(
            after_cp.iter().any(|(n, p, _)| n == b && *p),
            "{CP}: {b} lost to GC: {after_cp:?}"
        );
    }
    assert!(
        !after_cp.iter().any(|(n, _, _)| n == USER_IMAGE),
        "{after_cp:?}"
    );
    // kind's labels: etcd gone with the user's image; the release's kept.
    assert!(
        !after_worker
            .iter()
            .any(|(n, _, _)| n == etcd || n == USER_IMAGE),
        "{after_worker:?}"
    );
    for r in cluster::release_images() {
        assert!(
            after_worker.iter().any(|(n, _, _)| *n == r),
            "{WORKER}: {r}: {after_worker:?}"
        );
    }

    // After GC, offline: a pod on a bundled image that nothing was using
    // (the storage helper) starts on kiln's node; on the kind-labelled
    // node the same image is gone and cannot be pulled.
    apply(
        &d,
        &once_pod(
            "after-gc-cp",
            CP,
            HELPER,
            &["sh", "-c", "echo started offline"],
        ),
    );
    wait_phase(&d, "after-gc-cp", "Succeeded");
    let logs = kubectl(&d, &["logs", "after-gc-cp"]);
    assert_eq!(logs.trim(), "started offline");
    apply(
        &d,
        &once_pod(
            "after-gc-worker",
            WORKER,
            HELPER,
            &["sh", "-c", "echo started offline"],
        ),
    );
    let reason = waiting_reason(&d, "after-gc-worker");
    let events = kubectl(
        &d,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=after-gc-worker",
            "-o",
            "custom-columns=REASON:.reason,MESSAGE:.message",
        ],
    );
    eprintln!("after GC: {CP}: {HELPER} started offline; {WORKER}: {reason}\n{events}");
    assert!(
        ["ErrImagePull", "ImagePullBackOff"].contains(&reason.as_str()),
        "{reason}"
    );

    let o = kiln_testkit::tools::run_bounded(
        kind(&d, &home).args(["delete", "cluster", "--name", NAME]),
        120,
    );
    assert_ok(&o);
    eprintln!("kind delete cluster: {}", stderr(&o).trim());
}
