//! `kiln load`: flags in, [`crate::ops::load`] called, its report out.

use std::path::PathBuf;
use std::time::Instant;

use super::{interruptible, BadInput, JobsArg, JsonArg, PartialFailure, PlatformArgs};
use crate::engine::copy::CopyOptions;
use crate::ops::load::LoadTarget;
use crate::primitives::progress::Progress;
use crate::primitives::text::human_bytes;
use crate::sink::containerd::K8S_NAMESPACE;
use crate::source::archive::ArchiveSource;
use crate::source::AnySource;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["rootfs", "address"]))]
#[command(group = clap::ArgGroup::new("what").required(true).args(["refs", "archives"]))]
pub struct Args {
    /// The node rootfs whose var/lib/containerd receives the images.
    #[arg(long)]
    rootfs: Option<PathBuf>,
    /// A running containerd's socket instead (e.g. /run/containerd/containerd.sock).
    #[arg(long, value_name = "SOCKET")]
    address: Option<PathBuf>,
    /// containerd namespace (with --address).
    #[arg(long, default_value = K8S_NAMESPACE)]
    namespace: String,
    /// `docker save` or OCI image-layout tarballs (gzip allowed), repeatable.
    #[arg(long = "archive", value_name = "FILE", num_args = 1..)]
    archives: Vec<PathBuf>,
    /// Images to fetch from registries.
    #[arg(value_name = "REF")]
    refs: Vec<String>,
    #[command(flatten)]
    platforms: PlatformArgs,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Replace a bundled (pinned) image with a different one of the same name.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    daemon: super::DaemonArgs,
    #[command(flatten)]
    jobs: JobsArg,
    #[command(flatten)]
    cache: super::CacheArgs,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut opts = CopyOptions {
        platforms: args.platforms.get(),
        jobs: args.jobs.jobs,
        cache: args.cache.open()?,
        gate: None,
    };
    // Check every input before touching a store.
    check_namespace(&args.namespace)?;
    if !args.archives.is_empty() && !args.refs.is_empty() {
        return Err(BadInput("give either REFs or --archive, not both".into()).into());
    }
    let (registry, archive) = if args.archives.is_empty() {
        (Some(args.registry.client()?), None)
    } else {
        (
            None,
            Some(ArchiveSource::open(&args.archives).map_err(super::bad_input)?),
        )
    };
    let (source, refs) = match (&registry, &archive) {
        (_, Some(a)) => (AnySource::Archive(a), a.images()),
        (Some(r), None) => {
            let refs = args
                .refs
                .iter()
                .map(|r| super::parse_image("image", r))
                .collect::<Result<Vec<_>, _>>()?;
            (AnySource::Registry(r), refs)
        }
        (None, None) => unreachable!("a registry or an archive source"),
    };
    let target = match (&args.rootfs, &args.address) {
        (Some(rootfs), _) => LoadTarget::Rootfs(rootfs.clone(), args.daemon.choice()),
        (None, Some(socket)) => LoadTarget::Address(socket.clone(), args.namespace.clone()),
        (None, None) => unreachable!("clap requires --rootfs or --address"),
    };
    let progress = Progress::new(!args.json.json, refs.len());
    let report = interruptible(crate::ops::load::load(
        &target,
        &source,
        &refs,
        &opts,
        args.force,
        progress.clone(),
    ))
    .await;
    super::CacheArgs::close(opts.cache.take());
    progress.finish();
    let report = report?;
    if !args.json.print_timed(&report, started)? {
        for f in &report.failed {
            say!("kiln: failed: {}", f.error);
        }
        say!(
            "kiln: loaded {}/{} images (managed, unpinned) in {:.1}s: {} blobs fetched ({}), {} already present",
            report.images.len(),
            refs.len(),
            started.elapsed().as_secs_f64(),
            report.stats.blobs_fetched,
            human_bytes(report.stats.bytes_fetched),
            report.stats.blobs_present
        );
    }
    if !report.failed.is_empty() {
        let names: Vec<&str> = report.failed.iter().map(|f| f.reference.as_str()).collect();
        return Err(PartialFailure(format!(
            "{} of {} images failed ({})",
            names.len(),
            refs.len(),
            names.join(", ")
        ))
        .into());
    }
    Ok(())
}

/// containerd's namespace rule: labels of letters and digits joined by `.`,
/// `_` or `-` (ASCII only; it travels in a gRPC header).
fn check_namespace(ns: &str) -> Result<(), BadInput> {
    let ok = !ns.is_empty()
        && ns.len() <= 76
        && ns
            .split(['.', '_', '-'])
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric()));
    if ok {
        Ok(())
    } else {
        Err(BadInput(format!(
            "--namespace {ns:?}: want ASCII letters and digits, joined by '.', '_' or '-' (e.g. k8s.io)"
        )))
    }
}
