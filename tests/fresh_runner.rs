//! The registry is the build cache (issue 54): a fresh CI runner (an empty
//! cache, a HOME of its own) builds the next release following the last
//! one, and fetches and pushes only what changed, counted at the
//! registry's door by a proxy in front of it. Its image is byte for byte
//! the one a warm runner builds, and `kiln verify` passes on it.
//!
//! A digest names bytes, not who made them (issue 60): the previous
//! image's build record stands in for bytes only when its cosign
//! signature verifies under the build's policy. Unsigned (by tag, by
//! digest, through a lock), a record the registry serves otherwise than
//! its digest, and a record forged by whoever can push: each takes the
//! fetching path, said, and ships only what kiln made.

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

    /// `kiln build --push REPO:TAG` of `kube`'s release, following
    /// `previous`, with `extra` flags.
    fn build(
        &self,
        env: &Env,
        (registry, kube, tag): (&str, &str, &str),
        previous: Option<&str>,
        extra: &[&str],
    ) -> (serde_json::Value, String) {
        let m = manifest(env, kube);
        let o = push_build(
            (&m, &format!("{registry}/kindest/base:test")),
            (&format!("{registry}/kiln/node:{tag}"), previous),
            &format!("registry.k8s.io=http://{registry}"),
            extra,
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

/// The signing flags for runner builds: sign what is pushed, and trust
/// a previous image's record only under the policy.
fn signed(keys: &kiln_testkit::sigstore::NodeSigning) -> [&str; 4] {
    [
        "--sign-key",
        keys.key.to_str().unwrap(),
        "--verify-signatures",
        keys.policy.to_str().unwrap(),
    ]
}

fn reused(r: &serde_json::Value) -> usize {
    r["kilnLayers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["reused"] == true)
        .count()
}

#[test]
fn a_fresh_runner_fetches_and_pushes_only_what_changed() {
    let env = Env::new();
    let (v1, v2) = seed_two_releases(&env);
    let proxy = counting_proxy(env.registry.url());
    let reg = proxy.addr();
    let keys = kiln_testkit::sigstore::node_signing(&env.path("keys"), &format!("{reg}/kiln/node"));
    let (b1, b2) = (blobs(&v1), blobs(&v2));
    let changed: u64 = b2
        .iter()
        .filter(|(d, _)| !b1.contains_key(*d))
        .map(|(_, n)| n)
        .sum();
    let target = 1.05 * changed as f64 + (2 * MIB) as f64;

    // Runner A releases v1, signed.
    let a = Runner::new(&env, "a");
    let (r1, err) = a.build(&env, (&reg, "v1.31.2", "v1.31.2"), None, &signed(&keys));
    assert!(err.contains("signed with"), "{err}");
    let d1 = r1["digest"].as_str().unwrap().to_string();
    let by_digest = format!("{reg}/kiln/node@{d1}");
    // The real cosign accepts kiln's signature with the public key.
    let home = env.path("cosign-home");
    std::fs::create_dir_all(&home).unwrap();
    let o = kiln_testkit::tools::run_bounded(
        kiln_testkit::tools::cosign(&home).args([
            "verify",
            "--allow-http-registry",
            "--allow-insecure-registry",
            "--insecure-ignore-tlog=true",
            "--key",
            keys.public.to_str().unwrap(),
            &format!("{}/kiln/node:v1.31.2", env.registry.addr),
        ]),
        120,
    );
    eprintln!("cosign verify: {}", stderr(&o));
    assert!(
        o.status.success(),
        "cosign verify refused kiln's signature: {}",
        stderr(&o)
    );
    proxy.take();

    // Runner B, fresh, releases v2 following v1 by digest, the signature
    // verified: the record stands in for the bytes it lists.
    let b = Runner::new(&env, "b");
    let (r2, err) = b.build(
        &env,
        (&reg, "v1.31.3", "v1.31.3"),
        Some(&by_digest),
        &signed(&keys),
    );
    let (fetched, pushed) = door(&proxy.take());
    eprintln!(
        "fresh runner B, v2 after v1, signed: fetched {fetched} bytes, pushed {pushed} bytes at the registry's door; {changed} bytes changed (target {target:.0})"
    );
    assert_eq!(r2["previousTrust"]["recordUsed"], true, "{r2:#}\n{err}");
    assert!(
        err.contains("signed (cosign signature verified: key"),
        "{err}"
    );
    assert!(
        fetched as f64 <= target,
        "fetched {fetched}, changed {changed}\n{err}"
    );
    assert!(
        pushed as f64 <= target,
        "pushed {pushed}, changed {changed}\n{err}"
    );
    assert!(reused(&r2) >= 2, "{r2:#}");
    assert!(r2["baseLayersReplayed"].as_u64().unwrap() >= 1, "{r2:#}");

    // Runner D, fresh, the same v2 after v1 by digest with no policy: the
    // record is not used, every layer is fetched and judged by its bytes;
    // the same image.
    let d = Runner::new(&env, "d");
    let (unsigned, err) = d.build(&env, (&reg, "v1.31.3", "v1.31.3-d"), Some(&by_digest), &[]);
    let (fetched_u, pushed_u) = door(&proxy.take());
    eprintln!(
        "fresh runner D, v2 after v1 by digest, no signature policy: fetched {fetched_u} bytes, pushed {pushed_u} bytes at the registry's door"
    );
    assert_eq!(unsigned["digest"], r2["digest"]);
    assert_eq!(reused(&unsigned), 0, "{unsigned:#}");
    assert_eq!(unsigned["previousTrust"]["recordUsed"], false);
    assert!(
        err.contains("its build record is not used (no signature policy"),
        "{err}"
    );

    // Runner A, warm, builds the same v2 after the same v1: the same image,
    // signed by digest, and by tag (the signature is of what the tag names).
    let (warm, _) = a.build(
        &env,
        (&reg, "v1.31.3", "v1.31.3-warm"),
        Some(&by_digest),
        &signed(&keys),
    );
    assert_eq!(warm["digest"], r2["digest"]);
    let (by_tag, _) = a.build(
        &env,
        (&reg, "v1.31.3", "v1.31.3-tag"),
        Some(&format!("{reg}/kiln/node:v1.31.2")),
        &signed(&keys),
    );
    assert_eq!(by_tag["digest"], r2["digest"]);
    assert_eq!(by_tag["previousTrust"]["recordUsed"], true);
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
    let ckeys =
        kiln_testkit::sigstore::node_signing(&env.path("ckeys"), &format!("{creg}/kiln/node"));
    std::fs::copy(&keys.public, &ckeys.public).unwrap();
    let (r3, err) = c.build(
        &env,
        (&creg, "v1.31.3", "v1.31.3-c"),
        Some(&format!("{creg}/kiln/node@{d1}")),
        &["--verify-signatures", ckeys.policy.to_str().unwrap()],
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
    assert_eq!(reused(&r3), 0);

    // kiln verify of B's v2: a real containerd reads its store, CRI says
    // every image pinned.
    let v = kiln(&["verify", "--image", &format!("{reg}/kiln/node:v1.31.3")]);
    assert_ok(&v);
}

/// Issue 60.3, as it was found: whoever can push to the repository pushes
/// v1's manifest naming a forged record, whose content-keyed layer points
/// at v1's own layer plus a passwordless root and a setuid shell (key and
/// entries unchanged), as `:v1-evil`; `kiln lock --previous :v1-evil`
/// pins it by digest, and the build follows it through the lock. On the
/// landed main that shipped the forged layer (`reused: true`); now, with
/// no signature, the record is not used and no byte of it ships.
#[test]
fn a_forged_record_named_by_digest_ships_nothing() {
    use std::io::{Read, Write};
    let env = Env::new();
    let _ = seed_two_releases(&env);
    let reg = env.registry.addr.clone();
    let keys = kiln_testkit::sigstore::node_signing(&env.path("keys"), &format!("{reg}/kiln/node"));
    let a = Runner::new(&env, "a");
    let (r1, _) = a.build(&env, (&reg, "v1.31.2", "v1.31.2"), None, &signed(&keys));
    let d1 = r1["digest"].as_str().unwrap();
    const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    let mut m: serde_json::Value = env
        .registry
        .get(&format!("/v2/kiln/node/manifests/{d1}"), MANIFEST)
        .unwrap()
        .json()
        .unwrap();
    let record_digest = m["annotations"]["io.kiln.record"]
        .as_str()
        .unwrap()
        .to_string();
    let mut record: serde_json::Value = env
        .registry
        .get(&format!("/v2/kiln/node/blobs/{record_digest}"), "*/*")
        .unwrap()
        .json()
        .unwrap();
    // The forged layer: a keyed layer of v1's, its entries and then the
    // planted ones, as one gzip member.
    let layers = record["layers"].as_array_mut().unwrap();
    let keyed = layers
        .iter_mut()
        .find(|l| l.get("key").is_some())
        .expect("a keyed layer");
    let honest = keyed["digest"].as_str().unwrap().to_string();
    let blob = env
        .registry
        .get(&format!("/v2/kiln/node/blobs/{honest}"), "*/*")
        .unwrap()
        .bytes()
        .unwrap();
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(&blob[..])
        .read_to_end(&mut tar)
        .unwrap();
    tar.truncate(tar.len() - 1024);
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in [
        ("etc/passwd", kiln_testkit::crafted::EVIL_PASSWD, 0o644),
        (
            "usr/local/bin/suid-sh",
            kiln_testkit::crafted::EVIL_SHELL,
            0o4755,
        ),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        b.append_data(&mut h, path, data).unwrap();
    }
    tar.extend(b.into_inner().unwrap());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let evil =
        kiln_testkit::image::Blob::new(kiln_testkit::image::OCI_LAYER_GZIP, gz.finish().unwrap());
    env.registry.push_blob("kiln/node", &evil).unwrap();
    keyed["digest"] = evil.digest.clone().into();
    keyed["size"] = (evil.bytes.len() as u64).into();
    keyed["diffId"] = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&tar))
    )
    .into();
    let forged = kiln_testkit::image::Blob::new(
        "application/vnd.kiln.build-record.v1+json",
        serde_json::to_vec(&record).unwrap(),
    );
    env.registry.push_blob("kiln/node", &forged).unwrap();
    m["annotations"]["io.kiln.record"] = forged.digest.clone().into();
    m["annotations"]["io.kiln.record.size"] = forged.bytes.len().to_string().into();
    let doc = kiln_testkit::image::Blob::new(MANIFEST, serde_json::to_vec(&m).unwrap());
    env.registry
        .push_manifest("kiln/node", "v1-evil", &doc)
        .unwrap();

    // Locked by digest, built through the lock: the path docs/ci.md gives.
    let node = manifest(&env, "v1.31.3");
    let lock = env.path("node.lock");
    let o = kiln_env(
        &[
            "lock",
            "--manifest",
            node.to_str().unwrap(),
            "--base",
            &format!("{reg}/kindest/base:test"),
            "--previous",
            &format!("{reg}/kiln/node:v1-evil"),
            "--mirror",
            &format!("registry.k8s.io=http://{reg}"),
            "--lock-file",
            lock.to_str().unwrap(),
        ],
        &[],
    );
    assert_ok(&o);
    assert!(stderr(&o).contains("bytes (sha256:"), "{}", stderr(&o));
    assert!(stderr(&o).contains("not trust in them"), "{}", stderr(&o));
    let b = Runner::new(&env, "b");
    for (tag, extra) in [
        ("v1.31.3-locked", vec!["--lock", lock.to_str().unwrap()]),
        (
            "v1.31.3-policy",
            vec![
                "--lock",
                lock.to_str().unwrap(),
                "--verify-signatures",
                keys.policy.to_str().unwrap(),
            ],
        ),
    ] {
        let (r, err) = b.build(
            &env,
            (&reg, "v1.31.3", tag),
            Some(&format!("{reg}/kiln/node:v1-evil")),
            &extra,
        );
        let shipped = manifest_layers(&env, tag);
        assert!(
            !shipped.contains(&evil.digest),
            "{tag}: the forged layer ships\n{err}"
        );
        assert_eq!(reused(&r), 0, "{tag}: {r:#}");
        assert_eq!(r["previousTrust"]["recordUsed"], false, "{tag}");
        eprintln!("{tag}: {}", r["previousTrust"]);
    }
}

fn manifest_layers(env: &Env, tag: &str) -> Vec<String> {
    let m: serde_json::Value = env
        .registry
        .get(
            &format!("/v2/kiln/node/manifests/{tag}"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .unwrap()
        .json()
        .unwrap();
    m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}
