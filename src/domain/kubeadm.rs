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
/// has `+` (as kubeadm tags them). A version that makes no tag is bad input.
pub fn control_plane(version: &str) -> Result<Vec<ImageRef>, crate::primitives::error::BadInput> {
    crate::domain::kube_version::check(version).map_err(crate::primitives::error::BadInput)?;
    let tag = version.replace('+', "_");
    crate::domain::kubernetes::IMAGES
        .iter()
        .map(|i| {
            let name = format!("{}/{i}:{tag}", crate::domain::kubernetes::IMAGE_REGISTRY);
            ImageRef::parse(&name).map_err(|e| {
                crate::primitives::error::BadInput(format!(
                    "version {version:?} makes no image name ({name}): {e}"
                ))
            })
        })
        .collect()
}

/// The images kubeadm of `version` pulls by default, as `registry.k8s.io`
/// references; `Ok(None)` for a minor the table does not know.
pub fn images(version: &str) -> Result<Option<Vec<ImageRef>>, crate::primitives::error::BadInput> {
    let mut images = control_plane(version)?;
    let Some(row) = minor(version).and_then(|m| table().get(&m)) else {
        return Ok(None);
    };
    for n in [
        format!("registry.k8s.io/pause:{}", row.pause),
        format!("registry.k8s.io/etcd:{}", row.etcd),
        format!("registry.k8s.io/coredns/coredns:{}", row.coredns),
    ] {
        // The table is built in and tested (`table_rows_become_references`).
        images.push(ImageRef::parse(&n).map_err(|e| {
            crate::primitives::error::BadInput(format!("kiln's kubeadm table: {n}: {e}"))
        })?);
    }
    Ok(Some(images))
}

/// The minor versions the table knows, oldest first.
pub fn known() -> Vec<String> {
    table().keys().cloned().collect()
}

/// Which of kubeadm's images for `version` `have` lacks (by name and tag).
/// `Ok(Err)` when the table does not know the minor.
pub fn missing(
    version: &str,
    have: &[ImageRef],
) -> Result<Result<Vec<ImageRef>, String>, crate::primitives::error::BadInput> {
    let Some(want) = images(version)? else {
        return Ok(Err(format!(
            "kiln's kubeadm table knows {} but not {version}",
            known().join(", ")
        )));
    };
    Ok(Ok(lacking(&want, have)))
}

/// kubeadm's own answer (`kubeadm config images list`), as references:
/// each must be a valid image name (it comes from a release's binary).
pub fn listed(
    version: &str,
    names: &[String],
) -> Result<Vec<ImageRef>, crate::primitives::error::BadInput> {
    names
        .iter()
        .map(|n| {
            ImageRef::parse(n).map_err(|e| {
                crate::primitives::error::BadInput(format!(
                    "kubeadm {version} lists {n:?}, which is no image name: {e}"
                ))
            })
        })
        .collect()
}

/// Which of `want` `have` lacks, by name and tag.
pub fn lacking(want: &[ImageRef], have: &[ImageRef]) -> Vec<ImageRef> {
    want.iter()
        .filter(|w| !have.iter().any(|h| h.name() == w.name() && h.tag == w.tag))
        .cloned()
        .collect()
}

/// Where the table knows `version`'s minor and kubeadm's own list differs
/// from it: one line saying how (kubeadm's answer is the one used).
pub fn cross_check(version: &str, kubeadm: &[ImageRef]) -> Option<String> {
    let table = images(version).ok().flatten()?;
    let show = |v: &[ImageRef]| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (only_table, only_kubeadm) = (lacking(&table, kubeadm), lacking(kubeadm, &table));
    (!only_table.is_empty() || !only_kubeadm.is_empty()).then(|| {
        format!(
            "kubeadm {version} and kiln's table differ (table only: {}; kubeadm only: {}); kubeadm's own list is the one checked",
            show(&only_table),
            show(&only_kubeadm)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_become_references() {
        let v = images("v1.34.1").unwrap().unwrap();
        let names: Vec<String> = v.iter().map(|i| i.to_string()).collect();
        assert!(names.contains(&"registry.k8s.io/kube-apiserver:v1.34.1".to_string()));
        assert!(names.contains(&"registry.k8s.io/etcd:3.6.4-0".to_string()));
        assert!(names.contains(&"registry.k8s.io/pause:3.10.1".to_string()));
        assert_eq!(minor("v1.32.0-rc.1").as_deref(), Some("v1.32"));
        assert!(images("v1.99.0").unwrap().is_none());
        assert!(known().len() >= 5);
    }

    /// Issue 39.2c: a version from an image or a release that makes no
    /// tag is bad input, never a panic.
    #[test]
    fn versions_that_make_no_tag_are_refused() {
        for good in [
            "v1.34.1",
            "1.34.1",
            "v1.37.0-rc.1",
            "v1.34.1+abc.1",
            "v1.34.1-alpha.0+a-b",
        ] {
            assert!(crate::domain::kube_version::check(good).is_ok(), "{good}");
            assert_eq!(control_plane(good).unwrap().len(), 4, "{good}");
        }
        let long = format!("v1.34.1-{}", "a".repeat(130));
        for bad in [
            "v1.34.1-rc 1",
            "v1.34.1 ",
            "v1.34",
            "v1.34.1.2",
            "v1.34.x",
            "v1.34.1-",
            "v1.34.1+",
            "v1.34.1-a_b",
            "v1.34.1\n",
            "",
            long.as_str(),
        ] {
            let e = control_plane(bad).unwrap_err();
            assert!(e.0.contains("not a Kubernetes version"), "{bad}: {e}");
            assert!(images(bad).is_err() && missing(bad, &[]).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::primitives::fixed_proptest())]

        /// Whatever text a version file holds, asking for its images
        /// answers (Ok or a bad-input error) and never panics.
        #[test]
        fn any_version_text_answers(v in "\\PC{0,160}") {
            let _ = images(&v);
            let _ = control_plane(&v);
            let _ = missing(&v, &[]);
        }

        #[test]
        fn versions_checked_make_tags(v in "v?[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}(-[a-z0-9.-]{1,40})?(\\+[a-z0-9.-]{1,40})?") {
            proptest::prop_assert!(control_plane(&v).is_ok(), "{}", v);
        }
    }
}
