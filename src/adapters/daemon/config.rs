//! The private daemon's config: only the plugins a store needs (GC on
//! request, never on a timer), and with CRI the node's sandbox image, the
//! `native` snapshotter and private CNI paths.

use std::path::Path;

use super::{DaemonOptions, ALWAYS_DISABLED, GC_ON_REQUEST, RUNTIME_PLUGINS};
use crate::adapters::version::Version;

pub(super) fn daemon_config(
    root: &Path,
    dir: &Path,
    socket: &Path,
    opts: &DaemonOptions,
    version: &Version,
) -> String {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    let runtime: &[&str] = if opts.cri { &[] } else { RUNTIME_PLUGINS };
    let disabled = ALWAYS_DISABLED
        .iter()
        .chain(runtime)
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let q = |p: &Path| format!("{:?}", p.display().to_string());
    let mut c = format!(
        "version = 2\nroot = {}\nstate = {}\ndisabled_plugins = [{disabled}]\n\n[grpc]\n  address = {}\n  uid = {uid}\n  gid = {gid}\n\n[ttrpc]\n  address = {}\n  uid = {uid}\n  gid = {gid}\n\n[debug]\n  level = \"info\"\n",
        q(root),
        q(&dir.join("state")),
        q(socket),
        q(&dir.join("t.sock")),
    );
    if opts.cri {
        c.push_str(&cri_config(dir, opts, version));
    } else {
        // kiln's writer: GC runs only when kiln asks for it (a synchronous
        // lease or record deletion), never on its own timer or mutation
        // count. A verified blob renamed into the store is then safe until
        // its record is written, even before any record protects it.
        c.push_str(GC_ON_REQUEST);
    }
    c
}

/// The CRI part of a private daemon's config, for 1.7 (one plugin) or 2.x
/// (images and runtime plugins apart).
fn cri_config(dir: &Path, opts: &DaemonOptions, version: &Version) -> String {
    let q = |p: &Path| format!("{:?}", p.display().to_string());
    let v2 = version.major >= 2;
    let (images, runtime) = if v2 {
        (
            "io.containerd.cri.v1.images",
            "io.containerd.cri.v1.runtime",
        )
    } else {
        ("io.containerd.grpc.v1.cri", "io.containerd.grpc.v1.cri")
    };
    std::fs::create_dir_all(dir.join("cni/bin")).ok();
    std::fs::create_dir_all(dir.join("cni/conf")).ok();
    let mut c = String::new();
    // The runtime plugin's own keys (in 1.7 that one plugin holds them all).
    let mut keys = Vec::new();
    if opts.runc.is_some() {
        // This kernel refuses the sandbox's default oom_score_adj (-998).
        keys.push("restrict_oom_score_adj = true".to_string());
    }
    if let (false, Some(s)) = (v2, &opts.sandbox_image) {
        keys.push(format!("sandbox_image = {s:?}"));
    }
    if !keys.is_empty() {
        c.push_str(&format!(
            "\n[plugins.{runtime:?}]\n  {}\n",
            keys.join("\n  ")
        ));
    }
    if v2 {
        c.push_str(&format!(
            "\n[plugins.{images:?}]\n  snapshotter = \"native\"\n"
        ));
        if let Some(s) = &opts.sandbox_image {
            c.push_str(&format!(
                "\n[plugins.{images:?}.pinned_images]\n  sandbox = {s:?}\n"
            ));
        }
        // 2.x's transfer service (which CRI needs) unpacks with overlayfs
        // by default, and the private daemon has only `native`.
        c.push_str(&format!(
            "\n[[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]\n  platform = {:?}\n  snapshotter = \"native\"\n",
            crate::primitives::platform::Platform::host().to_string()
        ));
    } else {
        c.push_str(&format!(
            "\n[plugins.{images:?}.containerd]\n  snapshotter = \"native\"\n"
        ));
    }
    c.push_str(&format!(
        "\n[plugins.{runtime:?}.cni]\n  bin_dir = {}\n  conf_dir = {}\n",
        q(&dir.join("cni/bin")),
        q(&dir.join("cni/conf"))
    ));
    if let Some(runc) = &opts.runc {
        let table = format!("plugins.{runtime:?}.containerd.runtimes.runc");
        c.push_str(&format!(
            "\n[{table}]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[{table}.options]\n  BinaryName = {}\n",
            q(runc)
        ));
    }
    c
}
