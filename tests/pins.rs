//! Exactly the manifest pinned (issue 27): kiln marks its pins
//! (`io.kiln.pinned`), and after a build the images kiln pinned are the
//! manifest's: an image dropped from it, the old digest of a moved tag and
//! a base's kiln pins are unpinned (never deleted); pins made by others are
//! left and named; `--keep-pinned` keeps them; `verify` fails on a stale
//! kiln pin; a build killed while unpinning never unpins a manifest image.
//! Checked through CRI on containerd 1.7 and 2.x.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use crate::common::*;
use kiln_testkit::image::host_platform;

const ETCD: &str = "registry.k8s.io/etcd:3.5.16-0";
const PROXY: &str = "registry.k8s.io/kube-proxy:v1.31.2";

fn without(drop: &str) -> Vec<&'static str> {
    ALL.iter().copied().filter(|i| *i != drop).collect()
}

fn build_json(env: &Env, m: &Path, r: &Path, extra: &[&str]) -> serde_json::Value {
    let mut a = vec!["--json"];
    a.extend(extra);
    let o = env.build(m, r, &a);
    assert_ok(&o);
    eprintln!("{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn pinned(view: &serde_json::Value, name: &str) -> bool {
    report(view, name).unwrap_or_else(|| panic!("{name}: {view:#}"))["pinned"] == true
}

/// `kiln inspect` as people read it, for the record.
fn show(r: &Path, when: &str) {
    let o = kiln(&["inspect", "--rootfs", r.to_str().unwrap()]);
    assert_ok(&o);
    eprintln!(
        "kiln inspect --rootfs {} ({when}):\n{}",
        r.display(),
        stdout(&o)
    );
}

/// CRI's view of `name` on `containerd` over a copy of `r`'s store.
fn cri_pinned(r: &Path, containerd: &Path, names: &[&str]) -> Vec<(String, bool)> {
    let copy = tempfile::tempdir().unwrap();
    let st = std::process::Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(r.join("var"))
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(st.success());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cri = kiln_testkit::cri::CriNode::start(copy.path(), Some(containerd))
            .await
            .unwrap();
        let mut out = Vec::new();
        for n in names {
            let s = cri.image_status(n).await.unwrap();
            out.push((n.to_string(), s.is_some_and(|i| i.pinned)));
        }
        cri.stop().unwrap();
        out
    })
}

#[test]
fn an_image_dropped_from_the_manifest_or_left_by_a_moved_tag_is_unpinned() {
    let env = Env::new();
    let all = env.manifest("all.yaml", "registry.k8s.io/pause:3.10", ALL);
    let fewer = env.manifest("fewer.yaml", "registry.k8s.io/pause:3.10", &without(ETCD));
    let r = env.path("rootfs");
    build_json(&env, &all, &r, &[]);
    show(&r, "built from all.yaml");
    let view = inspect(&r);
    let etcd_digest = report(&view, ETCD).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();

    // (1) etcd dropped: its records are unpinned, its content stays whole.
    let rep = build_json(&env, &fewer, &r, &[]);
    show(&r, "rebuilt from fewer.yaml, without etcd");
    let unpinned: Vec<(String, String)> = rep["unpinned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["name"].as_str().unwrap().into(),
                u["reason"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(
        unpinned.contains(&(ETCD.into(), "no longer in the manifest".into())),
        "{rep:#}"
    );
    assert!(
        unpinned.contains(&(
            format!("registry.k8s.io/etcd@{etcd_digest}"),
            "no longer in the manifest".into()
        )),
        "{rep:#}"
    );
    let view = inspect(&r);
    let etcd = report(&view, ETCD).unwrap();
    assert_eq!(etcd["pinned"], false, "{view:#}");
    assert_eq!(etcd["complete"], true, "nothing is deleted: {view:#}");
    assert_eq!(etcd["managed"], true, "{view:#}");
    for i in without(ETCD) {
        assert!(pinned(&view, i), "{i}");
    }
    // What kubelet sees, on 1.7 and 2.x; and its GC's way to remove it works.
    for c in [
        kiln_testkit::tools::containerd(),
        kiln_testkit::tools::containerd2(),
    ] {
        let seen = cri_pinned(&r, &c, ALL);
        for (n, p) in &seen {
            assert_eq!(*p, n != ETCD, "{} on {}: {seen:?}", n, c.display());
        }
    }
    let copy = tempfile::tempdir().unwrap();
    assert!(std::process::Command::new("cp")
        .args(["-a"])
        .arg(r.join("var"))
        .arg(copy.path())
        .status()
        .unwrap()
        .success());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut cri = kiln_testkit::cri::CriNode::start(copy.path(), None)
            .await
            .unwrap();
        cri.remove_image(ETCD).await.unwrap();
        assert!(cri.image_status(ETCD).await.unwrap().is_none());
        for i in without(ETCD) {
            assert!(cri.image_status(i).await.unwrap().unwrap().pinned, "{i}");
        }
        cri.stop().unwrap();
    });
    // The same manifest again changes no pin.
    let rep = build_json(&env, &fewer, &r, &[]);
    assert_eq!(rep["unpinned"], serde_json::json!([]), "{rep:#}");

    // (2) kube-proxy's tag moves: the old digest's record is unpinned.
    let old = report(&inspect(&r), PROXY).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let layer = kiln_testkit::base::layer_of(&[(
        "etc/moved",
        tar::EntryType::Regular,
        b"a new build under the same tag\n",
        "",
        0o644,
    )]);
    let moved =
        kiln_testkit::base::image_of("kube-proxy", "v1.31.2", &[&host_platform()], vec![layer]);
    env.registry.push(&moved).unwrap();
    let rep = build_json(&env, &fewer, &r, &[]);
    let new = report(&inspect(&r), PROXY).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(old, new);
    assert_eq!(
        rep["unpinned"],
        serde_json::json!([{
            "name": format!("registry.k8s.io/kube-proxy@{old}"),
            "reason": format!("tag moved to {new}"),
        }]),
        "{rep:#}"
    );
    let seen = cri_pinned(
        &r,
        &kiln_testkit::tools::containerd(),
        &[PROXY, &format!("registry.k8s.io/kube-proxy@{old}")],
    );
    assert!(seen[0].1, "{seen:?}");
    assert!(!seen[1].1, "{seen:?}");
}

#[test]
fn keep_pinned_keeps_them_verify_names_a_stale_pin_and_a_killed_unpin_loses_no_pin() {
    let env = Env::new();
    let all = env.manifest("all.yaml", "registry.k8s.io/pause:3.10", ALL);
    let fewer = env.manifest("fewer.yaml", "registry.k8s.io/pause:3.10", &without(ETCD));
    let r = env.path("rootfs");
    build_json(&env, &all, &r, &[]);
    // (4) --keep-pinned: etcd stays pinned, and the report says so.
    let o = env.build(&fewer, &r, &["--keep-pinned"]);
    assert_ok(&o);
    assert!(
        stderr(&o).contains(&format!(
            "--keep-pinned: kept the pin on {ETCD} (no longer in the manifest)"
        )),
        "{}",
        stderr(&o)
    );
    assert!(pinned(&inspect(&r), ETCD));
    // (5) verify fails on that stale kiln pin, naming it.
    let v = kiln(&["verify", "--json", "--rootfs", r.to_str().unwrap()]);
    assert_fails(&v, 1, &["nothing but the manifest is pinned by kiln"]);
    let vr: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    assert!(
        vr["checks"]
            .to_string()
            .contains(&format!("{ETCD}: pinned by kiln but not in the manifest")),
        "{vr:#}"
    );
    // (6) killed between two unpins: every manifest image still pinned;
    // the next build finishes the job.
    let mut cmd = kiln_cmd(
        &[
            "build",
            "--manifest",
            fewer.to_str().unwrap(),
            "--rootfs",
            r.to_str().unwrap(),
            "--mirror",
            &env.mirror(),
        ],
        &[("KILN_FAULT", "mid-unpin:kiln")],
    );
    let o = kiln_testkit::tools::run_bounded(&mut cmd, 180);
    assert_eq!(o.status.signal(), Some(9), "{}", stderr(&o));
    let view = inspect(&r);
    for i in without(ETCD) {
        assert!(pinned(&view, i), "{i} lost its pin: {view:#}");
    }
    let rep = build_json(&env, &fewer, &r, &[]);
    assert!(!rep["unpinned"].as_array().unwrap().is_empty(), "{rep:#}");
    assert!(!pinned(&inspect(&r), ETCD));
    assert_ok(&kiln(&["verify", "--rootfs", r.to_str().unwrap()]));
}

#[test]
fn a_node_image_unpins_its_bases_kiln_pins_and_names_pins_by_others() {
    let env = Env::new();
    // A base an earlier kiln build made: its manifest named etcd too, and
    // someone pinned a loaded image by hand.
    let all = env.manifest("all.yaml", "registry.k8s.io/pause:3.10", ALL);
    let old = env.path("old-node");
    build_json(&env, &all, &old, &[]);
    assert_ok(&kiln(&[
        "load",
        "--rootfs",
        old.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
        "registry.k8s.io/extra/busybox:1.36",
    ]));
    let busybox = "registry.k8s.io/extra/busybox:1.36";
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let cri = kiln_testkit::cri::CriNode::start(&old, None).await.unwrap();
        let o = cri
            .ctr(&[
                "images",
                "label",
                busybox,
                "io.cri-containerd.pinned=pinned",
            ])
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        cri.stop().unwrap();
    });
    let c = kiln_testkit::tools::containerd();
    let mut layers = kiln_testkit::base::kind_base_with(&c, &[&host_platform()]).platforms[0]
        .layers
        .clone();
    layers.push(kiln_testkit::base::store_layer(&old));
    let base = kiln_testkit::base::image_of("kiln-built/node", "1", &[&host_platform()], layers);
    env.registry.push(&base).unwrap();
    let fewer = env.manifest("fewer.yaml", "registry.k8s.io/pause:3.10", &without(ETCD));
    let out = env.path("node.tar");
    let o = kiln(&[
        "build",
        "--json",
        "--manifest",
        fewer.to_str().unwrap(),
        "--base",
        &format!("{}/kiln-built/node:1", env.registry.addr),
        "--output",
        &format!("oci-archive:{}", out.display()),
        "--mirror",
        &env.mirror(),
    ]);
    assert_ok(&o);
    eprintln!("{}", stderr(&o));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pins = &rep["pins"][0];
    assert!(
        pins["unpinned"]
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u["name"] == ETCD && u["reason"] == "pinned by the base"),
        "{rep:#}"
    );
    assert_eq!(
        pins["pinnedByOthers"],
        serde_json::json!([busybox]),
        "{rep:#}"
    );
    // The node as CRI sees it: etcd reclaimable, busybox still pinned.
    let v = kiln(&[
        "verify",
        "--json",
        "--image",
        &format!("oci-archive:{}", out.display()),
    ]);
    assert_ok(&v);
    let vr: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(vr["pinnedByOthers"], serde_json::json!([busybox]), "{vr:#}");
    let cri_pin = |name: &str| {
        vr["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["repoTags"].as_array().unwrap().iter().any(|t| t == name))
            .unwrap_or_else(|| panic!("{name}: {vr:#}"))["pinned"]
            .clone()
    };
    assert_eq!(cri_pin(ETCD), false);
    assert_eq!(cri_pin(busybox), true);
}

/// crictl itself (cri-tools v1.37.0, built from its Go module) beside the
/// tests' own CRI client (issue 61): on kiln's node, `crictl images -o
/// json` says `pinned` for exactly the bundled set, and not for an image
/// loaded later with `kiln load`; on containerd 1.7 and 2.x.
#[test]
fn crictl_says_pinned_for_exactly_the_bundled_set() {
    let env = Env::new();
    let all = env.manifest("all.yaml", "registry.k8s.io/pause:3.10", ALL);
    let r = env.path("rootfs");
    build_json(&env, &all, &r, &[]);
    const LOADED: &str = "registry.k8s.io/extra/busybox:1.36";
    let o = kiln(&[
        "load",
        "--rootfs",
        r.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
        LOADED,
    ]);
    assert_ok(&o);
    for c in [
        kiln_testkit::tools::containerd(),
        kiln_testkit::tools::containerd2(),
    ] {
        let copy = tempfile::tempdir().unwrap();
        assert!(std::process::Command::new("cp")
            .args(["-a", "--reflink=auto"])
            .arg(r.join("var"))
            .arg(copy.path())
            .status()
            .unwrap()
            .success());
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut cri = kiln_testkit::cri::CriNode::start(copy.path(), Some(&c))
                .await
                .unwrap();
            // crictl's view: every tag it lists, pinned or not.
            let crictl: std::collections::BTreeMap<String, bool> =
                kiln_testkit::cri::crictl_images(cri.socket())
                    .into_iter()
                    .map(|(t, (pinned, _))| (t, pinned))
                    .collect();
            // The tests' own CRI client's view.
            let mut ours = std::collections::BTreeMap::new();
            for i in cri.list_images().await.unwrap() {
                for t in &i.repo_tags {
                    ours.insert(t.clone(), i.pinned);
                }
            }
            eprintln!("{}: crictl images -o json: {crictl:?}", c.display());
            assert_eq!(crictl, ours, "{}", c.display());
            let pinned: Vec<&String> = crictl.iter().filter(|(_, p)| **p).map(|(t, _)| t).collect();
            let mut want: Vec<&str> = ALL.to_vec();
            want.sort();
            assert_eq!(pinned, want, "{}", c.display());
            assert_eq!(
                crictl.get(LOADED),
                Some(&false),
                "{}: {crictl:?}",
                c.display()
            );
            cri.stop().unwrap();
        });
    }
}
