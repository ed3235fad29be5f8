//! Writing kiln's planned layers: each content-keyed one once per build,
//! and kept in the cache between builds by the key of its content and
//! compression (`sink::cache`).

use super::*;

/// Whether a layer is worth keeping in the cache: one whose compression is
/// real work (the release's binaries; under zstd, every blob layer). Under
/// gzip the store's blobs go out as stored blocks, so compressing them
/// again costs what copying them from the cache would.
pub(super) fn worth_caching(part: &plan::Part, compression: Compression) -> bool {
    use plan::Part::*;
    match part {
        Release => compression != Compression::None,
        SmallBlobs | SmallVersioned | Bucket(_) | Blob(_) => compression == Compression::Zstd,
        Documents | Kept | Node => false,
    }
}

/// The layer a cache holds for `key`, copied into the layout.
pub(super) fn from_cache(
    layout: &crate::sink::layout::OciLayout,
    cache: &crate::sink::cache::Cache,
    key: &Digest,
    compression: Compression,
) -> anyhow::Result<Option<LayerBlob>> {
    let Some((desc, v, path)) = cache.layer(key) else {
        return Ok(None);
    };
    let (Some(diff_id), Some(entries)) = (
        v["diffId"].as_str().and_then(|d| Digest::parse(d).ok()),
        v["entries"].as_u64(),
    ) else {
        return Ok(None);
    };
    if desc.media_type != compression.media_type() {
        return Ok(None);
    }
    let mut out = layout.new_blob()?;
    std::io::copy(&mut std::fs::File::open(&path)?, &mut out)?;
    layout.commit_blob(out, &desc.digest, desc.size)?;
    Ok(Some(LayerBlob {
        media_type: compression.media_type(),
        digest: desc.digest,
        size: desc.size,
        diff_id,
        entries: entries as usize,
        holds: String::new(),
        cached: true,
        reused: false,
        key: None,
        keyed: Vec::new(),
    }))
}

/// Keeps a layer just written in the cache; a failure costs only a later
/// compression, so it is a warning.
pub(super) fn keep_in_cache(
    layout: &crate::sink::layout::OciLayout,
    cache: &crate::sink::cache::Cache,
    key: &Digest,
    layer: &LayerBlob,
) {
    let about = serde_json::json!({"diffId": layer.diff_id, "entries": layer.entries});
    let desc = Descriptor::new(layer.media_type, layer.digest.clone(), layer.size);
    let kept = layout
        .open_blob(&layer.digest)
        .map_err(anyhow::Error::from)
        .and_then(|r| cache.keep_layer(key, &desc, about, r));
    if let Err(e) = kept {
        tracing::warn!("keeping layer {} in the cache: {e:#}", layer.digest);
    }
}

/// A planned layer with its key and entries, when content-keyed.
pub(super) struct Keyed {
    pub planned: plan::Planned,
    pub key: Option<(Digest, Vec<KeyedEntry>)>,
}

/// Each planned layer's key, from the rootfs's names, sizes and modes
/// alone ([`keyed_entries`], [`key_of`]): no file is read.
pub(super) fn keyed(
    rootfs: &Path,
    planned: Vec<plan::Planned>,
    owners: &crate::primitives::unpack::Owners,
    compression: Compression,
    known: &std::collections::HashMap<std::path::PathBuf, Digest>,
) -> Vec<Keyed> {
    planned
        .into_iter()
        .map(|p| {
            let key = p
                .part
                .content_keyed()
                .then(|| keyed_entries(rootfs, &p.entries, owners, known))
                .flatten()
                .map(|e| (key_of(&e, plan::CONTENT_MTIME, &compression.identity()), e));
            Keyed { planned: p, key }
        })
        .collect()
}

/// Writes each planned layer (into the archive when one is being written:
/// its bytes written once), unless a content-keyed one is already written
/// in this build, recorded by the previous image (`reuse`: taken by
/// digest, neither written nor fetched), or compressed before (the cache).
#[allow(clippy::too_many_arguments)]
pub(super) fn write_layers(
    layout: &crate::sink::layout::OciLayout,
    rootfs: &Path,
    planned: Vec<Keyed>,
    owners: &crate::primitives::unpack::Owners,
    build_mtime: u64,
    compression: Compression,
    written: &mut std::collections::HashMap<Digest, LayerBlob>,
    reuse: &std::collections::HashMap<Digest, LayerBlob>,
    cache: Option<&crate::sink::cache::Cache>,
) -> anyhow::Result<Vec<(plan::Part, LayerBlob)>> {
    let mut layers = Vec::new();
    for Keyed { planned: p, key } in planned {
        let holds = p.part.describe();
        let mtime = if p.part.content_keyed() {
            plan::CONTENT_MTIME
        } else {
            build_mtime
        };
        let k = key.as_ref().map(|(k, _)| k);
        if let Some(done) = k.and_then(|k| written.get(k).or_else(|| reuse.get(k))) {
            let mut done = done.clone();
            done.holds = holds;
            layers.push((p.part, done));
            continue;
        }
        let cache = cache.filter(|_| worth_caching(&p.part, compression));
        let cached = match (k, cache) {
            (Some(k), Some(c)) => from_cache(layout, c, k, compression)?,
            _ => None,
        };
        let mut layer = match cached {
            Some(l) => l,
            None => {
                let (layer, out) = write_layer(
                    rootfs,
                    &p.entries,
                    owners,
                    layout.new_blob()?,
                    mtime,
                    compression,
                )?;
                layout.commit_blob(out, &layer.digest, layer.size)?;
                if let (Some(k), Some(c)) = (k, cache) {
                    keep_in_cache(layout, c, k, &layer);
                }
                layer
            }
        };
        layer.holds = holds;
        if let Some((k, e)) = key {
            (layer.key, layer.keyed) = (Some(k.clone()), e);
            written.insert(k, layer.clone());
        }
        layers.push((p.part, layer));
    }
    Ok(layers)
}
