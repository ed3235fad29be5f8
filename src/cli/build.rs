//! `kiln build`: a manifest's images into a rootfs's store, pinned.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::{interruptible, BadInput, PartialFailure};
use crate::bake::{bake_rootfs, Baked};
use crate::copy::{CopiedImage, Stats};
use crate::manifest::NodeManifest;
use crate::platform::Platform;
use crate::progress::Progress;
use crate::source::{AnySource, Source};
use crate::text::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// The node manifest (YAML, kind: NodeImageManifest).
    #[arg(long)]
    manifest: PathBuf,
    /// The rootfs whose var/lib/containerd receives the images (created if missing).
    #[arg(long, required_unless_present_any = ["base", "base_archive"], conflicts_with_all = ["base", "base_archive"])]
    rootfs: Option<PathBuf>,
    /// Build a node image from this base image (kindest/base-style) instead of a rootfs.
    #[arg(long, value_name = "REF")]
    base: Option<String>,
    /// The base image from an archive (OCI layout or docker save) instead of a registry.
    #[arg(long, value_name = "PATH")]
    base_archive: Option<PathBuf>,
    /// Where the node image goes: oci-archive:PATH or docker-archive:PATH.
    #[arg(long, value_name = "KIND:PATH")]
    output: Option<String>,
    /// Push the node image to this reference.
    #[arg(long, value_name = "REF")]
    push: Option<String>,
    /// The node image's name in an archive (default: the --push REF, else kiln.local/node:<kubernetesVersion>).
    #[arg(long, value_name = "REF")]
    tag: Option<String>,
    /// Platforms to bundle, repeatable (default: linux/<host arch>).
    #[arg(long = "platform", value_name = "OS/ARCH")]
    platforms: Vec<Platform>,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Take every image from this bundle (kiln bundle) instead of registries:
    /// no network at all.
    #[arg(long, value_name = "PATH.tar")]
    from: Option<PathBuf>,
    /// Refuse manifest entries without an @sha256: digest.
    #[arg(long)]
    require_digests: bool,
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
    rootfs: String,
    images: Vec<&'a CopiedImage>,
    failed: Vec<Failed>,
    stats: Stats,
    seconds: f64,
    /// kiln's own peak resident memory (its containerd not included).
    peak_rss_kib: Option<u64>,
}

#[derive(Serialize)]
struct Failed {
    reference: String,
    error: String,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let manifest = NodeManifest::load(&args.manifest).map_err(|e| BadInput(e.to_string()))?;
    let platforms = if args.platforms.is_empty() {
        vec![Platform::host()]
    } else {
        args.platforms.clone()
    };
    if args.require_digests {
        let unpinned = manifest.unpinned();
        if !unpinned.is_empty() {
            let list: Vec<String> = unpinned
                .iter()
                .map(|(l, i)| format!("line {l}: {i}"))
                .collect();
            return Err(BadInput(format!(
                "{}: --require-digests, but {} has no digest; pin them with kiln lock --write",
                args.manifest.display(),
                list.join(", ")
            ))
            .into());
        }
    }
    let Some(rootfs) = args.rootfs.clone() else {
        return super::node::run(&args.node(), &manifest, platforms, started).await;
    };
    if rootfs.exists() && !rootfs.is_dir() {
        return Err(BadInput(format!("--rootfs {} is not a directory", rootfs.display())).into());
    }
    let bundle = args
        .from
        .as_deref()
        .map(|b| super::open_bundle(b, &manifest.images, &platforms))
        .transpose()?;
    let registry = if bundle.is_none() {
        Some(args.registry.source()?)
    } else {
        None
    };
    let source = match (&bundle, &registry) {
        (Some(b), _) => AnySource::Archive(b),
        (None, Some(r)) => AnySource::Registry(r),
        (None, None) => unreachable!("a registry source when there is no bundle"),
    };
    bake(&args, &rootfs, &manifest, &source, platforms, started).await
}

async fn bake<S: Source>(
    args: &Args,
    rootfs: &std::path::Path,
    manifest: &NodeManifest,
    source: &S,
    platforms: Vec<Platform>,
    started: Instant,
) -> anyhow::Result<()> {
    let progress = Progress::new(!args.json, manifest.images.len());
    let baked = interruptible(bake_rootfs(
        rootfs,
        &args.daemon.choice(),
        source,
        manifest,
        platforms,
        args.jobs,
        progress.clone(),
    ))
    .await;
    progress.finish();
    let Baked { results, stats } = baked?;

    let images: Vec<&CopiedImage> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let failed: Vec<Failed> = manifest
        .images
        .iter()
        .zip(&results)
        .filter_map(|(r, res)| {
            res.as_ref().err().map(|e| Failed {
                reference: r.to_string(),
                error: crate::text::one_line(&format!("{e:#}")),
            })
        })
        .collect();
    let seconds = started.elapsed().as_secs_f64();
    let failed_names: Vec<String> = failed.iter().map(|f| f.reference.clone()).collect();
    if args.json {
        let report = Report {
            rootfs: rootfs.display().to_string(),
            images: images.clone(),
            failed,
            stats,
            seconds,
            peak_rss_kib: crate::progress::peak_rss_kib(),
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for f in failed.iter() {
            eprintln!("kiln: failed: {}", f.error);
        }
        let platforms: std::collections::BTreeSet<&String> =
            images.iter().flat_map(|i| i.platforms.iter()).collect();
        eprintln!(
            "kiln: built {}/{} images ({}) into {} in {:.1}s: {} blobs fetched ({}), {} already present",
            images.len(),
            manifest.images.len(),
            platforms.into_iter().cloned().collect::<Vec<_>>().join(", "),
            rootfs.display(),
            seconds,
            stats.blobs_fetched,
            human_bytes(stats.bytes_fetched),
            stats.blobs_present,
        );
    }
    if !failed_names.is_empty() {
        return Err(PartialFailure(format!(
            "{} of {} images failed ({}); the others are stored and pinned, rerun to complete",
            failed_names.len(),
            manifest.images.len(),
            failed_names.join(", ")
        ))
        .into());
    }
    Ok(())
}

impl Args {
    fn node(&self) -> super::node::NodeArgs {
        super::node::NodeArgs {
            base: self.base.clone(),
            base_archive: self.base_archive.clone(),
            output: self.output.clone(),
            push: self.push.clone(),
            tag: self.tag.clone(),
            from: self.from.clone(),
            registry: self.registry.clone(),
            daemon: self.daemon.clone(),
            jobs: self.jobs,
            json: self.json,
        }
    }
}
