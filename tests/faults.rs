//! Registries misbehaving: every build either succeeds with verified content
//! or fails with a clear error and records nothing for the image concerned.

use std::sync::atomic::Ordering;

use crate::common::*;
use kiln_testkit::proxy::{fault_proxy, Fault};

/// kube-apiserver's own (last) layer: 300 KB of random data, one image uses it.
fn apiserver_layer(env: &Env) -> String {
    env.image("kube-apiserver").platforms[0]
        .layers
        .last()
        .unwrap()
        .blob
        .digest
        .clone()
}

fn build_via(
    env: &Env,
    proxy: &kiln_testkit::proxy::FaultProxy,
    rootfs: &str,
) -> std::process::Output {
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        env.path(rootfs).to_str().unwrap(),
        "--mirror",
        &format!("registry.k8s.io={}", proxy.server.url()),
    ])
}

/// `kiln build` of the one image `REPO:TAG`, named at `proxy`'s address
/// (no mirror), into a rootfs called `name`, with `--stall-timeout stall`
/// and `envs`.
fn build_one_via(
    env: &Env,
    proxy: &kiln_testkit::proxy::FaultProxy,
    image: &str,
    name: &str,
    stall: &str,
    envs: &[(&str, &str)],
) -> std::process::Output {
    let addr = proxy.server.url().trim_start_matches("http://").to_string();
    let image = format!("{addr}/{image}");
    let m = env.write(
        &format!("{name}.yaml"),
        &format!("apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: {image}\nimages:\n  - {image}\n"),
    );
    let r = env.path(name);
    kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            r.to_str().unwrap(),
            "--stall-timeout",
            stall,
        ],
        envs,
    )
}

fn all_complete_and_pinned(env: &Env, rootfs: &str) {
    assert_all_pinned_complete(&env.path(rootfs), Some(ALL.len()));
}

#[test]
fn a_connection_cut_mid_blob_is_resumed_with_a_range_request() {
    let env = Env::new();
    let layer = apiserver_layer(&env);
    let proxy = fault_proxy(env.registry.url(), Fault::DropMidBlob { times: 2 }, &layer);
    let o = build_via(&env, &proxy, "r");
    assert_ok(&o);
    assert_eq!(proxy.injected.load(Ordering::SeqCst), 2);
    let ranges = proxy.ranges.lock().unwrap().clone();
    assert!(
        ranges
            .iter()
            .any(|r| r.starts_with("bytes=") && r != "bytes=0-"),
        "no resuming Range request: {ranges:?}"
    );
    all_complete_and_pinned(&env, "r");
}

#[test]
fn server_errors_and_rate_limits_are_retried() {
    let env = Env::new();
    let p500 = fault_proxy(env.registry.url(), Fault::ServerError { times: 3 }, "");
    assert_ok(&build_via(&env, &p500, "a"));
    assert_eq!(p500.injected.load(Ordering::SeqCst), 3);
    all_complete_and_pinned(&env, "a");

    let p429 = fault_proxy(
        env.registry.url(),
        Fault::TooManyRequests { times: 2, secs: 1 },
        "",
    );
    assert_ok(&build_via(&env, &p429, "b"));
    assert_eq!(p429.injected.load(Ordering::SeqCst), 2);
    // Measured at the proxy: from each 429 to the retry of the same blob.
    let gaps = p429.retry_gaps();
    assert_eq!(gaps.len(), 2, "{gaps:?}");
    for gap in gaps {
        let gap = gap.expect("every 429 was retried");
        assert!(
            gap >= std::time::Duration::from_secs(1),
            "Retry-After: 1 was not honoured: retried after {gap:?}"
        );
    }
    all_complete_and_pinned(&env, "b");
}

#[test]
fn a_trickling_registry_is_slow_but_correct() {
    let env = Env::new();
    let layer = apiserver_layer(&env);
    let proxy = fault_proxy(
        env.registry.url(),
        Fault::Trickle {
            chunk: 16 << 10,
            delay_ms: 10,
        },
        &layer,
    );
    assert_ok(&build_via(&env, &proxy, "r"));
    all_complete_and_pinned(&env, "r");
}

#[test]
fn a_corrupted_byte_fails_that_image_and_records_nothing_for_it() {
    let env = Env::new();
    let layer = apiserver_layer(&env);
    let proxy = fault_proxy(env.registry.url(), Fault::CorruptByte, &layer);
    let o = build_via(&env, &proxy, "r");
    assert_fails(
        &o,
        1,
        &[
            "1 of 5 images failed",
            "registry.k8s.io/kube-apiserver:v1.31.2",
        ],
    );
    let line = failed_line(&o);
    assert!(
        line.contains("registry.k8s.io/kube-apiserver:v1.31.2")
            && line.contains("digest mismatch")
            && line.contains(&format!("expected {layer}")),
        "{line}"
    );
    let view = inspect(&env.path("r"));
    assert!(report(&view, "registry.k8s.io/kube-apiserver:v1.31.2").is_none());
    assert_eq!(view.as_array().unwrap().len(), ALL.len() - 1);
}

#[test]
fn a_registry_that_keeps_failing_gives_up_with_a_clear_error() {
    let env = Env::new();
    let layer = apiserver_layer(&env);
    let proxy = fault_proxy(
        env.registry.url(),
        Fault::ServerError { times: 1000 },
        &layer,
    );
    let o = build_via(&env, &proxy, "r");
    assert_fails(&o, 1, &["1 of 5 images failed"]);
    let line = failed_line(&o);
    assert!(
        line.contains("registry.k8s.io/kube-apiserver:v1.31.2")
            && line.contains(&layer)
            && line.contains("500")
            && line.contains("after 5 attempts"),
        "{line}"
    );
    assert!(report(
        &inspect(&env.path("r")),
        "registry.k8s.io/kube-apiserver:v1.31.2"
    )
    .is_none());
}

/// Issue 24: a registry that sends its headers and then one byte a second
/// (a read timeout never fires) cannot hold kiln: with `--stall-timeout 1`
/// the manifest is asked for again, then the image fails naming the host
/// and the stall; a trickled blob is resumed, then fails the same way. The
/// registry is named directly (no mirror), so no other host is tried.
#[test]
fn a_stalling_registry_cannot_hold_kiln() {
    let env = Env::new();
    for (case, fault, image) in [
        (
            "manifest",
            Fault::TrickleAll {
                chunk: 1,
                delay_ms: 1000,
            },
            "pause:3.10",
        ),
        (
            "blob",
            Fault::Trickle {
                chunk: 1,
                delay_ms: 1000,
            },
            "kube-apiserver:v1.31.2",
        ),
    ] {
        let only = if case == "blob" {
            apiserver_layer(&env)
        } else {
            String::new()
        };
        let proxy = fault_proxy(env.registry.url(), fault, &only);
        let addr = proxy.server.url().trim_start_matches("http://").to_string();
        let o = build_one_via(&env, &proxy, image, &format!("stall-{case}"), "1", &[]);
        assert_fails(&o, 1, &["1 of 1 images failed", "none was stored"]);
        let line = failed_line(&o);
        assert!(
            line.contains(&addr) && line.contains("stalled: ") && line.contains("--stall-timeout"),
            "{case}: {line}"
        );
        eprintln!("{case}: {line}");
    }
}

/// Issue 39.3: an error reply's body is read for one stall window at most
/// (and 64 KiB): a registry that answers 500 and then trickles its body
/// cannot hold kiln (it read error bodies whole, on every retry).
#[test]
fn a_stalling_error_body_cannot_hold_kiln() {
    let env = Env::new();
    let layer = apiserver_layer(&env);
    let proxy = fault_proxy(env.registry.url(), Fault::StallingErrorBody, &layer);
    let o = build_one_via(
        &env,
        &proxy,
        "kube-apiserver:v1.31.2",
        "stall-error",
        "1",
        &[],
    );
    assert_fails(&o, 1, &["1 of 1 images failed"]);
    let line = failed_line(&o);
    assert!(line.contains("500"), "{line}");
    let injected = proxy.injected.load(std::sync::atomic::Ordering::SeqCst);
    assert!(injected >= 1);
    // Each reply was abandoned: kiln hung up long before its 100 bytes
    // (the proxy sees a hang-up at its next write; each reply ends within
    // 20 s either way).
    let ended = proxy.ended.lock().unwrap();
    for i in 0..injected {
        assert!(ended.recv().unwrap(), "error reply {i} was read to its end");
    }
    eprintln!("{injected} error replies, each abandoned: {line}");
}

/// Issue 38.2: a registry that answers and then brings one byte a second
/// is not silent in a CI log: within the progress interval kiln says what
/// it waits on (the URL, the bytes so far, the tries left), and says it
/// again each interval until the stall guard gives up. (It printed nothing
/// until the error.)
#[test]
fn a_stalled_request_says_what_it_waits_on() {
    let env = Env::new();
    let proxy = fault_proxy(
        env.registry.url(),
        Fault::TrickleAll {
            chunk: 1,
            delay_ms: 1000,
        },
        "",
    );
    let o = build_one_via(
        &env,
        &proxy,
        "pause:3.10",
        "waiting",
        "4",
        &[("KILN_PROGRESS_SECS", "1")],
    );
    assert_fails(&o, 1, &["1 of 1 images failed"]);
    let err = stderr(&o);
    let waits: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("kiln: waiting "))
        .collect();
    let url = format!("{}/v2/pause/manifests/3.10", proxy.server.url());
    assert!(
        waits.len() >= 2
            && waits
                .iter()
                .all(|l| l.contains(&url) && l.contains("so far") && l.contains("more")),
        "{err}"
    );
    eprintln!("{}", waits.join("\n"));
}

/// Issue 24: off a terminal (a CI log), a slow transfer is never silent: a
/// progress line every KILN_PROGRESS_SECS while bytes move. The trickle
/// (8 KiB every 100 ms) makes the apiserver layer take several seconds.
#[test]
fn a_slow_build_in_a_ci_log_says_how_far_it_is() {
    let env = Env::new();
    // The apiserver's big layer (300 kB of random bytes): about 4 s.
    let big = env.image("kube-apiserver").platforms[0]
        .layers
        .iter()
        .max_by_key(|l| l.blob.bytes.len())
        .unwrap();
    assert!(big.blob.bytes.len() > 200_000);
    let proxy = fault_proxy(
        env.registry.url(),
        Fault::Trickle {
            chunk: 8 << 10,
            delay_ms: 100,
        },
        &big.blob.digest,
    );
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            env.path("r").to_str().unwrap(),
            "--mirror",
            &format!("registry.k8s.io={}", proxy.server.url()),
        ],
        &[("KILN_PROGRESS_SECS", "1")],
    );
    assert_ok(&o);
    let err = stderr(&o);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("kiln: progress "))
        .collect();
    assert!(!lines.is_empty(), "no progress line:\n{err}");
    assert!(lines[0].contains(" images done"), "{err}");
    eprintln!("{}", lines.join("\n"));
}
