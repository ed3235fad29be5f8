//! kubeadm's default image set per Kubernetes minor version (the table is
//! `manifests/kubeadm-images.yaml`, shipped next to the manifests and built
//! in): a node that lacks one of these cannot run `kubeadm init` offline.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::primitives::reference::ImageRef;

const TABLE: &str = include_str!("../../manifests/kubeadm-images.yaml");

#[derive(Deserialize)]
struct Row {
    pause: String,
    etcd: String,
    coredns: String,
}

/// The built-in table, parsed once.
fn table() -> &'static BTreeMap<String, Row> {
    static TABLE_ROWS: std::sync::OnceLock<BTreeMap<String, Row>> = std::sync::OnceLock::new();
    TABLE_ROWS
        .get_or_init(|| serde_yaml_ng::from_str(TABLE).expect("the built-in kubeadm table parses"))
}

/// `v1.34.1` → `v1.34`.
pub fn minor(version: &str) -> Option<String> {
    let mut parts = version.trim_start_matches('v').split('.');
    let (major, minor) = (parts.next()?, parts.next()?);
    let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
    (!major.is_empty() && !minor.is_empty()).then(|| format!("v{major}.{minor}"))
}

/// The four control-plane images kubeadm of `version` pulls, whatever the
/// table knows: `registry.k8s.io/NAME:VERSION`, with `_` where the version
/// has `+` (as kubeadm tags them).
pub fn control_plane(version: &str) -> Vec<ImageRef> {
    let tag = version.replace('+', "_");
    crate::domain::kubernetes::IMAGES
        .iter()
        .map(|i| {
            ImageRef::parse(&format!(
                "{}/{i}:{tag}",
                crate::domain::kubernetes::IMAGE_REGISTRY
            ))
            .expect("release images are references")
        })
        .collect()
}

/// The images kubeadm of `version` pulls by default, as `registry.k8s.io`
/// references; `None` for a minor the table does not know.
pub fn images(version: &str) -> Option<Vec<ImageRef>> {
    let row = table().get(&minor(version)?)?;
    let mut images = control_plane(version);
    for n in [
        format!("registry.k8s.io/pause:{}", row.pause),
        format!("registry.k8s.io/etcd:{}", row.etcd),
        format!("registry.k8s.io/coredns/coredns:{}", row.coredns),
    ] {
        images.push(ImageRef::parse(&n).expect("table entries are references"));
    }
    Some(images)
}

/// The minor versions the table knows, oldest first.
pub fn known() -> Vec<String> {
    table().keys().cloned().collect()
}

/// Which of kubeadm's images for `version` `have` lacks (by name and tag).
/// `Err` when the table does not know the minor.
pub fn missing(version: &str, have: &[ImageRef]) -> Result<Vec<ImageRef>, String> {
    let want = images(version).ok_or_else(|| {
        format!(
            "kiln's kubeadm table knows {} but not {version}",
            known().join(", ")
        )
    })?;
    Ok(want
        .into_iter()
        .filter(|w| !have.iter().any(|h| h.name() == w.name() && h.tag == w.tag))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_become_references() {
        let v = images("v1.34.1").unwrap();
        let names: Vec<String> = v.iter().map(|i| i.to_string()).collect();
        assert!(names.contains(&"registry.k8s.io/kube-apiserver:v1.34.1".to_string()));
        assert!(names.contains(&"registry.k8s.io/etcd:3.6.4-0".to_string()));
        assert!(names.contains(&"registry.k8s.io/pause:3.10.1".to_string()));
        assert_eq!(minor("v1.32.0-rc.1").as_deref(), Some("v1.32"));
        assert!(images("v1.99.0").is_none());
        assert!(known().len() >= 5);
    }
}
