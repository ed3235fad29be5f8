//! Whether an image is whole in a store: the one walk that `kiln build`,
//! `kiln load` and node images run before they report success, and that
//! `kiln inspect` reports as "complete". Top → manifests → config → layers,
//! each present, and (in a store with GC) each kept by a label on its parent.

use anyhow::anyhow;

use crate::primitives::digest::Digest;
use crate::primitives::oci::{Descriptor, Document, ImageConfigPlatform, ImageManifest};
use crate::sink::Sink;

/// Which manifests of an index the walk follows.
#[derive(Debug, Clone, Copy)]
pub enum Select<'a> {
    /// Those present in the store (inspect: whatever was stored must be whole).
    Present,
    /// Exactly these (the platforms a command copied).
    Only(&'a [Digest]),
}

/// A blob the image needs that the store lacks or does not keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hole {
    pub digest: Digest,
    /// "index", "manifest", "config" or "layer".
    pub what: &'static str,
    /// Present, but no GC label on its parent keeps it: the next GC deletes it.
    pub unkept: bool,
}

impl std::fmt::Display for Hole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.unkept {
            write!(
                f,
                "{} {} is not kept by its parent's GC labels",
                self.what, self.digest
            )
        } else {
            write!(f, "{} {} is missing", self.what, self.digest)
        }
    }
}

#[derive(Debug, Default)]
pub struct Walk {
    /// Every manifest followed, with its platform (from its config) and whether it is whole.
    pub manifests: Vec<(Digest, Option<String>, bool)>,
    pub holes: Vec<Hole>,
    /// Bytes present for what was followed.
    pub size: u64,
}

impl Walk {
    /// Something was followed and nothing is missing or unkept.
    pub fn complete(&self) -> bool {
        self.holes.is_empty() && !self.manifests.is_empty()
    }

    /// Platforms whose manifest, config and layers are all there and kept.
    pub fn platforms(&self) -> Vec<String> {
        self.manifests
            .iter()
            .filter(|(_, _, whole)| *whole)
            .filter_map(|(_, p, _)| p.clone())
            .collect()
    }
}

/// Walks `top`'s closure in `sink`.
pub async fn walk<K: Sink>(sink: &K, top: &Descriptor, select: Select<'_>) -> anyhow::Result<Walk> {
    let mut w = Walk::default();
    let Some(bytes) = present_doc(sink, top).await? else {
        let what = if crate::primitives::oci::media::is_index(&top.media_type) {
            "index"
        } else {
            "manifest"
        };
        w.holes.push(hole(top, what, false));
        return Ok(w);
    };
    w.size += top.size;
    let (_, doc) = Document::parse(&bytes).map_err(|e| anyhow!("{}: {e}", top.digest))?;
    match doc {
        Document::Manifest(m) => {
            let (platform, holes, size) = manifest(sink, &top.digest, &m).await?;
            w.size += size;
            w.manifests
                .push((top.digest.clone(), platform, holes.is_empty()));
            w.holes.extend(holes);
        }
        Document::Index(index) => {
            let kept = sink.gc_refs(&top.digest).await?;
            for entry in index.manifests.iter().filter(|d| !d.is_attestation()) {
                let wanted = match select {
                    Select::Present => sink.has(entry).await?,
                    Select::Only(ds) => ds.contains(&entry.digest),
                };
                if !wanted {
                    continue;
                }
                let Some(b) = present_doc(sink, entry).await? else {
                    w.holes.push(hole(entry, "manifest", false));
                    w.manifests.push((entry.digest.clone(), None, false));
                    continue;
                };
                w.size += entry.size;
                let mut holes = Vec::new();
                if !keeps(&kept, &entry.digest) {
                    holes.push(hole(entry, "manifest", true));
                }
                let platform = match Document::parse(&b) {
                    Ok((_, Document::Manifest(m))) => {
                        let (platform, h, size) = manifest(sink, &entry.digest, &m).await?;
                        w.size += size;
                        holes.extend(h);
                        platform
                    }
                    _ => {
                        holes.push(hole(entry, "manifest", false));
                        None
                    }
                };
                let platform = platform.or(entry.platform.as_ref().map(|p| p.to_string()));
                w.manifests
                    .push((entry.digest.clone(), platform, holes.is_empty()));
                w.holes.extend(holes);
            }
            if let Select::Only(ds) = select {
                if let Some(d) = ds.iter().find(|d| !w.manifests.iter().any(|m| m.0 == **d)) {
                    return Err(anyhow!("{}: index lists no manifest {d}", top.digest));
                }
            }
        }
    }
    Ok(w)
}

/// (platform, holes, bytes present) of one manifest's config and layers.
async fn manifest<K: Sink>(
    sink: &K,
    digest: &Digest,
    m: &ImageManifest,
) -> anyhow::Result<(Option<String>, Vec<Hole>, u64)> {
    let kept = sink.gc_refs(digest).await?;
    let mut holes = Vec::new();
    let mut size = 0;
    let mut platform = None;
    match present_doc(sink, &m.config).await? {
        Some(cfg) => {
            if !keeps(&kept, &m.config.digest) {
                holes.push(hole(&m.config, "config", true));
            }
            size += m.config.size;
            platform = serde_json::from_slice::<ImageConfigPlatform>(&cfg)
                .ok()
                .map(|c| c.platform().to_string());
        }
        None => holes.push(hole(&m.config, "config", false)),
    }
    for l in &m.layers {
        if sink.readable(l).await? {
            if !keeps(&kept, &l.digest) {
                holes.push(hole(l, "layer", true));
            }
            size += l.size;
        } else {
            holes.push(hole(l, "layer", false));
        }
    }
    Ok((platform, holes, size))
}

async fn present_doc<K: Sink>(sink: &K, d: &Descriptor) -> anyhow::Result<Option<bytes::Bytes>> {
    if !sink.has(d).await? {
        return Ok(None);
    }
    // Read in full: a record whose file is gone reads as absent.
    match sink.read(&d.digest).await {
        Ok(Some(b)) if b.len() as u64 == d.size => Ok(Some(b)),
        Ok(_) => Ok(None),
        Err(_) => Ok(None),
    }
}

fn keeps(kept: &Option<Vec<Digest>>, child: &Digest) -> bool {
    kept.as_ref().is_none_or(|k| k.contains(child))
}

fn hole(d: &Descriptor, what: &'static str, unkept: bool) -> Hole {
    Hole {
        digest: d.digest.clone(),
        what,
        unkept,
    }
}
