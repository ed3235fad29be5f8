//! `kiln load`: flags in, [`crate::ops::load`] called, its report out.

use std::path::PathBuf;
use std::time::Instant;

use super::{interruptible, BadInput, JobsArg, JsonArg, PartialFailure, PlatformArgs};
use crate::adapters::node_provider::Provider;
use crate::engine::copy::CopyOptions;
use crate::ops::load::LoadTarget;
use crate::ops::load_cluster::{Cluster, ClusterLoadReport};
use crate::primitives::progress::Progress;
use crate::primitives::text::human_bytes;
use crate::sink::containerd::K8S_NAMESPACE;
use crate::source::archive::ArchiveSource;
use crate::source::AnySource;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["rootfs", "address", "kind_cluster"]))]
#[command(group = clap::ArgGroup::new("what").required(true).args(["refs", "archives", "from_docker"]))]
pub struct Args {
    /// The node rootfs whose var/lib/containerd receives the images.
    #[arg(long)]
    rootfs: Option<PathBuf>,
    /// A running containerd's socket instead (e.g. /run/containerd/containerd.sock).
    #[arg(long, value_name = "SOCKET")]
    address: Option<PathBuf>,
    /// Every node of this running kind cluster instead, through the
    /// provider's exec (docker/podman/nerdctl), all nodes at once.
    #[arg(long, value_name = "NAME")]
    kind_cluster: Option<String>,
    /// Only these nodes of the --kind-cluster (comma-separated names).
    #[arg(
        long,
        value_name = "NODE,...",
        value_delimiter = ',',
        requires = "kind_cluster"
    )]
    nodes: Vec<String>,
    /// The engine the kind nodes run in [default: KIND_EXPERIMENTAL_PROVIDER, else docker].
    #[arg(long, value_enum)]
    provider: Option<Provider>,
    /// Images from the local engine's own store (`docker save`, so both of
    /// Docker's image stores work), repeatable.
    #[arg(long = "from-docker", value_name = "IMAGE", num_args = 1..)]
    from_docker: Vec<String>,
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
        absent: None,
    };
    // Check every input before touching a store.
    check_namespace(&args.namespace)?;
    let kinds = [
        !args.refs.is_empty(),
        !args.archives.is_empty(),
        !args.from_docker.is_empty(),
    ];
    if kinds.iter().filter(|k| **k).count() > 1 {
        return Err(
            BadInput("give one of REFs, --archive or --from-docker, not several".into()).into(),
        );
    }
    // Flags that would otherwise be ignored are refused.
    if args.kind_cluster.is_some() {
        if !args.platforms.platforms.is_empty() {
            return Err(BadInput(
                "--platform with --kind-cluster: each node gets its own platform (uname -m); drop --platform".into(),
            )
            .into());
        }
        if args.namespace != K8S_NAMESPACE {
            return Err(BadInput(format!(
                "--namespace {} with --kind-cluster: kind's nodes load into {K8S_NAMESPACE}, where CRI reads; drop --namespace",
                args.namespace
            ))
            .into());
        }
    } else if args.provider.is_some() && args.from_docker.is_empty() {
        return Err(
            BadInput("--provider is for --kind-cluster or --from-docker; drop it".into()).into(),
        );
    }
    let uses_provider = args.kind_cluster.is_some() || !args.from_docker.is_empty();
    let provider = match args.provider {
        Some(p) => p,
        None if uses_provider => Provider::from_env()?,
        None => Provider::Docker,
    };
    // A private directory for `docker save` and the nodes' archives.
    let work = uses_provider
        .then(|| crate::primitives::owned::work_dir("kiln-load-"))
        .transpose()?;
    let mut archives = args.archives.clone();
    if let Some(work) = work.as_ref().filter(|_| !args.from_docker.is_empty()) {
        let saved = work.path().join("saved.tar");
        let w = crate::primitives::progress::waiting(format!(
            "{} save {}",
            provider.program(),
            args.from_docker.join(" ")
        ));
        provider
            .save(&args.from_docker, &saved)
            .await
            .map_err(|e| BadInput(format!("--from-docker: {e:#}")))?;
        drop(w);
        archives.push(saved);
    }
    let (registry, archive) = if archives.is_empty() {
        (Some(args.registry.client()?), None)
    } else {
        (
            None,
            Some(ArchiveSource::open(&archives).map_err(super::bad_input)?),
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
    if let Some(name) = &args.kind_cluster {
        let cluster = Cluster {
            provider,
            name: name.clone(),
            nodes: args.nodes.clone(),
        };
        let progress = Progress::new(!args.json.json, refs.len());
        let report = interruptible(crate::ops::load_cluster::load_into_cluster(
            &cluster,
            &source,
            &refs,
            &opts,
            args.force,
            progress.clone(),
            work.as_ref().expect("made for --kind-cluster").path(),
        ))
        .await;
        super::CacheArgs::close(opts.cache.take());
        progress.finish();
        return render_cluster(&args, report?, refs.len(), started);
    }
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

/// One line per node, then the totals; exit 1 when an image or a node failed.
fn render_cluster(
    args: &Args,
    report: ClusterLoadReport,
    wanted: usize,
    started: Instant,
) -> anyhow::Result<()> {
    if !args.json.print_timed(&report, started)? {
        for f in &report.failed {
            say!("kiln: failed: {}", f.error);
        }
        for n in &report.nodes {
            match &n.error {
                Some(e) => say!("kiln: failed: {e}"),
                None => say!(
                    "kiln: {}: loaded {} images (managed, unpinned; {}, {} snapshotter) in {:.1}s",
                    n.name,
                    n.loaded.len(),
                    n.platform.as_deref().unwrap_or("?"),
                    n.snapshotter.as_deref().unwrap_or("?"),
                    n.seconds
                ),
            }
        }
        say!(
            "kiln: kind cluster {}: {}/{} nodes loaded, {}/{} images, in {:.1}s: {} blobs fetched ({}), {} streamed to each node",
            report.cluster,
            report.nodes.iter().filter(|n| n.error.is_none()).count(),
            report.nodes.len(),
            report.images.len(),
            wanted,
            started.elapsed().as_secs_f64(),
            report.stats.blobs_fetched,
            human_bytes(report.stats.bytes_fetched),
            human_bytes(report.archive_bytes)
        );
    }
    let bad_nodes: Vec<&str> = report
        .nodes
        .iter()
        .filter(|n| n.error.is_some())
        .map(|n| n.name.as_str())
        .collect();
    if !report.failed.is_empty() || !bad_nodes.is_empty() {
        let mut what = Vec::new();
        if !report.failed.is_empty() {
            what.push(format!("{} of {wanted} images failed", report.failed.len()));
        }
        if !bad_nodes.is_empty() {
            what.push(format!(
                "{} of {} nodes failed ({})",
                bad_nodes.len(),
                report.nodes.len(),
                bad_nodes.join(", ")
            ));
        }
        return Err(PartialFailure(what.join("; ")).into());
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
