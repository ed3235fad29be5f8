//! One lock for every input (`kiln lock --lock-file`, `kiln build --lock`):
//! a locked build builds exactly what was locked, byte for byte, even after
//! the tags moved; a build whose inputs differ from the lock (another base,
//! the manifest edited, another kiln) is refused naming the input, its
//! locked value and what it is now, and locked content a registry no longer
//! serves fails naming it.

use crate::common::*;
use kiln_testkit::base::{image_of, kind_base, layer_of};
use kiln_testkit::image::host_platform;

const EPOCH: &str = "1700000000";

fn refs() -> Vec<&'static str> {
    vec![
        "registry.k8s.io/pause:3.10",
        "registry.k8s.io/etcd:3.5.16-0",
    ]
}

/// `kiln build --lock` of a node image from `base` into `out`.
fn build_locked(env: &Env, m: &str, base: &str, lock: &str, out: &str) -> std::process::Output {
    let output = format!("oci-archive:{}", env.path(out).display());
    kiln_env(
        &[
            "build",
            "--manifest",
            m,
            "--base",
            base,
            "--mirror",
            &env.mirror(),
            "--output",
            &output,
            "--lock",
            lock,
            "--json",
        ],
        &[("SOURCE_DATE_EPOCH", EPOCH)],
    )
}

/// Another image under `repo:tag`: a moved tag.
fn moved(repo: &str, tag: &str) -> kiln_testkit::image::BuiltImage {
    let layer = layer_of(&[(
        "moved",
        tar::EntryType::Regular,
        format!("{repo}:{tag} moved").as_bytes(),
        "",
        0o644,
    )]);
    image_of(repo, tag, &[&host_platform()], vec![layer])
}

#[test]
fn a_locked_build_builds_what_was_locked_and_refuses_any_drift() {
    let env = Env::new();
    let base = kind_base(&[&host_platform()]);
    env.registry.push(&base).unwrap();
    let base_ref = format!("{}/kindest/base:test", env.registry.addr);
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", &refs());
    let (m, lock) = (m.to_str().unwrap(), env.path("kiln.lock"));
    let l = lock.to_str().unwrap();
    let o = kiln(&[
        "lock",
        "--manifest",
        m,
        "--mirror",
        &env.mirror(),
        "--base",
        &base_ref,
        "--lock-file",
        l,
    ]);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("kiln: locked 2 images, the base in"),
        "{}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(&lock).unwrap();
    let parsed: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(parsed["kind"], "NodeImageLock");
    assert_eq!(parsed["kilnVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(parsed["base"]["digest"], base.top.digest, "{text}");
    assert_eq!(
        parsed["images"][1]["digest"],
        env.image("etcd").top.digest,
        "{text}"
    );

    // Locked: builds, the same bytes as an unlocked build of the same inputs.
    let locked = build_locked(&env, m, &base_ref, l, "locked.tar");
    assert_ok(&locked);
    let plain = kiln_env(
        &[
            "build",
            "--manifest",
            m,
            "--base",
            &base_ref,
            "--mirror",
            &env.mirror(),
            "--output",
            &format!("oci-archive:{}", env.path("plain.tar").display()),
        ],
        &[("SOURCE_DATE_EPOCH", EPOCH)],
    );
    assert_ok(&plain);
    let sum = |f: &str| kiln::primitives::digest::Digest::of(&std::fs::read(env.path(f)).unwrap());
    assert_eq!(sum("locked.tar"), sum("plain.tar"));

    // Tags moved since (an image's and the base's): the lock holds, the
    // same bytes are built.
    let etcd = moved("etcd", "3.5.16-0");
    env.registry.push(&etcd).unwrap();
    let other_base = moved("kindest/base", "test");
    env.registry.push(&other_base).unwrap();
    assert_ok(&build_locked(&env, m, &base_ref, l, "moved.tar"));
    assert_eq!(sum("moved.tar"), sum("locked.tar"));

    // A registry that no longer holds the locked content: refused, naming
    // the image and its locked digest.
    let elsewhere = kiln_testkit::registry::Registry::start().unwrap();
    elsewhere.push(&etcd).unwrap();
    elsewhere.push(env.image("pause")).unwrap();
    let output = format!("oci-archive:{}", env.path("gone.tar").display());
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m,
            "--base",
            &base_ref,
            "--mirror",
            &format!("registry.k8s.io={}", elsewhere.url()),
            "--output",
            &output,
            "--lock",
            l,
        ],
        &[("SOURCE_DATE_EPOCH", EPOCH)],
    );
    assert_fails(&o, 1, &["etcd", &env.image("etcd").top.digest]);
    assert!(!env.path("gone.tar").exists());

    // Another base named than the locked one.
    let o = build_locked(
        &env,
        m,
        &format!("{}/kindest/other:test", env.registry.addr),
        l,
        "x.tar",
    );
    assert_fails(
        &o,
        2,
        &[
            "the build's inputs differ from the lock",
            "base: locked",
            "kindest/base:test",
        ],
    );

    // The manifest edited after locking.
    let edited = env.manifest(
        "node.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let o = build_locked(&env, edited.to_str().unwrap(), &base_ref, l, "x.tar");
    assert_fails(&o, 2, &["manifest", "locked sha256:", "now sha256:"]);
    env.manifest("node.yaml", "registry.k8s.io/pause:3.10", &refs());

    // Another kiln.
    std::fs::write(
        &lock,
        text.replace(
            &format!("kilnVersion: {}", env!("CARGO_PKG_VERSION")),
            "kilnVersion: 0.0.1",
        ),
    )
    .unwrap();
    let o = build_locked(&env, m, &base_ref, l, "x.tar");
    assert_fails(
        &o,
        2,
        &[&format!(
            "kiln: locked 0.0.1, this is {}",
            env!("CARGO_PKG_VERSION")
        )],
    );

    // Not a lock at all.
    std::fs::write(&lock, "apiVersion: kiln/v1\nkind: NodeImageManifest\n").unwrap();
    let o = build_locked(&env, m, &base_ref, l, "x.tar");
    assert_fails(&o, 2, &["kiln.lock"]);
}

#[test]
fn a_rootfs_build_takes_a_lock_of_its_images() {
    let env = Env::new();
    let m = env.manifest("m.yaml", "registry.k8s.io/pause:3.10", &refs());
    let lock = env.path("kiln.lock");
    assert_ok(&kiln(&[
        "lock",
        "--manifest",
        m.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
        "--lock-file",
        lock.to_str().unwrap(),
    ]));
    let o = env.build(&m, &env.path("r"), &["--lock", lock.to_str().unwrap()]);
    assert_ok(&o);
    assert_all_pinned_complete(&env.path("r"), Some(2));
    // verify --lock holds the node to it: passes, then names each
    // difference once the lock says otherwise.
    let (r, l) = (env.path("r"), lock.to_str().unwrap());
    let v = kiln(&["verify", "--rootfs", r.to_str().unwrap(), "--lock", l]);
    assert_ok(&v);
    assert!(
        stderr(&v).contains("ok    the node holds what the lock holds"),
        "{}",
        stderr(&v)
    );
    let text = std::fs::read_to_string(&lock).unwrap();
    let (etcd, pause) = (
        &env.image("etcd").top.digest,
        &env.image("pause").top.digest,
    );
    let other =
        text.replacen(etcd.as_str(), pause.as_str(), 1)
            .replacen("sha256: ", "sha256: 00", 1);
    std::fs::write(&lock, other).unwrap();
    let v = kiln(&["verify", "--rootfs", r.to_str().unwrap(), "--lock", l]);
    assert_fails(
        &v,
        1,
        &["1 of 6 checks failed: the node holds what the lock holds"],
    );
    let err = stderr(&v);
    for said in [
        format!("registry.k8s.io/etcd:3.5.16-0: the node has {etcd}, the lock holds {pause}"),
        "the node was built from a manifest with sha256:".to_string(),
    ] {
        assert!(err.contains(&said), "{said}:\n{err}");
    }
    // A lock's flags without a lock file are refused, not ignored.
    let o = kiln(&[
        "lock",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        "kindest/base:v1",
    ]);
    assert_fails(&o, 2, &["--base is locked only into a lock file"]);
}
