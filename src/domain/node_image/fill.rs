//! The bytes of blobs the bake recorded absent (the previous image's
//! record holds them in a layer) that a layer this build writes holds
//! after all: fetched from the image that has them (verified as they
//! stream, through the cache) and put in place of their stand-ins, so no
//! layer is ever written from a stand-in.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use anyhow::{anyhow, Context};

use super::NodeBuild;
use crate::engine::report::CopiedImage;
use crate::primitives::digest::Digest;
use crate::primitives::oci::{Descriptor, Document};
use crate::primitives::reference::ImageRef;

/// Fetches each blob of `need` and puts it at its place in `rootfs`'s
/// store, replacing its stand-in; `images` are the images the bake stored
/// (their manifests, read back from the store, say which holds which).
pub(super) async fn fill<S: crate::source::Source>(
    rootfs: &Path,
    need: &BTreeSet<Digest>,
    images: &[CopiedImage],
    source: &S,
    spec: &NodeBuild<'_>,
    work: &Path,
) -> anyhow::Result<()> {
    if need.is_empty() {
        return Ok(());
    }
    let root = crate::primitives::inroot::Root::open(rootfs)?;
    let blobs = Path::new(super::plan::BLOBS);
    let mut holder: HashMap<Digest, (ImageRef, Descriptor)> = HashMap::new();
    for image in images {
        let reference = ImageRef::parse(&image.reference)?;
        for m in &image.manifests {
            let Some(bytes) = root.read(&blobs.join(m.hex()))? else {
                continue;
            };
            if let Ok((_, Document::Manifest(m))) = Document::parse(&bytes) {
                for l in m.layers {
                    holder
                        .entry(l.digest.clone())
                        .or_insert((reference.clone(), l));
                }
            }
        }
    }
    let staged = crate::sink::layout::OciLayout::open(&work.join("fill"))?;
    let engine = crate::engine::copy::Engine::new(
        source,
        &staged,
        spec.jobs,
        crate::primitives::progress::Progress::hidden(),
    );
    let opts = crate::engine::copy::CopyOptions::blobs(spec.jobs, spec.cache.clone());
    let fetches = need.iter().map(|d| {
        let (engine, opts, holder) = (&engine, &opts, &holder);
        async move {
            let (image, desc) = holder
                .get(d)
                .ok_or_else(|| anyhow!("{d}: no image of the manifest holds it"))?;
            engine.copy_layer(image, desc, opts).await
        }
    });
    futures_util::future::try_join_all(fetches).await?;
    crate::primitives::blocking::off_runtime(|| -> anyhow::Result<()> {
        for d in need {
            let rel = blobs.join(d.hex());
            let dest = root
                .resolve(&rel, crate::primitives::inroot::Parents::Existing, false)?
                .real;
            let at = rootfs.join(&dest);
            let tmp = at.with_extension("kiln-fill");
            std::fs::copy(staged.blob_path(d), &tmp)
                .with_context(|| format!("putting {d} in place of its stand-in"))?;
            std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o444))?;
            std::fs::rename(&tmp, &at)?;
        }
        Ok(())
    })
}
