//! No false success, no silent loss (issue 20): flags that do not apply
//! are refused, output directories are checked first, one kiln per store,
//! a closed pipe ends kiln quietly, and exit codes mean what docs/output.md
//! says (2: bad input; 1: the world failed).

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

#[test]
fn node_image_flags_with_rootfs_are_refused_and_outputs_checked_first() {
    let env = Env::new();
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let r = env.path("rootfs");
    let out = format!("oci-archive:{}", env.path("x.tar").display());
    for (flag, value) in [
        ("--output", out.as_str()),
        ("--push", "127.0.0.1:1/x:1"),
        ("--tag", "kindest/node:v1"),
        ("--layer-compression", "zstd"),
        ("--keep-previous-layers", "0"),
        ("--kubernetes", "/nonexistent"),
        ("--kind-node", "kindest/node:v1.34.0"),
    ] {
        let o = env.build(&m, &r, &[flag, value]);
        assert_fails(&o, 2, &[flag, "is for node images", "--rootfs"]);
        assert!(!r.exists(), "{flag}: work was done");
    }
    // --keep-previous-layers with no image to follow would do nothing.
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        "127.0.0.1:1/never/pulled:1",
        "--output",
        &out,
        "--keep-previous-layers",
        "10",
    ]);
    assert_fails(&o, 2, &["--keep-previous-layers", "--previous", "--push"]);
    // An output whose directory is missing: refused before anything is pulled.
    let missing = env.path("no-such-dir/node.tar");
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        "127.0.0.1:1/never/pulled:1",
        "--output",
        &format!("oci-archive:{}", missing.display()),
    ]);
    assert_fails(&o, 2, &["--output", "does not exist", "create it first"]);
    let o = kiln(&[
        "bundle",
        "--manifest",
        m.to_str().unwrap(),
        "--output",
        missing.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]);
    assert_fails(&o, 2, &["--output", "does not exist"]);
}

/// Holds an exclusive flock on `dir` until dropped, as a kiln writing it does.
struct Held {
    _lock: std::fs::File,
}

fn hold(dir: &std::path::Path) -> Held {
    let f = std::fs::File::open(dir).unwrap();
    rustix::fs::flock(f.as_fd(), rustix::fs::FlockOperation::LockExclusive).unwrap();
    Held { _lock: f }
}

#[test]
fn one_kiln_per_store_a_second_waits_saying_who_or_fails_with_no_wait() {
    let env = Env::new();
    let (m, r) = env.pause_rootfs();
    let store = r.join("var/lib/containerd");
    let me = std::process::id();
    let held = hold(&store);
    let o = env.build(&m, &r, &["--no-wait"]);
    assert_fails(&o, 1, &[&format!("another kiln (pid {me}) is writing")]);
    // Without --no-wait: it says it waits, and goes on once the store is free.
    let mut cmd = kiln_cmd(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            r.to_str().unwrap(),
            "--mirror",
            &env.mirror(),
        ],
        &[],
    );
    let mut child = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let want = format!(
        "kiln: waiting for another kiln (pid {me}) holding {}",
        r.display()
    );
    let mut seen = false;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        if line == want {
            seen = true;
            break;
        }
    }
    assert!(seen, "no line {want:?}");
    drop(held);
    let status = kiln_testkit::tools::wait_bounded(&mut child, 120);
    let all = reader.join().unwrap();
    assert!(status.success(), "{all}");
    // A containerd running on the store (bbolt's lock on meta.db): named, at once.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = rt
        .block_on(kiln_testkit::cri::CriNode::start(&r, None))
        .unwrap();
    let o = env.build(&m, &r, &[]);
    assert_fails(
        &o,
        1,
        &["meta.db is held by another process (pid", "stop it first"],
    );
    cri.stop().unwrap();
    assert_ok(&env.build(&m, &r, &[]));
}

/// Stands in for a private daemon of a kiln (`kiln_pid`): a process whose
/// command line has `--config /tmp/kiln-ctd-*/config.toml`, as kiln starts
/// its containerd, holding bbolt's lock on `meta_db` until its stdin closes.
/// util-linux's `flock FILE CMD` takes the lock and keeps it while CMD runs.
fn fake_daemon(
    meta_db: &std::path::Path,
    kiln_pid: u32,
) -> (std::process::Child, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("kiln-ctd-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(dir.path().join("kiln.pid"), kiln_pid.to_string()).unwrap();
    let mut child = std::process::Command::new("flock")
        .arg(meta_db)
        .args(["sh", "-c", "echo held; read x || :", "--config"])
        .arg(dir.path().join("config.toml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "held\n");
    (child, dir)
}

#[test]
fn a_killed_kilns_daemon_still_stopping_is_waited_for_a_live_one_refused() {
    let env = Env::new();
    let (_, r) = env.pause_rootfs();
    let db = r.join("var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db");
    // The kiln that started it is alive: not ours to wait for, refused at once.
    let (mut live, _d) = fake_daemon(&db, std::process::id());
    let o = kiln(&["inspect", "--rootfs", r.to_str().unwrap()]);
    assert_fails(
        &o,
        1,
        &[&format!(
            "meta.db is held by another process (pid {})",
            live.id()
        )],
    );
    drop(live.stdin.take());
    assert!(kiln_testkit::tools::wait_bounded(&mut live, 30).success());
    // Its kiln is dead (killed): kiln says it waits, and goes on once it stopped.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let (mut orphan, _d) = fake_daemon(&db, dead);
    let mut child = kiln_cmd(&["inspect", "--rootfs", r.to_str().unwrap()], &[])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let want = format!(
        "kiln: waiting for the daemon (pid {}) of a killed kiln to stop using {}",
        orphan.id(),
        r.display()
    );
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert_eq!(first, want);
    drop(orphan.stdin.take());
    assert!(kiln_testkit::tools::wait_bounded(&mut orphan, 30).success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = kiln_testkit::tools::wait_bounded(&mut child, 120);
    assert!(status.success(), "{rest:?}");
}

/// Runs kiln with stdout and stderr pipes nobody reads (their read ends closed).
fn with_closed_pipes(args: &[&str]) -> std::process::ExitStatus {
    let (r1, w1) = std::io::pipe().unwrap();
    let (r2, w2) = std::io::pipe().unwrap();
    drop(r1);
    drop(r2);
    let mut cmd = kiln_cmd(args, &[]);
    let mut child = cmd
        .stdout(Stdio::from(w1))
        .stderr(Stdio::from(w2))
        .spawn()
        .unwrap();
    kiln_testkit::tools::wait_bounded(&mut child, 180)
}

#[test]
fn a_closed_pipe_ends_kiln_quietly_never_a_panic() {
    let env = Env::new();
    let (m, r) = env.pause_rootfs();
    let (ms, rs, mirror) = (m.to_str().unwrap(), r.to_str().unwrap(), env.mirror());
    let bundle = env.path("b.tar");
    let cases: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec![
            "build",
            "--manifest",
            ms,
            "--rootfs",
            rs,
            "--mirror",
            &mirror,
        ],
        vec![
            "build",
            "--json",
            "--manifest",
            ms,
            "--rootfs",
            rs,
            "--mirror",
            &mirror,
        ],
        vec!["inspect", "--rootfs", rs],
        vec!["inspect", "--json", "--rootfs", rs],
        vec!["lock", "--manifest", ms, "--mirror", &mirror],
        vec![
            "bundle",
            "--manifest",
            ms,
            "--output",
            bundle.to_str().unwrap(),
            "--mirror",
            &mirror,
        ],
        vec![
            "load",
            "--rootfs",
            rs,
            "--mirror",
            &mirror,
            "registry.k8s.io/pause:3.10",
        ],
        vec!["verify", "--rootfs", rs],
        vec!["build", "--manifest", "/nonexistent.yaml", "--rootfs", rs],
    ];
    for args in cases {
        let st = with_closed_pipes(&args);
        assert_ne!(st.code(), Some(101), "kiln {args:?} panicked");
        assert!(
            matches!(st.code(), Some(0 | 1 | 2 | 141)),
            "kiln {args:?}: {st:?}"
        );
    }
}

#[test]
fn exit_codes_say_who_failed() {
    let env = Env::new();
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let r = env.path("rootfs");
    let junk = env.write("junk.tar", "not a tar at all");
    let bad_manifest = env.write("bad.yaml", "apiVersion: kiln/v1\nkind: Nope\n");
    let ms = m.to_str().unwrap();
    let rs = r.to_str().unwrap();
    let table: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec![
                "build",
                "--manifest",
                bad_manifest.to_str().unwrap(),
                "--rootfs",
                rs,
            ],
            2,
            "bad.yaml",
        ),
        (
            vec![
                "build",
                "--manifest",
                ms,
                "--rootfs",
                rs,
                "--from",
                junk.to_str().unwrap(),
            ],
            2,
            "junk.tar",
        ),
        (
            vec![
                "build",
                "--manifest",
                ms,
                "--base-archive",
                junk.to_str().unwrap(),
                "--output",
                "oci-archive:x.tar",
            ],
            2,
            "junk.tar",
        ),
        (
            vec!["load", "--rootfs", rs, "--archive", junk.to_str().unwrap()],
            2,
            "junk.tar",
        ),
        (
            vec!["build", "--manifest", ms, "--rootfs", rs, "--push", "x/y:1"],
            2,
            "--push",
        ),
        // The world: a registry that does not answer.
        (
            vec![
                "build",
                "--manifest",
                ms,
                "--rootfs",
                rs,
                "--mirror",
                "registry.k8s.io=http://127.0.0.1:9",
            ],
            1,
            "failed",
        ),
    ];
    for (args, code, needle) in table {
        let o = kiln(&args);
        assert_eq!(
            o.status.code(),
            Some(code),
            "kiln {args:?}:\n{}",
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
        assert!(
            stderr(&o).contains(needle),
            "kiln {args:?}: lacks {needle:?}:\n{}",
            stderr(&o)
        );
    }
}

/// `build --rootfs --verify` on a rootfs with no containerd of its own
/// verifies with the containerd the build used (issue 20, case 7).
#[test]
fn build_verify_without_a_node_containerd_uses_the_builds() {
    let env = Env::new();
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let r = env.path("rootfs");
    let o = env.build(&m, &r, &["--verify"]);
    let err = stderr(&o);
    assert!(!err.contains("the node has no containerd"), "{err}");
    assert!(err.contains("with containerd 1.7"), "{err}");
    assert!(
        err.contains("  ok    every bundled image is present, complete and pinned"),
        "{err}"
    );
}

/// Issue 24, items 1 and 5: a file path where a reference goes is refused
/// with what to write; an OCI archive whose one image has no full name
/// (skopeo's `oci-archive:F:TAG`, or untagged) is taken as that image.
#[test]
fn file_paths_and_skopeo_style_archives_are_understood() {
    let env = Env::new();
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let tar = env.write("node.oci.tar", "x");
    let o = kiln(&["verify", "--image", tar.to_str().unwrap()]);
    assert_fails(&o, 2, &["that is a file", "--image oci-archive:PATH"]);
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        "out/base.tar",
        "--output",
        &format!("oci-archive:{}", env.path("o.tar").display()),
    ]);
    assert_fails(&o, 2, &["--base out/base.tar", "--base-archive PATH"]);
    // An OCI archive of one image, then its index.json without names.
    let base = kiln_testkit::base::kind_base(&[&kiln_testkit::image::host_platform()]);
    env.registry.push(&base).unwrap();
    let named = env.path("named.tar");
    assert_ok(&kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        &format!("{}/kindest/base:test", env.registry.addr),
        "--output",
        &format!("oci-archive:{}", named.display()),
        "--mirror",
        &env.mirror(),
    ]));
    let files = kiln_testkit::base::read_tar(&named);
    for (stem, ref_name) in [("skopeo-tagged", Some("demo")), ("skopeo-untagged", None)] {
        let mut index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let entry = &mut index["manifests"][0];
        entry["annotations"] = match ref_name {
            Some(t) => serde_json::json!({"org.opencontainers.image.ref.name": t}),
            None => serde_json::json!({}),
        };
        let mut b = tar::Builder::new(Vec::new());
        for (name, bytes) in &files {
            let bytes = if name == "index.json" {
                serde_json::to_vec(&index).unwrap()
            } else {
                bytes.clone()
            };
            let mut h = tar::Header::new_ustar();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, bytes.as_slice()).unwrap();
        }
        let archive = env.path(&format!("{stem}.tar"));
        std::fs::write(&archive, b.into_inner().unwrap()).unwrap();
        let out = env.path(&format!("{stem}-out.tar"));
        let o = kiln(&[
            "build",
            "--json",
            "--manifest",
            m.to_str().unwrap(),
            "--base-archive",
            archive.to_str().unwrap(),
            "--output",
            &format!("oci-archive:{}", out.display()),
            "--mirror",
            &env.mirror(),
        ]);
        assert_ok(&o);
        let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            rep["base"],
            format!("kiln.local/{stem}:{}", ref_name.unwrap_or("latest")),
            "{rep:#}"
        );
    }
    // The same archives written by a real skopeo (Debian 12's, make deps).
    let src = format!("docker://{}/kindest/base:test", env.registry.addr);
    for (stem, tag) in [
        ("skopeo-real-tagged", ":demo"),
        ("skopeo-real-untagged", ""),
    ] {
        let archive = env.path(&format!("{stem}.tar"));
        let o = kiln_testkit::tools::run_bounded(
            kiln_testkit::tools::skopeo().args([
                "--insecure-policy",
                "copy",
                "--src-tls-verify=false",
                &src,
                &format!("oci-archive:{}{tag}", archive.display()),
            ]),
            120,
        );
        assert!(
            o.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = env.path(&format!("{stem}-out.tar"));
        let o = kiln(&[
            "build",
            "--json",
            "--manifest",
            m.to_str().unwrap(),
            "--base-archive",
            archive.to_str().unwrap(),
            "--output",
            &format!("oci-archive:{}", out.display()),
            "--mirror",
            &env.mirror(),
        ]);
        assert_ok(&o);
        let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let want_tag = if tag.is_empty() { "latest" } else { "demo" };
        assert_eq!(
            rep["base"],
            format!("kiln.local/{stem}:{want_tag}"),
            "{rep:#}"
        );
    }
}
