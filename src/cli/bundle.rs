//! `kiln bundle`: a manifest's images in one OCI image-layout tarball, for
//! air-gapped builds (`kiln build --from`) and `ctr images import`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::{interruptible, BadInput, PartialFailure};
use crate::copy::{CopyOptions, Engine};
use crate::layout::OciLayout;
use crate::manifest::NodeManifest;
use crate::platform::Platform;
use crate::progress::Progress;
use crate::text::human_bytes;

/// Where the node manifest travels inside a bundle.
pub const MANIFEST_IN_BUNDLE: &str = "kiln/manifest.yaml";

#[derive(clap::Args)]
pub struct Args {
    /// The node manifest (YAML, kind: NodeImageManifest).
    #[arg(long)]
    manifest: PathBuf,
    /// The bundle to write (an OCI image-layout tar).
    #[arg(long, value_name = "PATH.tar")]
    output: PathBuf,
    /// Platforms to bundle, repeatable (default: linux/<host arch>).
    #[arg(long = "platform", value_name = "OS/ARCH")]
    platforms: Vec<Platform>,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Blob transfers in flight at once.
    #[arg(long, default_value_t = 8)]
    jobs: usize,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let manifest = NodeManifest::load(&args.manifest).map_err(|e| BadInput(e.to_string()))?;
    let platforms = if args.platforms.is_empty() {
        vec![Platform::host()]
    } else {
        args.platforms.clone()
    };
    let source = args.registry.source()?;
    // Blobs stage next to the output; a rerun after a failure reuses them.
    let staging = PathBuf::from(format!("{}.kiln-staging", args.output.display()));
    let layout = OciLayout::open(&staging)?;
    let progress = Progress::new(true, manifest.images.len());
    let opts = CopyOptions {
        platforms,
        jobs: args.jobs,
    };
    let engine = Engine::new(&source, &layout, args.jobs, progress.clone());
    let results = interruptible(async { Ok(engine.copy_all(&manifest.images, &opts).await) }).await;
    progress.finish();
    let results = results?;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|e| crate::text::one_line(&format!("{e:#}")))
        .collect();
    for f in &failed {
        eprintln!("kiln: failed: {f}");
    }
    if !failed.is_empty() {
        return Err(PartialFailure(format!(
            "{} of {} images failed; no bundle written (fetched blobs stay in {} for the next run)",
            failed.len(),
            manifest.images.len(),
            staging.display()
        ))
        .into());
    }
    layout.write_index()?;
    layout.add_file(MANIFEST_IN_BUNDLE, manifest.text.as_bytes())?;
    let size = layout
        .pack(&args.output, &[MANIFEST_IN_BUNDLE])
        .with_context(|| format!("writing {}", args.output.display()))?;
    std::fs::remove_dir_all(&staging).ok();
    let stats = engine.stats();
    eprintln!(
        "kiln: bundled {} images into {} ({}) in {:.1}s: {} blobs fetched ({})",
        manifest.images.len(),
        args.output.display(),
        human_bytes(size),
        started.elapsed().as_secs_f64(),
        stats.blobs_fetched,
        human_bytes(stats.bytes_fetched)
    );
    Ok(())
}
