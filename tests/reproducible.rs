//! Reproducible node images, built without root: the same base, digest-pinned
//! manifest and SOURCE_DATE_EPOCH give the same node image digest from
//! different temporary directories, `--jobs 1` and `--jobs 8`, root under
//! umask 022 and a
//! non-root user the test creates under umask 077; containerd 1.7 and 2.x open the canonical
//! metadata database and report every image pinned and complete.

use std::path::Path;
use std::process::Output;

use crate::common::*;
use kiln::primitives::digest::Digest;
use kiln::sink::containerd::ContainerdStore;
use kiln_testkit::base::{kind_base_with, layer_digests, read_tar, unpack_layers};
use kiln_testkit::image::{host_platform, BuiltImage};

const EPOCH: i64 = 1_700_000_000;

fn build_args<'a>(
    manifest: &'a str,
    base: &'a str,
    mirror: &'a str,
    out: &'a str,
    jobs: &'a str,
) -> Vec<&'a str> {
    vec![
        "build",
        "--json",
        "--manifest",
        manifest,
        "--base",
        base,
        "--mirror",
        mirror,
        "--output",
        out,
        "--jobs",
        jobs,
        "--tag",
        "kindest/node:v1.31.2",
    ]
}

fn digest_of(o: &Output) -> String {
    assert_ok(o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["digest"].as_str().unwrap().to_string()
}

/// Each content blob's and image record's creation time, as the node's own
/// containerd reports them (seconds), and every image pinned.
fn times_from_containerd(archive: &Path, containerd: &Path) -> Vec<i64> {
    let files = read_tar(archive);
    let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let m: serde_json::Value = serde_json::from_slice(kiln_testkit::base::blob(
        &files,
        index["manifests"][0]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let rootfs = tempfile::tempdir().unwrap();
    unpack_layers(&files, &layer_digests(&m), rootfs.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cri = kiln_testkit::cri::CriNode::start(rootfs.path(), Some(containerd))
            .await
            .unwrap();
        let images = cri.list_images().await.unwrap();
        for name in ALL {
            let i = images
                .iter()
                .find(|i| i.repo_tags.iter().any(|t| t == name))
                .unwrap_or_else(|| panic!("CRI lacks {name}"));
            assert!(i.pinned, "{name} not pinned");
        }
        let store = ContainerdStore::new(cri.channel().await.unwrap(), "k8s.io");
        let mut times = Vec::new();
        for rec in store.list_images().await.unwrap() {
            times.push(rec.created_at.as_ref().unwrap().seconds);
            let target = rec.target.as_ref().unwrap();
            let info = store
                .info(&Digest::parse(&target.digest).unwrap())
                .await
                .unwrap()
                .expect("the target blob is in the store");
            times.push(info.created_at.as_ref().unwrap().seconds);
            times.push(info.updated_at.as_ref().unwrap().seconds);
        }
        cri.stop().unwrap();
        times
    })
}

#[test]
fn same_inputs_give_the_same_node_image_from_any_builder_and_both_containerds_open_it() {
    let env = Env::new();
    let user = LocalUser::create("kiln-repro");
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    assert_ok(&kiln(&[
        "lock",
        "--write",
        "--manifest",
        m.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]));
    assert!(
        std::fs::read_to_string(&m)
            .unwrap()
            .matches("@sha256:")
            .count()
            == ALL.len()
    );
    // The manifest and its directory are readable by the builder.
    std::fs::set_permissions(
        env.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mirror = env.mirror();
    let epoch = EPOCH.to_string();
    for (name, containerd) in [
        ("one", kiln_testkit::tools::containerd()),
        ("two", kiln_testkit::tools::containerd2()),
    ] {
        let base = kind_base_with(&containerd, &[&host_platform()]);
        let repo = format!("kindest/base-{name}");
        env.registry
            .push(&BuiltImage {
                repo: repo.clone(),
                ..base
            })
            .unwrap();
        let base = format!("{}/{repo}:test", env.registry.addr);

        // Root, --jobs 1, its own temporary directory.
        let a_dir = env.path(&format!("{name}-root"));
        std::fs::create_dir_all(&a_dir).unwrap();
        let a_out = format!("oci-archive:{}/node.tar", a_dir.display());
        let a = kiln_env(
            &build_args(m.to_str().unwrap(), &base, &mirror, &a_out, "1"),
            &[
                ("SOURCE_DATE_EPOCH", &epoch),
                ("TMPDIR", a_dir.to_str().unwrap()),
            ],
        );
        // A non-root user under umask 077 (issue 44.2: the store's
        // directories took their modes from it), --jobs 8, another
        // temporary directory.
        let b_dir = user.dir(&env.path(&format!("{name}-user")));
        let b_out = format!("oci-archive:{}/node.tar", b_dir.display());
        let b_cmd = kiln_cmd(
            &build_args(m.to_str().unwrap(), &base, &mirror, &b_out, "8"),
            &[
                ("SOURCE_DATE_EPOCH", &epoch),
                ("TMPDIR", b_dir.to_str().unwrap()),
                ("HOME", b_dir.to_str().unwrap()),
            ],
        );
        let b =
            kiln_testkit::tools::run_bounded(&mut user.command(&with_umask(&b_cmd, "077")), 180);
        let (da, db) = (digest_of(&a), digest_of(&b));
        eprintln!("{name}: root --jobs 1: {da}; {} --jobs 8: {db}", user.name);
        assert_eq!(da, db, "containerd {name}: root and non-root builds differ");
        let a_tar = a_dir.join("node.tar");
        let b_tar = b_dir.join("node.tar");
        assert!(
            std::fs::read(&a_tar).unwrap() == std::fs::read(&b_tar).unwrap(),
            "the archives differ"
        );

        // kiln's layer is root's, whoever built it.
        let files = read_tar(&b_tar);
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let man: serde_json::Value = serde_json::from_slice(kiln_testkit::base::blob(
            &files,
            index["manifests"][0]["digest"].as_str().unwrap(),
        ))
        .unwrap();
        let last = layer_digests(&man).pop().unwrap();
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(kiln_testkit::base::blob(
            &files, &last,
        )));
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(
                (h.uid().unwrap(), h.gid().unwrap()),
                (0, 0),
                "{:?}",
                e.path().unwrap()
            );
        }

        // The node's own containerd opens the canonical file: all pinned, every time the epoch.
        let times = times_from_containerd(&b_tar, &containerd);
        assert!(!times.is_empty());
        assert!(times.iter().all(|t| *t == EPOCH), "{name}: {times:?}");
        let v = kiln(&[
            "verify",
            "--image",
            &format!("oci-archive:{}", b_tar.display()),
        ]);
        assert_ok(&v);
    }

    // Without SOURCE_DATE_EPOCH, containerd's own clock stays in the records.
    let base = format!("{}/kindest/base-one:test", env.registry.addr);
    let c_dir = env.path("now");
    std::fs::create_dir_all(&c_dir).unwrap();
    let c_out = format!("oci-archive:{}/node.tar", c_dir.display());
    assert_ok(&kiln(&build_args(
        m.to_str().unwrap(),
        &base,
        &mirror,
        &c_out,
        "8",
    )));
    let now = chrono::Utc::now().timestamp();
    let times = times_from_containerd(&c_dir.join("node.tar"), &kiln_testkit::tools::containerd());
    assert!(
        times.iter().all(|t| (now - 3600..=now).contains(t)),
        "{times:?}"
    );
}

#[test]
fn a_rootfs_build_and_a_load_work_without_root() {
    let env = Env::new();
    let user = LocalUser::create("kiln-repro");
    std::fs::set_permissions(
        env.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let home = user.dir(&env.path("home"));
    let rootfs = user.dir(&env.path("rootfs"));
    let envs = [
        ("HOME", home.to_str().unwrap()),
        ("TMPDIR", home.to_str().unwrap()),
    ];
    let mirror = env.mirror();
    let o = user.kiln(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--mirror",
            &mirror,
        ],
        &envs,
    );
    assert_ok(&o);
    let o = user.kiln(
        &[
            "load",
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--mirror",
            &mirror,
            "registry.k8s.io/extra/busybox:1.36",
        ],
        &envs,
    );
    assert_ok(&o);
    let bundle = home.join("bundle.tar");
    let o = user.kiln(
        &[
            "bundle",
            "--manifest",
            m.to_str().unwrap(),
            "--output",
            bundle.to_str().unwrap(),
            "--mirror",
            &mirror,
        ],
        &envs,
    );
    assert_ok(&o);
    // What the user built is whole: bundled pinned, loaded not.
    let view = inspect(&rootfs);
    for name in ALL {
        let r = report(&view, name).unwrap_or_else(|| panic!("{name}: {view:#}"));
        assert!(r["complete"] == true && r["pinned"] == true, "{r:#}");
    }
    let busybox = report(&view, "registry.k8s.io/extra/busybox:1.36").unwrap();
    assert!(busybox["complete"] == true && busybox["pinned"] == false);
    // And the air-gapped build from the bundle, still as that user.
    let again = user.dir(&env.path("rootfs2"));
    let o = user.kiln(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            again.to_str().unwrap(),
            "--from",
            bundle.to_str().unwrap(),
        ],
        &envs,
    );
    assert_ok(&o);
    assert_all_pinned_complete(&again, Some(ALL.len()));
}
