//! kill -9 at any point: the next `kiln build` completes the store, nothing
//! half-recorded, no stale daemon, directory or ingest left behind.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use kiln_testkit::cri::CriNode;
use kiln_testkit::proxy::{fault_proxy, Fault};

fn spawn_build(env: &Env, mirror_url: &str, rootfs: &Path, stderr: Stdio) -> std::process::Child {
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let deps = kiln_testkit::tools::containerd()
        .parent()
        .unwrap()
        .to_path_buf();
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--mirror",
            &format!("registry.k8s.io={mirror_url}"),
        ])
        .env(
            "PATH",
            format!("{}:{}", deps.display(), std::env::var("PATH").unwrap()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Processes holding `file` open.
fn holders(file: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == file))
        {
            out.push(pid);
        }
    }
    out
}

fn children(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

fn wait_no_holders(meta: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !holders(meta).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a containerd still holds {} after kiln died: {:?}",
            meta.display(),
            holders(meta)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn kill9(pid: i32) {
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

fn check_whole(rootfs: &Path) {
    assert_all_pinned_complete(rootfs, Some(ALL.len()));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut node = CriNode::start(rootfs, None).await.unwrap();
        for name in ALL {
            assert!(
                node.image_status(name)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("CRI lacks {name}"))
                    .pinned,
                "{name}"
            );
        }
        let active = String::from_utf8(node.ctr(&["content", "active"]).unwrap().stdout).unwrap();
        assert!(!active.contains("kiln-"), "ingests left behind:\n{active}");
        node.stop().unwrap();
    });
}

#[test]
fn killing_kiln_at_any_point_leaves_a_store_the_next_build_completes() {
    let env = Env::new();
    // Each blob takes 250 ms: the build lasts long enough to be cut anywhere.
    let slow = fault_proxy(env.registry.url(), Fault::Delay { ms: 250 }, "");
    let rootfs = env.path("rootfs");
    let meta = rootfs.join("var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db");
    for ms in [60u64, 250, 500, 800, 1200] {
        let mut child = spawn_build(&env, &slow.server.url(), &rootfs, Stdio::null());
        std::thread::sleep(Duration::from_millis(ms));
        kill9(child.id() as i32);
        let _ = child.wait();
        if meta.exists() {
            wait_no_holders(&meta.canonicalize().unwrap());
        }
    }
    // Stale daemon directories of dead kilns are swept by the next run.
    let o = kiln(&[
        "build",
        "--manifest",
        env.path("node.yaml").to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]);
    assert_ok(&o);
    for e in std::fs::read_dir("/tmp").unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("kiln-ctd-") {
            if let Ok(pid) = std::fs::read_to_string(e.path().join("kiln.pid")) {
                let alive = Path::new(&format!("/proc/{}", pid.trim())).exists();
                assert!(
                    alive,
                    "stale daemon directory {} of dead kiln {pid}",
                    e.path().display()
                );
            }
        }
    }
    check_whole(&rootfs);
}

#[test]
fn killing_containerd_mid_build_fails_clearly_and_the_next_build_completes() {
    let env = Env::new();
    let slow = fault_proxy(env.registry.url(), Fault::Delay { ms: 250 }, "");
    let rootfs = env.path("rootfs");
    let child = spawn_build(&env, &slow.server.url(), &rootfs, Stdio::piped());
    let m = env.path("node.yaml");
    let deadline = Instant::now() + Duration::from_secs(20);
    let daemon = loop {
        // The daemon, not the `containerd --version` kiln runs first.
        let is_daemon = |p: &i32| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("--config"))
        };
        if let Some(c) = children(child.id()).into_iter().find(is_daemon) {
            break c;
        }
        assert!(Instant::now() < deadline, "kiln started no containerd");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(400));
    kill9(daemon);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "kiln succeeded without its containerd?\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("kiln: error:") || l.starts_with("kiln: failed:")),
        "{err}"
    );
    assert_ok(&kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]));
    check_whole(&rootfs);
}
