//! What the images a node image is built on and after hold: the base's
//! manifests and depth (checked before anything is fetched), the previous
//! node image's layer order (`--previous`).

use super::*;

/// Refuses a base too deep for kiln's layers and the headroom above them
/// ([`plan::budget`]), from its manifests alone: before any of its layers,
/// or any image, is fetched. Anything else wrong with the base is left to
/// the copy, which says it as it always does.
pub async fn check_base_depth<S: crate::source::Source>(
    source: &S,
    base: &crate::primitives::reference::ImageRef,
    platforms: &[Platform],
) -> anyhow::Result<()> {
    for (_, m) in manifests_of(source, base, platforms).await {
        // Context keeps the BadInput in the chain (exit 2).
        plan::budget(m.layers.len()).with_context(|| format!("base {base}"))?;
    }
    Ok(())
}

/// The layers of the previous node image (`--previous`), by platform, for
/// [`order::arrange`] and [`kept::Keep::choose`]. The `--push` tag's image that cannot
/// be read (not pushed yet) only costs the order; one the user `named`
/// that cannot be read is bad input.
pub async fn previous_layers<S: crate::source::Source>(
    source: &S,
    image: &crate::primitives::reference::ImageRef,
    platforms: &[Platform],
    named: bool,
) -> anyhow::Result<std::collections::HashMap<String, Vec<Descriptor>>> {
    let found = manifests_of(source, image, platforms).await;
    if found.is_empty() {
        if named {
            // Building on as if it were a first build would quietly give up
            // the order the user asked to keep.
            return Err(crate::primitives::error::BadInput(format!(
                "--previous {image}: no node image for {} could be read there; name the image this one follows (as pushed or archived), or leave --previous out",
                platforms.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
            ))
            .into());
        }
        tracing::info!("{image}: no previous node image to keep the layer order of");
    }
    Ok(found
        .into_iter()
        .map(|(p, m)| (p.to_string(), m.layers))
        .collect())
}

/// `image`'s manifest for each of `platforms` it has, each document checked
/// against its digest; what cannot be had is left out.
pub(super) async fn manifests_of<S: crate::source::Source>(
    source: &S,
    image: &crate::primitives::reference::ImageRef,
    platforms: &[Platform],
) -> Vec<(Platform, ImageManifest)> {
    use crate::primitives::oci::Document;
    let Ok(top) = source.resolve(image).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match Document::parse(&top.bytes).map(|d| d.1) {
        Ok(Document::Manifest(m)) if platforms.len() == 1 => out.push((platforms[0].clone(), m)),
        Ok(Document::Index(idx)) => {
            for p in platforms {
                let Some(i) = crate::primitives::oci::select_platform(&idx.manifests, p) else {
                    continue;
                };
                let d = &idx.manifests[i];
                let Ok(bytes) = source.manifest(image, d).await else {
                    continue;
                };
                if Digest::of(&bytes) != d.digest {
                    continue;
                }
                if let Ok((_, Document::Manifest(m))) = Document::parse(&bytes) {
                    out.push((p.clone(), m));
                }
            }
        }
        _ => {}
    }
    out
}

/// The base's manifest for each platform asked for.
pub(super) fn base_manifests(
    layout: &crate::sink::layout::OciLayout,
    base_ref: &crate::primitives::reference::ImageRef,
    base_top: &Descriptor,
    platforms: &[Platform],
) -> anyhow::Result<Vec<(Platform, ImageManifest)>> {
    use crate::primitives::oci::Document;
    let top = read_blob(layout, &base_top.digest)?;
    match Document::parse(&top)
        .map_err(|e| anyhow!("base {base_ref}: {e}"))?
        .1
    {
        Document::Index(idx) => platforms
            .iter()
            .map(|p| {
                let d = crate::primitives::oci::select_platform(&idx.manifests, p)
                    .map(|i| &idx.manifests[i])
                    .ok_or_else(|| anyhow!("base {base_ref} has no {p} image"))?;
                match Document::parse(&read_blob(layout, &d.digest)?)
                    .map_err(|e| anyhow!("{e}"))?
                    .1
                {
                    Document::Manifest(m) => Ok((p.clone(), m)),
                    Document::Index(_) => bail!("base {base_ref}: nested index"),
                }
            })
            .collect(),
        Document::Manifest(m) => {
            if platforms.len() != 1 {
                bail!("base {base_ref} is a single-platform image; build one --platform from it");
            }
            Ok(vec![(platforms[0].clone(), m)])
        }
    }
}
