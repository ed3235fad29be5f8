//! `--verify-signatures POLICY`: cosign signatures, made by cosign itself
//! against the loopback registry, checked before anything of an image is
//! stored. Key pairs (`cosign generate-key-pair`, `cosign sign --key`) and
//! keyless certificates from a Sigstore of the test's own (a certificate
//! authority and a transparency log key in a test `trusted_root.json`,
//! the signatures attached with `cosign attach signature`). Each verdict
//! of kiln's is compared with `cosign verify`'s on the same image.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, SystemTime};

use crate::common::*;
use kiln_testkit::sigstore::{trusted_root, Authority, Log};
use kiln_testkit::tools::{cosign, run_bounded};

/// `127.0.0.1:PORT/repo@sha256:…` for a fixture image.
fn at_digest(env: &Env, repo: &str) -> String {
    let host = env.registry.url().replace("http://", "");
    format!("{host}/{repo}@{}", env.image(repo).top.digest)
}

fn cosign_ok(home: &Path, args: &[&str]) -> Output {
    let o = run_bounded(cosign(home).args(args), 120);
    assert!(o.status.success(), "cosign {args:?}: {}", stderr(&o));
    o
}

/// Whether `cosign verify` (with `args`) accepts `image`.
fn cosign_accepts(home: &Path, image: &str, args: &[&str], envs: &[(&str, &Path)]) -> bool {
    let mut all = vec![
        "verify",
        "--allow-http-registry",
        "--allow-insecure-registry",
    ];
    all.extend_from_slice(args);
    all.push(image);
    let mut cmd = cosign(home);
    cmd.args(&all);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let o = run_bounded(&mut cmd, 120);
    eprintln!("cosign verify {image}: {}", stderr(&o));
    o.status.success()
}

/// The build's report: (stored references, failed reference → error).
fn verdicts(o: &Output) -> (Vec<String>, Vec<(String, String)>) {
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(o), stderr(o)));
    let stored = report["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["reference"].as_str().unwrap().to_string())
        .collect();
    let failed = report["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["reference"].as_str().unwrap().to_string(),
                f["error"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (stored, failed)
}

/// What the build's report says admitted `reference`.
fn admitted_by(o: &Output, reference: &str) -> String {
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    report["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["reference"] == reference)
        .and_then(|i| i["admittedBy"].as_str())
        .unwrap_or_else(|| panic!("{reference}: no admittedBy: {report:#}"))
        .to_string()
}

fn error_of<'a>(failed: &'a [(String, String)], reference: &str) -> &'a str {
    &failed
        .iter()
        .find(|(r, _)| r == reference)
        .unwrap_or_else(|| panic!("{reference} did not fail: {failed:?}"))
        .1
}

/// Nothing of a refused image is in the store: not its top document.
fn assert_not_stored(rootfs: &Path, env: &Env, repo: &str) {
    let top = &env.image(repo).top.digest;
    let blob = rootfs
        .join("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256")
        .join(top.trim_start_matches("sha256:"));
    assert!(
        !blob.exists(),
        "{repo}'s manifest was stored though refused"
    );
}

#[test]
fn key_pair_signatures_admit_exactly_what_the_policy_wants() {
    let env = Env::new();
    let home = env.path("cosign");
    std::fs::create_dir_all(&home).unwrap();
    cosign_ok(
        &home,
        &["generate-key-pair", "--output-key-prefix", "release"],
    );
    cosign_ok(
        &home,
        &["generate-key-pair", "--output-key-prefix", "other"],
    );
    let sign = |key: &str, repo: &str| {
        cosign_ok(
            &home,
            &[
                "sign",
                "--key",
                key,
                "--tlog-upload=false",
                "--allow-http-registry",
                "--allow-insecure-registry",
                &at_digest(&env, repo),
            ],
        );
    };
    sign("release.key", "pause");
    sign("other.key", "etcd");
    // kube-apiserver's signature is an OCI 1.1 referrer (on this registry,
    // without the referrers API: in the index tagged sha256-<hex>).
    let o = run_bounded(
        cosign(&home).env("COSIGN_EXPERIMENTAL", "1").args([
            "sign",
            "--key",
            "release.key",
            "--tlog-upload=false",
            "--registry-referrers-mode=oci-1-1",
            "--allow-http-registry",
            "--allow-insecure-registry",
            &at_digest(&env, "kube-apiserver"),
        ]),
        120,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // kube-proxy carries a signature of pause's digest: signed by the
    // right key, for another image.
    let payload = cosign_ok(&home, &["generate", &at_digest(&env, "pause")]).stdout;
    std::fs::write(home.join("pause-payload.json"), &payload).unwrap();
    let sig = cosign_ok(
        &home,
        &[
            "sign-blob",
            "--key",
            "release.key",
            "--tlog-upload=false",
            "pause-payload.json",
        ],
    )
    .stdout;
    std::fs::write(home.join("pause.sig"), &sig).unwrap();
    cosign_ok(
        &home,
        &[
            "attach",
            "signature",
            "--payload",
            "pause-payload.json",
            "--signature",
            "pause.sig",
            "--allow-http-registry",
            "--allow-insecure-registry",
            &at_digest(&env, "kube-proxy"),
        ],
    );
    std::fs::copy(home.join("release.pub"), env.path("release.pub")).unwrap();
    let policy = env.write(
        "policy.yaml",
        "apiVersion: kiln/v1\nkind: SignaturePolicy\nimages:\n- match: registry.k8s.io\n  keys: [release.pub]\n",
    );
    let m = env.manifest("m.yaml", "registry.k8s.io/pause:3.10", ALL);
    let rootfs = env.path("rootfs");
    let sbom = env.path("sbom.json");
    let o = env.build(
        &m,
        &rootfs,
        &[
            "--verify-signatures",
            policy.to_str().unwrap(),
            "--sbom",
            sbom.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // The SBOM says what vouched for each image it lists.
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&sbom).unwrap()).unwrap();
    let pause = doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "registry.k8s.io/pause:3.10")
        .unwrap_or_else(|| panic!("{doc:#}"));
    assert!(
        pause["comment"]
            .as_str()
            .unwrap()
            .ends_with("; cosign signature verified: key release.pub"),
        "{pause:#}"
    );
    let (stored, failed) = verdicts(&o);
    assert_eq!(
        stored,
        vec![
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/kube-apiserver:v1.31.2"
        ],
        "{failed:#?}"
    );
    assert_eq!(
        admitted_by(&o, "registry.k8s.io/pause:3.10"),
        "cosign signature verified: key release.pub"
    );
    assert_eq!(
        admitted_by(&o, "registry.k8s.io/kube-apiserver:v1.31.2"),
        "cosign signature verified: key release.pub (an OCI 1.1 referrer)"
    );
    let etcd = error_of(&failed, "registry.k8s.io/etcd:3.5.16-0");
    assert!(etcd.contains("not signed by release.pub"), "{etcd}");
    let coredns = error_of(&failed, "registry.k8s.io/coredns/coredns:v1.11.3");
    assert!(
        coredns.contains("not signed: no cosign signature for sha256:"),
        "{coredns}"
    );
    let proxy = error_of(&failed, "registry.k8s.io/kube-proxy:v1.31.2");
    assert!(
        proxy.contains(&format!(
            "a signature for another image ({})",
            env.image("pause").top.digest
        )),
        "{proxy}"
    );
    for repo in ["etcd", "coredns/coredns", "kube-proxy"] {
        assert_not_stored(&rootfs, &env, repo);
    }
    // cosign's verdicts are the same.
    for (repo, admitted, referrer) in [
        ("pause", true, false),
        ("etcd", false, false),
        ("coredns/coredns", false, false),
        ("kube-apiserver", true, true),
        ("kube-proxy", false, false),
    ] {
        let mut args = vec!["--key", "release.pub", "--insecure-ignore-tlog"];
        if referrer {
            args.push("--experimental-oci11");
        }
        assert_eq!(
            cosign_accepts(
                &home,
                &at_digest(&env, repo),
                &args,
                &[("COSIGN_EXPERIMENTAL", Path::new("1"))]
            ),
            admitted,
            "cosign's verdict on {repo}"
        );
    }
    // With the other key trusted for etcd and coredns let in unsigned (the
    // longest match decides), the rerun completes the rest.
    std::fs::copy(home.join("other.pub"), env.path("other.pub")).unwrap();
    let policy2 = env.write(
        "policy2.yaml",
        "apiVersion: kiln/v1\nkind: SignaturePolicy\nimages:\n- match: registry.k8s.io\n  keys: [release.pub]\n- match: registry.k8s.io/etcd\n  keys: [other.pub]\n- match: registry.k8s.io/coredns\n  unsigned: true\n",
    );
    let m2 = env.manifest(
        "m2.yaml",
        "registry.k8s.io/pause:3.10",
        &[
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/etcd:3.5.16-0",
            "registry.k8s.io/coredns/coredns:v1.11.3",
            "registry.k8s.io/kube-apiserver:v1.31.2",
        ],
    );
    let o = env.build(
        &m2,
        &rootfs,
        &["--verify-signatures", policy2.to_str().unwrap(), "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // A bundle carries the signatures; a build from it checks them with
    // no registry at all.
    let bundle = env.path("signed.tar");
    let o = kiln(&[
        "bundle",
        "--manifest",
        m2.to_str().unwrap(),
        "--output",
        bundle.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
        "--verify-signatures",
        policy2.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // pause's and etcd's .sig manifests, kube-apiserver's referrer.
    assert_eq!(report["signatures"], 3, "{report}");
    // Issue 39.6b: a signature that was verified but could not be carried
    // (its payload answers 500 after the check read it) fails its image;
    // the bundle said the signatures were carried.
    let sig_tag = env.image("pause").top.digest.replacen(':', "-", 1) + ".sig";
    let sig: serde_json::Value = env
        .registry
        .get(
            &format!("/v2/pause/manifests/{sig_tag}"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .unwrap()
        .json()
        .unwrap();
    let payload = sig["layers"][0]["digest"].as_str().unwrap().to_string();
    let proxy = kiln_testkit::proxy::fault_proxy(
        env.registry.url(),
        kiln_testkit::proxy::Fault::ServerErrorAfter { ok: 1 },
        &payload,
    );
    let o = kiln(&[
        "bundle",
        "--manifest",
        m2.to_str().unwrap(),
        "--output",
        env.path("uncarried.tar").to_str().unwrap(),
        "--mirror",
        &format!("registry.k8s.io={}", proxy.server.url()),
        "--verify-signatures",
        policy2.to_str().unwrap(),
    ]);
    assert_fails(&o, 1, &["1 of 4 images failed"]);
    let err = stderr(&o);
    assert!(
        err.lines().any(|l| l.contains("registry.k8s.io/pause:3.10")
            && l.contains("was verified but could not be carried")),
        "{err}"
    );
    assert!(!env.path("uncarried.tar").exists());
    let mut env = env;
    env.registry.stop();
    let from = |policy: &Path, rootfs: &str| {
        kiln(&[
            "build",
            "--manifest",
            m2.to_str().unwrap(),
            "--rootfs",
            env.path(rootfs).to_str().unwrap(),
            "--from",
            bundle.to_str().unwrap(),
            "--verify-signatures",
            policy.to_str().unwrap(),
            "--json",
        ])
    };
    let o = from(&policy2, "offline");
    assert!(o.status.success(), "{}{}", stderr(&o), stdout(&o));
    assert_eq!(
        admitted_by(&o, "registry.k8s.io/kube-apiserver:v1.31.2"),
        "cosign signature verified: key release.pub (an OCI 1.1 referrer)"
    );
    let o = from(&policy, "offline2");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (stored, failed) = verdicts(&o);
    assert_eq!(
        stored,
        vec![
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/kube-apiserver:v1.31.2"
        ],
        "{failed:?}"
    );
    let etcd = error_of(&failed, "registry.k8s.io/etcd:3.5.16-0");
    assert!(etcd.contains("not signed by release.pub"), "{etcd}");
    // A policy that cannot be used is refused before anything is fetched.
    let bad = env.write(
        "bad.yaml",
        "apiVersion: kiln/v1\nkind: SignaturePolicy\nimages:\n- match: registry.k8s.io\n  keyless:\n  - identity: a@b.c\n    issuer: https://x\n",
    );
    let o = env.build(
        &m,
        &env.path("rootfs3"),
        &["--verify-signatures", bad.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("keyless signers need trustedRoot"),
        "{}",
        stderr(&o)
    );
}

/// Attaches a keyless signature of `repo` with cosign: a certificate from
/// `ca` for `identity`, valid `valid` around `signed_at`, its signing
/// logged by `log` at `logged_at`.
#[allow(clippy::too_many_arguments)]
fn attach_keyless(
    env: &Env,
    home: &Path,
    repo: &str,
    ca: &Authority,
    identity: &str,
    signed_at: SystemTime,
    log: &Log,
    logged_at: SystemTime,
) {
    let image = at_digest(env, repo);
    let leaf = ca.leaf(
        identity,
        ISSUER,
        signed_at - Duration::from_secs(60),
        signed_at + Duration::from_secs(600),
    );
    let payload = cosign_ok(home, &["generate", &image]).stdout;
    let sig = leaf.sign(&payload);
    let at = logged_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let bundle = log.bundle(&payload, &sig, &leaf.cert_pem, at);
    let name = repo.replace('/', "-");
    let files = [
        (format!("{name}.payload"), payload),
        (format!("{name}.sig"), sig.into_bytes()),
        (format!("{name}.pem"), leaf.cert_pem.into_bytes()),
        (format!("{name}.chain"), ca.pem().into_bytes()),
        (format!("{name}.bundle"), bundle.into_bytes()),
    ];
    for (f, b) in &files {
        std::fs::write(home.join(f), b).unwrap();
    }
    cosign_ok(
        home,
        &[
            "attach",
            "signature",
            "--payload",
            &files[0].0,
            "--signature",
            &files[1].0,
            "--certificate",
            &files[2].0,
            "--certificate-chain",
            &files[3].0,
            "--rekor-response",
            &files[4].0,
            "--allow-http-registry",
            "--allow-insecure-registry",
            &image,
        ],
    );
}

const IDENTITY: &str = "release@k8s.test";
const ISSUER: &str = "https://accounts.test";

#[test]
fn keyless_signatures_are_checked_against_a_trusted_root_offline() {
    let env = Env::new();
    let home = env.path("cosign");
    std::fs::create_dir_all(&home).unwrap();
    let ca = Authority::new("kiln test Fulcio");
    let stranger = Authority::new("someone else's CA");
    let log = Log::new();
    let other_log = Log::new();
    // Signed two days ago with a ten-minute certificate, as Fulcio issues
    // them: valid when the log saw it, long expired now.
    let then = SystemTime::now() - Duration::from_secs(2 * 86400);
    attach_keyless(&env, &home, "pause", &ca, IDENTITY, then, &log, then);
    attach_keyless(
        &env,
        &home,
        "etcd",
        &ca,
        "intruder@evil.test",
        then,
        &log,
        then,
    );
    attach_keyless(
        &env,
        &home,
        "coredns/coredns",
        &stranger,
        IDENTITY,
        then,
        &log,
        then,
    );
    // Logged a day after its certificate expired.
    let late = then + Duration::from_secs(86400);
    attach_keyless(
        &env,
        &home,
        "kube-apiserver",
        &ca,
        IDENTITY,
        then,
        &log,
        late,
    );
    // Logged by a log the trust root does not hold.
    attach_keyless(
        &env,
        &home,
        "kube-proxy",
        &ca,
        IDENTITY,
        then,
        &other_log,
        then,
    );
    std::fs::write(env.path("trusted_root.json"), trusted_root(&[&ca], &[&log])).unwrap();
    let policy = env.write(
        "policy.yaml",
        &format!("apiVersion: kiln/v1\nkind: SignaturePolicy\ntrustedRoot: trusted_root.json\nimages:\n- match: registry.k8s.io\n  keyless:\n  - identity: {IDENTITY}\n    issuer: {ISSUER}\n"),
    );
    let m = env.manifest("m.yaml", "registry.k8s.io/pause:3.10", ALL);
    let rootfs = env.path("rootfs");
    let o = env.build(
        &m,
        &rootfs,
        &["--verify-signatures", policy.to_str().unwrap(), "--json"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (stored, failed) = verdicts(&o);
    assert_eq!(stored, vec!["registry.k8s.io/pause:3.10"], "{failed:#?}");
    assert_eq!(
        admitted_by(&o, "registry.k8s.io/pause:3.10"),
        format!("cosign signature verified: {IDENTITY} from {ISSUER}")
    );
    let etcd = error_of(&failed, "registry.k8s.io/etcd:3.5.16-0");
    assert!(
        etcd.contains(&format!(
            "signed by intruder@evil.test from {ISSUER}, the policy wants {IDENTITY} from {ISSUER}"
        )),
        "{etcd}"
    );
    let coredns = error_of(&failed, "registry.k8s.io/coredns/coredns:v1.11.3");
    assert!(
        coredns.contains("not issued by an authority of the trusted root"),
        "{coredns}"
    );
    let apiserver = error_of(&failed, "registry.k8s.io/kube-apiserver:v1.31.2");
    assert!(
        apiserver.contains("the signing certificate: valid from"),
        "{apiserver}"
    );
    let proxy = error_of(&failed, "registry.k8s.io/kube-proxy:v1.31.2");
    assert!(
        proxy.contains("logged by a transparency log the trusted root does not hold"),
        "{proxy}"
    );
    for repo in ["etcd", "coredns/coredns", "kube-apiserver", "kube-proxy"] {
        assert_not_stored(&rootfs, &env, repo);
    }
    // cosign's verdicts, from the same authority and log key (cosign 2.5
    // reads a legacy bundle's log keys from SIGSTORE_REKOR_PUBLIC_KEY, not
    // from --trusted-root).
    std::fs::write(home.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(home.join("rekor.pub"), log.pem()).unwrap();
    let (ca_file, rekor_file) = (home.join("ca.pem"), home.join("rekor.pub"));
    for (repo, admitted) in [
        ("pause", true),
        ("etcd", false),
        ("coredns/coredns", false),
        ("kube-apiserver", false),
        ("kube-proxy", false),
    ] {
        assert_eq!(
            cosign_accepts(
                &home,
                &at_digest(&env, repo),
                &[
                    "--certificate-identity",
                    IDENTITY,
                    "--certificate-oidc-issuer",
                    ISSUER,
                    "--insecure-ignore-sct"
                ],
                &[
                    ("SIGSTORE_ROOT_FILE", &ca_file),
                    ("SIGSTORE_REKOR_PUBLIC_KEY", &rekor_file)
                ]
            ),
            admitted,
            "cosign's verdict on {repo}"
        );
    }
}
