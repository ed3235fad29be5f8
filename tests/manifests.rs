//! The shipped manifests parse and carry kubeadm's full default image set.

use kiln::manifest::NodeManifest;

#[test]
fn shipped_manifests_hold_the_kubeadm_image_set() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let m = NodeManifest::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<String> = m.images.iter().map(|i| i.name()).collect();
        for component in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kube-proxy",
            "coredns/coredns",
            "etcd",
            "pause",
        ] {
            let want = format!("registry.k8s.io/{component}");
            assert!(names.contains(&want), "{}: lacks {want}", path.display());
        }
        assert_eq!(m.sandbox_image.path, "pause");
        if let Some(v) = m.kubernetes_version {
            let kube = m
                .images
                .iter()
                .find(|i| i.path == "kube-apiserver")
                .unwrap();
            assert_eq!(kube.tag.as_deref(), Some(v.as_str()), "{}", path.display());
            versions.push(v);
        }
    }
    for minor in ["v1.31.", "v1.32.", "v1.33.", "v1.34."] {
        assert!(
            versions.iter().any(|v| v.starts_with(minor)),
            "no manifest for {minor}x"
        );
    }
}
