//! The SBOM (`kiln build --sbom FILE`): an SPDX 2.3 document that the SPDX
//! project's own validator (`pyspdxtools`, from PyPI, `make deps`) accepts,
//! naming the base and every bundled image at its digest, pinned or not;
//! the same bytes for the same inputs. And the provenance (`--provenance
//! FILE`): an in-toto statement with a SLSA provenance v1 predicate naming
//! the node image and every input at its digest.

use crate::common::*;
use kiln_testkit::base::kind_base;
use kiln_testkit::image::host_platform;

/// pyspdxtools's verdict on `file`: (exit success, what it printed).
fn validate(file: &std::path::Path) -> (bool, String) {
    let o = kiln_testkit::tools::run_bounded(
        kiln_testkit::tools::pyspdxtools().args(["--infile", file.to_str().unwrap()]),
        120,
    );
    (o.status.success(), format!("{}{}", stdout(&o), stderr(&o)))
}

fn package<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no package {name}: {doc:#}"))
}

#[test]
fn a_node_image_sbom_is_valid_spdx_names_every_input_and_is_reproducible() {
    let env = Env::new();
    let base = kind_base(&[&host_platform()]);
    env.registry.push(&base).unwrap();
    let base_ref = format!("{}/kindest/base:test", env.registry.addr);
    let text = "apiVersion: kiln/v1\nkind: NodeImageManifest\nkubernetesVersion: v1.31.2\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n  - registry.k8s.io/pause:3.10\n  - image: registry.k8s.io/etcd:3.5.16-0\n    pinned: false\n";
    let m = env.write("node.yaml", text);
    let build = |out: &str, sbom: &str| {
        let output = format!("oci-archive:{}", env.path(out).display());
        let provenance = env.path(&format!("{out}.intoto.json"));
        let sbom = env.path(sbom);
        assert_ok(&kiln_env(
            &[
                "build",
                "--manifest",
                m.to_str().unwrap(),
                "--base",
                &base_ref,
                "--mirror",
                &env.mirror(),
                "--output",
                &output,
                "--sbom",
                sbom.to_str().unwrap(),
                "--provenance",
                provenance.to_str().unwrap(),
            ],
            &[("SOURCE_DATE_EPOCH", "1700000000")],
        ));
        std::fs::read(sbom).unwrap()
    };
    let one = build("a.tar", "a.spdx.json");
    let (ok, said) = validate(&env.path("a.spdx.json"));
    assert!(ok && !said.contains("invalid"), "pyspdxtools: {said}");
    eprintln!("pyspdxtools: {said}");
    let doc: serde_json::Value = serde_json::from_slice(&one).unwrap();
    assert_eq!(doc["spdxVersion"], "SPDX-2.3");
    assert_eq!(doc["creationInfo"]["created"], "2023-11-14T22:13:20Z");
    let b = package(&doc, &base_ref);
    assert_eq!(b["versionInfo"], base.top.digest, "{b:#}");
    let pause = package(&doc, "registry.k8s.io/pause:3.10");
    assert_eq!(pause["versionInfo"], env.image("pause").top.digest);
    assert!(
        pause["comment"]
            .as_str()
            .unwrap()
            .contains("pinned (io.cri-containerd.pinned=pinned)"),
        "{pause:#}"
    );
    assert!(
        pause["comment"]
            .as_str()
            .unwrap()
            .contains(&host_platform()),
        "{pause:#}"
    );
    let etcd = package(&doc, "registry.k8s.io/etcd:3.5.16-0");
    assert!(
        etcd["comment"]
            .as_str()
            .unwrap()
            .contains("managed, not pinned"),
        "{etcd:#}"
    );
    assert!(package(&doc, "containerd")["versionInfo"]
        .as_str()
        .unwrap()
        .contains('.'));
    let rels = doc["relationships"].as_array().unwrap();
    assert!(rels
        .iter()
        .any(|r| r["relationshipType"] == "DESCENDANT_OF"
            && r["relatedSpdxElement"] == "SPDXRef-Base"));
    // The node image the SBOM describes is the one in the archive.
    let index: serde_json::Value =
        serde_json::from_slice(&kiln_testkit::base::read_tar(&env.path("a.tar"))["index.json"])
            .unwrap();
    assert_eq!(
        package(&doc, "kiln.local/node:v1.31.2")["versionInfo"],
        index["manifests"][0]["digest"]
    );

    // The provenance: the same node image, every input at its digest.
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.path("a.tar.intoto.json")).unwrap()).unwrap();
    assert_eq!(st["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(st["predicateType"], "https://slsa.dev/provenance/v1");
    let top = index["manifests"][0]["digest"].as_str().unwrap();
    assert_eq!(
        st["subject"][0]["digest"]["sha256"],
        top.trim_start_matches("sha256:")
    );
    let deps = st["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array()
        .unwrap();
    let dep = |name: &str| {
        deps.iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {st:#}"))
    };
    assert_eq!(
        dep("base")["digest"]["sha256"],
        base.top.digest.trim_start_matches("sha256:")
    );
    assert_eq!(
        dep("registry.k8s.io/etcd:3.5.16-0")["digest"]["sha256"],
        env.image("etcd").top.digest.trim_start_matches("sha256:")
    );
    assert_eq!(
        st["predicate"]["runDetails"]["builder"]["version"]["kiln"],
        env!("CARGO_PKG_VERSION")
    );

    // Reproducible: another build of the same inputs, the same bytes.
    assert_eq!(one, build("b.tar", "b.spdx.json"));
    assert_eq!(
        std::fs::read(env.path("a.tar.intoto.json")).unwrap(),
        std::fs::read(env.path("b.tar.intoto.json")).unwrap()
    );

    // The validator is not a rubber stamp: a document missing what SPDX
    // requires, and one whose relationship names no element, are refused.
    let mut broken = doc.clone();
    broken.as_object_mut().unwrap().remove("documentNamespace");
    broken["packages"][1]
        .as_object_mut()
        .unwrap()
        .remove("downloadLocation");
    std::fs::write(
        env.path("broken.spdx.json"),
        serde_json::to_vec(&broken).unwrap(),
    )
    .unwrap();
    let (ok, said) = validate(&env.path("broken.spdx.json"));
    assert!(!ok && said.contains("document_namespace"), "{said}");
    let mut dangling = doc.clone();
    dangling["relationships"][1]["relatedSpdxElement"] = "SPDXRef-Nope".into();
    std::fs::write(
        env.path("dangling.spdx.json"),
        serde_json::to_vec(&dangling).unwrap(),
    )
    .unwrap();
    let (ok, said) = validate(&env.path("dangling.spdx.json"));
    assert!(!ok && said.contains("SPDXRef-Nope"), "{said}");
}

#[test]
fn a_rootfs_sbom_lists_its_images() {
    let env = Env::new();
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &[
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/etcd:3.5.16-0",
        ],
    );
    let sbom = env.path("r.spdx.json");
    assert_ok(&env.build(&m, &env.path("d1/r"), &["--sbom", sbom.to_str().unwrap()]));
    // Issue 38.3: the same inputs into another directory give the same
    // document, byte for byte (it named the rootfs's path).
    let other = env.path("other.spdx.json");
    assert_ok(&env.build(&m, &env.path("d2/r"), &["--sbom", other.to_str().unwrap()]));
    let (a, b) = (
        std::fs::read(&sbom).unwrap(),
        std::fs::read(&other).unwrap(),
    );
    assert!(
        a == b,
        "{}\n---\n{}",
        String::from_utf8_lossy(&a),
        String::from_utf8_lossy(&b)
    );
    assert!(!String::from_utf8_lossy(&a).contains(env.path("d1").to_str().unwrap()));
    let (ok, said) = validate(&sbom);
    assert!(ok && !said.contains("invalid"), "pyspdxtools: {said}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&sbom).unwrap()).unwrap();
    assert_eq!(
        package(&doc, "registry.k8s.io/etcd:3.5.16-0")["versionInfo"],
        env.image("etcd").top.digest
    );
}

/// oras's view of `reference`'s referrers: (artifact type, digest) each.
fn discover(home: &std::path::Path, reference: &str) -> Vec<(String, String)> {
    let o = kiln_testkit::tools::run_bounded(
        kiln_testkit::tools::oras(home).args([
            "discover",
            "--plain-http",
            "--format",
            "json",
            reference,
        ]),
        120,
    );
    assert!(o.status.success(), "oras discover: {}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut found: Vec<(String, String)> = doc["manifests"]
        .as_array()
        .unwrap_or_else(|| panic!("{doc:#}"))
        .iter()
        .map(|m| {
            (
                m["artifactType"].as_str().unwrap().to_string(),
                m["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    found.sort();
    found
}

#[test]
fn a_pushed_node_image_carries_its_sbom_and_provenance_as_referrers() {
    let env = Env::new();
    let base = kind_base(&[&host_platform()]);
    env.registry.push(&base).unwrap();
    let base_ref = format!("{}/kindest/base:test", env.registry.addr);
    let m = env.manifest(
        "node.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let target = format!("{}/kindest/node:v1.31.2", env.registry.addr);
    let push = || {
        let o = kiln_env(
            &[
                "build",
                "--manifest",
                m.to_str().unwrap(),
                "--base",
                &base_ref,
                "--mirror",
                &env.mirror(),
                "--push",
                &target,
                "--sbom",
                env.path("sbom.spdx.json").to_str().unwrap(),
                "--provenance",
                env.path("provenance.json").to_str().unwrap(),
                "--json",
            ],
            &[("SOURCE_DATE_EPOCH", "1700000000")],
        );
        assert_ok(&o);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let report = push();
    let digest = report["digest"].as_str().unwrap().to_string();
    let attached = report["attached"].as_array().unwrap();
    assert_eq!(attached.len(), 2, "{report:#}");
    // This registry (distribution 2.8) has no referrers API: the tag schema.
    assert!(
        attached.iter().all(|a| a["index"] == "tagSchema"),
        "{report:#}"
    );
    // oras finds both, by the image's digest, and pulls the very files
    // kiln wrote.
    let home = env.path("oras");
    std::fs::create_dir_all(&home).unwrap();
    let subject = format!("{}/kindest/node@{digest}", env.registry.addr);
    let found = discover(&home, &subject);
    let types: Vec<&str> = found.iter().map(|(t, _)| t.as_str()).collect();
    // Beside them, the (one platform) manifest's build record
    // (docs/node-images.md), pulled by oras as another tool would.
    assert_eq!(
        types,
        vec![
            "application/spdx+json",
            "application/vnd.in-toto+json",
            "application/vnd.kiln.build-record.v1+json"
        ],
        "{found:?}"
    );
    for (t, d) in &found {
        let out = home.join(t.replace('/', "_"));
        let o = kiln_testkit::tools::run_bounded(
            kiln_testkit::tools::oras(&home).args([
                "pull",
                "--plain-http",
                "-o",
                out.to_str().unwrap(),
                &format!("{}/kindest/node@{d}", env.registry.addr),
            ]),
            120,
        );
        assert!(o.status.success(), "oras pull: {}", stderr(&o));
        if t == "application/vnd.kiln.build-record.v1+json" {
            let record: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("record.json")).unwrap()).unwrap();
            assert_eq!(record["kind"], "BuildRecord", "{record:#}");
            continue;
        }
        let (pulled, written) = if t == "application/spdx+json" {
            ("sbom.spdx.json", "sbom.spdx.json")
        } else {
            ("provenance.intoto.json", "provenance.json")
        };
        assert_eq!(
            std::fs::read(out.join(pulled)).unwrap(),
            std::fs::read(env.path(written)).unwrap(),
            "{t}"
        );
    }
    let sbom: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.path("sbom.spdx.json")).unwrap()).unwrap();
    assert!(
        sbom["packages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["checksums"][0]["checksumValue"] == digest.trim_start_matches("sha256:")),
        "the SBOM names the pushed image's digest"
    );
    // The same build pushed again: the same image, the same two referrers.
    let again = push();
    assert_eq!(again["digest"], report["digest"]);
    assert_eq!(discover(&home, &subject), found);
}
