//! `kiln load`: user images into a node, managed but never pinned.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::anyhow;
use serde::Serialize;

use super::{interruptible, BadInput, NodeStore, PartialFailure};
use crate::bake::copy_into_store;
use crate::copy::{CopiedImage, CopyOptions, Stats};
use crate::platform::Platform;
use crate::progress::Progress;
use crate::reference::ImageRef;
use crate::sink::containerd::{ContainerdStore, PinPolicy, K8S_NAMESPACE};
use crate::source::archive::ArchiveSource;
use crate::source::{AnySource, Source};
use crate::text::human_bytes;

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
    /// Platforms to load, repeatable (default: linux/<host arch>).
    #[arg(long = "platform", value_name = "OS/ARCH")]
    platforms: Vec<Platform>,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Replace a bundled (pinned) image with a different one of the same name.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    daemon: super::DaemonArgs,
    /// Blob transfers in flight at once.
    #[arg(long, default_value_t = 8)]
    jobs: usize,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    images: Vec<&'a CopiedImage>,
    failed: Vec<(String, String)>,
    stats: Stats,
    seconds: f64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let platforms = if args.platforms.is_empty() {
        vec![Platform::host()]
    } else {
        args.platforms.clone()
    };
    let opts = CopyOptions {
        platforms,
        jobs: args.jobs,
    };
    // Check every input before touching a store.
    check_namespace(&args.namespace)?;
    if !args.archives.is_empty() && !args.refs.is_empty() {
        return Err(BadInput("give either REFs or --archive, not both".into()).into());
    }
    let (registry, archive) = if args.archives.is_empty() {
        (Some(args.registry.source()?), None)
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
                .map(|r| ImageRef::parse(r).map_err(|e| BadInput(e.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            (AnySource::Registry(r), refs)
        }
        (None, None) => unreachable!("a registry or an archive source"),
    };
    load(&args, &source, &refs, &opts, started).await
}

async fn load<S: Source>(
    args: &Args,
    source: &S,
    refs: &[ImageRef],
    opts: &CopyOptions,
    started: Instant,
) -> anyhow::Result<()> {
    let (mut store, node) = match (&args.rootfs, &args.address) {
        (Some(rootfs), _) => {
            let node = NodeStore::open(rootfs, &args.daemon.choice()).await?;
            (node.store.clone(), Some(node))
        }
        (None, Some(socket)) => {
            let channel = containerd_client::connect(socket)
                .await
                .map_err(|e| anyhow!("cannot reach containerd at {}: {e}; is it running, and may you use its socket?", socket.display()))?;
            (ContainerdStore::new(channel, &args.namespace), None)
        }
        (None, None) => unreachable!("clap requires --rootfs or --address"),
    };
    store = store.with_policy(PinPolicy::Unpinned { force: args.force });
    let progress = Progress::new(!args.json, refs.len());
    let outcome = interruptible(async {
        // Ingests are only ours to abort when we run the daemon.
        copy_into_store(
            &mut store,
            node.is_some(),
            source,
            refs,
            opts,
            progress.clone(),
        )
        .await
    })
    .await;
    progress.finish();
    if let Some(node) = node {
        node.close()?;
    }
    let (results, stats) = outcome?;
    let images: Vec<&CopiedImage> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let failed: Vec<(String, String)> = refs
        .iter()
        .zip(&results)
        .filter_map(|(r, res)| {
            res.as_ref()
                .err()
                .map(|e| (r.to_string(), crate::text::one_line(&format!("{e:#}"))))
        })
        .collect();
    let failed_names: Vec<String> = failed.iter().map(|(r, _)| r.clone()).collect();
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&Report {
                images: images.clone(),
                failed,
                stats,
                seconds
            })?
        );
    } else {
        for (_, e) in &failed {
            eprintln!("kiln: failed: {e}");
        }
        eprintln!(
            "kiln: loaded {}/{} images (managed, unpinned) in {:.1}s: {} blobs fetched ({}), {} already present",
            images.len(),
            refs.len(),
            seconds,
            stats.blobs_fetched,
            human_bytes(stats.bytes_fetched),
            stats.blobs_present
        );
    }
    if !failed_names.is_empty() {
        return Err(PartialFailure(format!(
            "{} of {} images failed ({})",
            failed_names.len(),
            refs.len(),
            failed_names.join(", ")
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
