//! `kiln build --base`: the node-image flags, checked and handed to
//! [`crate::ops::node_image`]; its report out.

use std::path::PathBuf;
use std::time::Instant;

use super::{interruptible, BadInput};
use crate::adapters::registry::RegistryClient;
use crate::domain::manifest::NodeManifest;
use crate::ops::node_image::{NodeImageOptions, Output};
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::source::archive::ArchiveSource;
use crate::source::{AnySource, Source};

/// What a node-image build takes from `kiln build`'s flags, which
/// `cli/build.rs` owns and implements this for (so this file needs nothing
/// of that one).
pub(super) trait BuildFlags {
    fn node(&self) -> &NodeArgs;
    fn json(&self) -> bool;
    fn json_arg(&self) -> &super::JsonArg;
    fn daemon(&self) -> &super::DaemonArgs;
    /// `--qemu PATH`.
    fn qemu(&self) -> Option<&std::path::Path>;
    fn jobs(&self) -> usize;
    fn cache(&self) -> &super::CacheArgs;
    fn signatures(&self) -> &super::SignatureArgs;
    /// `--sbom FILE`.
    fn sbom(&self) -> Option<&std::path::Path>;
    /// `--provenance FILE`.
    fn provenance(&self) -> Option<&std::path::Path>;
    fn pin_existing(&self) -> bool;
    fn keep_pinned(&self) -> bool;
    fn verify(&self) -> bool;
    /// `--verify` on what was built, every built platform.
    fn run_verify<S: Source>(
        &self,
        target: crate::ops::verify::NodeTarget<'_, S>,
        platforms: &[String],
        kind: bool,
    ) -> impl std::future::Future<Output = anyhow::Result<()>>;
}

/// The flags only node-image builds take.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NodeArgs {
    #[command(flatten)]
    pub(super) inputs: NodeInputs,
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
    /// With --push: sign the image with this PEM P-256 private key, as
    /// `cosign sign --key` does, after the verify and before the tag. A
    /// later build that follows it trusts its build record only when the
    /// signature verifies under --verify-signatures.
    #[arg(long, value_name = "FILE", requires = "push")]
    sign_key: Option<PathBuf>,
    /// kind's default-cni.yaml / default-storage.yaml from this directory
    /// instead of kiln's own.
    #[arg(long, value_name = "DIR", conflicts_with = "kind_node")]
    kind_manifests: Option<PathBuf>,
    /// How kiln's layer is compressed (default: gzip).
    #[arg(long, value_enum)]
    layer_compression: Option<crate::domain::node_image::Compression>,
    /// Layers of the --previous image this one no longer needs may stay in
    /// place, so the layers after them keep their chain (Docker and
    /// containerd then fetch and unpack only what changed), up to this
    /// percentage of kiln's own layers' bytes (default: 50; 0: none).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(0..=100))]
    keep_previous_layers: Option<u8>,
    #[command(flatten)]
    pub(super) limits: super::LimitArgs,
}

/// A node image's inputs besides its manifest: shared by `build` (which
/// uses them) and `lock` (which locks them).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NodeInputs {
    /// Build a node image from this base image (kindest/base-style) instead of a rootfs.
    #[arg(long, value_name = "REF")]
    pub base: Option<String>,
    /// Build Kubernetes in: a kubernetes-server-linux-ARCH.tar.gz, an https://
    /// URL of one, or a directory holding kubernetes/server/bin/; `{arch}` is
    /// replaced per --platform.
    #[arg(long, value_name = "SRC")]
    pub kubernetes: Option<String>,
    /// The release tarball's SHA-512 (default: read SRC.sha512 beside it).
    #[arg(long, value_name = "HEX", requires = "kubernetes")]
    pub kubernetes_sha512: Option<String>,
    /// kind's own /kind/manifests, byte for byte, from a published
    /// kindest/node of your kind release (REF, oci-archive:PATH or
    /// docker-archive:PATH); the images they run are bundled and pinned.
    /// Only those files are read from it; nothing of it runs.
    #[arg(long, value_name = "IMAGE")]
    pub kind_node: Option<String>,
    /// The node image this one follows (REF, oci-archive:PATH or
    /// docker-archive:PATH): the layers both share keep its order and new
    /// ones go after, so Docker and containerd, which reuse layers by
    /// chain, fetch and unpack only what changed (default: the --push
    /// tag's image, if the registry has one).
    #[arg(long, value_name = "IMAGE")]
    pub previous: Option<String>,
}

impl NodeInputs {
    /// `--kubernetes` as a release spec, not yet checked.
    pub fn release(&self) -> Option<crate::domain::kubernetes::ReleaseSpec> {
        self.kubernetes
            .as_ref()
            .map(|src| crate::domain::kubernetes::ReleaseSpec {
                src: src.clone(),
                sha512: self.kubernetes_sha512.clone(),
                locked: Default::default(),
            })
    }
}

fn parse_output(s: &str) -> Result<Output, BadInput> {
    let out = match s.split_once(':') {
        Some(("oci-archive", p)) if !p.is_empty() => Output::Oci(PathBuf::from(p)),
        Some(("docker-archive", p)) if !p.is_empty() => Output::Docker(PathBuf::from(p)),
        _ => {
            return Err(BadInput(format!(
                "--output {s:?}: want oci-archive:PATH or docker-archive:PATH"
            )))
        }
    };
    let (Output::Oci(p) | Output::Docker(p)) = &out;
    super::check_output_dir("--output", p)?;
    Ok(out)
}

pub async fn run<S: Source>(
    build: &impl BuildFlags,
    manifest: &NodeManifest,
    platforms: Vec<Platform>,
    registry: &RegistryClient,
    images: &S,
    lock: Option<(&crate::domain::lockfile::Lock, &std::path::Path)>,
    started: Instant,
) -> anyhow::Result<()> {
    let args = build.node();
    // It keeps layers of the image this one follows: with none named and
    // no --push tag to default to, it would do nothing.
    if args.keep_previous_layers.is_some() && args.inputs.previous.is_none() && args.push.is_none()
    {
        return Err(BadInput(
            "--keep-previous-layers: there is no previous image to keep layers of; name the image this one follows with --previous, or push with --push (its tag's image is the default)".into(),
        )
        .into());
    }
    let (output, push, tag) = targets(args, &platforms)?;
    // Read before anything is built: a key that cannot sign is bad input.
    let sign_key = args
        .sign_key
        .as_deref()
        .map(crate::domain::signatures::sign::SigningKey::load)
        .transpose()?;
    let base_archive = args
        .base_archive
        .as_deref()
        .map(|a| ArchiveSource::open(&[a.to_path_buf()]).map_err(super::bad_input))
        .transpose()?;
    let base = match (&args.inputs.base, &base_archive) {
        (Some(b), _) => super::parse_image_or_file("--base", b, "--base-archive PATH")?,
        (None, Some(src)) => src.images().into_iter().next().ok_or_else(|| {
            BadInput(format!(
                "{} names no image",
                args.base_archive
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            ))
        })?,
        (None, None) => unreachable!("clap: --base or --base-archive"),
    };
    let base_source = match &base_archive {
        Some(a) => AnySource::Archive(a),
        None => AnySource::Registry(registry),
    };
    let mut kubernetes = args.inputs.release();
    if let Some(k) = &kubernetes {
        k.check_platforms(&platforms).map_err(BadInput)?;
    }
    if let Some(d) = &args.kind_manifests {
        if !d.is_dir() {
            return Err(
                BadInput(format!("--kind-manifests {}: not a directory", d.display())).into(),
            );
        }
    }
    let kind_node_archive = args
        .inputs
        .kind_node
        .as_deref()
        .and_then(super::archive_path)
        .map(|p| ArchiveSource::open(&[p]).map_err(super::bad_input))
        .transpose()?;
    let kind_node = image_at(
        "--kind-node",
        args.inputs.kind_node.as_deref(),
        kind_node_archive.as_ref(),
        registry,
    )?;
    let previous_archive = args
        .inputs
        .previous
        .as_deref()
        .and_then(super::archive_path)
        .map(|p| ArchiveSource::open(&[p]).map_err(super::bad_input))
        .transpose()?;
    let previous = match image_at(
        "--previous",
        args.inputs.previous.as_deref(),
        previous_archive.as_ref(),
        registry,
    )? {
        Some(p) => Some(p),
        // Pushing to a tag: what it names now is the natural predecessor.
        None => push.as_ref().map(|t| crate::ops::node_image::KindNode {
            image: t.clone(),
            source: AnySource::Registry(registry),
        }),
    };
    let mut kind_node = kind_node;
    let mut base = base;
    let named_previous = args.inputs.previous.is_some();
    // A push registry that is down is found before anything is built (the
    // tag's image, followed by default, is read first anyway).
    if let (true, Some(target)) = (named_previous, &push) {
        if let Err(e) = registry.resolve(target).await {
            if e.is::<crate::primitives::error::Unreachable>() {
                return Err(e.context(format!(
                    "the --push registry cannot be reached ({target}): nothing was built; check the registry and the network, then rerun"
                )));
            }
        }
    }
    let mut previous = previous;
    if let Some((lock, path)) = lock {
        super::refuse_drift(
            path,
            lock.drift_inputs(
                Some(&base),
                kind_node.as_ref().map(|k| &k.image),
                named_previous
                    .then(|| previous.as_ref().map(|p| &p.image))
                    .flatten(),
                kubernetes.is_some(),
            ),
        )?;
        base = lock.pin(&base);
        if let Some(k) = &mut kind_node {
            k.image = lock.pin(&k.image);
        }
        if let Some(p) = &mut previous {
            p.image = lock.pin(&p.image);
        }
        if let Some(k) = &mut kubernetes {
            k.locked = lock.releases();
        }
    }
    let progress = Progress::new(!build.json(), manifest.images.len());
    let cache = build.cache().open()?;
    let opts = NodeImageOptions {
        manifest,
        platforms,
        base,
        output,
        push: push.clone(),
        tag,
        registry,
        daemon: build.daemon().choice(),
        qemu: build.qemu().map(std::path::Path::to_path_buf),
        jobs: build.jobs(),
        progress: progress.clone(),
        kubernetes,
        kind_manifests: args.kind_manifests.clone(),
        kind_node,
        previous_named: args.inputs.previous.is_some(),
        previous,
        pin_existing: build.pin_existing(),
        keep_pinned: build.keep_pinned(),
        compression: args.layer_compression.unwrap_or_default(),
        keep_previous: args
            .keep_previous_layers
            .unwrap_or(crate::domain::node_image::KEEP_PREVIOUS),
        limits: args.limits.limits(),
        cache: cache.clone(),
        gate: build.signatures().gate()?,
        attach_sbom: build.sbom().is_some(),
        attach_provenance: build.provenance().is_some(),
    };
    let report = interruptible(crate::ops::node_image::node_image(
        opts,
        &base_source,
        images,
    ))
    .await;
    super::CacheArgs::close(cache);
    progress.finish();
    let report = report?;
    if let Some(path) = build.sbom() {
        super::write_sbom(path, &report.sbom)?;
    }
    if let Some(path) = build.provenance() {
        let platforms: Vec<String> = report
            .platforms
            .iter()
            .map(|p| p.platform.clone())
            .collect();
        let text = crate::domain::provenance::render(&report.sbom, manifest, &platforms);
        super::write_document("--provenance", path, text)?;
    }
    let mut report = report;
    // The verify before the tag: pushed by digest until it holds.
    let verified = if build.verify() {
        let kind = report.kind.iter().any(|k| k.kind_base);
        let platforms: Vec<String> = report
            .platforms
            .iter()
            .map(|p| p.platform.clone())
            .collect();
        match &report.archive {
            Some(path) => {
                let archive = ArchiveSource::open(std::slice::from_ref(path))?;
                let image = archive
                    .images()
                    .into_iter()
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("{} names no image", path.display()))?;
                let source = AnySource::Archive(&archive);
                let target = crate::ops::verify::NodeTarget::Image {
                    source: &source,
                    image,
                };
                build.run_verify(target, &platforms, kind).await
            }
            None => {
                let mut image = ImageRef::parse(&report.name)?;
                image.digest = Some(report.digest.clone());
                let source = AnySource::Registry(registry);
                let target = crate::ops::verify::NodeTarget::Image {
                    source: &source,
                    image,
                };
                build.run_verify(target, &platforms, kind).await
            }
        }
    } else {
        Ok(())
    };
    if let Some(target) = push.as_ref().filter(|_| verified.is_ok()) {
        crate::ops::node_image::publish(registry, target, &mut report, sign_key.as_ref()).await?;
    }
    render(build, &report, started)?;
    if let (Err(_), Some(target)) = (&verified, &push) {
        say!(
            "kiln: {} is pushed by digest only ({}@{}): not signed, not tagged, as the verify did not hold",
            target,
            target.name(),
            report.digest
        );
    }
    verified
}

impl NodeArgs {
    /// The first node-image flag given, if any: with `--rootfs` it would do
    /// nothing, so it is refused rather than ignored.
    pub(super) fn node_only_flag(&self) -> Option<&'static str> {
        [
            ("--output", self.output.is_some()),
            ("--push", self.push.is_some()),
            ("--tag", self.tag.is_some()),
            ("--layer-compression", self.layer_compression.is_some()),
            (
                "--keep-previous-layers",
                self.keep_previous_layers.is_some(),
            ),
            ("--kubernetes", self.inputs.kubernetes.is_some()),
            (
                "--kubernetes-sha512",
                self.inputs.kubernetes_sha512.is_some(),
            ),
            ("--kind-manifests", self.kind_manifests.is_some()),
            ("--kind-node", self.inputs.kind_node.is_some()),
            ("--max-entries", self.limits.max_entries.is_some()),
            ("--max-bytes", self.limits.max_bytes.is_some()),
            ("--max-depth", self.limits.max_depth.is_some()),
        ]
        .into_iter()
        .find_map(|(f, given)| given.then_some(f))
    }
}

/// Where the image goes (`--output`, `--push`) and its name (`--tag`).
fn targets(
    args: &NodeArgs,
    platforms: &[Platform],
) -> anyhow::Result<(Option<Output>, Option<ImageRef>, Option<ImageRef>)> {
    let output = args.output.as_deref().map(parse_output).transpose()?;
    let push = args
        .push
        .as_deref()
        .map(|p| super::parse_image("--push", p))
        .transpose()?;
    if output.is_none() && push.is_none() {
        return Err(BadInput("a node image needs somewhere to go: --output oci-archive:PATH, --output docker-archive:PATH or --push REF".into()).into());
    }
    if matches!(output, Some(Output::Docker(_))) && platforms.len() > 1 {
        return Err(BadInput(
            "docker-archive holds one platform; use oci-archive: or --push for several".into(),
        )
        .into());
    }
    let tag = match (&args.tag, &push) {
        (Some(t), _) => Some(super::parse_image("--tag", t)?),
        (None, Some(p)) => Some(p.clone()),
        (None, None) => None,
    };
    Ok((output, push, tag))
}

use crate::ops::node_image::Published;

fn render(
    build: &impl BuildFlags,
    report: &crate::ops::node_image::NodeImageReport,
    started: Instant,
) -> anyhow::Result<()> {
    build.json_arg().print_timed(report, started)?;
    // Per platform: how many layers kiln added and their bytes.
    let layers: Vec<String> = report
        .platforms
        .iter()
        .map(|p| {
            let mine = report
                .kiln_layers
                .iter()
                .filter(|l| l.platform == p.platform);
            let (n, bytes, cached, reused) = mine.fold((0, 0, 0, 0), |(n, b, c, r), l| {
                (
                    n + 1,
                    b + l.size,
                    c + usize::from(l.cached),
                    r + usize::from(l.reused),
                )
            });
            format!(
                "{n} layers, {}{}{}",
                crate::primitives::text::human_bytes(bytes),
                if cached > 0 {
                    format!(", {cached} from the cache")
                } else {
                    String::new()
                },
                if reused > 0 {
                    format!(", {reused} taken by digest from the previous image")
                } else {
                    String::new()
                }
            )
        })
        .collect();
    for s in &report.removed_kubelet_state {
        say!(
            "kiln: {}: the base's kubelet image-manager state is whited out ({}): {}",
            s.platform,
            s.found.summary(),
            super::KUBELET_STATE_WHY
        );
    }
    for k in &report.kubernetes {
        say!(
            "kiln: {}: Kubernetes {} from {} ({}; {})",
            k.platform,
            k.version,
            k.source,
            k.binaries.join(", "),
            k.images.join(", ")
        );
    }
    if let (Some(p), Some(t)) = (&report.previous, &report.previous_trust) {
        say!("kiln: {}", t.line(p));
    }
    for a in &report.attached {
        say!(
            "kiln: attached {} {} to {} ({})",
            a.artifact_type,
            a.digest.short(),
            report.name,
            match a.index {
                crate::adapters::registry::ReferrerIndex::Api =>
                    "the registry's referrers API lists it",
                crate::adapters::registry::ReferrerIndex::TagSchema =>
                    "listed in the referrers tag schema: the registry has no referrers API",
            }
        );
    }
    for k in &report.kept {
        say!("kiln: {}", k.describe());
    }
    for (i, pinned) in report.pinned_existing.iter().enumerate() {
        say!(
            "kiln: {}: pinned {} images the base already held{}{}",
            report
                .platforms
                .get(i)
                .map(|p| p.platform.as_str())
                .unwrap_or("?"),
            pinned.len(),
            if pinned.is_empty() { "" } else { ": " },
            pinned.join(", ")
        );
    }
    for pins in &report.pins {
        super::render_pins(
            &format!("{}: ", pins.platform),
            &pins.unpinned,
            &pins.kept_pinned,
            &pins.pinned_by_others,
        );
    }
    let p = &report.phases;
    say!(
        "kiln: phases: pull base {:.1}s, extract {:.1}s, bake {:.1}s, pack {:.1}s",
        p.pull_base,
        p.extract,
        p.bake,
        p.pack
    );
    say!(
        "kiln: node image {} {} from {} ({}; kiln's: {}) in {:.1}s: {}",
        report.name,
        report.digest,
        report.base,
        report
            .platforms
            .iter()
            .map(|p| p.platform.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        layers.join(", "),
        started.elapsed().as_secs_f64(),
        report.outputs.join("; ")
    );
    if let Some(Published {
        signed_with: Some(key),
        signature: Some(at),
        ..
    }) = &report.published
    {
        say!("kiln: signed with {key} before tagging: {at} (cosign's format)");
    }
    Ok(())
}

/// An image a flag names (`FLAG`: REF, oci-archive:PATH or
/// docker-archive:PATH, the archive opened by the caller) and where to
/// read it.
fn image_at<'a>(
    flag: &str,
    value: Option<&str>,
    archive: Option<&'a ArchiveSource>,
    registry: &'a RegistryClient,
) -> anyhow::Result<Option<crate::ops::node_image::KindNode<'a>>> {
    Ok(match (value, archive) {
        (Some(_), Some(a)) => Some(crate::ops::node_image::KindNode {
            image: a
                .images()
                .into_iter()
                .next()
                .ok_or_else(|| BadInput(format!("{flag}: the archive names no image")))?,
            source: AnySource::Archive(a),
        }),
        (Some(r), None) => Some(crate::ops::node_image::KindNode {
            image: super::parse_image_or_file(
                flag,
                r,
                &format!("{flag} oci-archive:PATH or docker-archive:PATH"),
            )?,
            source: AnySource::Registry(registry),
        }),
        (None, _) => None,
    })
}
