//! kiln's compressed layers kept in the cache between builds, by the key of
//! their content and compression (`sink::cache`).

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
