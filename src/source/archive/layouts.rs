//! The archive layouts kiln reads: an OCI image layout (`index.json`, with
//! names from containerd's or the OCI annotation), a one-image layout with
//! no name (a base), and `docker save`'s `manifest.json` with its
//! `<id>/layer.tar` layers, for which kiln makes a Docker manifest.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail};
use bytes::Bytes;
use serde::Deserialize;

use super::tarball::{clean, hash_span, read_span};
use super::{ArchiveImage, ArchiveSource, Span, MAX_DOC_BYTES};
use crate::primitives::digest::Digest;
use crate::primitives::oci::{
    media, Descriptor, Document, ImageConfigPlatform, ImageIndex, ImageManifest,
    ANNOTATION_IMAGE_NAME, ANNOTATION_REF_NAME,
};
use crate::primitives::reference::ImageRef;

impl ArchiveSource {
    /// Images named in an OCI `index.json`; false if it names none.
    pub(super) fn add_oci(
        &mut self,
        index: &[u8],
        read: &dyn Fn(&str) -> anyhow::Result<Option<Bytes>>,
    ) -> anyhow::Result<bool> {
        let index: ImageIndex = serde_json::from_slice(index)
            .map_err(|e| anyhow!("index.json is not an OCI index: {e}"))?;
        let mut found = false;
        for d in &index.manifests {
            let name = d.annotations.get(ANNOTATION_IMAGE_NAME).or_else(|| {
                d.annotations
                    .get(ANNOTATION_REF_NAME)
                    .filter(|n| n.contains('/') || n.contains(':'))
            });
            let Some(name) = name else { continue };
            let name = ImageRef::parse(name).map_err(|e| anyhow!("index.json: {e}"))?;
            let bytes = read(&format!("blobs/sha256/{}", d.digest.hex()))?.ok_or_else(|| {
                anyhow!(
                    "index.json lists {} for {name} but the archive lacks blobs/sha256/{}",
                    d.digest,
                    d.digest.hex()
                )
            })?;
            let (media_type, _) = Document::parse(&bytes).map_err(|e| anyhow!("{name}: {e}"))?;
            let top = Descriptor::new(&media_type, d.digest.clone(), d.size);
            self.images.push(ArchiveImage { name, top, bytes });
            found = true;
        }
        Ok(found)
    }

    /// The one image of an index that names none, called
    /// `kiln.local/<archive file name>:<its bare ref.name tag, else latest>`.
    pub(super) fn add_single_unnamed(
        &mut self,
        index: &[u8],
        read: &dyn Fn(&str) -> anyhow::Result<Option<Bytes>>,
        path: &Path,
    ) -> anyhow::Result<bool> {
        let index: ImageIndex = serde_json::from_slice(index)
            .map_err(|e| anyhow!("index.json is not an OCI index: {e}"))?;
        let [d] = index.manifests.as_slice() else {
            return Ok(false);
        };
        let stem = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = stem
            .trim_end_matches(".gz")
            .trim_end_matches(".tar")
            .to_ascii_lowercase();
        let repo: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let repo = repo
            .trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string();
        let repo = if repo.is_empty() {
            "archive".to_string()
        } else {
            repo
        };
        let tag = d
            .annotations
            .get(ANNOTATION_REF_NAME)
            .filter(|t| ImageRef::parse(&format!("kiln.local/x:{t}")).is_ok())
            .cloned()
            .unwrap_or_else(|| "latest".into());
        let name = ImageRef::parse(&format!("kiln.local/{repo}:{tag}"))
            .map_err(|e| anyhow!("naming the archive's image: {e}"))?;
        let bytes = read(&format!("blobs/sha256/{}", d.digest.hex()))?.ok_or_else(|| {
            anyhow!(
                "index.json lists {} but the archive lacks blobs/sha256/{}",
                d.digest,
                d.digest.hex()
            )
        })?;
        let (media_type, _) = Document::parse(&bytes).map_err(|e| anyhow!("{name}: {e}"))?;
        let top = Descriptor::new(&media_type, d.digest.clone(), d.size);
        tracing::debug!("{}: its one image, unnamed, is {name}", path.display());
        self.images.push(ArchiveImage { name, top, bytes });
        Ok(true)
    }

    /// Images of a `docker save` `manifest.json`, with a schema2 manifest
    /// made for each (docker save carries none for the legacy layout).
    pub(super) fn add_docker(
        &mut self,
        manifest: &[u8],
        entries: &HashMap<String, Span>,
        tar: &std::fs::File,
    ) -> anyhow::Result<()> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        #[derive(Deserialize)]
        struct RootFs {
            #[serde(default)]
            diff_ids: Vec<String>,
        }
        #[derive(Deserialize)]
        struct Config {
            rootfs: RootFs,
        }
        let list: Vec<Entry> = serde_json::from_slice(manifest)
            .map_err(|e| anyhow!("manifest.json is not a docker save manifest: {e}"))?;
        if list.is_empty() {
            bail!("manifest.json lists no images");
        }
        for e in list {
            let tags = e.repo_tags.unwrap_or_default();
            if tags.is_empty() {
                bail!(
                    "image {} has no name (RepoTags is empty); tag it before docker save",
                    e.config
                );
            }
            let cspan = *entries.get(clean(&e.config)?.as_str()).ok_or_else(|| {
                anyhow!(
                    "manifest.json lists config {} but the archive lacks it",
                    e.config
                )
            })?;
            let cbytes = read_span(&self.files[cspan.archive], cspan, MAX_DOC_BYTES)?;
            let cdigest = Digest::of(&cbytes);
            let claimed = e
                .config
                .trim_start_matches("blobs/sha256/")
                .trim_end_matches(".json");
            if claimed.len() == 64 && claimed != cdigest.hex() {
                bail!(
                    "config {} does not match its name: its digest is {cdigest}",
                    e.config
                );
            }
            let cfg: Config = serde_json::from_slice(&cbytes)
                .map_err(|err| anyhow!("config {} is not an image config: {err}", e.config))?;
            serde_json::from_slice::<ImageConfigPlatform>(&cbytes)
                .map_err(|err| anyhow!("config {}: {err}", e.config))?;
            let layers = self.docker_layers(&e.layers, &cfg.rootfs.diff_ids, entries, tar)?;
            self.add_blob(cdigest.clone(), cspan);
            let m = ImageManifest {
                schema_version: 2,
                media_type: Some(media::DOCKER_MANIFEST.to_string()),
                config: Descriptor::new(media::DOCKER_CONFIG, cdigest, cbytes.len() as u64),
                layers,
                annotations: Default::default(),
            };
            let bytes = Bytes::from(serde_json::to_vec(&m)?);
            let top = Descriptor::new(
                media::DOCKER_MANIFEST,
                Digest::of(&bytes),
                bytes.len() as u64,
            );
            self.made.insert(top.digest.clone(), bytes.clone());
            for t in tags {
                let name = ImageRef::parse(&t).map_err(|err| anyhow!("manifest.json: {err}"))?;
                self.images.push(ArchiveImage {
                    name,
                    top: top.clone(),
                    bytes: bytes.clone(),
                });
            }
        }
        Ok(())
    }

    /// A docker-save image's layers, each checked against its name and (when
    /// uncompressed, as the legacy layout stores them) its config's diff_id.
    fn docker_layers(
        &mut self,
        names: &[String],
        diff_ids: &[String],
        entries: &HashMap<String, Span>,
        tar: &std::fs::File,
    ) -> anyhow::Result<Vec<Descriptor>> {
        let mut layers = Vec::new();
        for (i, l) in names.iter().enumerate() {
            let span = *entries
                .get(clean(l)?.as_str())
                .ok_or_else(|| anyhow!("manifest.json lists layer {l} but the archive lacks it"))?;
            let (digest, gzip) = hash_span(tar, span)?;
            let named = l
                .strip_prefix("blobs/sha256/")
                .map(|h| format!("sha256:{h}"));
            if let Some(n) = named.filter(|n| *n != digest.as_str()) {
                bail!("layer {l} does not match its name: its digest is {digest} (expected {n})");
            }
            if !gzip {
                match diff_ids.get(i) {
                    Some(want) if *want == digest.as_str() => {}
                    Some(want) => bail!("layer {l} does not match the config: digest {digest}, expected diff_id {want}"),
                    None => bail!("layer {l} has no diff_id in the config"),
                }
            }
            let mt = if gzip {
                media::DOCKER_LAYER_GZIP
            } else {
                media::DOCKER_LAYER
            };
            self.add_blob(digest.clone(), span);
            layers.push(Descriptor::new(mt, digest, span.size));
        }
        Ok(layers)
    }
}

/// `index` narrowed to the image it names `select` (by its full name or
/// its `ref.name`), when one is given; an error lists what it names.
pub(super) fn narrowed(index: &[u8], select: Option<&str>) -> anyhow::Result<Bytes> {
    let Some(want) = select else {
        return Ok(Bytes::copy_from_slice(index));
    };
    let mut idx: ImageIndex = serde_json::from_slice(index)
        .map_err(|e| anyhow!("index.json is not an OCI index: {e}"))?;
    let names = |d: &Descriptor| -> Vec<String> {
        [ANNOTATION_IMAGE_NAME, ANNOTATION_REF_NAME]
            .iter()
            .filter_map(|k| d.annotations.get(*k).cloned())
            .collect()
    };
    let all: Vec<String> = idx.manifests.iter().flat_map(names).collect();
    idx.manifests.retain(|d| names(d).iter().any(|n| n == want));
    if idx.manifests.is_empty() {
        bail!(
            "its index names no image {want:?} (it names: {})",
            if all.is_empty() {
                "none".to_string()
            } else {
                all.join(", ")
            }
        );
    }
    Ok(Bytes::from(serde_json::to_vec(&idx)?))
}
