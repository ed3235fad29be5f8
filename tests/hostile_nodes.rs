//! A kind node cannot hold kiln (issue 55): a stand-in `docker` on PATH
//! plays a node that floods its output, never answers, stops taking an
//! import, prints terminal escapes, or lacks a tool kiln runs there; each
//! ends in one line naming the node, within the `--node-timeout`, kiln's
//! memory bounded. And `--from-*` values are references, never options.

use crate::common::*;

const NODE: &str = "kiln-test-control-plane";

/// What the stand-in answers: the probe, records, and imports, as a node
/// with containerd 1.7 would (`MODE` says how it misbehaves).
const STANDIN: &str = r#"#!/bin/sh
case "$1" in
  ps) echo kiln-test-control-plane; exit 0 ;;
  inspect) echo control-plane; exit 0 ;;
  save) printf '%s\n' "$@" > "$SAVE_ARGS"; echo "no such image" >&2; exit 1 ;;
esac
case "$MODE" in
  flood) exec yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx ;;
  hang) exec sleep 600 ;;
  escape) printf 'boom\033[2K\r\033[1Akiln: loaded everything\n' >&2; exit 1 ;;
  notool) echo "sh: 1: uname: not found" >&2; exit 127 ;;
esac
for a; do last=$a; done
case "$*" in
  *"sh -c"*) printf 'x86_64\ncontainerd github.com/containerd/containerd v1.7.24 deadbeef\nversion = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n' ;;
  *"images ls"*) echo "REF TYPE DIGEST SIZE PLATFORMS LABELS" ;;
  *"images check"*) echo "REF TYPE DIGEST STATUS SIZE UNPACKED" ;;
  *"images import"*) exec sleep 600 ;;
esac
"#;

/// `kiln load --kind-cluster` of an image from the registry, with the
/// stand-in as `docker` playing `mode`.
fn load_with(env: &Env, mode: &str, extra: &[&str]) -> (std::process::Output, f64) {
    let bin = env.path("standin-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let docker = bin.join("docker");
    std::fs::write(&docker, STANDIN).unwrap();
    std::fs::set_permissions(&docker, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let save_args = env.path("save-args");
    let mirror = env.mirror();
    let mut args = vec![
        "load",
        "--kind-cluster",
        "kiln-test",
        "--provider",
        "docker",
        "--node-timeout",
        "2",
        "--json",
    ];
    args.extend(extra);
    if !extra.iter().any(|a| a.starts_with("--from")) {
        args.extend(["--mirror", &mirror, "registry.k8s.io/extra/busybox:1.36"]);
    }
    let t = std::time::Instant::now();
    let o = kiln_testkit::tools::run_bounded(
        &mut kiln_cmd(
            &args,
            &[
                ("PATH+", bin.to_str().unwrap()),
                ("MODE", mode),
                ("SAVE_ARGS", save_args.to_str().unwrap()),
            ],
        ),
        120,
    );
    (o, t.elapsed().as_secs_f64())
}

/// The one line about the node, as the report (`--json`) gives it.
fn node_line(o: &std::process::Output) -> String {
    let r: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(o), stderr(o)));
    let line = r["nodes"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(line.starts_with(&format!("node {NODE}: ")), "{r:#}");
    assert!(!line.contains('\n'), "{line}");
    line
}

#[test]
fn a_node_that_floods_hangs_or_stalls_is_stopped_and_named() {
    let env = Env::new();
    // Flooding the probe: stopped at the cap, kiln's memory bounded.
    let (o, _) = load_with(&env, "flood", &[]);
    assert!(!o.status.success());
    let line = node_line(&o);
    assert!(
        line.contains("printed more than 4194304 bytes; stopped"),
        "{line}"
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rss = r["peakRssKib"].as_u64().unwrap();
    assert!(rss < 256 * 1024, "kiln grew to {rss} KiB");
    // Never answering: stopped at the deadline.
    let (o, took) = load_with(&env, "hang", &[]);
    assert!(!o.status.success());
    let line = node_line(&o);
    assert!(line.contains("gave no answer within 2s; stopped"), "{line}");
    assert!(took < 60.0, "{took}s");
    // Taking an import (it fits the pipe) and never ending it: stopped one
    // step after its last chunk.
    let (o, took) = load_with(&env, "stall", &[]);
    assert!(!o.status.success());
    let line = node_line(&o);
    assert!(
        line.contains("took its input, then gave no answer within 2s; stopped"),
        "{line}"
    );
    assert!(took < 60.0, "{took}s");
}

#[test]
fn what_a_node_prints_is_escaped_and_a_missing_tool_named() {
    let env = Env::new();
    let (o, _) = load_with(&env, "escape", &[]);
    assert!(!o.status.success());
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(!err.contains('\u{1b}') && !err.contains('\r'), "{err:?}");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    let line = node_line(&o);
    assert!(line.contains("\\u{1b}[2K"), "{line}");
    // A node without `uname`: said so, not "was the container removed?".
    let (o, _) = load_with(&env, "notool", &[]);
    let line = node_line(&o);
    assert!(
        line.contains("the node lacks a command kiln runs there")
            && line.contains("uname: not found")
            && line.contains("docs/kind.md"),
        "{line}"
    );
}

#[test]
fn from_values_are_references_never_options() {
    let env = Env::new();
    // `--` before the images: `save` reads none of them as an option.
    let (o, _) = load_with(&env, "", &["--from-docker", "app:1"]);
    assert!(!o.status.success());
    let args = std::fs::read_to_string(env.path("save-args")).unwrap();
    let args: Vec<&str> = args.lines().collect();
    let dashes = args
        .iter()
        .position(|a| *a == "--")
        .expect("no -- before the images");
    assert_eq!(args[dashes + 1..], ["app:1"], "{args:?}");
    // A value that is an option, or no reference, is refused before
    // anything runs.
    let _ = std::fs::remove_file(env.path("save-args"));
    for bad in ["--output=/elsewhere.tar", "app:1 --output=x"] {
        let (o, _) = load_with(&env, "", &[&format!("--from-docker={bad}")]);
        assert_fails(&o, 2, &["--from-docker"]);
        assert!(!env.path("save-args").exists(), "{bad}: save ran");
    }
}

/// Issue 60.4: SIGTERM ends kiln within 5 seconds (exit 143) whatever it
/// waits on: here a `docker save` that never ends (a stand-in that says
/// it is saving, through a FIFO the test reads, then sleeps). The signal
/// is sent once the stand-in is saving: an event, not a guessed delay.
#[test]
fn sigterm_ends_a_kiln_held_by_a_stalled_docker_save() {
    let env = Env::new();
    let bin = env.path("stall-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let docker = bin.join("docker");
    std::fs::write(
        &docker,
        "#!/bin/sh\ncase \"$1\" in\n  save) echo saving > \"$SYNC\"; exec sleep 600 ;;\nesac\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&docker, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sync = env.path("sync");
    nix::unistd::mkfifo(&sync, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let rootfs = env.path("rootfs");
    let mut child = kiln_cmd(
        &[
            "load",
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--from-docker",
            "example.com/app/api:1.0",
        ],
        &[
            ("PATH+", bin.to_str().unwrap()),
            ("SYNC", sync.to_str().unwrap()),
        ],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // The stand-in's write opens the FIFO: then `docker save` is running.
    let (tx, rx) = std::sync::mpsc::channel();
    let at = sync.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let f = std::fs::File::open(&at).unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(f), &mut line).unwrap();
        let _ = tx.send(line);
    });
    let said = rx.recv_timeout(std::time::Duration::from_secs(120));
    assert!(said.is_ok(), "the stand-in's docker save never started");
    let t = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = kiln_testkit::tools::wait_bounded(&mut child, 60);
    let took = t.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    eprintln!(
        "SIGTERM to exit: {:.2} s, {status}: {err}",
        took.as_secs_f64()
    );
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(
        took < std::time::Duration::from_secs(5),
        "took {took:?}: {err}"
    );
    assert!(err.contains("interrupted by SIGTERM"), "{err}");
}

/// Issue 60.4: an `oci:DIR` layout's blobs are opened once, when listed,
/// without following a link or blocking on a FIFO, checked regular, and
/// read only through that descriptor. A blob that is a FIFO or a link to
/// root's files is refused in one line, at once (the landed main opened
/// blobs later by path: a FIFO swapped in hung it past SIGTERM, a link
/// made root read the file it named).
#[test]
fn a_layout_blob_that_is_a_fifo_or_a_link_is_refused_in_one_line() {
    let env = Env::new();
    let img = env.image("pause");
    let layer = img.platforms[0].layers[0].blob.digest.clone();
    for (what, plant, said) in [
        ("fifo", "fifo", "not a regular file"),
        ("link", "link", "is a symbolic link"),
    ] {
        let dir = env.path(&format!("layout-{what}"));
        std::fs::create_dir_all(&dir).unwrap();
        let tar = kiln_testkit::archive::oci_layout(img, "example.com/pause:3.10", None);
        tar::Archive::new(&tar[..]).unpack(&dir).unwrap();
        let blob = dir
            .join("blobs/sha256")
            .join(layer.trim_start_matches("sha256:"));
        std::fs::remove_file(&blob).unwrap();
        match plant {
            "fifo" => {
                nix::unistd::mkfifo(&blob, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }
            _ => std::os::unix::fs::symlink("/etc/shadow", &blob).unwrap(),
        }
        let o = kiln_testkit::tools::run_bounded(
            &mut kiln_cmd(
                &[
                    "load",
                    "--rootfs",
                    env.path(&format!("rootfs-{what}")).to_str().unwrap(),
                    &format!("oci:{}", dir.display()),
                ],
                &[],
            ),
            60,
        );
        let err = stderr(&o);
        assert!(!o.status.success(), "{what}: {err}");
        assert!(err.contains(said), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: one line: {err}");
    }
}
