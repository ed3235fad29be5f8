//! The registry is the build cache (issue 54): a fresh CI runner (an empty
//! cache, a HOME of its own) builds the next release following the last
//! one by digest, and fetches and pushes only what changed, counted at the
//! registry's door by a proxy in front of it. Its image is byte for byte
//! the one a warm runner builds, and `kiln verify` passes on it; a
//! previous image named by tag, and a record the registry serves
//! otherwise than its digest says, take the fetching path, each said.

use crate::common::releases::{blobs, manifest, seed_two_releases, MIB};
use crate::common::*;
use kiln_testkit::proxy::{counting_proxy, Crossed};

/// Bytes the registry sent (every GET's body: manifests and blobs) and
/// received (every upload and manifest PUT).
fn door(log: &[Crossed]) -> (u64, u64) {
    (
        log.iter().map(|c| c.received).sum(),
        log.iter().map(|c| c.sent).sum(),
    )
}

/// A runner: its own HOME and cache.
struct Runner {
    home: std::path::PathBuf,
    cache: std::path::PathBuf,
}

impl Runner {
    fn new(env: &Env, name: &str) -> Runner {
        let (home, cache) = (
            env.path(&format!("{name}-home")),
            env.path(&format!("{name}-cache")),
        );
        std::fs::create_dir_all(&home).unwrap();
        Runner { home, cache }
    }

    /// `kiln build --push REPO:TAG` of `kube`'s release, following `previous`.
    fn build(
        &self,
        env: &Env,
        (registry, kube, tag): (&str, &str, &str),
        previous: Option<&str>,
    ) -> (serde_json::Value, String) {
        let m = manifest(env, kube);
        let o = push_build(
            (&m, &format!("{registry}/kindest/base:test")),
            (&format!("{registry}/kiln/node:{tag}"), previous),
            &format!("registry.k8s.io=http://{registry}"),
            &[],
            &[
                ("SOURCE_DATE_EPOCH", "1700086400"),
                ("HOME", self.home.to_str().unwrap()),
                ("KILN_CACHE_DIR", self.cache.to_str().unwrap()),
            ],
        );
        assert_ok(&o);
        (serde_json::from_slice(&o.stdout).unwrap(), stderr(&o))
    }
}

#[test]
fn a_fresh_runner_fetches_and_pushes_only_what_changed() {
    let env = Env::new();
    let (v1, v2) = seed_two_releases(&env);
    let proxy = counting_proxy(env.registry.url());
    let reg = proxy.addr();
    let (b1, b2) = (blobs(&v1), blobs(&v2));
    let changed: u64 = b2
        .iter()
        .filter(|(d, _)| !b1.contains_key(*d))
        .map(|(_, n)| n)
        .sum();
    let target = 1.05 * changed as f64 + (2 * MIB) as f64;

    // Runner A releases v1.
    let a = Runner::new(&env, "a");
    let (r1, _) = a.build(&env, (&reg, "v1.31.2", "v1.31.2"), None);
    let d1 = r1["digest"].as_str().unwrap().to_string();
    let by_digest = format!("{reg}/kiln/node@{d1}");
    proxy.take();

    // Runner B, fresh, releases v2 following v1 by digest.
    let b = Runner::new(&env, "b");
    let (r2, err) = b.build(&env, (&reg, "v1.31.3", "v1.31.3"), Some(&by_digest));
    let (fetched, pushed) = door(&proxy.take());
    eprintln!(
        "fresh runner B, v2 after v1: fetched {fetched} bytes, pushed {pushed} bytes at the registry's door; {changed} bytes changed (target {target:.0})"
    );
    assert!(
        fetched as f64 <= target,
        "fetched {fetched}, changed {changed}\n{err}"
    );
    assert!(
        pushed as f64 <= target,
        "pushed {pushed}, changed {changed}\n{err}"
    );
    let reused = r2["kilnLayers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["reused"] == true)
        .count();
    assert!(reused >= 2, "{r2:#}");
    assert!(r2["baseLayersReplayed"].as_u64().unwrap() >= 1, "{r2:#}");

    // Runner A, warm, builds the same v2 after the same v1: the same image,
    // by digest or (its record untrusted, everything fetched) by tag.
    let (warm, _) = a.build(&env, (&reg, "v1.31.3", "v1.31.3-warm"), Some(&by_digest));
    assert_eq!(warm["digest"], r2["digest"]);
    let (by_tag, err) = a.build(
        &env,
        (&reg, "v1.31.3", "v1.31.3-tag"),
        Some(&format!("{reg}/kiln/node:v1.31.2")),
    );
    assert_eq!(by_tag["digest"], r2["digest"]);
    assert!(
        err.contains("named by tag, its build record is not trusted"),
        "{err}"
    );
    proxy.take();

    // A registry that serves the record otherwise than its digest says
    // (corrupted on the way): it is not used, said so; the image is the same.
    let record = env
        .registry
        .get(
            &format!("/v2/kiln/node/manifests/{d1}"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap()["annotations"]["io.kiln.record"]
        .as_str()
        .unwrap()
        .to_string();
    let corrupt = kiln_testkit::proxy::fault_proxy(
        env.registry.url(),
        kiln_testkit::proxy::Fault::CorruptByte,
        record.strip_prefix("sha256:").unwrap(),
    );
    let c = Runner::new(&env, "c");
    let creg = corrupt.server.addr.to_string();
    let (r3, err) = c.build(
        &env,
        (&creg, "v1.31.3", "v1.31.3-c"),
        Some(&format!("{creg}/kiln/node@{d1}")),
    );
    assert!(err.contains("build record cannot be used"), "{err}");
    // The same layers (the names in its annotations are this proxy's).
    let digests = |r: &serde_json::Value| -> Vec<String> {
        r["kilnLayers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(digests(&r3), digests(&r2));
    assert!(r3["kilnLayers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["reused"] == false));

    // kiln verify of B's v2: a real containerd reads its store, CRI says
    // every image pinned.
    let v = kiln(&["verify", "--image", &format!("{reg}/kiln/node:v1.31.3")]);
    assert_ok(&v);
}
