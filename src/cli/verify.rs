//! `kiln verify`: flags in, [`crate::ops::verify`] called, one line per
//! check out (or `--json`); exit 1 names each failed check.

use std::path::PathBuf;

use super::{BadInput, JsonArg, PartialFailure};
use crate::ops::verify::{NodeTarget, VerifyOptions};
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
    /// Also hold the node to the lock it was built from (kiln lock
    /// --lock-file): the manifest's bytes, each image at its locked digest.
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// The platforms to check, each on its own (default: with --image, every
    /// platform the node image holds; else linux/<host arch>). Another
    /// platform than this machine's: see --qemu.
    #[command(flatten)]
    platforms: super::PlatformArgs,
    #[command(flatten)]
    qemu: super::QemuArg,
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
    limits: super::LimitArgs,
    #[command(flatten)]
    registry: super::RegistryArgs,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let registry = args.registry.client()?;
    let archive = match args.image.as_deref().and_then(archive_path) {
        Some(p) => Some(ArchiveSource::open(&[p]).map_err(super::bad_input)?),
        None => None,
    };
    let lock = super::load_lock(args.lock.as_deref())?;
    // An index is verified platform by platform, every one unless told: a
    // platform left out would be one nobody checked.
    let platforms = match (&args.image, args.platforms.platforms.is_empty()) {
        (Some(_), true) => {
            let (source, image) = image_target(&args, &registry, archive.as_ref())?;
            match crate::ops::verify::image_platforms(&source, &image).await? {
                Some(p) if !p.is_empty() => {
                    if p.len() > 1 {
                        say!(
                            "kiln: {image} holds {}: each is verified on its own",
                            p.iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                    p
                }
                _ => args.platforms.get(),
            }
        }
        _ => args.platforms.get(),
    };
    let mut reports = Vec::new();
    for platform in platforms {
        let opts = VerifyOptions {
            manifest: args.manifest.clone(),
            platform,
            daemon: args.daemon.choice(),
            start: args.start,
            kind: args.kind,
            limits: args.limits.limits(),
            qemu: args.qemu.qemu.clone(),
            lock: lock.clone(),
        };
        reports.push(verify_one(&args, &opts, &registry, archive.as_ref()).await?);
    }
    report_all(args.json.json, true, &reports)
}

/// `--image`'s source and the image in it.
fn image_target<'a>(
    args: &Args,
    registry: &'a crate::adapters::registry::RegistryClient,
    archive: Option<&'a ArchiveSource>,
) -> anyhow::Result<(AnySource<'a>, crate::primitives::reference::ImageRef)> {
    match (&args.image, archive) {
        (_, Some(a)) => {
            let image = a
                .images()
                .into_iter()
                .next()
                .ok_or_else(|| BadInput("the archive names no image".into()))?;
            Ok((AnySource::Archive(a), image))
        }
        (Some(r), None) => {
            let image = super::parse_image_or_file(
                "--image",
                r,
                "--image oci-archive:PATH or --image docker-archive:PATH",
            )?;
            Ok((AnySource::Registry(registry), image))
        }
        (None, None) => unreachable!("--image given"),
    }
}

/// One platform of `verify`.
async fn verify_one(
    args: &Args,
    opts: &VerifyOptions,
    registry: &crate::adapters::registry::RegistryClient,
    archive: Option<&ArchiveSource>,
) -> anyhow::Result<crate::ops::verify::VerifyReport> {
    Ok(match &args.rootfs {
        Some(dir) => {
            let target: NodeTarget<'_, AnySource<'_>> = NodeTarget::Rootfs(dir.clone());
            super::interruptible(crate::ops::verify::verify(target, opts)).await?
        }
        None => {
            let (source, image) = image_target(args, registry, archive)?;
            let target = NodeTarget::Image {
                source: &source,
                image,
            };
            super::interruptible(crate::ops::verify::verify(target, opts)).await?
        }
    })
}

/// The reports out (`--json`: one platform's object, or an array of them
/// for several), then the exit: 1 naming every failed check, else 3 when
/// some check could not run here, else 0.
/// (`build --json --verify` prints the build's report only: `text` false.)
pub(super) fn report_all(
    json: bool,
    text: bool,
    reports: &[crate::ops::verify::VerifyReport],
) -> anyhow::Result<()> {
    if json {
        let text = match reports {
            [one] => serde_json::to_string_pretty(one)?,
            many => serde_json::to_string_pretty(many)?,
        };
        out!("{text}");
    } else if text {
        for r in reports {
            render(r, reports.len() > 1);
        }
    }
    outcome(reports)
}

/// One line per check (and what it saw or what is wrong), on stderr.
fn render(report: &crate::ops::verify::VerifyReport, name_platform: bool) {
    say!(
        "kiln: verify {} with containerd {}",
        report.platform,
        report.containerd
    );
    let platform = if name_platform {
        format!("{} ", report.platform)
    } else {
        String::new()
    };
    for w in &report.warnings {
        say!("  note  {w}");
    }
    for c in &report.checks {
        let status = match (c.ran, c.ok) {
            (false, _) => "--",
            (true, true) => "ok",
            (true, false) => "FAIL",
        };
        say!("  {status:<5} {platform}{}", c.name);
        for d in &c.details {
            say!("          {d}");
        }
    }
    say!(
        "  note  {} blob files ({}) re-hashed against their names in {:.2}s",
        report.rehashed.blobs,
        crate::primitives::text::human_bytes(report.rehashed.bytes),
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

/// Exit 1 naming each failed check (with its platform when several), else
/// exit 3 naming what could not run.
fn outcome(reports: &[crate::ops::verify::VerifyReport]) -> anyhow::Result<()> {
    let named = |r: &crate::ops::verify::VerifyReport, c: &crate::ops::verify::Check| {
        if reports.len() > 1 {
            format!("{}: {}", r.platform, c.name)
        } else {
            c.name.clone()
        }
    };
    let total: usize = reports.iter().map(|r| r.checks.len()).sum();
    let failed: Vec<String> = reports
        .iter()
        .flat_map(|r| r.failed().map(move |c| (r, c)))
        .map(|(r, c)| named(r, c))
        .collect();
    if !failed.is_empty() {
        return Err(PartialFailure(format!(
            "{} of {total} checks failed: {}",
            failed.len(),
            failed.join("; ")
        ))
        .into());
    }
    let not_run: Vec<String> = reports
        .iter()
        .flat_map(|r| r.not_run().map(move |c| (r, c)))
        .map(|(r, c)| format!("{} ({})", c.name, r.platform))
        .collect();
    if !not_run.is_empty() {
        return Err(crate::primitives::error::NotVerified(format!(
            "verified except {} of {total} checks that could not run here: {}",
            not_run.len(),
            not_run.join("; ")
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
