//! The documents around the layers: the base's config extended with kiln's
//! layers (and their history), the per-platform manifest with its provenance
//! annotations, and the index over the platforms.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

use super::LayerBlob;
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor, ImageManifest};
use crate::primitives::platform::Platform;

/// The OCI annotation naming the base a node image was built on (its
/// manifest carries it; `kiln verify --lock` reads it).
pub const BASE_DIGEST: &str = "org.opencontainers.image.base.digest";
/// The annotations naming the node image a build followed (`--previous`),
/// beside the base's: an input like the base, by digest.
pub const PREVIOUS_NAME: &str = "io.kiln.previous.name";
pub const PREVIOUS_DIGEST: &str = "io.kiln.previous.digest";

/// What the new image says about itself.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// RFC 3339; from SOURCE_DATE_EPOCH when set.
    pub created: String,
    pub kubernetes_version: Option<String>,
    pub base_name: String,
    pub base_digest: Digest,
    pub images: usize,
    /// The node image this one follows (name, digest): it decides the
    /// layers' order and may give layers, so it is recorded as an input.
    pub previous: Option<(String, Digest)>,
    /// A platform manifest's build record (`record`), named by digest.
    pub record: Option<Descriptor>,
}

impl Provenance {
    pub(super) fn annotations(&self) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([
            (
                "org.opencontainers.image.created".to_string(),
                self.created.clone(),
            ),
            (
                "org.opencontainers.image.base.name".to_string(),
                self.base_name.clone(),
            ),
            (BASE_DIGEST.to_string(), self.base_digest.to_string()),
            (
                "org.opencontainers.image.description".to_string(),
                format!(
                    "Kubernetes node image: {} component images pinned, built by kiln",
                    self.images
                ),
            ),
        ]);
        if let Some(v) = &self.kubernetes_version {
            a.insert("org.opencontainers.image.version".to_string(), v.clone());
        }
        if let Some((name, digest)) = &self.previous {
            a.insert(PREVIOUS_NAME.to_string(), name.clone());
            a.insert(PREVIOUS_DIGEST.to_string(), digest.to_string());
        }
        if let Some(r) = &self.record {
            a.insert(super::record::ANNOTATION.to_string(), r.digest.to_string());
            a.insert(
                super::record::ANNOTATION_SIZE.to_string(),
                r.size.to_string(),
            );
        }
        a
    }
}

/// The base config with kiln's layers appended (diff_ids, history); every
/// other field (entrypoint, env, labels, ...) kept as the base had it.
pub fn node_config(
    base_config: &[u8],
    layers: &[LayerBlob],
    prov: &Provenance,
    kind_base: bool,
) -> anyhow::Result<Vec<u8>> {
    let mut cfg: Value =
        serde_json::from_slice(base_config).context("base image config is not JSON")?;
    if kind_base {
        crate::domain::kind::node_config(&mut cfg)?;
    }
    let obj = cfg
        .as_object_mut()
        .ok_or_else(|| anyhow!("base image config is not a JSON object"))?;
    let rootfs = obj
        .entry("rootfs")
        .or_insert_with(|| json!({"type": "layers", "diff_ids": []}));
    let diff_ids = rootfs["diff_ids"]
        .as_array_mut()
        .ok_or_else(|| anyhow!("base config has no rootfs.diff_ids"))?;
    diff_ids.extend(layers.iter().map(|l| json!(l.diff_id.to_string())));
    let history = obj.entry("history").or_insert_with(|| json!([]));
    let history = history
        .as_array_mut()
        .ok_or_else(|| anyhow!("base config history is not a list"))?;
    history.extend(layers.iter().map(|l| {
        json!({
            "created": prov.created,
            "created_by": format!("kiln build: {} component images, pinned; {}", prov.images, l.holds),
            "comment": "kiln",
        })
    }));
    obj.insert("created".into(), json!(prov.created));
    Ok(serde_json::to_vec(&cfg)?)
}

/// OCI layer media type for a base layer (same bytes, same digest).
fn oci_layer_type(m: &str) -> String {
    match m {
        media::DOCKER_LAYER_GZIP => media::OCI_LAYER_GZIP.to_string(),
        media::DOCKER_LAYER => media::OCI_LAYER.to_string(),
        other => other.to_string(),
    }
}

/// The node image manifest: the base's layers untouched, then kiln's.
pub fn node_manifest(
    base: &ImageManifest,
    config: &Descriptor,
    kiln: &[LayerBlob],
    prov: &Provenance,
) -> anyhow::Result<Vec<u8>> {
    if base.layers.iter().any(|l| !l.urls.is_empty()) {
        bail!("base image has foreign (non-distributable) layers; kiln does not rebuild those");
    }
    let mut layers: Vec<Descriptor> = base
        .layers
        .iter()
        .map(|l| Descriptor {
            media_type: oci_layer_type(&l.media_type),
            ..l.clone()
        })
        .collect();
    layers.extend(
        kiln.iter()
            .map(|l| Descriptor::new(l.media_type, l.digest.clone(), l.size)),
    );
    crate::primitives::oci::write::manifest(
        &Descriptor::new(media::OCI_CONFIG, config.digest.clone(), config.size),
        &layers,
        &prov.annotations(),
    )
}

/// An index of per-platform node manifests.
pub fn node_index(
    manifests: &[(Platform, Descriptor)],
    prov: &Provenance,
) -> anyhow::Result<Vec<u8>> {
    let entries: Vec<Descriptor> = manifests
        .iter()
        .map(|(p, d)| Descriptor {
            platform: Some(p.clone()),
            ..d.clone()
        })
        .collect();
    crate::primitives::oci::write::index(&entries, &prov.annotations(), false)
}
