//! The node's `etc/containerd/config.toml`: kiln sets CRI's sandbox image to
//! the manifest's (so the pause image kubelet uses is the pinned one) and
//! keeps every other setting, comment and ordering as it was.

use std::path::Path;

use anyhow::{anyhow, Context};
use toml_edit::{value, DocumentMut, Item, Table, TableLike};

use crate::adapters::version::Version;

/// Sets the sandbox image in `existing` (or a new config) for the given
/// containerd; returns the new text.
pub fn set_sandbox_image(
    existing: Option<&str>,
    sandbox: &str,
    containerd: Option<Version>,
) -> anyhow::Result<String> {
    let mut doc: DocumentMut =
        existing
            .unwrap_or("")
            .parse()
            .map_err(|e: toml_edit::TomlError| {
                anyhow!("{}", crate::primitives::text::one_line(&e.to_string()))
            })?;
    let version = match doc.get("version") {
        Some(v) => v
            .as_integer()
            .ok_or_else(|| anyhow!("`version` is not an integer"))?,
        None if existing.is_some_and(|t| !t.trim().is_empty()) => 1,
        None => {
            // A fresh config in the form the node's containerd reads natively.
            let v = if containerd.is_some_and(|c| c.major >= 2) {
                3
            } else {
                2
            };
            doc.insert("version", value(v));
            v
        }
    };
    let (path, key) = sandbox_location(version);
    let mut table: &mut dyn TableLike = doc.as_table_mut();
    for part in path {
        if !table.contains_key(part) {
            let mut t = Table::new();
            t.set_implicit(true);
            table.insert(part, Item::Table(t));
        }
        table = table
            .get_mut(part)
            .and_then(Item::as_table_like_mut)
            .ok_or_else(|| anyhow!("`{part}` is not a table"))?;
    }
    table.insert(key, value(sandbox));
    Ok(doc.to_string())
}

/// Where a config of this `version` keeps CRI's sandbox image: (tables, key).
fn sandbox_location(version: i64) -> (&'static [&'static str], &'static str) {
    match version {
        1 => (&["plugins", "cri"], "sandbox_image"),
        2 => (&["plugins", "io.containerd.grpc.v1.cri"], "sandbox_image"),
        _ => (
            &["plugins", "io.containerd.cri.v1.images", "pinned_images"],
            "sandbox",
        ),
    }
}

/// The sandbox image a config names, if it names one.
pub fn sandbox_image(text: &str) -> anyhow::Result<Option<String>> {
    let doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        anyhow!("{}", crate::primitives::text::one_line(&e.to_string()))
    })?;
    let version = doc.get("version").and_then(Item::as_integer).unwrap_or(1);
    let (path, key) = sandbox_location(version);
    let mut item: &Item = doc.as_item();
    for part in path {
        match item.get(part) {
            Some(i) => item = i,
            None => return Ok(None),
        }
    }
    Ok(item.get(key).and_then(Item::as_str).map(str::to_string))
}

/// Updates the rootfs's `etc/containerd/config.toml`, through the in-root
/// resolver: `etc/containerd` must be a real directory, and a symlink at
/// `config.toml` is replaced, never written through.
pub fn write_sandbox_image(
    root: &crate::primitives::inroot::Root,
    sandbox: &str,
    containerd: Option<Version>,
) -> anyhow::Result<()> {
    let rel = Path::new(crate::adapters::rootfs::CONFIG_FILE);
    root.owned_dir(Path::new(crate::adapters::rootfs::CONFIG_DIR))?;
    let existing = root
        .read(rel)
        .with_context(|| format!("reading the rootfs's /{}", rel.display()))?
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let text = set_sandbox_image(existing.as_deref(), sandbox, containerd).with_context(|| {
        format!(
            "the rootfs's /{}: cannot set the sandbox image; fix the TOML",
            rel.display()
        )
    })?;
    if existing.as_deref() != Some(text.as_str()) {
        root.write(rel, text.as_bytes(), 0o644)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2: &str = r#"# kind's base config
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  restrict_oom_score_adj = false
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
"#;

    #[test]
    fn merges_version_2_keeping_settings() {
        let out = set_sandbox_image(
            Some(V2),
            "registry.k8s.io/pause:3.10",
            Some(Version::new(1, 7, 24)),
        )
        .unwrap();
        assert!(
            out.starts_with("# kind's base config\nversion = 2"),
            "{out}"
        );
        assert!(
            out.contains(r#"sandbox_image = "registry.k8s.io/pause:3.10""#),
            "{out}"
        );
        assert!(!out.contains("pause:3.9"));
        assert!(
            out.contains("restrict_oom_score_adj = false")
                && out.contains(r#"snapshotter = "overlayfs""#)
        );
        // Idempotent.
        assert_eq!(
            set_sandbox_image(Some(&out), "registry.k8s.io/pause:3.10", None).unwrap(),
            out
        );
    }

    #[test]
    fn version_3_uses_pinned_images() {
        let v3 =
            "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n";
        let out = set_sandbox_image(Some(v3), "registry.k8s.io/pause:3.10", None).unwrap();
        let doc: DocumentMut = out.parse().unwrap();
        assert_eq!(
            doc["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert_eq!(
            doc["plugins"]["io.containerd.cri.v1.runtime"]["enable_selinux"].as_bool(),
            Some(false)
        );
    }

    #[test]
    fn fresh_config_matches_the_daemon() {
        let out = set_sandbox_image(None, "p:1", Some(Version::new(2, 1, 0))).unwrap();
        assert!(
            out.contains("version = 3") && out.contains("pinned_images"),
            "{out}"
        );
        let out = set_sandbox_image(None, "p:1", Some(Version::new(1, 7, 24))).unwrap();
        assert!(
            out.contains("version = 2") && out.contains(r#"sandbox_image = "p:1""#),
            "{out}"
        );
        let v1 = "[plugins.cri]\n  stream_server_port = \"10010\"\n";
        let out = set_sandbox_image(Some(v1), "p:1", None).unwrap();
        assert!(
            out.contains(r#"sandbox_image = "p:1""#) && out.contains("10010"),
            "{out}"
        );
        assert!(set_sandbox_image(Some("version = [\n"), "p:1", None).is_err());
    }
}
