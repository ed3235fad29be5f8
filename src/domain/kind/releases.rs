//! kind's addon images per kind release (`manifests/kind-releases.yaml`,
//! read from kind's own source at each tag; built in). The shipped
//! `kind-v1.X.yaml` manifests are held to it by tests/manifests.rs.

use std::collections::BTreeMap;

use serde::Deserialize;

const TABLE: &str = include_str!("../../../manifests/kind-releases.yaml");

/// One kind release's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KindRelease {
    /// The kindest/node version it defaults to.
    pub kubernetes: String,
    pub kindnetd: String,
    pub local_path_provisioner: String,
    pub local_path_helper: String,
    /// kiln's shipped manifests built with its addons: kind's node-image
    /// build adds the same addon images whatever the Kubernetes version
    /// (`pkg/build/nodeimage/buildcontext.go` appends `defaultCNIImages` and
    /// `defaultStorageImages`, constants), so one release serves several minors.
    #[serde(default)]
    pub manifests: Vec<String>,
}

impl KindRelease {
    /// The three addon images, as kind's manifests name them.
    pub fn images(&self) -> [String; 3] {
        [
            format!("docker.io/kindest/kindnetd:{}", self.kindnetd),
            format!(
                "docker.io/kindest/local-path-provisioner:{}",
                self.local_path_provisioner
            ),
            format!(
                "docker.io/kindest/local-path-helper:{}",
                self.local_path_helper
            ),
        ]
    }
}

/// The built-in table, parsed once: kind release (`v0.32`, `main`) → row.
pub fn table() -> &'static BTreeMap<String, KindRelease> {
    static ROWS: std::sync::OnceLock<BTreeMap<String, KindRelease>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| serde_yaml_ng::from_str(TABLE).expect("the built-in kind table parses"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_has_kind_0_29_to_0_32_and_main() {
        let t = super::table();
        for r in ["v0.29", "v0.30", "v0.31", "v0.32", "main"] {
            assert!(t.contains_key(r), "{r}");
        }
        assert_eq!(t["v0.29"].local_path_helper, "v20241212-8ac705d0");
        assert_eq!(t["v0.32"].kubernetes, "v1.36.1");
    }
}
