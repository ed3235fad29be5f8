//! The OCI and Docker schema2 documents kiln reads and writes, and the labels
//! containerd's garbage collector follows from a parent blob to its children.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::primitives::digest::Digest;
use crate::primitives::platform::Platform;

pub mod media {
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    pub const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";
    /// OCI 1.1's empty config (`{}`), for artifacts that have none.
    pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";

    /// What kiln asks a registry for when it resolves a reference.
    pub const ACCEPT: &[&str] = &[OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST];

    pub fn is_index(m: &str) -> bool {
        m == OCI_INDEX || m == DOCKER_LIST
    }
    pub fn is_manifest(m: &str) -> bool {
        m == OCI_MANIFEST || m == DOCKER_MANIFEST
    }
}

/// The image name containerd's exporter writes on an index entry, and
/// `ctr images import` and k3s read.
/// The most a manifest, an index or a config may weigh: anything larger
/// is not an image document, and is refused before it is held in memory
/// (registries, archives, stores, the cache all read documents whole).
pub const MAX_DOCUMENT_BYTES: u64 = 8 << 20;

/// Refuses a stored document over [`MAX_DOCUMENT_BYTES`] before it is read.
pub fn check_document_size(
    digest: &Digest,
    size: u64,
) -> Result<(), crate::primitives::error::BadInput> {
    if size <= MAX_DOCUMENT_BYTES {
        return Ok(());
    }
    Err(crate::primitives::error::BadInput(format!(
        "{digest} is {size} bytes where a manifest or config was expected (the limit is {MAX_DOCUMENT_BYTES}); the store or archive holding it is corrupt or hostile: rebuild it from its source"
    )))
}

pub const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI image-layout name (a tag, or a full reference), as oci-spec has it.
pub use oci_spec::image::ANNOTATION_REF_NAME;

/// An OCI 1.1 artifact manifest: one blob (`blob`, of `artifact_type`,
/// titled `title`) about `subject`, with the empty config; what a registry
/// lists among `subject`'s referrers. Returns the manifest and its config.
pub fn artifact_manifest(
    artifact_type: &str,
    blob: &Descriptor,
    title: &str,
    subject: &Descriptor,
) -> (Vec<u8>, Descriptor, &'static [u8]) {
    artifact_manifest_of(artifact_type, &[(blob.clone(), title.to_string())], subject)
}

/// [`artifact_manifest`] with several blobs, each with its title.
pub fn artifact_manifest_of(
    artifact_type: &str,
    blobs: &[(Descriptor, String)],
    subject: &Descriptor,
) -> (Vec<u8>, Descriptor, &'static [u8]) {
    const EMPTY: &[u8] = b"{}";
    let config = Descriptor::new(media::OCI_EMPTY, Digest::of(EMPTY), EMPTY.len() as u64);
    let layers: Vec<serde_json::Value> = blobs
        .iter()
        .map(|(blob, title)| {
            serde_json::json!({
                "mediaType": blob.media_type,
                "digest": blob.digest,
                "size": blob.size,
                "annotations": {"org.opencontainers.image.title": title},
            })
        })
        .collect();
    let doc = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": config.media_type, "digest": config.digest, "size": config.size},
        "layers": layers,
        "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": subject.size},
    });
    (serde_json::to_vec(&doc).expect("serialises"), config, EMPTY)
}

/// An entry of a referrers index (OCI 1.1): a manifest and its artifact type.
pub fn referrer_entry(
    media_type: &str,
    digest: &Digest,
    size: u64,
    artifact_type: &str,
) -> serde_json::Value {
    serde_json::json!({
        "mediaType": media_type,
        "digest": digest,
        "size": size,
        "artifactType": artifact_type,
    })
}

/// A referrers index (OCI 1.1) listing `entries` ([`referrer_entry`]).
pub fn referrers_index(entries: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_INDEX,
        "manifests": entries,
    })
}

/// Annotation BuildKit puts on attestation manifests inside an index.
pub const ATTESTATION_ANNOTATION: &str = "vnd.docker.reference.type";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: Digest, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_string(),
            digest,
            size,
            platform: None,
            annotations: BTreeMap::new(),
            urls: Vec::new(),
        }
    }

    /// Attestations and other non-runnable index entries.
    pub fn is_attestation(&self) -> bool {
        self.annotations.contains_key(ATTESTATION_ANNOTATION)
            || self
                .platform
                .as_ref()
                .is_some_and(|p| p.os == "unknown" && p.architecture == "unknown")
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ImageIndex {
    /// The platforms its image manifests name, attestations aside.
    pub fn platforms(&self) -> Vec<crate::primitives::platform::Platform> {
        self.manifests
            .iter()
            .filter(|d| !d.is_attestation())
            .filter_map(|d| d.platform.clone())
            .collect()
    }
}

/// The part of an image config kiln needs to pick a platform: its os,
/// architecture and variant (a single-manifest image says its platform
/// only here).
#[derive(Debug, Clone, Deserialize)]
pub struct ImageConfigPlatform {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl ImageConfigPlatform {
    pub fn platform(&self) -> Platform {
        Platform {
            os: self.os.clone(),
            architecture: self.architecture.clone(),
            variant: self.variant.clone().filter(|v| !v.is_empty()),
        }
    }
}

/// A top-level document, as fetched.
#[derive(Debug, Clone)]
pub enum Document {
    Index(ImageIndex),
    Manifest(ImageManifest),
}

impl Document {
    /// Parses a manifest or index; `media_type` is what the parent descriptor
    /// or the document itself says it is (OCI allows omitting it in the body).
    pub fn parse(bytes: &[u8]) -> Result<(String, Document), String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Probe {
            schema_version: Option<u32>,
            media_type: Option<String>,
            manifests: Option<serde_json::Value>,
            config: Option<serde_json::Value>,
        }
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| format!("not a JSON manifest: {e}"))?;
        if probe.schema_version == Some(1)
            || probe.media_type.as_deref() == Some(media::DOCKER_SCHEMA1)
        {
            return Err("Docker schema 1 manifests are not supported; re-push the image with a current client".into());
        }
        let media_type = match probe.media_type {
            Some(m) => m,
            None if probe.manifests.is_some() => media::OCI_INDEX.to_string(),
            None if probe.config.is_some() => media::OCI_MANIFEST.to_string(),
            None => return Err("document is neither an image index nor an image manifest".into()),
        };
        if media::is_index(&media_type) {
            let idx: ImageIndex =
                serde_json::from_slice(bytes).map_err(|e| format!("malformed image index: {e}"))?;
            Ok((media_type, Document::Index(idx)))
        } else if media::is_manifest(&media_type) {
            let m: ImageManifest = serde_json::from_slice(bytes)
                .map_err(|e| format!("malformed image manifest: {e}"))?;
            Ok((media_type, Document::Manifest(m)))
        } else {
            Err(format!("unsupported media type {media_type}"))
        }
    }
}

/// Documents kiln writes (node manifests and indexes, layout indexes) are
/// built with `oci-spec`; pulled documents stay raw bytes, so nothing a
/// registry sent is re-serialised.
pub mod write {
    use std::collections::{BTreeMap, HashMap};
    use std::str::FromStr;

    use oci_spec::image::{
        Arch, DescriptorBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType, Os,
        PlatformBuilder,
    };

    use super::Descriptor;

    fn annotations(a: &BTreeMap<String, String>) -> Option<HashMap<String, String>> {
        (!a.is_empty()).then(|| a.clone().into_iter().collect())
    }

    /// kiln's descriptor as oci-spec's.
    pub fn descriptor(d: &Descriptor) -> anyhow::Result<oci_spec::image::Descriptor> {
        let mut b = DescriptorBuilder::default()
            .media_type(MediaType::from(d.media_type.as_str()))
            .digest(oci_spec::image::Digest::from_str(d.digest.as_str())?)
            .size(d.size);
        if let Some(a) = annotations(&d.annotations) {
            b = b.annotations(a);
        }
        if !d.urls.is_empty() {
            b = b.urls(d.urls.clone());
        }
        if let Some(p) = &d.platform {
            let mut pb = PlatformBuilder::default()
                .architecture(Arch::from(p.architecture.as_str()))
                .os(Os::from(p.os.as_str()));
            if let Some(v) = &p.variant {
                pb = pb.variant(v.clone());
            }
            b = b.platform(pb.build()?);
        }
        Ok(b.build()?)
    }

    /// An OCI image manifest.
    pub fn manifest(
        config: &Descriptor,
        layers: &[Descriptor],
        annotations_: &BTreeMap<String, String>,
    ) -> anyhow::Result<Vec<u8>> {
        let mut b = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(descriptor(config)?)
            .layers(
                layers
                    .iter()
                    .map(descriptor)
                    .collect::<Result<Vec<_>, _>>()?,
            );
        if let Some(a) = annotations(annotations_) {
            b = b.annotations(a);
        }
        canonical(&b.build()?, false)
    }

    /// JSON with object keys in order: oci-spec keeps annotations in a
    /// HashMap, whose order changes from run to run, and a document's
    /// digest must not.
    fn canonical(doc: &impl serde::Serialize, pretty: bool) -> anyhow::Result<Vec<u8>> {
        let v = serde_json::to_value(doc)?;
        Ok(if pretty {
            serde_json::to_vec_pretty(&v)?
        } else {
            serde_json::to_vec(&v)?
        })
    }

    /// An OCI image index.
    pub fn index(
        manifests: &[Descriptor],
        annotations_: &BTreeMap<String, String>,
        pretty: bool,
    ) -> anyhow::Result<Vec<u8>> {
        let mut b = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(
                manifests
                    .iter()
                    .map(descriptor)
                    .collect::<Result<Vec<_>, _>>()?,
            );
        if let Some(a) = annotations(annotations_) {
            b = b.annotations(a);
        }
        canonical(&b.build()?, pretty)
    }

    #[test]
    fn documents_are_the_same_bytes_every_time() {
        let d = crate::primitives::digest::Digest::of(b"x");
        let cfg = Descriptor::new(super::media::OCI_CONFIG, d, 1);
        let a: BTreeMap<String, String> = (0..20)
            .map(|i| (format!("k{i}"), format!("v{i}")))
            .collect();
        let first = manifest(&cfg, &[], &a).unwrap();
        for _ in 0..10 {
            assert_eq!(manifest(&cfg, &[], &a).unwrap(), first);
        }
        let text = String::from_utf8(first).unwrap();
        assert!(text.find("\"k0\"").unwrap() < text.find("\"k19\"").unwrap());
    }

    #[test]
    fn written_documents_parse_back() {
        use super::media;
        let d = crate::primitives::digest::Digest::of(b"x");
        let mut l = Descriptor::new(media::OCI_LAYER_GZIP, d.clone(), 1);
        l.platform = Some(crate::primitives::platform::Platform::parse("linux/arm64/v8").unwrap());
        let cfg = Descriptor::new(media::OCI_CONFIG, d.clone(), 1);
        let a = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let m = manifest(&cfg, &[l.clone()], &a).unwrap();
        let (mt, doc) = super::Document::parse(&m).unwrap();
        assert_eq!(mt, media::OCI_MANIFEST);
        let super::Document::Manifest(m) = doc else {
            panic!()
        };
        assert_eq!(m.layers[0].digest, d);
        assert_eq!(m.annotations["k"], "v");
        let i = index(&[l], &BTreeMap::new(), false).unwrap();
        let (mt, doc) = super::Document::parse(&i).unwrap();
        assert_eq!(mt, media::OCI_INDEX);
        let super::Document::Index(i) = doc else {
            panic!()
        };
        assert_eq!(
            i.manifests[0].platform.as_ref().unwrap().to_string(),
            "linux/arm64/v8"
        );
    }
}

/// The one platform selection: the index entry (by position) that best
/// serves `want`, attestations and non-manifests skipped; ties go to the
/// first. Used by the copy engine, the bundle check and node images.
pub fn select_platform(entries: &[Descriptor], want: &Platform) -> Option<usize> {
    entries
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.is_attestation() && media::is_manifest(&d.media_type))
        .filter_map(|(i, d)| Some((want.rank(d.platform.as_ref()?)?, i)))
        .min()
        .map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_documents_without_media_type() {
        let d = format!("sha256:{}", "1".repeat(64));
        let idx = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"digest":"{d}","size":3,"mediaType":"{}"}}]}}"#,
            media::OCI_MANIFEST
        );
        let (mt, doc) = Document::parse(idx.as_bytes()).unwrap();
        assert_eq!(mt, media::OCI_INDEX);
        assert!(matches!(doc, Document::Index(_)));
        let man = format!(
            r#"{{"schemaVersion":2,"config":{{"digest":"{d}","size":3}},"layers":[{{"digest":"{d}","size":3}}]}}"#
        );
        let (mt, doc) = Document::parse(man.as_bytes()).unwrap();
        assert_eq!(mt, media::OCI_MANIFEST);
        let Document::Manifest(m) = doc else { panic!() };
        assert_eq!(m.config.digest.as_str(), d);
        assert!(Document::parse(br#"{"schemaVersion":1}"#)
            .unwrap_err()
            .contains("schema 1"));
        assert!(Document::parse(b"<html>").is_err());
    }

    #[test]
    fn select_prefers_the_best_match() {
        use crate::primitives::digest::Digest;
        let entry = |p: &str, n: &[u8]| {
            let mut d = Descriptor::new(media::OCI_MANIFEST, Digest::of(n), 1);
            d.platform = Some(crate::primitives::platform::Platform::parse(p).unwrap());
            d
        };
        let idx = vec![
            entry("linux/arm/v5", b"a"),
            entry("linux/arm/v6", b"b"),
            entry("linux/amd64", b"c"),
        ];
        let want = crate::primitives::platform::Platform::parse("linux/arm/v7").unwrap();
        assert_eq!(select_platform(&idx, &want), Some(1));
        assert_eq!(
            select_platform(
                &idx,
                &crate::primitives::platform::Platform::parse("linux/arm64").unwrap()
            ),
            None
        );
        assert_eq!(
            select_platform(
                &idx,
                &crate::primitives::platform::Platform::parse("linux/amd64").unwrap()
            ),
            Some(2)
        );
    }
}
