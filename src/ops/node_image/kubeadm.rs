//! Asking a release's kubeadm for its image list, with the user's consent.

use super::*;

/// What the release's own kubeadm said of its images.
pub(super) enum Asked {
    Listed(Vec<crate::primitives::reference::ImageRef>),
    /// Not asked, or no answer: why, and what would ask it.
    Not(String),
}

/// Asks the release's kubeadm which images it pulls: only with consent to
/// run node binaries (`--trust-node-binaries`), and only a release whose
/// SHA-512 was checked; for another architecture under `qemu-ARCH`. A
/// kubeadm that cannot answer is a warning (the table still applies).
pub(super) fn ask_kubeadm(
    release: &Release,
    platform: &Platform,
    daemon: &DaemonChoice,
    qemu: Option<&Path>,
) -> anyhow::Result<Asked> {
    if !daemon.trust_node_binaries {
        let who = if rustix::process::geteuid().is_root() {
            "run as root: you are root"
        } else {
            "run as you"
        };
        return Ok(Asked::Not(format!(
            "pass --trust-node-binaries to ask the release's own kubeadm ({who})"
        )));
    }
    if release.sha512.is_none() {
        return Ok(Asked::Not(format!(
            "the release's own kubeadm is not run: {} has no SHA-512 checked (give a release tarball)",
            release.src
        )));
    }
    let kubeadm = release.binary("kubeadm");
    let emulator = if crate::adapters::rootfs::runs_here(&kubeadm) {
        None
    } else {
        match crate::adapters::daemon::find_qemu(platform, qemu) {
            Ok(q) => Some(q),
            Err(why) => return Ok(Asked::Not(format!("its kubeadm is not run: {why}"))),
        }
    };
    let answer = crate::primitives::blocking::off_runtime(|| {
        crate::adapters::kubeadm::images_list(&kubeadm, emulator.as_deref(), &release.version)
    });
    match answer {
        Ok(names) => Ok(Asked::Listed(crate::domain::kubeadm::listed(
            &release.version,
            &names,
        )?)),
        Err(why) => {
            tracing::warn!("asking the release's kubeadm: {why}");
            Ok(Asked::Not(format!("its kubeadm gave no answer ({why})")))
        }
    }
}
