//! A node rootfs: where its store is, and which containerd will read it.

use std::path::{Path, PathBuf};

use crate::version::Version;

pub const STORE_DIR: &str = "var/lib/containerd";
pub const CONFIG_FILE: &str = "etc/containerd/config.toml";
const OWN_BINARIES: &[&str] = &["usr/local/bin/containerd", "usr/bin/containerd"];

/// The containerd that will run inside the node, if the rootfs has one.
#[derive(Debug, Clone)]
pub struct NodeContainerd {
    pub path: PathBuf,
    /// None when the binary does not run on this host (another architecture).
    pub version: Option<Version>,
}

pub fn node_containerd(rootfs: &Path) -> Option<NodeContainerd> {
    OWN_BINARIES
        .iter()
        .map(|p| rootfs.join(p))
        .find(|p| p.is_file())
        .map(|path| {
            let version = Version::of_binary(&path).ok();
            NodeContainerd { path, version }
        })
}

/// The daemon binary kiln runs: `--containerd`, else the rootfs's own when it
/// runs here, else `containerd` on PATH.
pub fn daemon_binary(
    explicit: Option<&Path>,
    node: Option<&NodeContainerd>,
) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(n) = node.filter(|n| n.version.is_some()) {
        return Ok(n.path.clone());
    }
    which("containerd").ok_or_else(|| {
        anyhow::anyhow!("no containerd to write the store with: the rootfs has none that runs here and none is on PATH; install containerd or pass --containerd PATH")
    })
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A warning about pinning support, if the node's containerd deserves one.
pub fn pinning_warning(node: Option<&NodeContainerd>) -> Option<String> {
    match node {
        None => Some("the rootfs has no containerd (usr/local/bin or usr/bin); cannot check that it honours pinned images (needs 1.6.22+/1.7.3+)".into()),
        Some(NodeContainerd { path, version: None }) => Some(format!(
            "{} does not run on this host; cannot check that it honours pinned images (needs 1.6.22+/1.7.3+)",
            path.display()
        )),
        Some(NodeContainerd { version: Some(v), .. }) if !v.honours_pinned_label() => Some(format!(
            "the rootfs's containerd {v} ignores io.cri-containerd.pinned: kubelet may garbage-collect bundled images; upgrade it to 1.6.25+/1.7.10+/2.x"
        )),
        Some(NodeContainerd { version: Some(v), .. }) if !v.pins_reliably() => Some(format!(
            "the rootfs's containerd {v} pins by label only unreliably (fixed in 1.6.25/1.7.10); upgrade it"
        )),
        _ => None,
    }
}
