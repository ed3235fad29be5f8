//! Node images: a base image's layers, byte for byte, plus ONE new layer with
//! exactly what kiln added or changed (the containerd store, the node's
//! containerd config, the manifest record), a config extended to match, and
//! OCI annotations. Deterministic where kiln decides: sorted entries, fixed
//! mtimes and owners from SOURCE_DATE_EPOCH, gzip without timestamps.
//! containerd's own `meta.db` records wall-clock times; see the README.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor, ImageManifest};
use crate::primitives::platform::Platform;

/// What kiln owns in a node rootfs: the layer holds what changed under these.
pub const OWNED: &[&str] = &["var/lib/containerd", "etc/containerd", "kind"];
/// Single files kiln owns: the Kubernetes node binaries it installs.
pub const OWNED_FILES: &[&str] = &["usr/bin/kubeadm", "usr/bin/kubelet", "usr/bin/kubectl"];
pub use crate::domain::manifest::MANIFEST_RECORD;

/// File metadata before kiln touched the rootfs.
#[derive(Debug, Default)]
pub struct Snapshot(BTreeMap<PathBuf, (u64, i64, i64, u32, u64)>);

fn stamp(m: &std::fs::Metadata) -> (u64, i64, i64, u32, u64) {
    (m.size(), m.mtime(), m.mtime_nsec(), m.mode(), m.ino())
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let full = root.join(rel);
    let Ok(meta) = std::fs::symlink_metadata(&full) else {
        return Ok(());
    };
    out.push(rel.to_path_buf());
    if meta.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(&full)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for n in names {
            walk(root, &rel.join(n), out)?;
        }
    }
    Ok(())
}

/// Everything under [`OWNED`], walked without following links; an owned
/// path (or a parent of one) that is a symlink is refused, so nothing
/// outside the rootfs is ever read into the layer.
fn owned_paths(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let r = crate::primitives::inroot::Root::open(root)?;
    let mut out = Vec::new();
    for o in OWNED {
        r.check_owned(Path::new(o))?;
        walk(root, Path::new(o), &mut out)?;
    }
    for f in OWNED_FILES {
        let f = Path::new(f);
        r.check_owned(f.parent().expect("has a parent"))?;
        walk(root, f, &mut out)?;
    }
    out.sort();
    Ok(out)
}

/// Whether kiln's layer may carry `rel`: a path under what kiln owns, or a
/// parent of one. Their owners are noted while the base is unpacked.
pub fn tracked(rel: &Path) -> bool {
    OWNED
        .iter()
        .chain(OWNED_FILES)
        .map(Path::new)
        .any(|o| rel.starts_with(o) || o.starts_with(rel))
}

/// What a node-image build extracts from its base: what kiln owns (and
/// the parents), plus the node's containerd binary (its version decides
/// the config's form) and kind's entrypoint (it marks a kind base).
pub fn extracted(rel: &Path) -> bool {
    tracked(rel)
        || crate::adapters::rootfs::OWN_BINARIES
            .iter()
            .chain([&crate::domain::kind::ENTRYPOINT])
            .map(Path::new)
            .any(|b| b.starts_with(rel))
}

pub fn snapshot(root: &Path) -> anyhow::Result<Snapshot> {
    let mut s = Snapshot::default();
    for p in owned_paths(root)? {
        s.0.insert(p.clone(), stamp(&std::fs::symlink_metadata(root.join(&p))?));
    }
    Ok(s)
}

/// Writes through to `inner`, hashing and counting what passes.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    n: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.hash.update(&buf[..k]);
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// How kiln's layer is compressed (`--layer-compression`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Every runtime reads it (the default).
    #[default]
    Gzip,
    /// Much faster to write (all cores), containerd 1.5+ and Docker 23+ read it.
    Zstd,
    /// No compression: fastest; the layer is mostly compressed blobs anyway.
    None,
}

impl Compression {
    pub fn media_type(self) -> &'static str {
        match self {
            Compression::Gzip => media::OCI_LAYER_GZIP,
            Compression::Zstd => media::OCI_LAYER_ZSTD,
            Compression::None => media::OCI_LAYER,
        }
    }
}

/// The compressor the tar streams into, itself writing into the hashing file.
enum Compressor<W: Write> {
    Gzip(crate::primitives::gzip::MixedGz<W>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
    None(W),
}

impl<W: Write> Compressor<W> {
    fn new(kind: Compression, out: W) -> std::io::Result<Self> {
        Ok(match kind {
            // No timestamp in the header: the same tar gives the same bytes.
            Compression::Gzip => Compressor::Gzip(crate::primitives::gzip::MixedGz::new(
                out,
                flate2::Compression::default(),
            )?),
            Compression::Zstd => {
                let mut z = zstd::stream::write::Encoder::new(out, 3)?;
                // Workers >= 1 give the same bytes whatever their number.
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                z.multithread(cores as u32)?;
                z.include_checksum(true)?;
                Compressor::Zstd(z)
            }
            Compression::None => Compressor::None(out),
        })
    }

    /// The next bytes are already compressed (a stored layer blob): gzip
    /// stores them instead of deflating them again; zstd finds that itself.
    fn set_stored(&mut self, stored: bool) -> std::io::Result<()> {
        match self {
            Compressor::Gzip(g) => g.set_stored(stored),
            _ => Ok(()),
        }
    }

    fn finish(self) -> std::io::Result<W> {
        match self {
            Compressor::Gzip(g) => g.finish(),
            Compressor::Zstd(z) => z.finish(),
            Compressor::None(w) => Ok(w),
        }
    }
}

impl<W: Write> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Compressor::Gzip(g) => g.write(buf),
            Compressor::Zstd(z) => z.write(buf),
            Compressor::None(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Compressor::Gzip(g) => g.flush(),
            Compressor::Zstd(z) => z.flush(),
            Compressor::None(w) => w.flush(),
        }
    }
}

/// A layer blob written to disk.
#[derive(Debug, Clone)]
pub struct LayerBlob {
    pub path: PathBuf,
    pub media_type: &'static str,
    pub digest: Digest,
    pub size: u64,
    pub diff_id: Digest,
    pub entries: usize,
}

/// What changed under [`OWNED`] since `before`, sorted: (path, is a
/// whiteout). New and changed entries come with their parents, so modes
/// and owners of new directories travel; what disappeared gets a whiteout.
fn changes(root: &Path, before: &Snapshot) -> anyhow::Result<Vec<(PathBuf, bool)>> {
    let now = owned_paths(root)?;
    let mut changed: Vec<PathBuf> = Vec::new();
    for p in &now {
        let m = std::fs::symlink_metadata(root.join(p))?;
        let differs = before.0.get(p).is_none_or(|b| *b != stamp(&m));
        if differs && !(m.is_dir() && before.0.contains_key(p)) {
            changed.push(p.clone());
        }
    }
    let mut with_parents: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
    for p in &changed {
        let mut a = p.parent();
        while let Some(d) = a.filter(|d| !d.as_os_str().is_empty()) {
            with_parents.insert(d.to_path_buf());
            a = d.parent();
        }
        with_parents.insert(p.clone());
    }
    // `now` is sorted ([`owned_paths`]): a lookup is a binary search, so the
    // whole diff stays n log n in what a base holds under what kiln owns.
    let deleted: Vec<&PathBuf> = before
        .0
        .keys()
        .filter(|p| now.binary_search(p).is_err())
        .collect();
    let mut names: Vec<(PathBuf, bool)> = with_parents.into_iter().map(|p| (p, false)).collect();
    for d in deleted {
        let name = format!(
            ".wh.{}",
            d.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        );
        names.push((d.parent().unwrap_or(Path::new("")).join(name), true));
    }
    names.sort();
    Ok(names)
}

/// The layer of everything under [`OWNED`] that is new or changed since
/// `before`, with whiteouts for what disappeared. Streams to `out_dir`.
pub fn diff_layer(
    root: &Path,
    before: &Snapshot,
    owners: &crate::primitives::unpack::Owners,
    out_dir: &Path,
    mtime: u64,
    compression: Compression,
) -> anyhow::Result<LayerBlob> {
    let names = changes(root, before)?;
    let tmp = tempfile::NamedTempFile::new_in(out_dir)?;
    let file = Hashing {
        inner: std::io::BufWriter::with_capacity(1 << 20, tmp.reopen()?),
        hash: Sha256::new(),
        n: 0,
    };
    let tar_out = Hashing {
        inner: Compressor::new(compression, file)?,
        hash: Sha256::new(),
        n: 0,
    };
    // Large writes into the hashing and compression chain.
    let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(1 << 20, tar_out));
    tar.follow_symlinks(false);
    let mut entries = 0;
    for (rel, whiteout) in names {
        crate::primitives::interrupt::check()?;
        let owner = owners.get(&rel).unwrap_or((0, 0));
        let stored = !whiteout && compressed_already(&root.join(&rel));
        if stored {
            let w = tar.get_mut();
            w.flush()?;
            w.get_mut().inner.set_stored(true)?;
        }
        if append_entry(&mut tar, root, &rel, whiteout, owner, mtime)? {
            entries += 1;
        }
        if stored {
            let w = tar.get_mut();
            w.flush()?;
            w.get_mut().inner.set_stored(false)?;
        }
    }
    let tar_out = tar
        .into_inner()?
        .into_inner()
        .map_err(|e| anyhow!("{}", e.error()))?;
    let diff_id = Digest::from_hasher(tar_out.hash);
    let mut file = tar_out.inner.finish()?;
    file.flush()?;
    let Hashing {
        inner,
        hash,
        n: size,
    } = file;
    drop(inner);
    let digest = Digest::from_hasher(hash);
    let path = out_dir.join(digest.hex());
    tmp.persist(&path).map_err(|e| anyhow!("{e}"))?;
    Ok(LayerBlob {
        path,
        media_type: compression.media_type(),
        digest,
        size,
        diff_id,
        entries,
    })
}

/// Whether a file's bytes are compressed already (gzip, zstd, xz, bzip2
/// magic) and big enough to matter: a stored layer blob.
fn compressed_already(path: &Path) -> bool {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !m.is_file() || m.len() < 64 << 10 {
        return false;
    }
    let mut magic = [0u8; 4];
    let read =
        std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
    read.is_ok()
        && (magic.starts_with(&[0x1f, 0x8b])
            || magic == [0x28, 0xb5, 0x2f, 0xfd]
            || magic == [0xfd, 0x37, 0x7a, 0x58]
            || magic.starts_with(b"BZh"))
}

/// Appends `rel` (or a whiteout for it) to kiln's layer: modes as on disk,
/// `owner` as the base's headers said (0:0 for what kiln added), whoever
/// ran kiln; mtime fixed; files read without following links. False for
/// what kiln does not carry (sockets, devices).
fn append_entry<W: Write>(
    tar: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    whiteout: bool,
    owner: (u64, u64),
    mtime: u64,
) -> anyhow::Result<bool> {
    let mut h = tar::Header::new_gnu();
    h.set_mtime(mtime);
    if whiteout {
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        h.set_uid(0);
        h.set_gid(0);
        tar.append_data(&mut h, rel, std::io::empty())?;
        return Ok(true);
    }
    let full = root.join(rel);
    let m = std::fs::symlink_metadata(&full)?;
    h.set_mode(m.mode() & 0o7777);
    h.set_uid(owner.0);
    h.set_gid(owner.1);
    if m.is_dir() {
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        tar.append_data(&mut h, rel, std::io::empty())?;
    } else if m.file_type().is_symlink() {
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        tar.append_link(&mut h, rel, std::fs::read_link(&full)?)?;
    } else if m.is_file() {
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(m.len());
        let f = rustix::fs::openat(
            rustix::fs::CWD,
            &full,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        tar.append_data(&mut h, rel, std::fs::File::from(f))?;
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// What the new image says about itself.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// RFC 3339; from SOURCE_DATE_EPOCH when set.
    pub created: String,
    pub kubernetes_version: Option<String>,
    pub base_name: String,
    pub base_digest: Digest,
    pub images: usize,
}

impl Provenance {
    fn annotations(&self) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([
            (
                "org.opencontainers.image.created".to_string(),
                self.created.clone(),
            ),
            (
                "org.opencontainers.image.base.name".to_string(),
                self.base_name.clone(),
            ),
            (
                "org.opencontainers.image.base.digest".to_string(),
                self.base_digest.to_string(),
            ),
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
        a
    }
}

/// The base config with the new layer appended (diff_ids, history); every
/// other field (entrypoint, env, labels, ...) kept as the base had it.
pub fn node_config(
    base_config: &[u8],
    layer: &LayerBlob,
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
    rootfs["diff_ids"]
        .as_array_mut()
        .ok_or_else(|| anyhow!("base config has no rootfs.diff_ids"))?
        .push(json!(layer.diff_id.to_string()));
    let history = obj.entry("history").or_insert_with(|| json!([]));
    history
        .as_array_mut()
        .ok_or_else(|| anyhow!("base config history is not a list"))?
        .push(json!({
            "created": prov.created,
            "created_by": format!("kiln build: {} component images, pinned", prov.images),
            "comment": "kiln",
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
    layer: &LayerBlob,
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
    layers.push(Descriptor::new(
        layer.media_type,
        layer.digest.clone(),
        layer.size,
    ));
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

/// A built node image in a layout: its top descriptor and per-platform manifests.
#[derive(Debug, Clone)]
pub struct NodeImage {
    pub top: Descriptor,
    pub manifests: Vec<(Platform, Descriptor)>,
    pub layers: Vec<LayerBlob>,
    /// Per platform: what kiln wrote of kind's layout.
    pub kind: Vec<crate::domain::kind::KindLayout>,
    /// Per platform: images the base's store held that kiln pinned.
    pub pinned_existing: Vec<Vec<String>>,
    /// Per platform: the base's pins kiln removed, or kept (`--keep-pinned`),
    /// and pins by others it left.
    pub pins: Vec<PinChanges>,
    /// Seconds spent per phase, all platforms together.
    pub phases: Phases,
}

/// Where a node-image build's time goes (seconds).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Phases {
    /// The base's blobs into the staging layout.
    pub pull_base: f64,
    /// The paths kiln needs, out of the base's layers.
    pub extract: f64,
    /// The images into the store (fetched, recorded, pinned), binaries and kind's layout.
    pub bake: f64,
    /// kiln's layer written and compressed, and the archive or push.
    pub pack: f64,
}

/// One platform's inputs: the manifest to bake (completed by its release's
/// control-plane images, when built from one) and the release.
pub struct PlatformInput {
    pub platform: Platform,
    pub manifest: crate::domain::manifest::NodeManifest,
    pub release: Option<crate::domain::kubernetes::Release>,
}

/// What every platform's build shares.
pub struct NodeBuild<'a> {
    pub inputs: &'a [PlatformInput],
    pub daemon: &'a crate::adapters::rootfs::DaemonChoice,
    pub jobs: usize,
    pub progress: crate::primitives::progress::Progress,
    /// kind's default CNI and storage manifests from this directory, and
    /// how to name where they came from (`--kind-manifests`, `--kind-node`).
    pub kind_manifests: Option<(&'a Path, &'a str)>,
    /// Pin the images the base's store already holds.
    pub pin_existing: bool,
    /// `--keep-pinned`.
    pub keep_pinned: bool,
    pub compression: Compression,
    pub limits: crate::primitives::unpack::Limits,
}

/// Builds a node image per platform from `base` (already copied into
/// `layout` as `base_ref`) and each platform's manifest, its images from
/// the platform's release first, then `images`.
pub async fn build_node_image<S: crate::source::Source>(
    layout: &crate::sink::layout::OciLayout,
    base_ref: &crate::primitives::reference::ImageRef,
    base_top: &Descriptor,
    images: &S,
    spec: &NodeBuild<'_>,
) -> anyhow::Result<NodeImage> {
    use crate::sink::Sink;
    let (created, mtime) = crate::primitives::epoch::creation_time()?;
    let first = spec
        .inputs
        .first()
        .ok_or_else(|| anyhow!("no platform to build"))?;
    let prov = Provenance {
        created,
        kubernetes_version: first.manifest.kubernetes_version.clone(),
        base_name: base_ref
            .tagged_name()
            .unwrap_or_else(|| base_ref.to_string()),
        base_digest: base_top.digest.clone(),
        images: first.manifest.images.len(),
    };
    let platforms: Vec<Platform> = spec.inputs.iter().map(|i| i.platform.clone()).collect();
    let mut node = NodeImage {
        top: base_top.clone(),
        manifests: Vec::new(),
        layers: Vec::new(),
        kind: Vec::new(),
        pinned_existing: Vec::new(),
        pins: Vec::new(),
        phases: Phases::default(),
    };
    let bases = base_manifests(layout, base_ref, base_top, &platforms)?;
    for (input, (_, base)) in spec.inputs.iter().zip(bases) {
        let built = build_platform(layout, images, spec, input, &base, &prov, mtime).await?;
        node.manifests
            .push((input.platform.clone(), built.manifest));
        node.layers.push(built.layer);
        node.kind.push(built.kind);
        node.pinned_existing.push(built.pinned_existing);
        node.pins.push(built.pins);
        node.phases.extract += built.phases.extract;
        node.phases.bake += built.phases.bake;
        node.phases.pack += built.phases.pack;
    }
    node.top = if node.manifests.len() == 1 {
        node.manifests[0].1.clone()
    } else {
        let b = node_index(&node.manifests, &prov)?;
        let d = Descriptor::new(media::OCI_INDEX, Digest::of(&b), b.len() as u64);
        layout.put_bytes(&d, bytes::Bytes::from(b)).await?;
        d
    };
    Ok(node)
}

fn read_blob(layout: &crate::sink::layout::OciLayout, d: &Digest) -> anyhow::Result<Vec<u8>> {
    std::fs::read(layout.blob_path(d)).with_context(|| format!("{d} is not in the layout"))
}

/// The base's manifest for each platform asked for.
fn base_manifests(
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

/// What a platform's build did to pins it did not make for the manifest.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PinChanges {
    pub platform: String,
    pub unpinned: Vec<crate::domain::bake::Unpinned>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_pinned: Vec<crate::domain::bake::Unpinned>,
    pub pinned_by_others: Vec<String>,
}

/// One platform's result.
struct BuiltPlatform {
    manifest: Descriptor,
    layer: LayerBlob,
    kind: crate::domain::kind::KindLayout,
    pinned_existing: Vec<String>,
    pins: PinChanges,
    phases: Phases,
}

/// A kindest/base (kind's entrypoint) with no `/kind/version` and no
/// release to build in makes an image kind cannot start ("failed to get
/// kubernetes version"): refused before any work. A kindest/node base
/// carries `/kind/version` and is fine.
fn refuse_kind_base_without_kubernetes(
    rootfs: &Path,
    input: &PlatformInput,
    base: &str,
) -> anyhow::Result<()> {
    let root = crate::primitives::inroot::Root::open(rootfs)?;
    if input.release.is_none()
        && crate::domain::kind::is_kind_base(&root)
        && root
            .read(Path::new(crate::domain::kind::VERSION_FILE))?
            .is_none()
    {
        return Err(crate::primitives::error::BadInput(format!(
            "base {base} is a kind base (it has /{}) without Kubernetes (no /{}): kind cannot start the node image; add --kubernetes SRC (a kubernetes-server-linux-ARCH release), or build from a kindest/node base",
            crate::domain::kind::ENTRYPOINT,
            crate::domain::kind::VERSION_FILE
        ))
        .into());
    }
    Ok(())
}

/// One platform: the base unpacked, the store baked, the release's binaries
/// and kind's layout written, kiln's layer, the config and the manifest.
async fn build_platform<S: crate::source::Source>(
    layout: &crate::sink::layout::OciLayout,
    images: &S,
    spec: &NodeBuild<'_>,
    input: &PlatformInput,
    base: &ImageManifest,
    prov: &Provenance,
    mtime: u64,
) -> anyhow::Result<BuiltPlatform> {
    use crate::sink::Sink;
    let platform = &input.platform;
    let work = tempfile::Builder::new().prefix("kiln-node-").tempdir()?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs)?;
    let mut phases = Phases::default();
    let started = std::time::Instant::now();
    let mut owners = crate::primitives::unpack::Owners::new(tracked);
    let mut budget = crate::primitives::unpack::Budget::new(spec.limits, tracked);
    for l in &base.layers {
        crate::primitives::unpack::apply_layer_part(
            &rootfs,
            &layout.blob_path(&l.digest),
            &mut owners,
            extracted,
            &mut budget,
        )
        .with_context(|| format!("unpacking base layer {}", l.digest))?;
    }
    refuse_kind_base_without_kubernetes(&rootfs, input, &prov.base_name)?;
    let before = snapshot(&rootfs)?;
    phases.extract = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let renamed = input.release.as_ref().map(|r| r.source()).transpose()?;
    let source = crate::source::renamed::Overlay {
        first: renamed.as_ref(),
        rest: images,
    };
    let built = crate::domain::bake::build_rootfs(
        &rootfs,
        &source,
        crate::domain::bake::BuildSpec {
            choice: spec.daemon,
            manifest: &input.manifest,
            platforms: vec![platform.clone()],
            jobs: spec.jobs,
            progress: spec.progress.clone(),
            pin_existing: spec.pin_existing,
            keep_pinned: spec.keep_pinned,
            from_base: true,
        },
    )
    .await?;
    if !built.failed.is_empty() {
        let failed: Vec<&str> = built.failed.iter().map(|f| f.error.as_str()).collect();
        bail!(
            "{platform}: {} of {} images failed: {}",
            failed.len(),
            input.manifest.images.len(),
            failed.join("; ")
        );
    }
    let root = crate::primitives::inroot::Root::open(&rootfs)?;
    if let Some(r) = &input.release {
        r.install(&root)?;
    }
    let kind = crate::domain::kind::write_layout(
        &root,
        &input.manifest,
        input.release.as_ref().map(|r| r.version.as_str()),
        spec.kind_manifests,
    )?;
    phases.bake = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let layer = diff_layer(
        &rootfs,
        &before,
        &owners,
        &layout.blobs_dir(),
        mtime,
        spec.compression,
    )?;
    let config_bytes = node_config(
        &read_blob(layout, &base.config.digest)?,
        &layer,
        prov,
        kind.kind_base,
    )?;
    let config = Descriptor::new(
        media::OCI_CONFIG,
        Digest::of(&config_bytes),
        config_bytes.len() as u64,
    );
    layout
        .put_bytes(&config, bytes::Bytes::from(config_bytes))
        .await?;
    let m_bytes = node_manifest(base, &config, &layer, prov)?;
    let m_desc = Descriptor::new(
        media::OCI_MANIFEST,
        Digest::of(&m_bytes),
        m_bytes.len() as u64,
    );
    layout
        .put_bytes(&m_desc, bytes::Bytes::from(m_bytes))
        .await?;
    phases.pack = started.elapsed().as_secs_f64();
    Ok(BuiltPlatform {
        manifest: m_desc,
        layer,
        kind,
        pinned_existing: built.pinned_existing,
        pins: PinChanges {
            platform: platform.to_string(),
            unpinned: built.unpinned,
            kept_pinned: built.kept_pinned,
            pinned_by_others: built.pinned_by_others,
        },
        phases,
    })
}
