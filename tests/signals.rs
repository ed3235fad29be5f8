//! SIGTERM and Ctrl-C reach kiln in synchronous work too (gunzip, unpack):
//! it unwinds, cleans its temp files, and exits 143 / 130 with one line.
//! The signal is sent by kiln's own fault hook at a named step
//! (`KILN_FAULT=POINT:sigterm|sigint`), not after a guessed delay.

use crate::common::*;
use kiln_testkit::image::host_platform;

fn empty(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The arguments of a node-image build from a kind base pushed to `env`'s
/// registry into `out`, and an empty TMPDIR for it to leave nothing in.
fn node_build(env: &Env, out: &std::path::Path) -> (Vec<String>, std::path::PathBuf) {
    let base = kiln_testkit::base::kind_base(&[&host_platform()]);
    env.registry.push(&base).unwrap();
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let tmp = env.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let args = vec![
        "build".to_string(),
        "--manifest".into(),
        m.display().to_string(),
        "--base".into(),
        format!("{}/kindest/base:test", env.registry.addr),
        "--output".into(),
        format!("oci-archive:{}", out.display()),
        "--mirror".into(),
        env.mirror(),
    ];
    (args, tmp)
}

#[test]
fn sigterm_while_gunzipping_an_archive_exits_143_and_leaves_no_temp() {
    let env = Env::new();
    let archive = env.path("pause.tar.gz");
    let layout =
        kiln_testkit::archive::oci_layout(env.image("pause"), "registry.k8s.io/pause:3.10", None);
    std::fs::write(&archive, kiln_testkit::image::gzip(&layout)).unwrap();
    let tmp = env.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let rootfs = env.path("rootfs");
    let o = kiln_env(
        &[
            "load",
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--archive",
            archive.to_str().unwrap(),
        ],
        &[
            ("KILN_FAULT", "gunzip:sigterm"),
            ("TMPDIR", tmp.to_str().unwrap()),
        ],
    );
    assert_fails(&o, 143, &["interrupted by SIGTERM"]);
    assert_eq!(empty(&tmp), Vec::<String>::new(), "temp files left behind");
}

#[test]
fn ctrl_c_while_unpacking_a_base_exits_130_and_leaves_no_staging() {
    let env = Env::new();
    let out = env.path("node.tar");
    let (args, tmp) = node_build(&env, &out);
    let o = kiln_env(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[
            ("KILN_FAULT", "unpack:sigint"),
            ("TMPDIR", tmp.to_str().unwrap()),
        ],
    );
    assert_fails(&o, 130, &["interrupted by Ctrl-C"]);
    assert_eq!(empty(&tmp), Vec::<String>::new(), "staging left behind");
    assert!(!out.exists());
}

/// Issue 39.6f: a reader of kiln's output that goes away (`kiln build
/// 2>&1 | head -1`) stops kiln as an interrupt does: it unwinds, leaving
/// no staging and no half-written archive, and exits 141. (It called
/// `exit(141)` from inside the write, skipping every cleanup.)
#[test]
fn a_vanished_reader_ends_kiln_with_141_after_cleaning_up() {
    let env = Env::new();
    let outdir = env.path("out");
    std::fs::create_dir(&outdir).unwrap();
    let out = outdir.join("node.tar");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let (args, tmp) = node_build(&env, &out);
    let mut cmd = kiln_cmd(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[("TMPDIR", tmp.to_str().unwrap())],
    );
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(writer)
        .spawn()
        .unwrap();
    let status = kiln_testkit::tools::wait_bounded(&mut child, 180);
    assert_eq!(status.code(), Some(141), "{status}");
    assert_eq!(empty(&tmp), Vec::<String>::new(), "staging left behind");
    assert_eq!(
        empty(&outdir),
        Vec::<String>::new(),
        "a half-written archive left behind"
    );
}
