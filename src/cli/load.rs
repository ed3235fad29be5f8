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
#[command(group = clap::ArgGroup::new("what").required(true).args(["refs", "archives", "from_docker", "from_podman"]))]
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
    /// Images from Docker's own store (`docker save`, so both of Docker's
    /// image stores work), repeatable.
    #[arg(long = "from-docker", value_name = "IMAGE", num_args = 1..)]
    from_docker: Vec<String>,
    /// Images from podman's own store (`podman save`), repeatable.
    #[arg(long = "from-podman", value_name = "IMAGE", num_args = 1..)]
    from_podman: Vec<String>,
    /// How long a kind node may take to answer one step (probe, records,
    /// labels), or to take the next chunk of an import, in seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 120,
        requires = "kind_cluster"
    )]
    node_timeout: u64,
    /// containerd namespace (with --address).
    #[arg(long, default_value = K8S_NAMESPACE)]
    namespace: String,
    /// `docker save` or OCI image-layout tarballs (gzip allowed), repeatable.
    #[arg(long = "archive", value_name = "FILE", num_args = 1..)]
    archives: Vec<PathBuf>,
    /// Images to fetch from registries; or OCI layouts, as skopeo names
    /// them: `oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]`.
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
        !args.from_podman.is_empty(),
    ];
    if kinds.iter().filter(|k| **k).count() > 1 {
        return Err(BadInput(
            "give one of REFs, --archive, --from-docker or --from-podman, not several".into(),
        )
        .into());
    }
    // Each value an engine is given is a reference, never an option.
    for (flag, values) in [
        ("--from-docker", &args.from_docker),
        ("--from-podman", &args.from_podman),
    ] {
        for v in values {
            if v.starts_with('-') {
                return Err(BadInput(format!("{flag} {v:?}: not an image reference")).into());
            }
            super::parse_image(flag, v)?;
        }
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
    } else if args.provider.is_some() {
        return Err(BadInput("--provider is for --kind-cluster; drop it".into()).into());
    }
    let saved_from = match (args.from_docker.is_empty(), args.from_podman.is_empty()) {
        (false, _) => Some((Provider::Docker, &args.from_docker, "--from-docker")),
        (_, false) => Some((Provider::Podman, &args.from_podman, "--from-podman")),
        _ => None,
    };
    let uses_provider = args.kind_cluster.is_some() || saved_from.is_some();
    let provider = match args.provider {
        Some(p) => p,
        None if uses_provider => Provider::from_env()?,
        None => Provider::Docker,
    };
    // A private directory for `docker save` and the nodes' archives.
    let work = uses_provider
        .then(|| crate::primitives::owned::work_dir("kiln-load-"))
        .transpose()?;
    // OCI layouts named as skopeo names them, each narrowed to its TAG.
    let layouts: Vec<Option<(PathBuf, Option<String>)>> =
        args.refs.iter().map(|r| layout_source(r)).collect();
    if layouts.iter().any(Option::is_some) && layouts.iter().any(Option::is_none) {
        return Err(BadInput(
            "give registry references or OCI layouts (oci:DIR[:TAG], oci-archive:FILE[:TAG]), not both".into(),
        )
        .into());
    }
    let mut archives: Vec<(PathBuf, Option<String>)> =
        args.archives.iter().map(|a| (a.clone(), None)).collect();
    archives.extend(layouts.into_iter().flatten());
    if let (Some(work), Some((engine, images, flag))) = (work.as_ref(), saved_from) {
        let saved = work.path().join("saved.tar");
        let w = crate::primitives::progress::waiting(format!(
            "{} save {}",
            engine.program(),
            images.join(" ")
        ));
        engine.save(images, &saved).await.map_err(|e| {
            if e.is::<crate::primitives::interrupt::Interrupted>() {
                e
            } else {
                BadInput(format!("{flag}: {e:#}")).into()
            }
        })?;
        drop(w);
        archives.push((saved, None));
    }
    let (registry, archive) = if archives.is_empty() {
        (Some(args.registry.client()?), None)
    } else {
        (
            None,
            Some(ArchiveSource::open_selected(&archives).map_err(super::bad_input)?),
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
            steps: crate::adapters::node_provider::Steps {
                step: std::time::Duration::from_secs(args.node_timeout.max(1)),
            },
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
                    "kiln: {}: loaded {} images (managed, unpinned; {}, {} snapshotter){}, {} streamed, in {:.1}s",
                    n.name,
                    n.loaded.len(),
                    n.platform.as_deref().unwrap_or("?"),
                    n.snapshotter.as_deref().unwrap_or("?"),
                    if n.already_there.is_empty() {
                        String::new()
                    } else {
                        format!("; {} already there", n.already_there.len())
                    },
                    human_bytes(n.streamed),
                    n.seconds
                ),
            }
        }
        say!(
            "kiln: kind cluster {}: {}/{} nodes loaded, {}/{} images, in {:.1}s: {} blobs fetched ({}), archives of {}",
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

/// `oci:DIR[:TAG]` or `oci-archive:FILE[:TAG]`, as skopeo names an OCI
/// layout: its path and the name (a `ref.name`: a tag, or a full
/// reference) to take, if any; `None` for anything else. Split at the
/// first colon, as containers/image does (`SplitPathAndImage`; its paths
/// may hold no colon).
fn layout_source(s: &str) -> Option<(PathBuf, Option<String>)> {
    let rest = s
        .strip_prefix("oci-archive:")
        .or_else(|| s.strip_prefix("oci:"))?;
    Some(match rest.split_once(':') {
        Some((path, name)) if !name.is_empty() => (PathBuf::from(path), Some(name.to_string())),
        Some((path, _)) => (PathBuf::from(path), None),
        None => (PathBuf::from(rest), None),
    })
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
