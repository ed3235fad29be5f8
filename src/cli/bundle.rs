//! `kiln bundle`: flags in, [`crate::ops::bundle`] called, its report out.

use std::path::PathBuf;
use std::time::Instant;

use super::{interruptible, JobsArg, JsonArg, ManifestArg, PartialFailure, PlatformArgs};
use crate::engine::copy::CopyOptions;
use crate::primitives::progress::Progress;
use crate::primitives::text::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    manifest: ManifestArg,
    /// The bundle to write (an OCI image-layout tar).
    #[arg(long, value_name = "PATH.tar")]
    output: PathBuf,
    #[command(flatten)]
    platforms: PlatformArgs,
    #[command(flatten)]
    registry: super::RegistryArgs,
    #[command(flatten)]
    jobs: JobsArg,
    #[command(flatten)]
    cache: super::CacheArgs,
    #[command(flatten)]
    signatures: super::SignatureArgs,
    /// Leave out every layer this earlier bundle holds: a differential
    /// bundle, built from with --from NEW --from OLD.
    #[arg(long, value_name = "OLD.tar")]
    since: Option<PathBuf>,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let manifest = args.manifest.load()?;
    super::check_output_dir("--output", &args.output)?;
    let registry = args.registry.client()?;
    let mut opts = CopyOptions {
        platforms: args.platforms.get(),
        jobs: args.jobs.jobs,
        cache: args.cache.open()?,
        gate: args.signatures.gate()?,
        absent: None,
    };
    // The earlier bundle, refused before anything is fetched unless it is
    // an OCI layout (a bundle) kiln can name by its index.
    let old = args
        .since
        .as_ref()
        .map(|p| {
            let archive = crate::source::archive::ArchiveSource::open(std::slice::from_ref(p))
                .map_err(|e| super::BadInput(format!("--since {}: {e:#}", p.display())))?;
            let index = archive.index_digest(0).ok_or_else(|| {
                super::BadInput(format!(
                    "--since {}: not a bundle (no OCI index.json); give the bundle kiln bundle wrote",
                    p.display()
                ))
            })?;
            Ok::<_, super::BadInput>((archive, index))
        })
        .transpose()?;
    let progress = Progress::new(!args.json.json, manifest.images.len());
    let report = interruptible(crate::ops::bundle::bundle(
        &registry,
        &manifest,
        &opts,
        &args.output,
        progress.clone(),
        args.since
            .as_deref()
            .zip(old.as_ref())
            .map(|(path, (archive, index))| crate::ops::bundle::Earlier {
                path,
                archive,
                index: index.clone(),
            }),
    ))
    .await;
    super::CacheArgs::close(opts.cache.take());
    progress.finish();
    let report = report?;
    if !args.json.print(&report)? {
        for f in &report.failed {
            say!("kiln: failed: {}", f.error);
        }
        if report.output.is_some() {
            say!(
                "kiln: bundled {} images into {} ({}) in {:.1}s: {} blobs fetched ({})",
                report.images.len(),
                args.output.display(),
                human_bytes(report.size),
                started.elapsed().as_secs_f64(),
                report.stats.blobs_fetched,
                human_bytes(report.stats.bytes_fetched)
            );
            if let Some(s) = &report.since {
                say!(
                    "kiln: differential: {} layers ({}) left to {}; build with --from {} --from {}",
                    s.layers_left_out,
                    human_bytes(s.bytes_left_out),
                    s.bundle,
                    args.output.display(),
                    s.bundle
                );
            }
            if args.signatures.verify_signatures.is_some() {
                say!(
                    "kiln: signatures checked; {} signature manifests carried for build --from --verify-signatures",
                    report.signatures
                );
            }
        }
    }
    if let Some(staging) = &report.staging {
        return Err(PartialFailure(format!(
            "{} of {} images failed; no bundle written (fetched blobs stay in {staging} for the next run)",
            report.failed.len(),
            manifest.images.len(),
        ))
        .into());
    }
    Ok(())
}
