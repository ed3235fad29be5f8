//! The previous node image is hostile input (issue 53): a layer of it that
//! another reader reads differently, or that is not kiln's, is never kept.
//! Each construct is planted where keeping would pay (right after the
//! base, before every shared layer), in an image given both by
//! `--previous` and as the `--push` tag's own (followed with no flag at
//! all); the next image is unpacked by real containerd 1.7 and 2.x and by
//! Docker 28, and each tree must be the one kiln builds with no previous
//! image at all.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;
use kiln_testkit::base::kind_base;
use kiln_testkit::crafted;
use kiln_testkit::docker::{Dockerd, Store};
use kiln_testkit::image::{host_platform, Format, ImageDef, ImageSet, Layer, LayerDef};
use kiln_testkit::unpacked::{containerd_tree, differences, docker_tree};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// The constructs, by name.
pub(crate) fn constructs() -> Vec<(&'static str, Layer)> {
    vec![
        (
            "pax-path-twice",
            crafted::gzip_layer(crafted::pax_path_twice()),
        ),
        (
            "gnu-sparse",
            crafted::gzip_layer(crafted::gnu_sparse_rename()),
        ),
        (
            "nul-type-dir",
            crafted::gzip_layer(crafted::nul_type_directory()),
        ),
        (
            "xattr-dir",
            crafted::gzip_layer(crafted::xattr_on_directory()),
        ),
        ("two-members", crafted::two_member_gzip()),
        ("sized-dir", crafted::gzip_layer(crafted::sized_directory())),
        (
            "base256-owner",
            crafted::gzip_layer(crafted::base256_owner()),
        ),
        ("named-gzip", crafted::named_gzip(crafted::blob_layer())),
        ("gzip-bomb", crafted::gzip_bomb(256 << 20)),
        // Plainly not kiln's: a file outside the store.
        (
            "outside-the-store",
            Layer::build(
                &LayerDef {
                    files: BTreeMap::from([(
                        "etc/passwd".to_string(),
                        String::from_utf8(crafted::EVIL_PASSWD.to_vec()).unwrap(),
                    )]),
                    random_bytes: 0,
                    seed: 0,
                },
                kiln_testkit::image::OCI_LAYER_GZIP,
            ),
        ),
    ]
}

/// A node's images: pause and an etcd with a 2 MiB layer (a layer of its
/// own in the node image, worth a chain).
fn seed(env: &Env) -> std::path::PathBuf {
    let set = ImageSet {
        layers: BTreeMap::from([(
            "etcd-bin".to_string(),
            LayerDef {
                files: BTreeMap::new(),
                random_bytes: 2 << 20,
                seed: 53,
            },
        )]),
        images: vec![ImageDef {
            repo: "prev/etcd".into(),
            tag: "3.5.16-0".into(),
            format: Format::Oci,
            platforms: vec![host_platform()],
            attestations: false,
            layers: vec!["etcd-bin".into()],
            runnable: false,
        }],
    };
    env.registry.seed(&set).expect("seed");
    env.registry
        .push(&kind_base(&[&host_platform()]))
        .expect("base");
    env.write(
        "node.yaml",
        "apiVersion: kiln/v1\nkind: NodeImageManifest\nkubernetesVersion: v1.31.2\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n  - registry.k8s.io/pause:3.10\n  - registry.k8s.io/prev/etcd:3.5.16-0\n",
    )
}

/// `kiln build --push reg/kiln/node:TAG --json`, following `previous`
/// (a full reference) when given, plus `extra`.
fn build_with(
    env: &Env,
    manifest: &Path,
    tag: &str,
    previous: Option<&str>,
    extra: &[&str],
) -> std::process::Output {
    let reg = &env.registry.addr;
    push_build(
        (manifest, &format!("{reg}/kindest/base:test")),
        (&format!("{reg}/kiln/node:{tag}"), previous),
        &env.mirror(),
        extra,
        &[("SOURCE_DATE_EPOCH", "1700000000")],
    )
}

/// [`build_with`] following `reg/kiln/node:PREVIOUS`.
fn build(env: &Env, manifest: &Path, tag: &str, previous: Option<&str>) -> std::process::Output {
    let previous = previous.map(|p| format!("{}/kiln/node:{p}", env.registry.addr));
    build_with(env, manifest, tag, previous.as_deref(), &[])
}

fn manifest_of(env: &Env, tag: &str) -> serde_json::Value {
    env.registry
        .get(&format!("/v2/kiln/node/manifests/{tag}"), OCI_MANIFEST)
        .unwrap()
        .json()
        .unwrap()
}

/// `from`'s manifest with `layer` planted after the base's `base_layers`
/// layers, pushed as `tag`.
fn plant(env: &Env, from: &str, base_layers: usize, layer: &Layer, tag: &str) {
    env.registry.push_blob("kiln/node", &layer.blob).unwrap();
    let mut m = manifest_of(env, from);
    m["layers"]
        .as_array_mut()
        .unwrap()
        .insert(base_layers, layer.blob.descriptor());
    let doc = kiln_testkit::image::Blob::new(OCI_MANIFEST, serde_json::to_vec(&m).unwrap());
    env.registry.push_manifest("kiln/node", tag, &doc).unwrap();
}

/// Builds v1, plants each construct in a copy of it, builds the next image
/// following it (`via_push_tag`: as the push tag's own image, no flag;
/// else by `--previous`), and unpacks every next image with containerd
/// 1.7, containerd 2.x and Docker 28.
fn nothing_planted_reaches_the_node(via_push_tag: bool) {
    let env = Env::new();
    let manifest = seed(&env);
    let o = build(&env, &manifest, "v1", None);
    assert_ok(&o);
    let r1: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let base_layers = manifest_of(&env, "v1")["layers"].as_array().unwrap().len()
        - r1["kilnLayers"].as_array().unwrap().len();
    let mut built = Vec::new();
    for (name, layer) in constructs() {
        let (tag, previous) = if via_push_tag {
            // The push tag already holds the planted image: an ordinary
            // `kiln build --push` follows it.
            plant(&env, "v1", base_layers, &layer, name);
            (name.to_string(), None)
        } else {
            plant(&env, "v1", base_layers, &layer, &format!("planted-{name}"));
            (format!("next-{name}"), Some(format!("planted-{name}")))
        };
        let o = build(&env, &manifest, &tag, previous.as_deref());
        assert_ok(&o);
        built.push((name, tag, layer.blob.digest.clone(), o));
    }
    // The planted layer is nowhere in the next image.
    let mut failures = Vec::new();
    for (name, tag, planted, _) in &built {
        let m = manifest_of(&env, tag);
        if m["layers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| &l["digest"] == planted)
        {
            failures.push(format!(
                "{name}: the next image ships the planted layer {planted}"
            ));
        }
    }
    // Each unpacked tree is v1's.
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (which, bin) in [
        ("containerd 1.7", kiln_testkit::tools::containerd()),
        ("containerd 2.x", kiln_testkit::tools::containerd2()),
    ] {
        let root = env.path(&format!("ctr-{}", which.replace(' ', "-")));
        let d = rt
            .block_on(kiln::adapters::daemon::Daemon::start(
                &bin,
                &root,
                &Default::default(),
            ))
            .unwrap();
        let want = containerd_tree(&d, &env.registry, "kiln/node", "v1").unwrap();
        assert!(want.contains_key("var/lib/containerd"), "{want:?}");
        for (name, tag, _, _) in &built {
            let diff = match containerd_tree(&d, &env.registry, "kiln/node", tag) {
                Ok(got) => differences(&want, &got),
                Err(e) => vec![e],
            };
            if !diff.is_empty() {
                failures.push(format!(
                    "{which}: {name}'s next image:\n  {}",
                    diff.join("\n  ")
                ));
            }
        }
        d.stop().unwrap();
    }
    let docker = Dockerd::start(Store::Containerd, &[&env.registry.addr]).unwrap();
    let want = docker_tree(&docker, &format!("{}/kiln/node:v1", env.registry.addr)).unwrap();
    for p in crafted::PLANTED {
        assert!(!want.get(*p).is_some_and(|w| w.starts_with("link")), "{p}");
    }
    for (name, tag, _, _) in &built {
        let diff = match docker_tree(&docker, &format!("{}/kiln/node:{tag}", env.registry.addr)) {
            Ok(got) => differences(&want, &got),
            Err(e) => vec![e],
        };
        if !diff.is_empty() {
            failures.push(format!(
                "Docker 28: {name}'s next image:\n  {}",
                diff.join("\n  ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Not kept, said so, and the report names the image it came from.
    for (name, _, planted, o) in &built {
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let err = stderr(o);
        eprintln!("{name}: refused: {}", r["kept"][0]["refused"]);
        // Refused for what it plants, not for a mode that happens to differ
        // (the constructs' directories read as the node's own).
        let why = r["kept"][0]["refused"][0]["why"]
            .as_str()
            .unwrap_or_default();
        let want = match *name {
            "pax-path-twice" | "gnu-sparse" | "xattr-dir" => "type 'x'",
            "nul-type-dir" => "type '\\0'",
            "two-members" => "without the blocks that end an archive",
            "sized-dir" => "header-only",
            "base256-owner" => "base-256",
            "gzip-bomb" => "inflates",
            _ => "not kiln's",
        };
        assert!(
            why.contains(want),
            "{name}: refused for {why:?}, not for {want:?}"
        );
        assert!(err.contains("is not kept in place"), "{name}: {err}");
        assert!(
            r["kept"][0]["layers"].as_array().unwrap().is_empty(),
            "{name}: {:#}",
            r["kept"]
        );
        assert_eq!(
            &r["kept"][0]["refused"][0]["layer"], planted,
            "{name}: {:#}",
            r["kept"]
        );
        assert!(
            r["previous"].as_str().unwrap().contains("@sha256:"),
            "{name}"
        );
        // kiln's layers are v1's: the image it builds anyway.
        assert_eq!(r["kilnLayers"], r1["kilnLayers"], "{name}");
    }
}

#[test]
fn a_planted_previous_named_by_flag_gives_nothing_to_the_node() {
    nothing_planted_reaches_the_node(false);
}

#[test]
fn a_planted_push_tag_gives_nothing_to_the_node() {
    nothing_planted_reaches_the_node(true);
}

/// The previous image is an input like the base (issue 53.5, 53.6, 53.8):
/// resolved once and recorded by digest (annotations, SBOM, provenance,
/// lock), accepted by digest, and read whole or not at all: for the
/// `--push` tag's image only "no such manifest" means a first push.
#[test]
fn the_previous_image_is_a_declared_input_read_whole() {
    let env = Env::new();
    let manifest = seed(&env);
    let reg = env.registry.addr.clone();
    let json = |o: &std::process::Output| -> serde_json::Value {
        assert_ok(o);
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // A first push: the tag holds nothing yet, and the build says so.
    let o = build(&env, &manifest, "v1", None);
    let r1 = json(&o);
    assert!(stderr(&o).contains("follows nothing"), "{}", stderr(&o));
    assert!(r1.get("previous").is_none(), "{r1:#}");
    let v1 = r1["digest"].as_str().unwrap().to_string();

    // A rebuild pushed to its own tag follows itself and is the same
    // image: it records what that one recorded (nothing).
    let again = json(&build(&env, &manifest, "v1", None));
    assert_eq!(again["digest"], r1["digest"]);
    assert!(again["previous"].as_str().unwrap().ends_with(&v1));

    // The next release (one image more), by tag or by digest: the same
    // input, the same image, recorded.
    let manifest = env.write(
        "node-2.yaml",
        &format!(
            "{}  - registry.k8s.io/coredns/coredns:v1.11.3\n",
            std::fs::read_to_string(&manifest).unwrap()
        ),
    );
    let (sbom, prov) = (env.path("sbom.json"), env.path("prov.json"));
    let with = |tag: &str, previous: &str, extra: &[&str]| {
        build_with(&env, &manifest, tag, Some(previous), extra)
    };
    let by_tag = format!("{reg}/kiln/node:v1");
    let r2 = json(&with(
        "v2",
        &by_tag,
        &[
            "--sbom",
            sbom.to_str().unwrap(),
            "--provenance",
            prov.to_str().unwrap(),
        ],
    ));
    let r2d = json(&with("v2d", &format!("{reg}/kiln/node@{v1}"), &[]));
    assert_eq!(r2["digest"], r2d["digest"]);
    let repo = format!("{reg}/kiln/node");
    assert_eq!(r2["previous"], format!("{repo}@{v1}"));
    let a = &manifest_of(&env, "v2")["annotations"];
    assert_eq!(a["io.kiln.previous.digest"], v1);
    assert_eq!(a["io.kiln.previous.name"], repo);
    let sbom: serde_json::Value = serde_json::from_slice(&std::fs::read(&sbom).unwrap()).unwrap();
    let hex = v1.strip_prefix("sha256:").unwrap();
    let package = sbom["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["SPDXID"] == "SPDXRef-Previous")
        .unwrap_or_else(|| panic!("{sbom:#}"));
    assert_eq!(package["checksums"][0]["checksumValue"], hex);
    let prov: serde_json::Value = serde_json::from_slice(&std::fs::read(&prov).unwrap()).unwrap();
    let deps = &prov["predicate"]["buildDefinition"]["resolvedDependencies"];
    assert!(
        deps.as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "previous" && d["digest"]["sha256"] == hex),
        "{deps:#}"
    );

    // Locked: the tag moving later changes nothing the build follows.
    let lock = env.path("node.lock");
    let base = format!("{reg}/kindest/base:test");
    let mirror = env.mirror();
    let o = kiln(&[
        "lock",
        "--manifest",
        manifest.to_str().unwrap(),
        "--lock-file",
        lock.to_str().unwrap(),
        "--base",
        &base,
        "--previous",
        &by_tag,
        "--mirror",
        &mirror,
    ]);
    assert_ok(&o);
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(text.contains("previous:") && text.contains(&v1), "{text}");
    let v2_manifest = kiln_testkit::image::Blob::new(
        OCI_MANIFEST,
        serde_json::to_vec(&manifest_of(&env, "v2")).unwrap(),
    );
    env.registry
        .push_manifest("kiln/node", "v1", &v2_manifest)
        .unwrap();
    let r3 = json(&with("v3", &by_tag, &["--lock", lock.to_str().unwrap()]));
    assert_eq!(r3["previous"], format!("{repo}@{v1}"), "{r3:#}");

    // The push tag's image that cannot be read, other than not being
    // there: an error naming the answer, before anything is pushed.
    for status in [403u16, 503] {
        let proxy = kiln_testkit::proxy::fault_proxy(
            env.registry.url(),
            kiln_testkit::proxy::Fault::ManifestStatus { status },
            "/kiln/node/manifests/",
        );
        let target = format!("{}/kiln/node:v4", proxy.server.addr);
        let o = push_build(
            (&manifest, &base),
            (&target, None),
            &mirror,
            &[],
            &[("SOURCE_DATE_EPOCH", "1700000000")],
        );
        assert_fails(&o, 2, &["the --push tag's image", &status.to_string()]);
        assert!(
            env.registry
                .get("/v2/kiln/node/manifests/v4", OCI_MANIFEST)
                .unwrap()
                .status()
                == 404,
            "a refused build pushed"
        );
    }

    // A named previous without one of the platforms built: refused.
    let other = kiln_testkit::tools::other_platform().0;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": v2_manifest.digest,
            "size": v2_manifest.bytes.len(),
            "platform": {"os": "linux", "architecture": host_platform().split('/').nth(1).unwrap()},
        }],
    });
    let index = kiln_testkit::image::Blob::new(
        "application/vnd.oci.image.index.v1+json",
        serde_json::to_vec(&index).unwrap(),
    );
    env.registry
        .push_manifest("kiln/node", "one-platform", &index)
        .unwrap();
    let host = host_platform();
    let o = with(
        "v5",
        &format!("{reg}/kiln/node:one-platform"),
        &["--platform", &host, "--platform", &other],
    );
    assert_fails(&o, 2, &["--previous", &format!("no {other} image")]);

    // A layer worth keeping that cannot be fetched: an error, not an
    // image that depends on the network.
    let planted = crafted::gzip_layer(crafted::pax_path_twice());
    let base_layers = manifest_of(&env, "v2")["layers"].as_array().unwrap().len()
        - r2["kilnLayers"].as_array().unwrap().len();
    plant(&env, "v2", base_layers, &planted, "unfetchable");
    let hex = planted.blob.digest.strip_prefix("sha256:").unwrap();
    let proxy = kiln_testkit::proxy::fault_proxy(
        env.registry.url(),
        kiln_testkit::proxy::Fault::ServerError { times: 1000 },
        hex,
    );
    let o = with(
        "v6",
        &format!("{}/kiln/node:unfetchable", proxy.server.addr),
        &[],
    );
    assert_fails(&o, 2, &["cannot be had", hex]);
    assert_eq!(
        env.registry
            .get("/v2/kiln/node/manifests/v6", OCI_MANIFEST)
            .unwrap()
            .status(),
        404
    );
}
