//! A node rootfs: where its store is, which containerd will read it, and
//! which containerd kiln runs to write it. Nothing from the rootfs is
//! executed unless the user says so (`--trust-node-binaries`).

use std::path::{Path, PathBuf};

use crate::adapters::version::Version;
use crate::primitives::inroot::Root;

pub const STORE_DIR: &str = "var/lib/containerd";
pub const CONFIG_DIR: &str = "etc/containerd";
pub const CONFIG_FILE: &str = "etc/containerd/config.toml";
/// containerd's metadata database, under the store directory.
pub const META_DB: &str = "io.containerd.metadata.v1.bolt/meta.db";
pub const OWN_BINARIES: &[&str] = &["usr/local/bin/containerd", "usr/bin/containerd"];

/// The containerd that will run inside the node, if the rootfs has one.
#[derive(Debug, Clone)]
pub struct NodeContainerd {
    /// Its host path, every symlink resolved inside the rootfs.
    pub path: PathBuf,
    /// Read from the file (never by running it); `None` with the reason
    /// when it cannot be read.
    pub version: Result<Version, String>,
}

/// Which containerd writes the store: `--containerd` always wins; the
/// rootfs's own only when the user trusts the image's binaries.
#[derive(Debug, Clone, Default)]
pub struct DaemonChoice {
    pub containerd: Option<PathBuf>,
    pub trust_node_binaries: bool,
    /// Fail at once when another kiln holds the store (`--no-wait`).
    pub no_wait: bool,
}

pub fn node_containerd(root: &Root) -> Option<NodeContainerd> {
    OWN_BINARIES.iter().find_map(|rel| {
        let file = root.open_file(Path::new(rel)).ok()?;
        let real = root
            .resolve(
                Path::new(rel),
                crate::primitives::inroot::Parents::Existing,
                true,
            )
            .ok()?
            .real;
        let version = Version::of_elf(&file).map_err(|e| format!("{e:#}"));
        Some(NodeContainerd {
            path: root.path().join(real),
            version,
        })
    })
}

/// The daemon binary kiln runs: `--containerd`; else, when trusted, the
/// rootfs's own if it runs here; else `containerd` on PATH.
pub fn daemon_binary(
    choice: &DaemonChoice,
    node: Option<&NodeContainerd>,
) -> anyhow::Result<PathBuf> {
    if let Some(p) = &choice.containerd {
        return Ok(p.clone());
    }
    if choice.trust_node_binaries {
        if let Some(n) = node.filter(|n| runs_here(&n.path)) {
            return Ok(n.path.clone());
        }
    }
    if let Some(p) = which("containerd") {
        return Ok(p);
    }
    let hint = match node {
        Some(n) if !choice.trust_node_binaries => format!(
            "; the rootfs's own ({}) is not run unless you pass --trust-node-binaries",
            n.path.display()
        ),
        _ => String::new(),
    };
    anyhow::bail!(
        "no containerd to write the store with: none on PATH{hint}; install containerd{} or pass --containerd PATH",
        node.and_then(|n| n.version.as_ref().ok())
            .map(|v| format!(" {}.x", v.major))
            .unwrap_or_default()
    )
}

/// Whether an ELF binary is for this machine's architecture (read, not run).
pub fn runs_here(path: &Path) -> bool {
    use object::Object;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let cache = object::ReadCache::new(&file);
    let Ok(elf) = object::File::parse(&cache) else {
        return false;
    };
    let host = match std::env::consts::ARCH {
        "x86_64" => object::Architecture::X86_64,
        "aarch64" => object::Architecture::Aarch64,
        "arm" => object::Architecture::Arm,
        "s390x" => object::Architecture::S390x,
        "powerpc64" => object::Architecture::PowerPc64,
        "riscv64" => object::Architecture::Riscv64,
        _ => return false,
    };
    elf.architecture() == host
}

/// `name` in a directory of `PATH`, if any.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
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
        Some(NodeContainerd { path, version: Err(why) }) => Some(format!(
            "cannot read the version of {}: {why}; cannot check that it honours pinned images (needs 1.6.22+/1.7.3+)",
            path.display()
        )),
        Some(NodeContainerd { version: Ok(v), .. }) if !v.honours_pinned_label() => Some(format!(
            "the rootfs's containerd {v} ignores io.cri-containerd.pinned: kubelet may garbage-collect bundled images; upgrade it to 1.6.25+/1.7.10+/2.x"
        )),
        Some(NodeContainerd { version: Ok(v), .. }) if !v.pins_reliably() => Some(format!(
            "the rootfs's containerd {v} pins by label only unreliably (fixed in 1.6.25/1.7.10); upgrade it"
        )),
        _ => None,
    }
}

/// Refuses a store a hostile base could make containerd write or read
/// through: symlinks are allowed only inside snapshot contents
/// (`io.containerd.snapshotter.v1.*/snapshots/ID/...`), where images keep theirs.
pub fn check_store_tree(store: &Path) -> anyhow::Result<()> {
    fn walk(dir: &Path, rel: &Path) -> anyhow::Result<()> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for e in rd {
            let e = e?;
            let rel = rel.join(e.file_name());
            let parts: Vec<_> = rel.components().collect();
            let in_snapshot = parts.len() > 3
                && parts[0]
                    .as_os_str()
                    .to_string_lossy()
                    .starts_with("io.containerd.snapshotter.")
                && parts[1].as_os_str() == "snapshots";
            if in_snapshot {
                continue;
            }
            let ft = e.file_type()?;
            if ft.is_symlink() {
                anyhow::bail!(
                    "the rootfs's /{}/{} is a symlink; a containerd store holds none outside snapshots, and kiln will not let containerd write through one: remove it from the base image",
                    STORE_DIR,
                    rel.display()
                );
            }
            if ft.is_dir() {
                walk(&e.path(), &rel)?;
            } else if !ft.is_file() {
                // A device node here would let containerd (root) write to
                // whatever disk its numbers name; a FIFO or socket hangs it.
                use std::os::unix::fs::{FileTypeExt, MetadataExt};
                let what = if ft.is_block_device() {
                    "a block device"
                } else if ft.is_char_device() {
                    "a character device"
                } else if ft.is_fifo() {
                    "a FIFO"
                } else if ft.is_socket() {
                    "a socket"
                } else {
                    "neither a directory nor a regular file"
                };
                let numbers = if ft.is_block_device() || ft.is_char_device() {
                    let r = e.metadata()?.rdev();
                    format!(" ({}:{})", rustix::fs::major(r), rustix::fs::minor(r))
                } else {
                    String::new()
                };
                return Err(crate::primitives::error::BadInput(format!(
                    "the rootfs's /{}/{} is {what}{numbers}; a containerd store holds only directories and regular files, and kiln will not start containerd on it: remove it",
                    STORE_DIR,
                    rel.display()
                ))
                .into());
            }
        }
        Ok(())
    }
    walk(store, Path::new(""))
}
