//! An image's layers for one platform applied in a private directory: the
//! image copied (every byte verified) into a layout under a work
//! directory, its manifest read, each layer handed to `apply`, which
//! decides what is written and charges it to the limits. `kiln verify
//! --image` and a build's `--kind-node` read images this way.

use std::path::Path;

use anyhow::{anyhow, bail, Context};

use crate::engine::copy::{CopyOptions, Engine};
use crate::primitives::oci::{Document, ImageManifest};
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::layout::OciLayout;
use crate::source::Source;

/// Copies `image`'s `platform` manifest into `work/layout` and calls
/// `apply` with each of its layers' blob, bottom first; `label` names the
/// image in errors (`--kind-node REF`, or the reference). Returns the
/// layout (its config is there) and the manifest.
pub(crate) async fn unpack_image<S: Source>(
    source: &S,
    image: &ImageRef,
    platform: &Platform,
    jobs: usize,
    work: &Path,
    label: &str,
    mut apply: impl FnMut(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<(OciLayout, ImageManifest)> {
    let layout = OciLayout::open(&work.join("layout"))?;
    let copied = Engine::new(source, &layout, jobs, Progress::hidden())
        .copy(
            image,
            &CopyOptions {
                platforms: vec![platform.clone()],
                jobs,
                cache: None,
                gate: None,
                absent: None,
            },
        )
        .await
        .with_context(|| label.to_string())?;
    let manifest = copied
        .manifests
        .first()
        .ok_or_else(|| anyhow!("{label}: no {platform} manifest"))?;
    let Ok((_, Document::Manifest(m))) =
        Document::parse(&std::fs::read(layout.blob_path(manifest))?)
    else {
        bail!("{label}: its {platform} manifest is unreadable");
    };
    for l in &m.layers {
        crate::primitives::blocking::off_runtime(|| apply(&layout.blob_path(&l.digest)))
            .with_context(|| format!("{label}: layer {}", l.digest))?;
    }
    Ok((layout, m))
}
