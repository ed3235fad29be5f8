//! A kindest/base-style base image for node-image tests: a real containerd
//! binary at usr/local/bin/containerd, an existing containerd config whose
//! settings must survive, and a second layer with a whiteout and an opaque
//! directory. Plus an independent unpacker for OCI archives, so tests do not
//! judge kiln's output with kiln's own code.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde_json::json;

use crate::image::{
    gzip, Blob, BuiltImage, Layer, PlatformImage, OCI_CONFIG, OCI_INDEX, OCI_LAYER_GZIP,
    OCI_MANIFEST,
};

pub const BASE_CONFIG_TOML: &str = "# kindest/base-style settings that must survive\nversion = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.9\"\n  max_container_log_line_size = 12345\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"native\"\n";

/// One tar entry: (path, kind, data, link target, mode).
pub type Entry<'a> = (&'a str, tar::EntryType, &'a [u8], &'a str, u32);

/// A layer from explicit entries (names written as given, so hostile ones too).
pub fn layer_of(entries: &[Entry]) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data, link, mode) in entries {
        let mut h = tar::Header::new_gnu();
        {
            let g = h.as_gnu_mut().unwrap();
            g.name[..name.len()].copy_from_slice(name.as_bytes());
            g.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_600_000_000);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    let tar = b.into_inner().unwrap();
    Layer {
        diff_id: crate::image::sha256(&tar),
        blob: Blob::new(OCI_LAYER_GZIP, gzip(&tar)),
        tar,
    }
}

/// A layer of hand-made tar bytes (headers no builder writes on its own).
pub fn layer_from_tar(tar: Vec<u8>) -> Layer {
    Layer {
        diff_id: crate::image::sha256(&tar),
        blob: Blob::new(OCI_LAYER_GZIP, gzip(&tar)),
        tar,
    }
}

/// A tar whose one file `path` says size 0 in its ustar header and
/// `data.len()` in a PAX `size` record, which readers obey (POSIX pax).
pub fn pax_sized_tar(path: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let size = data.len().to_string();
    b.append_pax_extensions([("size", size.as_bytes())])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path(path).unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(0);
    h.set_mode(0o644);
    h.set_mtime(1_600_000_000);
    h.set_cksum();
    // The data follows the header as PAX's size says (padded by what is
    // written, not by the header's field).
    b.append(&h, data).unwrap();
    b.into_inner().unwrap()
}

/// A tar whose one GNU sparse file `path` is `logical` bytes long when
/// read back, of which only its last `data.len()` (a multiple of 512) are
/// stored: the rest is a hole, written out as zeros by an unpack.
pub fn sparse_tar(path: &str, logical: u64, data: &[u8]) -> Vec<u8> {
    assert!(data.len().is_multiple_of(512) && data.len() as u64 <= logical);
    let mut h = tar::Header::new_gnu();
    h.set_path(path).unwrap();
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(1_600_000_000);
    {
        let g = h.as_gnu_mut().unwrap();
        g.set_real_size(logical);
        g.sparse[0].set_offset(logical - data.len() as u64);
        g.sparse[0].set_length(data.len() as u64);
    }
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, data).unwrap();
    b.into_inner().unwrap()
}

/// An image (an OCI index over `platforms`) from the given layers.
pub fn image_of(repo: &str, tag: &str, platforms: &[&str], layers: Vec<Layer>) -> BuiltImage {
    image_running(repo, tag, platforms, layers, &["/sbin/init"])
}

/// An image whose entrypoint is `entrypoint`.
pub fn image_running(
    repo: &str,
    tag: &str,
    platforms: &[&str],
    layers: Vec<Layer>,
    entrypoint: &[&str],
) -> BuiltImage {
    let mut pis = Vec::new();
    for p in platforms {
        let parts: Vec<&str> = p.split('/').collect();
        let cfg = json!({
            "architecture": parts[1], "os": parts[0],
            "config": {"Entrypoint": entrypoint, "Env": ["container=docker", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Labels": {"org.example.base": "kiln-test"}, "StopSignal": "SIGRTMIN+3"},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
            "history": layers.iter().map(|_| json!({"created_by": "kiln-testkit base"})).collect::<Vec<_>>(),
        });
        let config = Blob::new(OCI_CONFIG, serde_json::to_vec(&cfg).unwrap());
        let m = json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config.descriptor(), "layers": layers.iter().map(|l| l.blob.descriptor()).collect::<Vec<_>>()});
        let manifest = Blob::new(OCI_MANIFEST, serde_json::to_vec(&m).unwrap());
        pis.push(PlatformImage {
            platform: p.to_string(),
            manifest,
            config,
            layers: layers.clone(),
        });
    }
    index_over(repo, tag, pis)
}

/// An image (an OCI index over one platform) of these layers and this
/// whole config document.
pub fn single_image(
    repo: &str,
    tag: &str,
    platform: &str,
    layers: Vec<Layer>,
    config: serde_json::Value,
) -> BuiltImage {
    let config = Blob::new(OCI_CONFIG, serde_json::to_vec(&config).unwrap());
    let m = json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config.descriptor(), "layers": layers.iter().map(|l| l.blob.descriptor()).collect::<Vec<_>>()});
    let manifest = Blob::new(OCI_MANIFEST, serde_json::to_vec(&m).unwrap());
    index_over(
        repo,
        tag,
        vec![PlatformImage {
            platform: platform.to_string(),
            manifest,
            config,
            layers,
        }],
    )
}

/// One image (an OCI index) over the platforms of several single-platform
/// images: a multi-arch base whose platforms differ in content.
pub fn index_of(repo: &str, tag: &str, images: Vec<BuiltImage>) -> BuiltImage {
    index_over(
        repo,
        tag,
        images.into_iter().flat_map(|i| i.platforms).collect(),
    )
}

fn index_over(repo: &str, tag: &str, pis: Vec<PlatformImage>) -> BuiltImage {
    let entries: Vec<serde_json::Value> = pis
        .iter()
        .map(|pi| {
            let parts: Vec<&str> = pi.platform.split('/').collect();
            let mut d = pi.manifest.descriptor();
            d["platform"] = json!({"os": parts[0], "architecture": parts[1]});
            d
        })
        .collect();
    let top = Blob::new(
        OCI_INDEX,
        serde_json::to_vec(
            &json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}),
        )
        .unwrap(),
    );
    BuiltImage {
        repo: repo.into(),
        tag: tag.into(),
        top,
        platforms: pis,
        extra: vec![],
    }
}

/// The standard test base: containerd (the binary `make deps` fetched), a
/// config to keep, and a second layer with a whiteout and an opaque dir.
pub fn kind_base(platforms: &[&str]) -> BuiltImage {
    kind_base_with(&crate::tools::containerd(), platforms)
}

/// [`kind_base`] with another containerd binary (e.g. 2.x).
pub fn kind_base_with(containerd: &Path, platforms: &[&str]) -> BuiltImage {
    kind_base_custom(containerd, platforms, BASE_CONFIG_TOML, false)
}

/// A containerd 2.x-era config in the version-3 form (containerd 2.0-2.2).
pub const BASE_CONFIG_TOML_V3: &str = "# kindest/base-style settings that must survive\nversion = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = \"native\"\n\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"registry.k8s.io/pause:3.9\"\n\n[plugins.'io.containerd.cri.v1.runtime']\n  max_container_log_line_size = 12345\n";

/// [`kind_base_with`] with its own `etc/containerd/config.toml`, and (`kind`)
/// kind's `usr/local/bin/entrypoint`, which marks a kindest/base.
pub fn kind_base_custom(
    containerd: &Path,
    platforms: &[&str],
    config_toml: &str,
    kind: bool,
) -> BuiltImage {
    use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as S};
    // Its shim too, as kindest/base ships it: `kiln verify --start` runs containers.
    let shim = std::fs::read(containerd.with_file_name("containerd-shim-runc-v2")).unwrap();
    let containerd = std::fs::read(containerd).unwrap();
    let l1 = layer_of(&[
        ("etc/", D, b"", "", 0o755),
        ("etc/containerd/", D, b"", "", 0o755),
        (
            "etc/containerd/config.toml",
            F,
            config_toml.as_bytes(),
            "",
            0o644,
        ),
        ("etc/old-file", F, b"removed by layer 2\n", "", 0o644),
        ("etc/keep-file", F, b"kept\n", "", 0o644),
        ("etc/keep-hard", H, b"", "etc/keep-file", 0o644),
        ("opq/", D, b"", "", 0o755),
        ("opq/a", F, b"a\n", "", 0o644),
        ("opq/b", F, b"b\n", "", 0o644),
        ("usr/", D, b"", "", 0o755),
        ("usr/local/", D, b"", "", 0o755),
        ("usr/local/bin/", D, b"", "", 0o755),
        ("usr/local/bin/containerd", F, &containerd, "", 0o755),
        ("usr/local/bin/containerd-shim-runc-v2", F, &shim, "", 0o755),
        ("usr/bin/", D, b"", "", 0o755),
        (
            "usr/bin/containerd-link",
            S,
            b"",
            "../local/bin/containerd",
            0o777,
        ),
        ("var/", D, b"", "", 0o755),
        ("var/lib/", D, b"", "", 0o755),
    ]);
    let mut l2: Vec<Entry> = vec![
        ("etc/.wh.old-file", F, b"", "", 0o644),
        ("opq/.wh..wh..opq", F, b"", "", 0o644),
        ("opq/c", F, b"c\n", "", 0o644),
        ("etc/layer2-file", F, b"from layer 2\n", "", 0o600),
    ];
    if kind {
        l2.push((
            "usr/local/bin/entrypoint",
            F,
            b"#!/bin/sh\nexec \"$@\"\n",
            "",
            0o755,
        ));
    }
    image_of("kindest/base", "test", platforms, vec![l1, layer_of(&l2)])
}

/// [`kind_base`] with one more layer on top.
pub fn kind_base_plus(platforms: &[&str], extra: Layer) -> BuiltImage {
    let b = kind_base(platforms);
    let layers: Vec<Layer> = b.platforms[0]
        .layers
        .iter()
        .cloned()
        .chain(std::iter::once(extra))
        .collect();
    image_of(&b.repo, &b.tag, platforms, layers)
}

/// A kindest/base-style base for the platform that is not this machine's
/// ([`crate::tools::other_platform`]): Debian's containerd for it at
/// usr/local/bin/containerd, the C library it loads (`lib` -> `usr/lib`, as
/// a merged-/usr Debian has it), a containerd config and kind's entrypoint.
pub fn foreign_kind_base() -> BuiltImage {
    use tar::EntryType::{Directory as D, Regular as F, Symlink as S};
    let (platform, _) = crate::tools::other_platform();
    let root = crate::tools::foreign_root();
    let containerd = std::fs::read(root.join("usr/bin/containerd")).unwrap();
    let mut libs: Vec<(String, Vec<u8>, Option<String>)> = Vec::new();
    for dir in ["usr/lib", "usr/lib64"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // The dynamic loader, wherever the ELF interpreter names it.
            if name.starts_with("ld-linux") {
                let p = e.path();
                match std::fs::read_link(&p) {
                    Ok(t) => libs.push((
                        format!("{dir}/{name}"),
                        vec![],
                        Some(t.display().to_string()),
                    )),
                    Err(_) => {
                        libs.push((format!("{dir}/{name}"), std::fs::read(&p).unwrap(), None))
                    }
                }
            }
        }
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in rd.flatten().filter(|e| e.path().is_dir()) {
            let triplet = e.file_name().to_string_lossy().into_owned();
            if !triplet.ends_with("-linux-gnu") {
                continue;
            }
            for lib in ["libc.so.6", "ld-linux-aarch64.so.1", "ld-linux-x86-64.so.2"] {
                let p = e.path().join(lib);
                if p.is_file() {
                    libs.push((
                        format!("{dir}/{triplet}/{lib}"),
                        std::fs::read(&p).unwrap(),
                        None,
                    ));
                }
            }
        }
    }
    assert!(
        libs.iter().any(|(n, _, _)| n.ends_with("libc.so.6")),
        "no libc.so.6 under {}",
        root.display()
    );
    let mut dirs: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for (n, _, _) in &libs {
        let mut p = Path::new(n).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(format!("{}/", d.display()));
            p = d.parent();
        }
    }
    let mut entries: Vec<Entry> = vec![
        ("etc/", D, b"", "", 0o755),
        ("etc/containerd/", D, b"", "", 0o755),
        (
            "etc/containerd/config.toml",
            F,
            BASE_CONFIG_TOML.as_bytes(),
            "",
            0o644,
        ),
        ("usr/", D, b"", "", 0o755),
        ("usr/local/", D, b"", "", 0o755),
        ("usr/local/bin/", D, b"", "", 0o755),
        ("usr/local/bin/containerd", F, &containerd, "", 0o755),
        (
            "usr/local/bin/entrypoint",
            F,
            b"#!/bin/sh\nexec \"$@\"\n",
            "",
            0o755,
        ),
        ("lib", S, b"", "usr/lib", 0o777),
        ("lib64", S, b"", "usr/lib64", 0o777),
        ("var/", D, b"", "", 0o755),
        ("var/lib/", D, b"", "", 0o755),
    ];
    entries.extend(
        dirs.iter()
            .filter(|d| *d != "usr/")
            .map(|d| (d.as_str(), D, &b""[..], "", 0o755)),
    );
    for (n, data, link) in &libs {
        match link {
            Some(t) => entries.push((n.as_str(), S, b"", t.as_str(), 0o777)),
            None => entries.push((n.as_str(), F, data.as_slice(), "", 0o755)),
        }
    }
    image_of(
        "kindest/base",
        "test",
        &[&platform],
        vec![layer_of(&entries)],
    )
}

/// The store of `rootfs` (its `var/lib/containerd`) as one layer.
pub fn store_layer(rootfs: &Path) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all("var/lib/containerd", rootfs.join("var/lib/containerd"))
        .unwrap();
    let tar = b.into_inner().unwrap();
    Layer {
        diff_id: crate::image::sha256(&tar),
        blob: Blob::new(OCI_LAYER_GZIP, gzip(&tar)),
        tar,
    }
}

/// The one layer that makes a base kind-like to kiln: `/kind/version`
/// holding `version` (kiln refuses a kind base with no Kubernetes).
pub fn kind_version_layer(version: &str) -> Layer {
    let line = format!("{version}\n");
    layer_of(&[
        ("kind/", tar::EntryType::Directory, b"", "", 0o755),
        (
            "kind/version",
            tar::EntryType::Regular,
            line.as_bytes(),
            "",
            0o644,
        ),
    ])
}

/// A stand-in kindest/node: a kind base, then a layer with `/kind/version`
/// and `manifests` (file name under `/kind/manifests/` -> bytes), then (if
/// given) the store of `store_rootfs`, as a published kind node carries its
/// images.
pub fn kind_node(
    containerd: &Path,
    platforms: &[&str],
    version: &str,
    manifests: &[(&str, &[u8])],
    store_rootfs: Option<&Path>,
) -> BuiltImage {
    use tar::EntryType::{Directory as D, Regular as F};
    let base = kind_base_custom(containerd, platforms, BASE_CONFIG_TOML, true);
    let version_line = format!("{version}\n");
    let names: Vec<String> = manifests
        .iter()
        .map(|(n, _)| format!("kind/manifests/{n}"))
        .collect();
    let mut entries: Vec<Entry> = vec![
        ("kind/", D, b"", "", 0o755),
        ("kind/version", F, version_line.as_bytes(), "", 0o644),
        ("kind/manifests/", D, b"", "", 0o755),
    ];
    for (name, (_, bytes)) in names.iter().zip(manifests) {
        entries.push((name, F, bytes, "", 0o644));
    }
    let mut layers: Vec<Layer> = base.platforms[0].layers.clone();
    layers.push(layer_of(&entries));
    if let Some(r) = store_rootfs {
        layers.push(store_layer(r));
    }
    image_of("kindest/node", version, platforms, layers)
}

/// Reads an OCI image-layout tar fully into memory: name -> bytes.
pub fn read_tar(path: &Path) -> BTreeMap<String, Vec<u8>> {
    tar_entries(std::fs::File::open(path).unwrap())
}

/// Every entry of a tar stream: name -> bytes.
pub fn tar_entries(r: impl Read) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut ar = tar::Archive::new(r);
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut v = Vec::new();
        e.read_to_end(&mut v).unwrap();
        out.insert(name, v);
    }
    out
}

pub fn blob<'a>(files: &'a BTreeMap<String, Vec<u8>>, digest: &str) -> &'a [u8] {
    files
        .get(&format!(
            "blobs/sha256/{}",
            digest.trim_start_matches("sha256:")
        ))
        .unwrap_or_else(|| panic!("archive lacks {digest}"))
}

/// A layer's tar from its blob: gzip, zstd (ruzstd, not the encoder kiln
/// uses) or plain.
pub fn decompress(b: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    match b {
        [0x1f, 0x8b, ..] => {
            flate2::read::GzDecoder::new(b).read_to_end(&mut v).unwrap();
        }
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            ruzstd::decoding::StreamingDecoder::new(b)
                .unwrap()
                .read_to_end(&mut v)
                .unwrap();
        }
        _ => v.extend_from_slice(b),
    }
    v
}

/// Applies an image's layers to `dest` with the tar crate's own unpacking,
/// handling OCI whiteouts: an unpacker that shares no code with kiln.
pub fn unpack_layers(files: &BTreeMap<String, Vec<u8>>, layer_digests: &[String], dest: &Path) {
    for d in layer_digests {
        let tar = decompress(blob(files, d));
        let mut ar = tar::Archive::new(tar.as_slice());
        let mut deferred = Vec::new();
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let p = e.path().unwrap().into_owned();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let dir = dest.join(p.parent().unwrap());
            if name == ".wh..wh..opq" {
                for c in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let _ = std::fs::remove_dir_all(c.path())
                        .or_else(|_| std::fs::remove_file(c.path()));
                }
            } else if let Some(h) = name.strip_prefix(".wh.") {
                let t = dir.join(h);
                let _ = std::fs::remove_dir_all(&t).or_else(|_| std::fs::remove_file(&t));
            } else {
                deferred.push(p);
            }
        }
        let mut ar = tar::Archive::new(tar.as_slice());
        ar.set_preserve_permissions(true);
        ar.set_overwrite(true);
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let p = e.path().unwrap().into_owned();
            if deferred.contains(&p) {
                e.unpack_in(dest).unwrap();
            }
        }
    }
}

/// A runnable single-binary image for `kiln verify --start`: the static
/// stand-in (waits for SIGTERM; with `exit` as its argument, exits at once)
/// at `path`, run with `args`.
pub fn runnable(repo: &str, tag: &str, path: &str, args: &[&str]) -> BuiltImage {
    use tar::EntryType::{Directory as D, Regular as F};
    let bin = std::fs::read(crate::tools::standin()).unwrap();
    let rel = path.trim_start_matches('/');
    let mut entries: Vec<(String, tar::EntryType, Vec<u8>, u32)> = Vec::new();
    let mut dir = String::new();
    for part in rel.split('/').take(rel.split('/').count() - 1) {
        dir.push_str(part);
        dir.push('/');
        entries.push((dir.clone(), D, vec![], 0o755));
    }
    entries.push((rel.to_string(), F, bin, 0o755));
    let refs: Vec<Entry> = entries
        .iter()
        .map(|(n, k, d, m)| (n.as_str(), *k, d.as_slice(), "", *m))
        .collect();
    let mut entrypoint = vec![path];
    entrypoint.extend(args);
    image_running(
        repo,
        tag,
        &[&crate::image::host_platform()],
        vec![layer_of(&refs)],
        &entrypoint,
    )
}

/// The layer digests an image manifest (as JSON) lists, in order.
pub fn layer_digests(manifest: &serde_json::Value) -> Vec<String> {
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}
