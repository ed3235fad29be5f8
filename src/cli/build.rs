//! `kiln build`: flags in, [`crate::ops::build`] (a rootfs) or
//! [`crate::ops::node_image`] (a node image from a base) called, the report out.

use std::path::PathBuf;
use std::time::Instant;

use super::node::BuildFlags as _;
use super::{
    interruptible, BadInput, DaemonArgs, JobsArg, JsonArg, ManifestArg, PartialFailure,
    PlatformArgs,
};
use crate::primitives::progress::Progress;
use crate::primitives::text::human_bytes;
use crate::source::AnySource;

#[derive(clap::Args)]
#[command(
    override_usage = "kiln build --manifest FILE --rootfs DIR [OPTIONS]\n       kiln build --manifest FILE (--base REF | --base-archive PATH) (--output KIND:PATH | --push REF) [OPTIONS]"
)]
pub struct Args {
    #[command(flatten)]
    manifest: ManifestArg,
    /// The rootfs whose var/lib/containerd receives the images (created if missing).
    #[arg(long, required_unless_present_any = ["base", "base_archive"], conflicts_with_all = ["base", "base_archive"])]
    rootfs: Option<PathBuf>,
    #[command(flatten)]
    pub(super) node: super::node::NodeArgs,
    #[command(flatten)]
    platforms: PlatformArgs,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Take every image from this bundle (kiln bundle) instead of registries:
    /// no network at all. Repeat it for a differential bundle (kiln bundle
    /// --since) and the bundle it was made against.
    #[arg(long, value_name = "PATH.tar")]
    from: Vec<PathBuf>,
    /// Refuse manifest entries without an @sha256: digest.
    #[arg(long)]
    require_digests: bool,
    /// Build exactly what this lock (kiln lock --lock-file) holds: refused,
    /// naming each, if the manifest, an image, the base, a release, the
    /// kindest/node or kiln itself differs from it.
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Write an SPDX 2.3 JSON SBOM of the build to FILE: the base image,
    /// every bundled image (digest, platforms, pinned or not), the
    /// Kubernetes release and its binaries (SHA-256), the containerd the
    /// store was written for. The same inputs give the same bytes.
    #[arg(long, value_name = "FILE")]
    sbom: Option<PathBuf>,
    /// Write the node image's provenance to FILE: an in-toto statement
    /// with a SLSA provenance v1 predicate (kiln's version; the manifest,
    /// base, images and release it was built from, with their digests).
    #[arg(long, value_name = "FILE", conflicts_with = "rootfs")]
    provenance: Option<PathBuf>,
    /// Pin every image already in the store too (a base that is a node
    /// image, e.g. kindest/node, whose images kind left unpinned).
    #[arg(long)]
    pin_existing: bool,
    /// Keep kiln's pins on images the manifest no longer names (dropped
    /// entries, old digests of moved tags, a base's pins); by default they
    /// are unpinned (never deleted) so exactly the manifest stays pinned.
    #[arg(long)]
    keep_pinned: bool,
    /// Before reporting success, run `kiln verify` on what was built (with
    /// --start when root and runc are there).
    #[arg(long)]
    verify: bool,
    #[command(flatten)]
    qemu: super::QemuArg,
    #[command(flatten)]
    daemon: DaemonArgs,
    #[command(flatten)]
    jobs: JobsArg,
    #[command(flatten)]
    cache: super::CacheArgs,
    #[command(flatten)]
    signatures: super::SignatureArgs,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let manifest = args.manifest.load()?;
    let platforms = args.platforms.get();
    if args.require_digests {
        let unpinned = manifest.unpinned();
        if !unpinned.is_empty() {
            let list: Vec<String> = unpinned
                .iter()
                .map(|(l, i)| format!("line {l}: {i}"))
                .collect();
            return Err(BadInput(format!(
                "{}: --require-digests, but {} has no digest; pin them with kiln lock --write",
                args.manifest.manifest.display(),
                list.join(", ")
            ))
            .into());
        }
    }
    let lock = super::load_lock(args.lock.as_deref())?;
    let manifest = match &lock {
        Some(l) => {
            let path = args.lock.as_deref().expect("loaded from it");
            super::refuse_drift(path, l.drift(&manifest))?;
            if args.rootfs.is_some() {
                super::refuse_drift(path, l.drift_inputs(None, None, None, false))?;
            }
            let mut pinned = manifest;
            pinned.images = pinned.images.iter().map(|i| l.pin(i)).collect();
            pinned
        }
        None => manifest,
    };
    let registry = args.registry.client()?;
    let bundle = (!args.from.is_empty())
        .then(|| super::open_bundle(&args.from, &manifest.images, &platforms))
        .transpose()?;
    let source = match &bundle {
        Some(b) => AnySource::Archive(b),
        None => AnySource::Registry(&registry),
    };
    if args.rootfs.is_some() {
        if let Some(flag) = args.node.node_only_flag() {
            return Err(BadInput(format!(
                "{flag} is for node images (--base or --base-archive); a --rootfs build writes into the rootfs only: drop {flag}, or build a node image"
            ))
            .into());
        }
    }
    let Some(rootfs) = args.rootfs.clone() else {
        let lock = lock.as_ref().zip(args.lock.as_deref());
        return super::node::run(
            &args, &manifest, platforms, &registry, &source, lock, started,
        )
        .await;
    };
    if rootfs.exists() && !rootfs.is_dir() {
        return Err(BadInput(format!("--rootfs {} is not a directory", rootfs.display())).into());
    }
    let progress = Progress::new(!args.json.json, manifest.images.len());
    let cache = args.cache.open()?;
    let report = interruptible(crate::ops::build::build_rootfs(
        &rootfs,
        &source,
        crate::ops::build::BuildSpec {
            choice: &args.daemon.choice(),
            manifest: &manifest,
            platforms,
            jobs: args.jobs.jobs,
            progress: progress.clone(),
            pin_existing: args.pin_existing,
            keep_pinned: args.keep_pinned,
            from_base: false,
            cache: cache.clone(),
            gate: args.signatures.gate()?,
            node: None,
            absent: None,
        },
    ))
    .await;
    super::CacheArgs::close(cache);
    progress.finish();
    let report = report?;
    if let Some(path) = &args.sbom {
        // Named by what built it (the manifest's bytes), never by where it
        // went: a local path has no place in a document that is shipped,
        // and the same inputs must give the same bytes anywhere.
        let sbom = crate::domain::sbom::Sbom {
            subject: format!(
                "a node rootfs from the manifest {}",
                crate::primitives::digest::Digest::of(manifest.text.as_bytes())
            ),
            images: report.sbom_images(&manifest),
            containerd: Some(report.containerd.clone()),
            ..Default::default()
        };
        super::write_sbom(path, &sbom)?;
    }
    if !args.json.print_timed(&report, started)? {
        for f in &report.failed {
            say!("kiln: failed: {}", f.error);
        }
        super::render_pins(
            "",
            &report.unpinned,
            &report.kept_pinned,
            &report.pinned_by_others,
        );
        if let Some(f) = &report.removed_kubelet_state {
            say!(
                "kiln: removed the kubelet's image-manager state ({}): {}",
                f.summary(),
                super::KUBELET_STATE_WHY
            );
        }
        if !report.pinned_existing.is_empty() {
            say!(
                "kiln: pinned {} images the store already held: {}",
                report.pinned_existing.len(),
                report.pinned_existing.join(", ")
            );
        }
        let platforms: std::collections::BTreeSet<&String> = report
            .images
            .iter()
            .flat_map(|i| i.platforms.iter())
            .collect();
        // Only what is true: no platform list when nothing was stored.
        let platforms = platforms.into_iter().cloned().collect::<Vec<_>>();
        let platforms = if platforms.is_empty() {
            String::new()
        } else {
            format!(" ({})", platforms.join(", "))
        };
        say!(
            "kiln: built {}/{} images{} into {} in {:.1}s: {} blobs fetched ({}), {} already present",
            report.images.len(),
            manifest.images.len(),
            platforms,
            rootfs.display(),
            started.elapsed().as_secs_f64(),
            report.stats.blobs_fetched,
            human_bytes(report.stats.bytes_fetched),
            report.stats.blobs_present,
        );
    }
    if !report.failed.is_empty() {
        let names: Vec<&str> = report.failed.iter().map(|f| f.reference.as_str()).collect();
        let (count, names) = (
            format!("{} of {} images", names.len(), manifest.images.len()),
            names.join(", "),
        );
        let kept = if report.images.is_empty() {
            "none was stored"
        } else {
            "the others are stored and pinned"
        };
        // A tag or digest that is nowhere is the manifest's fault: a rerun
        // would fail the same way.
        if report.failed.iter().all(|f| f.not_found) {
            return Err(BadInput(format!(
                "{count} do not exist where kiln looked ({names}); {kept}; fix the manifest (or the mirror), then rerun"
            ))
            .into());
        }
        let rest = if report.images.is_empty() {
            "fix what the lines above name, then rerun"
        } else {
            "rerun to complete"
        };
        return Err(PartialFailure(format!("{count} failed ({names}); {kept}; {rest}")).into());
    }
    if args.verify {
        let target: crate::ops::verify::NodeTarget<'_, AnySource<'_>> =
            crate::ops::verify::NodeTarget::Rootfs(rootfs.clone());
        let platforms = report
            .images
            .first()
            .map(|i| i.platforms.clone())
            .unwrap_or_default();
        // A kind node (kind's entrypoint and /kind/version) is also held to
        // kind's contract.
        let kind = crate::primitives::inroot::Root::open(&rootfs).is_ok_and(|r| {
            crate::domain::kind::is_kind_base(&r)
                && r.read(std::path::Path::new(crate::domain::kind::VERSION_FILE))
                    .is_ok_and(|v| v.is_some())
        });
        args.run_verify(target, &platforms, kind).await?;
    }
    Ok(())
}

impl super::node::BuildFlags for Args {
    /// `--verify`: each built platform on its own (a foreign one's CRI view
    /// under emulation, see [`crate::ops::verify`]); `--start` only where
    /// it can run (root, runc, this machine's platform).
    async fn run_verify<S: crate::source::Source>(
        &self,
        target: crate::ops::verify::NodeTarget<'_, S>,
        platforms: &[String],
        kind: bool,
    ) -> anyhow::Result<()> {
        // A node image records the manifest it was built from, completed
        // (a release's control-plane images added): verify holds it to that.
        let manifest = match target {
            crate::ops::verify::NodeTarget::Rootfs(_) => Some(self.manifest.manifest.clone()),
            crate::ops::verify::NodeTarget::Image { .. } => None,
        };
        let mut platforms: Vec<crate::primitives::platform::Platform> =
            platforms.iter().filter_map(|p| p.parse().ok()).collect();
        if platforms.is_empty() {
            platforms.push(crate::primitives::platform::Platform::host());
        }
        // The lock the build was held to; unreadable now is an error, not
        // a verify that silently skips it.
        let lock = super::load_lock(self.lock.as_deref())?;
        let mut reports = Vec::new();
        for platform in platforms {
            let opts = crate::ops::verify::VerifyOptions {
                manifest: manifest.clone(),
                start: crate::ops::verify::can_start() && platform.runs_on_host(),
                platform,
                daemon: self.daemon.choice(),
                kind,
                limits: self.node.limits.limits(),
                qemu: self.qemu.qemu.clone(),
                lock: lock.clone(),
            };
            let target = target.clone();
            reports.push(interruptible(crate::ops::verify::verify(target, &opts)).await?);
        }
        super::verify::report_all(false, !self.json.json, &reports)
    }

    fn node(&self) -> &super::node::NodeArgs {
        &self.node
    }

    fn pin_existing(&self) -> bool {
        self.pin_existing
    }

    fn keep_pinned(&self) -> bool {
        self.keep_pinned
    }

    fn verify(&self) -> bool {
        self.verify
    }

    fn daemon(&self) -> &DaemonArgs {
        &self.daemon
    }
    fn qemu(&self) -> Option<&std::path::Path> {
        self.qemu.qemu.as_deref()
    }
    fn jobs(&self) -> usize {
        self.jobs.jobs
    }
    fn cache(&self) -> &super::CacheArgs {
        &self.cache
    }
    fn signatures(&self) -> &super::SignatureArgs {
        &self.signatures
    }
    fn sbom(&self) -> Option<&std::path::Path> {
        self.sbom.as_deref()
    }
    fn provenance(&self) -> Option<&std::path::Path> {
        self.provenance.as_deref()
    }
    fn json(&self) -> bool {
        self.json.json
    }
    fn json_arg(&self) -> &JsonArg {
        &self.json
    }
}
