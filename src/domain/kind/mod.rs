//! kind's node layout: what `kind create cluster` expects in a node image
//! beyond a pinned store: `/kind/version`, the default CNI and storage
//! manifests under `/kind/manifests/`, and (on a kindest/base) the image
//! config kind's own node images carry.

pub mod contract;
pub mod releases;

use std::path::Path;

use anyhow::{anyhow, Context};
use serde::Serialize;

use crate::domain::manifest::NodeManifest;
use crate::primitives::inroot::Root;
use crate::primitives::reference::ImageRef;

/// kindest/base's entrypoint; its presence marks a kind base.
pub const ENTRYPOINT: &str = "usr/local/bin/entrypoint";
pub const VERSION_FILE: &str = "kind/version";
pub const CNI_MANIFEST: &str = "kind/manifests/default-cni.yaml";
pub const STORAGE_MANIFEST: &str = "kind/manifests/default-storage.yaml";

const CNI_TEMPLATE: &str = include_str!("../../../manifests/kind-layout/default-cni.yaml");
const STORAGE_TEMPLATE: &str = include_str!("../../../manifests/kind-layout/default-storage.yaml");

/// What kiln wrote of kind's layout.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindLayout {
    pub kind_base: bool,
    pub version: Option<String>,
    /// `/kind/manifests/*` written, and where each came from.
    pub manifests: Vec<String>,
}

/// Whether the rootfs is a kindest/base (it has kind's entrypoint).
pub fn is_kind_base(root: &Root) -> bool {
    root.open_file(Path::new(ENTRYPOINT)).is_ok()
}

/// The manifest's image whose repository ends in `/name`, if any.
fn image_named<'a>(manifest: &'a NodeManifest, name: &str) -> Option<&'a ImageRef> {
    manifest
        .images
        .iter()
        .find(|i| i.path == name || i.path.ends_with(&format!("/{name}")))
}

/// How an image is written into a pod spec: the name the store records it under.
fn spec_name(i: &ImageRef) -> String {
    i.tagged_name().unwrap_or_else(|| i.to_string())
}

/// Writes `/kind/version` (when a release gave one) and the default CNI and
/// storage manifests: from `overrides` (`--kind-manifests DIR`) where it has
/// them, else kiln's own, naming the manifest's kindnetd and local-path
/// images. A manifest without those images gets no such file.
pub fn write_layout(
    root: &Root,
    manifest: &NodeManifest,
    version: Option<&str>,
    overrides: Option<(&Path, &str)>,
) -> anyhow::Result<KindLayout> {
    let mut done = KindLayout {
        kind_base: is_kind_base(root),
        version: version.map(str::to_string),
        manifests: Vec::new(),
    };
    if let Some(v) = version {
        root.write(Path::new(VERSION_FILE), format!("{v}\n").as_bytes(), 0o644)?;
    }
    let ours = [
        (
            CNI_MANIFEST,
            image_named(manifest, "kindnetd")
                .map(|k| CNI_TEMPLATE.replace("@KINDNETD_IMAGE@", &spec_name(k))),
        ),
        (
            STORAGE_MANIFEST,
            match (
                image_named(manifest, "local-path-provisioner"),
                image_named(manifest, "local-path-helper"),
            ) {
                (Some(p), Some(h)) => Some(
                    STORAGE_TEMPLATE
                        .replace("@PROVISIONER_IMAGE@", &spec_name(p))
                        .replace("@HELPER_IMAGE@", &spec_name(h)),
                ),
                _ => None,
            },
        ),
    ];
    for (rel, own) in ours {
        let file = Path::new(rel).file_name().expect("has a name");
        let given = match overrides {
            Some((dir, label)) => match std::fs::read(dir.join(file)) {
                Ok(b) => Some((b, label)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(anyhow!("{label}: {}: {e}", dir.join(file).display())),
            },
            None => None,
        };
        let (bytes, from) = match (given, own) {
            (Some((b, label)), _) => (b, label.to_string()),
            (None, Some(t)) => (t.into_bytes(), "kiln".to_string()),
            (None, None) => continue,
        };
        root.write(Path::new(rel), &bytes, 0o644)
            .with_context(|| format!("writing /{rel}"))?;
        done.manifests.push(format!("/{rel} ({from})"));
    }
    Ok(done)
}

/// The image config kind's node images carry, applied to a kind base's
/// config: kind's entrypoint running systemd, proxy variables cleared (kind
/// sets them per cluster), the base's STOPSIGNAL and the rest kept.
pub fn node_config(cfg: &mut serde_json::Value) -> anyhow::Result<()> {
    let config = cfg
        .as_object_mut()
        .ok_or_else(|| anyhow!("base image config is not a JSON object"))?
        .entry("config")
        .or_insert_with(|| serde_json::json!({}));
    let config = config
        .as_object_mut()
        .ok_or_else(|| anyhow!("base image config's config is not an object"))?;
    config.insert(
        "Entrypoint".into(),
        serde_json::json!([format!("/{ENTRYPOINT}"), "/sbin/init"]),
    );
    config.remove("Cmd");
    let mut env: Vec<String> = config
        .get("Env")
        .and_then(|e| e.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"] {
        env.retain(|e| e.split('=').next() != Some(var));
        env.push(format!("{var}="));
    }
    config.insert("Env".into(), serde_json::json!(env));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::contract::{self, PATCH_MARKER, TEMPLATE_MARKER};
    use super::*;

    /// kiln's own templates, written for a manifest and then read the way
    /// `kind create cluster` reads them.
    #[test]
    fn kilns_templates_follow_kinds_contract() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let text = "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n  - registry.k8s.io/pause:3.10\n  - docker.io/kindest/kindnetd:v1\n  - docker.io/kindest/local-path-provisioner:v2\n  - docker.io/kindest/local-path-helper:v3\n";
        let m = NodeManifest::parse(Path::new("m.yaml"), text).unwrap();
        let done = write_layout(&root, &m, Some("v1.34.1"), None).unwrap();
        assert_eq!(done.manifests.len(), 2);
        let cni = String::from_utf8(root.read(Path::new(CNI_MANIFEST)).unwrap().unwrap()).unwrap();
        let storage =
            String::from_utf8(root.read(Path::new(STORAGE_MANIFEST)).unwrap().unwrap()).unwrap();
        assert!(cni.contains(&format!("# {TEMPLATE_MARKER}\n")));
        assert!(cni.contains(&format!("# {PATCH_MARKER}\n")));
        let rendered = contract::render_cni(&cni, "10.244.0.0/16").unwrap();
        assert!(!rendered.contains("{{"), "{rendered}");
        assert!(rendered.contains("value: 10.244.0.0/16"));
        // Every document parses; the images they run are the manifest's.
        assert_eq!(
            contract::addon_images(&cni, &storage).unwrap(),
            vec![
                "docker.io/kindest/kindnetd:v1",
                "docker.io/kindest/local-path-helper:v3",
                "docker.io/kindest/local-path-provisioner:v2",
            ]
        );
        // kindnetd as kind ships it: no limits, NRI, system-node-critical.
        let ds: serde_yaml_ng::Value = serde_yaml_ng::Deserializer::from_str(&rendered)
            .map(|d| <serde_yaml_ng::Value as serde::Deserialize>::deserialize(d).unwrap())
            .find(|v| v["kind"].as_str() == Some("DaemonSet"))
            .unwrap();
        let spec = &ds["spec"]["template"]["spec"];
        assert_eq!(
            spec["priorityClassName"].as_str(),
            Some("system-node-critical")
        );
        let c = &spec["containers"][0];
        assert!(c["resources"]["limits"].is_null(), "{c:?}");
        assert!(c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v["mountPath"].as_str() == Some("/var/run/nri")));
        // The helper pod tolerates NoSchedule and NoExecute, as kind's does.
        let cm: serde_yaml_ng::Value = serde_yaml_ng::Deserializer::from_str(&storage)
            .map(|d| <serde_yaml_ng::Value as serde::Deserialize>::deserialize(d).unwrap())
            .find(|v| v["kind"].as_str() == Some("ConfigMap"))
            .unwrap();
        let helper: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(cm["data"]["helperPod.yaml"].as_str().unwrap()).unwrap();
        let effects: Vec<&str> = helper["spec"]["tolerations"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|t| t["effect"].as_str())
            .collect();
        assert_eq!(effects, ["NoSchedule", "NoExecute"]);
        assert_eq!(
            helper["spec"]["priorityClassName"].as_str(),
            Some("system-node-critical")
        );
        // RBAC no broader than kind's: no wildcard verb anywhere, pods only
        // through a namespaced Role.
        assert!(!storage.contains("\"*\""));
        let kindnet_role: serde_yaml_ng::Value = serde_yaml_ng::Deserializer::from_str(&rendered)
            .map(|d| <serde_yaml_ng::Value as serde::Deserialize>::deserialize(d).unwrap())
            .find(|v| v["kind"].as_str() == Some("ClusterRole"))
            .unwrap();
        let verbs: Vec<&str> = kindnet_role["rules"]
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|r| r["verbs"].as_sequence().unwrap())
            .filter_map(|v| v.as_str())
            .collect();
        assert!(
            verbs.iter().all(|v| ["list", "watch", "use"].contains(v)),
            "{verbs:?}"
        );
    }
}
