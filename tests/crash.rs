//! The crash matrix: kiln, or its private containerd, is SIGKILLed at each
//! named step of a build (`KILN_FAULT=POINT:VICTIM`, see src/primitives/fault.rs), never
//! after a guessed delay. Each case: the killed run does not report success,
//! and the next `kiln build` completes with every image whole (CRI
//! `pinned: true`, `ctr images check` complete), no ingest or daemon
//! directory of the dead kiln left behind. Each case runs three times: on
//! an empty store; on a store that already holds blobs the build will find
//! present and rely on; and on an empty store with a content cache (blobs
//! land in the cache, then are linked in), after which every cache entry
//! still hashes to its name.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use crate::common::*;
use kiln_testkit::cri::CriNode;

const VICTIMS: &[&str] = &["kiln", "containerd"];
const REPEATS: usize = 3;

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

/// Every image of `names` whole and pinned as kiln, CRI and `ctr` see it.
fn check_whole(rootfs: &Path, names: &[&str], case: &str) {
    assert_all_pinned_complete(rootfs, Some(names.len()));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut node = CriNode::start(rootfs, None).await.unwrap();
        for name in names {
            let img = node
                .image_status(name)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{case}: CRI lacks {name}"));
            assert!(img.pinned, "{case}: {name} not pinned");
        }
        let check = node.ctr(&["images", "check"]).unwrap();
        let text = String::from_utf8_lossy(&check.stdout).into_owned();
        let rows: Vec<&str> = text.lines().skip(1).collect();
        assert!(!rows.is_empty(), "{case}: ctr images check listed nothing");
        for row in rows {
            assert!(
                row.contains("complete") && !row.contains("incomplete"),
                "{case}: ctr images check: {row}\n{text}"
            );
        }
        // No blob file the store does not list: what a killed run renamed
        // in without a record was collected or recorded by the next one.
        let listed = String::from_utf8(node.ctr(&["content", "ls", "-q"]).unwrap().stdout).unwrap();
        let content = rootfs.join("var/lib/containerd/io.containerd.content.v1.content");
        for f in std::fs::read_dir(content.join("blobs/sha256"))
            .unwrap()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            assert!(listed.contains(&name), "{case}: orphan blob file {name}");
        }
        assert!(
            !content.join(".kiln-ingest").exists(),
            "{case}: kiln's temporary files left"
        );
        let active = String::from_utf8(node.ctr(&["content", "active"]).unwrap().stdout).unwrap();
        assert!(
            !active.contains("kiln-"),
            "{case}: ingests left behind:\n{active}"
        );
        node.stop().unwrap();
    });
}

fn build_args<'a>(
    manifest: &'a str,
    rootfs: &'a str,
    mirror: &'a str,
    cache: Option<&'a str>,
) -> Vec<&'a str> {
    let mut args = vec![
        "build",
        "--manifest",
        manifest,
        "--rootfs",
        rootfs,
        "--mirror",
        mirror,
    ];
    if let Some(c) = cache {
        args.extend(["--cache-dir", c]);
    }
    args
}

fn matrix(point: &str) {
    let env = Env::new();
    let all = env.manifest("all.yaml", "registry.k8s.io/pause:3.10", ALL);
    let some = env.manifest(
        "some.yaml",
        "registry.k8s.io/pause:3.10",
        &[
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/kube-proxy:v1.31.2",
        ],
    );
    let mirror = env.mirror();
    for victim in VICTIMS {
        for rep in 0..REPEATS {
            let case = format!("{point}:{victim} #{rep}");
            let rootfs = env.path(&format!("{point}-{victim}-{rep}"));
            let r = rootfs.to_str().unwrap();
            let cache_dir = env.path(&format!("cache-{point}-{victim}"));
            let cache = (rep == 2).then(|| cache_dir.to_str().unwrap());
            if rep == 1 {
                // Blobs (pause, base and bin layers) the build will find present.
                assert_ok(&kiln(&build_args(some.to_str().unwrap(), r, &mirror, None)));
            }
            let fault = format!("{point}:{victim}");
            let mut cmd = kiln_cmd(
                &build_args(all.to_str().unwrap(), r, &mirror, cache),
                &[("KILN_FAULT", &fault)],
            );
            let (pid, o) = kiln_testkit::tools::run_bounded_pid(&mut cmd, 180);
            let err = stderr(&o);
            assert!(
                !o.status.success(),
                "{case}: the killed run reported success:\n{err}"
            );
            assert!(!err.contains("panicked"), "{case}:\n{err}");
            if *victim == "kiln" {
                assert_eq!(
                    o.status.signal(),
                    Some(9),
                    "{case}: the fault did not fire:\n{err}"
                );
            } else {
                assert_eq!(o.status.code(), Some(1), "{case}:\n{err}");
                assert!(
                    err.lines()
                        .any(|l| l.starts_with("kiln: error:") || l.starts_with("kiln: failed:")),
                    "{case}: no clear failure line:\n{err}"
                );
                assert!(
                    err.contains("KILN_FAULT"),
                    "{case}: the fault did not fire:\n{err}"
                );
            }
            // Run at once: a killed kiln's daemon may still be stopping,
            // and the next kiln waits for it (it does not refuse the store).
            let o = kiln(&build_args(all.to_str().unwrap(), r, &mirror, cache));
            assert!(
                o.status.success(),
                "{case}: the next build failed:\n{}",
                stderr(&o)
            );
            let meta = rootfs.join("var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db");
            let meta = meta.canonicalize().unwrap();
            assert!(
                holders(&meta).is_empty(),
                "{case}: a daemon outlived the build that stopped: {:?}",
                holders(&meta)
            );
            check_whole(&rootfs, ALL, &case);
            if let Some(c) = cache {
                let ls = kiln(&["cache", "ls", "--check", "--cache-dir", c]);
                assert!(
                    ls.status.success(),
                    "{case}: the cache:\n{}{}",
                    stdout(&ls),
                    stderr(&ls)
                );
            }
            // The dead kiln's daemon directory was swept by the next run.
            for e in std::fs::read_dir("/tmp").unwrap().flatten() {
                if e.file_name().to_string_lossy().starts_with("kiln-ctd-") {
                    let owner =
                        std::fs::read_to_string(e.path().join("kiln.pid")).unwrap_or_default();
                    assert_ne!(
                        owner.trim(),
                        pid.to_string(),
                        "{case}: stale daemon directory {}",
                        e.path().display()
                    );
                }
            }
        }
    }
}

#[test]
fn crash_mid_blob() {
    matrix("mid-blob");
}

#[test]
fn crash_after_a_blob_rename_before_its_record() {
    matrix("blob-renamed");
}

#[test]
fn crash_after_a_blob_commit_before_its_parent_labels() {
    matrix("blob-committed");
}

#[test]
fn crash_after_labels_before_the_records() {
    matrix("before-records");
}

#[test]
fn crash_after_the_records_before_the_lease_is_dropped() {
    matrix("before-gc");
}

#[test]
fn crash_during_the_final_gc() {
    matrix("during-gc");
}

#[test]
fn crash_after_the_final_gc_before_the_completeness_walk() {
    matrix("after-gc");
}

#[test]
fn every_crash_point_is_tested() {
    let src = std::fs::read_to_string(file!()).unwrap();
    for p in kiln::primitives::fault::POINTS {
        assert!(src.contains(&format!("matrix(\"{p}\")")), "{p} untested");
    }
}
