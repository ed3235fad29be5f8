//! Builds OCI / Docker schema2 images in memory, deterministically: the same
//! definition always yields the same digests.

use std::collections::BTreeMap;

use flate2::write::GzEncoder;
use rand::{RngCore, SeedableRng};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

pub fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// How an image is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// OCI index, optionally with BuildKit-style attestation manifests.
    OciIndex,
    /// Docker manifest list.
    DockerList,
    /// A single Docker schema2 manifest.
    Docker,
    /// A single OCI manifest.
    Oci,
}

/// What a layer holds.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(deny_unknown_fields)]
pub struct LayerDef {
    /// path -> file content
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// A file `random.bin` of this many pseudo-random bytes (incompressible).
    #[serde(default)]
    pub random_bytes: u64,
    #[serde(default)]
    pub seed: u64,
}

/// An image to build and push: `repo:tag`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageDef {
    pub repo: String,
    pub tag: String,
    pub format: Format,
    #[serde(default = "host_platform_list")]
    pub platforms: Vec<String>,
    #[serde(default)]
    pub attestations: bool,
    /// Names of shared layers (from the file's `layers:`), in order, below
    /// the image's own per-platform layer.
    #[serde(default)]
    pub layers: Vec<String>,
    /// Its entrypoint (`/<last part of repo>`) is the static stand-in
    /// daemon on the host's platform, so `kiln verify --start` can run it.
    #[serde(default)]
    pub runnable: bool,
}

fn host_platform_list() -> Vec<String> {
    vec![host_platform()]
}

pub fn host_platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("linux/{arch}")
}

/// A file of image definitions, as in `images/*.yaml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSet {
    #[serde(default)]
    pub layers: BTreeMap<String, LayerDef>,
    pub images: Vec<ImageDef>,
}

impl ImageSet {
    pub fn load(path: &std::path::Path) -> anyhow::Result<ImageSet> {
        let text = std::fs::read_to_string(path)?;
        Ok(serde_yaml_ng::from_str(&text)?)
    }
}

/// A blob with its digest and media type.
#[derive(Debug, Clone)]
pub struct Blob {
    pub media_type: String,
    pub digest: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    pub fn new(media_type: &str, bytes: Vec<u8>) -> Blob {
        Blob {
            media_type: media_type.to_string(),
            digest: sha256(&bytes),
            bytes,
        }
    }

    pub fn descriptor(&self) -> serde_json::Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.bytes.len()})
    }
}

/// A layer: its compressed blob and its diff_id (digest of the plain tar).
#[derive(Debug, Clone)]
pub struct Layer {
    pub blob: Blob,
    pub diff_id: String,
    pub tar: Vec<u8>,
}

/// Builds a deterministic tar of `files` (sorted, mtime 0, root-owned).
pub fn tar_of(files: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(content.len() as u64);
        h.set_mode(if path.ends_with(".sh") || !path.contains('.') {
            0o755
        } else {
            0o644
        });
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, content.as_slice())
            .expect("in-memory tar");
    }
    b.into_inner().expect("in-memory tar")
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("in-memory gzip");
    e.finish().expect("in-memory gzip")
}

impl Layer {
    pub fn build(def: &LayerDef, media_type: &str) -> Layer {
        let mut files: BTreeMap<String, Vec<u8>> = def
            .files
            .iter()
            .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
            .collect();
        if def.random_bytes > 0 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(def.seed);
            let mut data = vec![0u8; def.random_bytes as usize];
            rng.fill_bytes(&mut data);
            files.insert("random.bin".into(), data);
        }
        let tar = tar_of(&files);
        Layer {
            diff_id: sha256(&tar),
            blob: Blob::new(media_type, gzip(&tar)),
            tar,
        }
    }
}

/// One platform's image: manifest, config, layers.
#[derive(Debug, Clone)]
pub struct PlatformImage {
    pub platform: String,
    pub manifest: Blob,
    pub config: Blob,
    pub layers: Vec<Layer>,
}

/// A built image: every blob to push, and the top-level document.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub repo: String,
    pub tag: String,
    pub top: Blob,
    pub platforms: Vec<PlatformImage>,
    /// Attestation manifests and their blobs (index images only).
    pub extra: Vec<Blob>,
}

impl BuiltImage {
    /// Every blob (not manifests) to upload, deduplicated.
    pub fn blobs(&self) -> Vec<&Blob> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for p in &self.platforms {
            for b in p
                .layers
                .iter()
                .map(|l| &l.blob)
                .chain(std::iter::once(&p.config))
            {
                if seen.insert(b.digest.clone()) {
                    out.push(b);
                }
            }
        }
        for b in &self.extra {
            if !b.media_type.contains("manifest") && seen.insert(b.digest.clone()) {
                out.push(b);
            }
        }
        out
    }

    pub fn platform(&self, p: &str) -> Option<&PlatformImage> {
        self.platforms.iter().find(|i| i.platform == p)
    }
}

fn split_platform(p: &str) -> (String, String, Option<String>) {
    let parts: Vec<&str> = p.split('/').collect();
    (
        parts[0].to_string(),
        parts[1].to_string(),
        parts.get(2).map(|s| s.to_string()),
    )
}

pub fn build(def: &ImageDef, shared: &BTreeMap<String, LayerDef>) -> anyhow::Result<BuiltImage> {
    let oci = matches!(def.format, Format::OciIndex | Format::Oci);
    let (layer_mt, config_mt, manifest_mt) = if oci {
        (OCI_LAYER_GZIP, OCI_CONFIG, OCI_MANIFEST)
    } else {
        (DOCKER_LAYER_GZIP, DOCKER_CONFIG, DOCKER_MANIFEST)
    };
    let single = matches!(def.format, Format::Docker | Format::Oci);
    anyhow::ensure!(
        !single || def.platforms.len() == 1,
        "{}: a single-manifest image has one platform",
        def.repo
    );
    let mut platforms = Vec::new();
    for p in &def.platforms {
        let mut layers = Vec::new();
        for name in &def.layers {
            let l = shared
                .get(name)
                .ok_or_else(|| anyhow::anyhow!("{}: no shared layer {name:?}", def.repo))?;
            layers.push(Layer::build(l, layer_mt));
        }
        let own = LayerDef {
            files: BTreeMap::from([(
                format!("etc/kiln-test/{}", def.repo.replace('/', "_")),
                format!("{}:{} for {p}\n", def.repo, def.tag),
            )]),
            random_bytes: 0,
            seed: 0,
        };
        let mut own = Layer::build(&own, layer_mt);
        if def.runnable && *p == host_platform() {
            let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            files.insert(
                format!("etc/kiln-test/{}", def.repo.replace('/', "_")),
                format!("{}:{} for {p}\n", def.repo, def.tag).into_bytes(),
            );
            files.insert(
                def.repo.rsplit('/').next().unwrap().to_string(),
                std::fs::read(crate::tools::standin())?,
            );
            let tar = tar_of(&files);
            own = Layer {
                diff_id: sha256(&tar),
                blob: Blob::new(layer_mt, gzip(&tar)),
                tar,
            };
        }
        layers.push(own);
        let (os, arch, variant) = split_platform(p);
        let mut cfg = json!({
            "architecture": arch,
            "os": os,
            "config": {"Entrypoint": [format!("/{}", def.repo.rsplit('/').next().unwrap())], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
            "history": layers.iter().map(|_| json!({"created_by": "kiln-testkit"})).collect::<Vec<_>>(),
        });
        if let Some(v) = &variant {
            cfg["variant"] = json!(v);
        }
        let config = Blob::new(config_mt, serde_json::to_vec(&cfg)?);
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": manifest_mt,
            "config": config.descriptor(),
            "layers": layers.iter().map(|l| l.blob.descriptor()).collect::<Vec<_>>(),
        });
        let manifest = Blob::new(manifest_mt, serde_json::to_vec_pretty(&manifest)?);
        platforms.push(PlatformImage {
            platform: p.clone(),
            manifest,
            config,
            layers,
        });
    }
    let mut extra = Vec::new();
    let top = if single {
        platforms[0].manifest.clone()
    } else {
        let list_mt = if oci { OCI_INDEX } else { DOCKER_LIST };
        let mut entries = Vec::new();
        for pi in &platforms {
            let (os, arch, variant) = split_platform(&pi.platform);
            let mut d = pi.manifest.descriptor();
            d["platform"] = json!({"os": os, "architecture": arch});
            if let Some(v) = variant {
                d["platform"]["variant"] = json!(v);
            }
            entries.push(d);
        }
        if def.attestations {
            for pi in &platforms {
                // BuildKit's shape: an unknown/unknown manifest whose layer is an in-toto statement.
                let statement = Blob::new(
                    "application/vnd.in-toto+json",
                    format!("{{\"subject\":\"{}\"}}", pi.manifest.digest).into_bytes(),
                );
                let cfg = Blob::new(OCI_CONFIG, b"{}".to_vec());
                let m = json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg.descriptor(), "layers": [statement.descriptor()]});
                let m = Blob::new(OCI_MANIFEST, serde_json::to_vec(&m)?);
                let mut d = m.descriptor();
                d["platform"] = json!({"os": "unknown", "architecture": "unknown"});
                d["annotations"] = json!({"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": pi.manifest.digest});
                entries.push(d);
                extra.extend([statement, cfg, m]);
            }
        }
        let index = json!({"schemaVersion": 2, "mediaType": list_mt, "manifests": entries});
        Blob::new(list_mt, serde_json::to_vec_pretty(&index)?)
    };
    Ok(BuiltImage {
        repo: def.repo.clone(),
        tag: def.tag.clone(),
        top,
        platforms,
        extra,
    })
}
