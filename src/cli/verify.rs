//! `kiln verify`: flags in, [`crate::ops::verify`] called, one line per
//! check out (or `--json`); exit 1 names each failed check.

use std::path::PathBuf;

use super::{BadInput, JsonArg, PartialFailure};
use crate::ops::verify::{NodeTarget, VerifyOptions};
use crate::platform::Platform;
use crate::source::archive::ArchiveSource;
use crate::source::AnySource;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("node").required(true).args(["rootfs", "image"]))]
pub struct Args {
    /// An unpacked node rootfs (its store is copied; the rootfs is not touched).
    #[arg(long)]
    rootfs: Option<PathBuf>,
    /// A node image: oci-archive:PATH, docker-archive:PATH, or a registry REF
    /// (unpacked privately).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// The manifest to hold the node to (default: the one kiln recorded in it).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// The platform to check (default: linux/<host arch>).
    #[arg(long = "platform", value_name = "OS/ARCH")]
    platform: Option<Platform>,
    // Which containerd reads the private copy of the store (CRI on):
    // --containerd PATH, else containerd on PATH; the node's own only with
    // --trust-node-binaries (code from the image, run as you).
    #[command(flatten)]
    daemon: super::DaemonArgs,
    /// Also do what kubelet does for static pods, offline: in a network
    /// namespace with only loopback, run a host-network pod sandbox and one
    /// container per control-plane image (etcd, kube-apiserver,
    /// kube-controller-manager, kube-scheduler); each must be running a few
    /// seconds later. Needs root and runc.
    #[arg(long)]
    start: bool,
    /// Also read the node the way `kind create cluster` does: /kind/version,
    /// both CNI template markers, no template field left once PodSubnet is
    /// filled in, the default StorageClass, every image the manifests and
    /// kubeadm run bundled and pinned, kubelet/kubeadm/kubectl 0755 and of
    /// the platform's architecture, kind's entrypoint.
    #[arg(long)]
    kind: bool,
    #[command(flatten)]
    registry: super::RegistryArgs,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let opts = VerifyOptions {
        manifest: args.manifest.clone(),
        platform: args.platform.clone().unwrap_or_else(Platform::host),
        daemon: args.daemon.choice(),
        start: args.start,
        kind: args.kind,
    };
    let registry = args.registry.client()?;
    let archive = match args.image.as_deref().and_then(archive_path) {
        Some(p) => Some(ArchiveSource::open(&[p]).map_err(super::bad_input)?),
        None => None,
    };
    let report = match (&args.rootfs, &args.image, &archive) {
        (Some(dir), _, _) => {
            let target: NodeTarget<'_, AnySource<'_>> = NodeTarget::Rootfs(dir.clone());
            super::interruptible(crate::ops::verify::verify(target, &opts)).await?
        }
        (None, Some(_), Some(a)) => {
            let image = a
                .images()
                .into_iter()
                .next()
                .ok_or_else(|| BadInput("the archive names no image".into()))?;
            let source = AnySource::Archive(a);
            let target = NodeTarget::Image {
                source: &source,
                image,
            };
            super::interruptible(crate::ops::verify::verify(target, &opts)).await?
        }
        (None, Some(r), None) => {
            let image = super::parse_image_or_file(
                "--image",
                r,
                "--image oci-archive:PATH or --image docker-archive:PATH",
            )?;
            let source = AnySource::Registry(&registry);
            let target = NodeTarget::Image {
                source: &source,
                image,
            };
            super::interruptible(crate::ops::verify::verify(target, &opts)).await?
        }
        (None, None, _) => unreachable!("clap: --rootfs or --image"),
    };
    if !args.json.print(&report)? {
        render(&report);
    }
    outcome(&report)
}

/// One line per check (and what it saw or what is wrong), on stderr.
pub(super) fn render(report: &crate::ops::verify::VerifyReport) {
    say!(
        "kiln: verify with containerd {}, {}",
        report.containerd,
        report.platform
    );
    for c in &report.checks {
        say!("  {:<5} {}", if c.ok { "ok" } else { "FAIL" }, c.name);
        for d in &c.details {
            say!("          {d}");
        }
    }
    say!(
        "  note  {} blob files ({}) re-hashed against their names in {:.2}s",
        report.rehashed.blobs,
        crate::text::human_bytes(report.rehashed.bytes),
        report.rehashed.seconds
    );
    for o in &report.pinned_by_others {
        say!("  note  {o} is pinned by someone other than kiln (left as it is)");
    }
    for i in report.images.iter().filter(|i| !i.bundled) {
        say!(
            "  note  {} is not bundled (loaded later); pinned: {}",
            i.repo_tags
                .first()
                .map(String::as_str)
                .unwrap_or("(untagged)"),
            i.pinned
        );
    }
}

/// Exit 1 naming each failed check.
pub(super) fn outcome(report: &crate::ops::verify::VerifyReport) -> anyhow::Result<()> {
    let failed: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    if !failed.is_empty() {
        return Err(PartialFailure(format!(
            "{} of {} checks failed: {}",
            failed.len(),
            report.checks.len(),
            failed.join("; ")
        ))
        .into());
    }
    Ok(())
}

/// `oci-archive:PATH` / `docker-archive:PATH` -> PATH.
pub(super) fn archive_path(s: &str) -> Option<PathBuf> {
    s.strip_prefix("oci-archive:")
        .or_else(|| s.strip_prefix("docker-archive:"))
        .map(PathBuf::from)
}
