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
