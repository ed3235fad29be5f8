//! The shipped manifests parse and carry kubeadm's image set for their
//! version (checked against kiln's kubeadm table, the one rule); kind's also
//! carry what kind bundles besides.

use kiln::domain::manifest::NodeManifest;

fn shipped(prefix: &str) -> Vec<(String, NodeManifest)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with(prefix) && name.ends_with(".yaml") {
            let m = NodeManifest::load(&path).unwrap_or_else(|e| panic!("{e}"));
            out.push((name, m));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn kubernetes_manifests_hold_the_kubeadm_image_set() {
    let mut minors = Vec::new();
    for (name, m) in shipped("kubernetes-") {
        let v = m.kubernetes_version.clone().expect("a version");
        let missing = kiln::domain::kubeadm::missing(&v, &m.images)
            .unwrap()
            .unwrap();
        assert!(missing.is_empty(), "{name}: lacks {missing:?}");
        assert_eq!(m.sandbox_image.path, "pause");
        minors.push(kiln::domain::kubeadm::minor(&v).unwrap());
    }
    // One manifest per minor the table knows, and the other way round.
    assert_eq!(minors, kiln::domain::kubeadm::known());
}

#[test]
fn kind_manifests_hold_all_but_the_release_images_plus_kinds() {
    let kind = shipped("kind-v");
    assert!(kind.len() >= 3);
    for (name, m) in kind {
        let minor = name.trim_start_matches("kind-").trim_end_matches(".yaml");
        let version = format!("{minor}.0");
        // The release supplies the control-plane images; kubeadm's others are here.
        let release: Vec<_> = kiln::domain::kubernetes::IMAGES
            .iter()
            .map(|i| {
                kiln::primitives::reference::ImageRef::parse(&format!(
                    "registry.k8s.io/{i}:{version}"
                ))
                .unwrap()
            })
            .collect();
        let completed = m
            .with_release(&version, &release)
            .unwrap_or_else(|e| panic!("{e}"));
        let missing = kiln::domain::kubeadm::missing(&version, &completed.images)
            .unwrap()
            .unwrap();
        assert!(missing.is_empty(), "{name}: lacks {missing:?}");
        for want in ["kindnetd", "local-path-provisioner", "local-path-helper"] {
            assert!(
                m.images.iter().any(|i| i.path == format!("kindest/{want}")),
                "{name}: lacks kindest/{want}"
            );
        }
    }
}

#[test]
fn kind_manifests_use_the_tags_of_their_kind_release() {
    let shipped: std::collections::BTreeMap<String, NodeManifest> =
        shipped("kind-v").into_iter().collect();
    let mut held = 0;
    for (release, row) in kiln::domain::kind::releases::table() {
        for file in &row.manifests {
            let m = shipped
                .get(file)
                .unwrap_or_else(|| panic!("kind {release}: no manifests/{file}"));
            for want in row.images() {
                assert!(
                    m.images.iter().any(|i| i.to_string() == want),
                    "{file} (kind {release}) lacks {want}"
                );
            }
            // No other tag of kind's addons sneaks in.
            for i in m.images.iter().filter(|i| i.path.starts_with("kindest/")) {
                assert!(
                    row.images().contains(&i.to_string()),
                    "{file}: {i} is not kind {release}'s"
                );
            }
            held += 1;
        }
    }
    assert_eq!(held, shipped.len(), "every kind manifest has a row");
}

/// The demo's manifest (what a newcomer copies first) agrees with kiln's
/// own kubeadm table, so it works with a real release of its version.
#[test]
fn the_demo_manifest_holds_the_kubeadm_image_set() {
    let (name, m) = shipped("demo").pop().expect("manifests/demo.yaml");
    let v = m.kubernetes_version.clone().expect("a version");
    let missing = kiln::domain::kubeadm::missing(&v, &m.images)
        .unwrap()
        .unwrap();
    assert!(missing.is_empty(), "{name}: lacks {missing:?}");
}
