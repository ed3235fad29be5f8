//! A newcomer's first hour (issue 24): answers that say what is true and
//! what to do, and logs that read well in a CI file.

use crate::common::*;
use kiln_testkit::image::{host_platform, Blob, OCI_INDEX};

/// An index whose entry for the platform is another index is refused with
/// a line saying so (it used to say "no linux/amd64 image (it has:
/// linux/amd64)").
#[test]
fn a_nested_index_is_named_not_contradicted() {
    let env = Env::new();
    let inner = kiln_testkit::base::image_of(
        "nested/inner",
        "1",
        &[&host_platform()],
        vec![kiln_testkit::base::layer_of(&[(
            "etc/x",
            tar::EntryType::Regular,
            b"x",
            "",
            0o644,
        )])],
    );
    env.registry.push(&inner).unwrap();
    let (os, arch) = host_platform()
        .split_once('/')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unwrap();
    let mut entry = inner.top.descriptor();
    entry["platform"] = serde_json::json!({"os": os, "architecture": arch});
    let outer = Blob::new(
        OCI_INDEX,
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]
        }))
        .unwrap(),
    );
    env.registry
        .push_manifest("nested/inner", "outer", &outer)
        .unwrap();
    // Named by the loopback registry itself: no other host is tried.
    let image = format!("{}/nested/inner:outer", env.registry.addr);
    let m = env.write(
        "nested.yaml",
        &format!("apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: {image}\nimages:\n  - {image}\n"),
    );
    let o = env.build(&m, &env.path("rootfs"), &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("its index names another index")
            && err.contains("nested indexes are not followed"),
        "{err}"
    );
    assert!(!err.contains("(it has: "), "{err}");
}

/// Warnings written to a file or pipe carry no colour codes, and
/// RUST_LOG=debug shows kiln's events without the HTTP/2 frames under them.
#[test]
fn logs_in_a_file_are_plain_and_debug_is_kilns_own() {
    let env = Env::new();
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    // A rootfs without containerd: kiln warns that it cannot check pinning.
    let r = env.path("rootfs");
    let mut args = vec![
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        r.to_str().unwrap(),
    ];
    let mirror = env.mirror();
    args.extend(["--mirror", &mirror]);
    let o = kiln_env(&args, &[("RUST_LOG", "debug")]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains("WARN") && err.contains("cannot check that it honours pinned images"),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe:\n{err}");
    assert!(err.contains("DEBUG started containerd"), "{err}");
    assert!(
        !err.contains("frame="),
        "HTTP/2 frames at RUST_LOG=debug:\n{err}"
    );
    // Named, the HTTP stack speaks.
    let o = kiln_env(&args, &[("RUST_LOG", "debug,h2=debug")]);
    assert_ok(&o);
    assert!(stderr(&o).contains("frame="), "{}", stderr(&o));

    // verify says when its containerd predates pinning (here a 1.7 binary
    // that claims 1.6.20).
    let old = env.path("old/containerd");
    kiln_testkit::tools::containerd_claiming("1.6.20", &old);
    let o = kiln(&[
        "verify",
        "--rootfs",
        r.to_str().unwrap(),
        "--containerd",
        old.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert!(
        err.contains("note  containerd 1.6.20 predates pinning (1.6.22+, 1.7.3+)"),
        "{err}"
    );
}

/// When no image could be stored the summary says so, without an empty
/// platform list or "the others are stored"; an image that is nowhere is
/// the manifest's fault (exit 2).
#[test]
fn a_build_where_everything_failed_says_nothing_was_stored() {
    let env = Env::new();
    let image = format!("{}/nope:1", env.registry.addr);
    let m = env.write(
        "m.yaml",
        &format!("apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: {image}\nimages:\n  - {image}\n"),
    );
    let o = env.build(&m, &env.path("rootfs"), &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("kiln: built 0/1 images into"), "{err}");
    assert!(err.contains("fix the manifest"), "{err}");
    assert!(err.contains("none was stored"), "{err}");
    assert!(!err.contains("the others are stored"), "{err}");
}

/// A plain-HTTP registry written as TLS (`https://`, or no scheme) is named
/// with the fix, at once: no retries of a handshake that cannot succeed.
/// (A `certs.d` server for a made-up domain, so no other host is tried.)
/// A registries file whose caCert is missing is refused before any work.
#[test]
fn a_plain_http_registry_written_as_tls_gets_the_fix() {
    let env = Env::new();
    let dir = env.path("certs.d/kiln.test");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("hosts.toml"),
        format!("server = \"https://{}\"\n", env.registry.addr),
    )
    .unwrap();
    let m = env.write(
        "tls.yaml",
        "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: kiln.test/pause:3.10\nimages:\n  - kiln.test/pause:3.10\n  - kiln.test/etcd:3.5.16-0\n",
    );
    let hosts = env.path("certs.d");
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            env.path("r").to_str().unwrap(),
            "--hosts-dir",
            hosts.to_str().unwrap(),
        ],
        &[("RUST_LOG", "debug")],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "answers plain HTTP, not TLS: write http://{} for a plain-HTTP mirror",
            env.registry.addr
        )),
        "{err}"
    );
    assert!(
        !err.contains("retrying"),
        "a handshake that cannot work was retried:\n{err}"
    );
    assert!(err.contains("none was stored"), "{err}");

    let f = env.write(
        "registries.yaml",
        "registries:\n  registry.k8s.io:\n    mirrors:\n      - url: https://mirror.example\n        caCert: /no/such/ca.pem\n",
    );
    let r = env.path("r2");
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        r.to_str().unwrap(),
        "--registry-config",
        f.to_str().unwrap(),
    ]);
    assert_fails(&o, 2, &["--registry-config", "caCert", "/no/such/ca.pem"]);
    assert!(
        !r.exists(),
        "work was done before the registries file was read"
    );
}

/// A bundle names each image by its full reference in the OCI layout
/// (ref.name as well as containerd's image name), so a real skopeo selects
/// one image of several that share a tag.
#[test]
fn skopeo_selects_one_image_from_a_bundle() {
    let env = Env::new();
    let m = env.manifest("m.yaml", "registry.k8s.io/pause:3.10", ALL);
    let bundle = env.path("bundle.tar");
    let o = kiln(&[
        "bundle",
        "--manifest",
        m.to_str().unwrap(),
        "--output",
        bundle.to_str().unwrap(),
        "--mirror",
        &env.mirror(),
    ]);
    assert_ok(&o);
    // kube-apiserver and kube-proxy share the tag v1.31.2.
    for repo in ["kube-proxy", "kube-apiserver"] {
        let src = format!(
            "oci-archive:{}:registry.k8s.io/{repo}:v1.31.2",
            bundle.display()
        );
        let o = kiln_testkit::tools::run_bounded(
            kiln_testkit::tools::skopeo().args(["--insecure-policy", "inspect", "--raw", &src]),
            60,
        );
        assert!(
            o.status.success(),
            "skopeo inspect {src}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            kiln_testkit::image::sha256(&o.stdout),
            env.image(repo).top.digest,
            "skopeo read another image than {repo}"
        );
    }
}

/// Every `--json` report spells its keys one way (camelCase, as OCI and
/// CRI spell theirs): no snake_case key anywhere in build, lock, bundle,
/// inspect or verify.
#[test]
fn json_reports_use_one_naming_convention() {
    fn snake_keys(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    // Keys that are data (image names, annotation keys) may hold anything.
                    if k.contains('_') && !k.contains('/') && !k.contains('.') {
                        out.push(format!("{path}.{k}"));
                    }
                    snake_keys(v, &format!("{path}.{k}"), out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| snake_keys(v, path, out)),
            _ => {}
        }
    }
    let env = Env::new();
    let m = env.manifest("m.yaml", "registry.k8s.io/pause:3.10", ALL);
    let r = env.path("r");
    let mirror = env.mirror();
    let (ms, rs) = (m.to_str().unwrap(), r.to_str().unwrap());
    let bundle = env.path("b.tar");
    let runs: Vec<Vec<&str>> = vec![
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
        vec!["lock", "--json", "--manifest", ms, "--mirror", &mirror],
        vec![
            "bundle",
            "--json",
            "--manifest",
            ms,
            "--output",
            bundle.to_str().unwrap(),
            "--mirror",
            &mirror,
        ],
        vec!["inspect", "--json", "--rootfs", rs],
        vec!["verify", "--json", "--rootfs", rs, "--manifest", ms],
    ];
    let mut found = Vec::new();
    for args in runs {
        let o = kiln(&args);
        assert_ok(&o);
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{}: {e}", args[0]));
        snake_keys(&v, args[0], &mut found);
    }
    assert!(found.is_empty(), "snake_case keys: {found:?}");
}

/// A registry that does not answer at all is said once, with the fix, and
/// the images after it fail at once rather than each paying the retries.
/// (A refused port on loopback: no other host is tried.)
#[test]
fn a_registry_that_does_not_answer_is_said_once() {
    let env = Env::new();
    let m = env.write(
        "dead.yaml",
        "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: 127.0.0.1:1/a:1\nimages:\n  - 127.0.0.1:1/a:1\n  - 127.0.0.1:1/b:1\n  - 127.0.0.1:1/c:1\n",
    );
    let o = env.build(&m, &env.path("r"), &["--jobs", "1"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let warned = err.matches("127.0.0.1:1 does not answer").count();
    assert_eq!(warned, 1, "{err}");
    assert!(err.contains("--mirror 127.0.0.1:1=URL"), "{err}");
    assert_eq!(
        err.matches("not tried: 127.0.0.1:1 did not answer earlier in this run")
            .count(),
        2,
        "{err}"
    );
    assert!(err.contains("none was stored"), "{err}");
}
