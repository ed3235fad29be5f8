//! The build record: what a later build needs to reuse a node image's
//! parts without their bytes. One per platform manifest: for each of
//! kiln's layers its digest, diff ID, and, for a content-keyed one, its key
//! and the entries the key was made from (`layer::key_of`); for each base
//! layer what it gave the extract (`extract`: a contribution blob); the
//! layer format, the compressor and the extract rule they were made under.
//!
//! Where it lives, and why: the record is a JSON blob pushed with its
//! contributions as an OCI 1.1 referrer of the platform manifest (artifact
//! type [`ARTIFACT_TYPE`], as kiln attaches SBOMs), and the manifest names
//! its digest in the annotation [`ANNOTATION`]. A referrer because only
//! kiln reads it: Docker, containerd and kind never fetch it, so no puller
//! pays for it, and the registry keeps it as long as its subject (a blob
//! named only in an annotation would be garbage-collected). The digest in
//! the manifest because a referrer alone proves nothing (anyone who can
//! push may attach one): named there, the record is exactly as
//! trustworthy as the manifest. The record holds no digest of the
//! manifest, so there is no cycle, and it is a function of the build's
//! inputs alone: the same build, fresh or warm, gives the same record and
//! so the same manifest.
//!
//! Trusting a record without the bytes it describes is what it is for: a
//! layer whose key matches is taken by digest, unseen. A digest names
//! bytes, not who made them: whoever can push to the repository can push
//! a manifest naming a forged record, and anyone can name that manifest
//! by digest or lock it. So a record is used only when the manifest's
//! signature verifies under the build's signature policy
//! (`inputs::previous_trust`, the one place that decides); it must hold
//! together (each key
//! re-derived from its own entries); and a record made under another
//! layer format, compressor or extract rule is not used at all.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize};

use super::{KeyedEntry, LayerBlob, What};
use crate::primitives::digest::Digest;
use crate::primitives::oci::Descriptor;

/// The artifact type of a record's referrer.
pub const ARTIFACT_TYPE: &str = "application/vnd.kiln.build-record.v1+json";
/// The media type of the record blob itself.
pub const MEDIA_TYPE: &str = "application/vnd.kiln.build-record.v1+json";
/// The platform manifest's annotations naming its record: digest, size.
pub const ANNOTATION: &str = "io.kiln.record";
pub const ANNOTATION_SIZE: &str = "io.kiln.record.size";
/// A record is small: kiln's layers and their entries, no file bytes.
pub const MAX_BYTES: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    pub api_version: String,
    pub kind: String,
    /// `layer::LAYER_FORMAT` when it was written.
    pub layer_format: String,
    /// `layer::Compression::identity` of its layers.
    pub compression: String,
    /// `extract::EXTRACT_RULE`.
    pub extract_rule: String,
    pub platform: String,
    /// The base's layers, in order.
    pub base: Vec<Digest>,
    /// What each base layer gave the extract, where it is small enough.
    pub extract: Vec<Given>,
    /// kiln's layers, in manifest order.
    pub layers: Vec<RecordedLayer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Given {
    pub layer: Digest,
    pub contribution: Option<Blob>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Blob {
    pub digest: Digest,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedLayer {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    pub diff_id: Digest,
    pub entries: usize,
    pub holds: String,
    /// A content-keyed layer's key, and the entries it was made from (also
    /// a kept layer's, whose key is not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Digest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyed: Vec<KeyedEntry>,
}

const API_VERSION: &str = "kiln/v1";
const KIND: &str = "BuildRecord";

impl Record {
    /// The record of a platform built with `layers` (in manifest order)
    /// on `base` under `compression`.
    pub fn new(
        platform: &str,
        compression: &str,
        base: &[Descriptor],
        extract: &[(Digest, Option<Descriptor>)],
        layers: &[LayerBlob],
    ) -> Record {
        Record {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            layer_format: super::layer::LAYER_FORMAT.into(),
            compression: compression.into(),
            extract_rule: super::extract::EXTRACT_RULE.into(),
            platform: platform.into(),
            base: base.iter().map(|d| d.digest.clone()).collect(),
            extract: extract
                .iter()
                .map(|(layer, c)| Given {
                    layer: layer.clone(),
                    contribution: c.as_ref().map(|d| Blob {
                        digest: d.digest.clone(),
                        size: d.size,
                    }),
                })
                .collect(),
            layers: layers
                .iter()
                .map(|l| RecordedLayer {
                    media_type: l.media_type.to_string(),
                    digest: l.digest.clone(),
                    size: l.size,
                    diff_id: l.diff_id.clone(),
                    entries: l.entries,
                    holds: l.holds.clone(),
                    key: l.key.clone(),
                    keyed: l.keyed.clone(),
                })
                .collect(),
        }
    }

    /// Its bytes: JSON with its fields in order, the same for the same record.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record serialises")
    }

    /// Reads a record `bytes`, fetched by the digest a signed
    /// manifest names (checked by the caller), for a build of `platform`
    /// under `compression`. `Err` says, in a few words, why it cannot be
    /// used: the build then fetches what it needs, as without one.
    pub fn read(bytes: &[u8], platform: &str, compression: &str) -> anyhow::Result<Record> {
        let r: Record = serde_json::from_slice(bytes)
            .map_err(|e| anyhow!("it is not a kiln build record: {e}"))?;
        if r.api_version != API_VERSION || r.kind != KIND {
            bail!(
                "it is a {} {}, not a {API_VERSION} {KIND}",
                r.api_version,
                r.kind
            );
        }
        if r.platform != platform {
            bail!("it is {}'s, not {platform}'s", r.platform);
        }
        if r.layer_format != super::layer::LAYER_FORMAT {
            bail!(
                "its layers are of another format ({}; this kiln writes {})",
                r.layer_format,
                super::layer::LAYER_FORMAT
            );
        }
        if r.compression != compression {
            bail!(
                "its layers were compressed otherwise ({}; this build: {compression})",
                r.compression
            );
        }
        for l in &r.layers {
            if let Some(k) = &l.key {
                let again = super::key_of(&l.keyed, super::plan::CONTENT_MTIME, compression);
                if again != *k {
                    bail!(
                        "it does not hold together: layer {}'s key is not its entries'",
                        l.digest
                    );
                }
            }
        }
        Ok(r)
    }

    /// Its content-keyed layers by key, as a build takes them.
    pub fn by_key(&self) -> HashMap<Digest, LayerBlob> {
        self.layers
            .iter()
            .filter_map(|l| {
                let key = l.key.clone()?;
                let layer = LayerBlob {
                    media_type: crate::primitives::unpack::LayerCompression::of(&l.media_type)
                        .map(|c| match c {
                            crate::primitives::unpack::LayerCompression::Gzip => {
                                crate::primitives::oci::media::OCI_LAYER_GZIP
                            }
                            crate::primitives::unpack::LayerCompression::Zstd => {
                                crate::primitives::oci::media::OCI_LAYER_ZSTD
                            }
                            crate::primitives::unpack::LayerCompression::None => {
                                crate::primitives::oci::media::OCI_LAYER
                            }
                        })?,
                    digest: l.digest.clone(),
                    size: l.size,
                    diff_id: l.diff_id.clone(),
                    entries: l.entries,
                    holds: l.holds.clone(),
                    cached: false,
                    reused: true,
                    key: Some(key.clone()),
                    keyed: l.keyed.clone(),
                };
                Some((key, layer))
            })
            .collect()
    }

    /// The recorded layer `digest`, if it is one of its own.
    pub fn layer(&self, digest: &Digest) -> Option<&RecordedLayer> {
        self.layers.iter().find(|l| l.digest == *digest)
    }

    /// Every content blob its layers hold: what a build following it may
    /// record without the bytes, until a layer it writes needs them.
    pub fn blobs(&self) -> HashSet<Digest> {
        self.layers
            .iter()
            .flat_map(|l| &l.keyed)
            .filter(|e| super::plan::is_blob(&e.path))
            .filter_map(|e| match &e.what {
                What::File { content, .. } => Some(content.clone()),
                _ => None,
            })
            .collect()
    }

    /// What the base's layers gave the extract, by layer, where recorded.
    pub fn contributions(&self) -> HashMap<Digest, Descriptor> {
        self.extract
            .iter()
            .filter_map(|g| {
                let c = g.contribution.as_ref()?;
                Some((
                    g.layer.clone(),
                    Descriptor::new(
                        crate::primitives::oci::media::OCI_LAYER,
                        c.digest.clone(),
                        c.size,
                    ),
                ))
            })
            .collect()
    }

    /// Whether it was built on `base` (its layers, in order).
    pub fn built_on(&self, base: &[Descriptor]) -> bool {
        self.base.iter().eq(base.iter().map(|d| &d.digest))
    }
}

/// The record a manifest's annotations name, if they name one.
pub fn named_by(a: &std::collections::BTreeMap<String, String>) -> Option<Descriptor> {
    Some(Descriptor::new(
        MEDIA_TYPE,
        Digest::parse(a.get(ANNOTATION)?).ok()?,
        a.get(ANNOTATION_SIZE)?.parse().ok()?,
    ))
}

/// The blobs of `entries` (a layer to be written) among `absent`: what
/// must be fetched before it is.
pub fn needed<'a>(
    entries: &'a [(std::path::PathBuf, bool)],
    absent: &'a HashSet<Digest>,
) -> impl Iterator<Item = Digest> + 'a {
    entries.iter().filter_map(move |(p, whiteout)| {
        if *whiteout {
            return None;
        }
        let d = blob_digest(p)?;
        absent.contains(&d).then_some(d)
    })
}

/// A content blob's digest, from its path in the store.
pub fn blob_digest(rel: &Path) -> Option<Digest> {
    if !super::plan::is_blob(rel) {
        return None;
    }
    Digest::parse(&format!("sha256:{}", rel.file_name()?.to_str()?)).ok()
}
