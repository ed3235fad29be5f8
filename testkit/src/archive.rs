//! Image archives as `docker save` (legacy and Docker 25+) and OCI tools
//! write them, for `kiln load --archive` tests.

use serde_json::json;

use crate::image::{Blob, BuiltImage, PlatformImage};

/// A tar of `(name, bytes)` entries, written as given: names may be hostile
/// (`../x`, `/abs`), which the tar crate's own path checks would refuse.
pub fn raw_tar(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_old();
        let field = &mut h.as_old_mut().name;
        field[..name.len()].copy_from_slice(name.as_bytes());
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// `docker save` before Docker 25: `manifest.json`, `<hex>.json` configs,
/// uncompressed `<id>/layer.tar`s, `repositories`. A layer two images share
/// is a symlink to the first copy, as docker writes it.
pub fn docker_save_legacy(images: &[(&PlatformImage, &[&str])]) -> Vec<u8> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut links: Vec<(String, String)> = Vec::new();
    let mut manifest = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (img, tags) in images {
        let config_name = format!("{}.json", img.config.digest.trim_start_matches("sha256:"));
        files.push((config_name.clone(), img.config.bytes.clone()));
        let mut layers = Vec::new();
        for l in &img.layers {
            let id = l.diff_id.trim_start_matches("sha256:").to_string();
            let path = format!("{id}/layer.tar");
            if let Some(first) = seen.get(&id) {
                if *first != path {
                    links.push((path.clone(), format!("../{first}")));
                }
            } else {
                seen.insert(id.clone(), path.clone());
                files.push((path.clone(), l.tar.clone()));
                files.push((format!("{id}/VERSION"), b"1.0".to_vec()));
            }
            layers.push(path);
        }
        manifest.push(json!({"Config": config_name, "RepoTags": tags, "Layers": layers}));
    }
    files.push((
        "manifest.json".into(),
        serde_json::to_vec(&manifest).unwrap(),
    ));
    files.push(("repositories".into(), b"{}".to_vec()));
    let entries: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let mut tar = raw_tar(&entries);
    for (from, to) in links {
        tar = raw_tar_with_link_into(tar, &from, &to);
    }
    tar
}

fn raw_tar_with_link_into(mut bytes: Vec<u8>, from: &str, to: &str) -> Vec<u8> {
    bytes.truncate(bytes.len() - 1024);
    let mut b = tar::Builder::new(bytes);
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..from.len()].copy_from_slice(from.as_bytes());
    h.as_old_mut().linkname[..to.len()].copy_from_slice(to.as_bytes());
    h.set_size(0);
    h.set_mode(0o777);
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_cksum();
    b.append(&h, std::io::empty()).unwrap();
    b.into_inner().unwrap()
}

/// An OCI image layout tarball holding `img` (its whole index, or its
/// manifest) named `name` by both annotations; `platforms` limits which
/// platforms' blobs are included (None: all).
pub fn oci_layout(img: &BuiltImage, name: &str, platforms: Option<&[&str]>) -> Vec<u8> {
    let mut blobs: Vec<&Blob> = vec![&img.top];
    for p in &img.platforms {
        if platforms.is_some_and(|ps| !ps.contains(&p.platform.as_str())) {
            continue;
        }
        blobs.push(&p.manifest);
        blobs.push(&p.config);
        blobs.extend(p.layers.iter().map(|l| &l.blob));
    }
    let tag = name.rsplit(':').next().unwrap();
    let mut entry = img.top.descriptor();
    entry["annotations"] =
        json!({"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag});
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [entry]});
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".into(), serde_json::to_vec(&index).unwrap()),
    ];
    let mut seen = std::collections::HashSet::new();
    for b in blobs {
        if seen.insert(b.digest.clone()) {
            files.push((
                format!("blobs/sha256/{}", b.digest.trim_start_matches("sha256:")),
                b.bytes.clone(),
            ));
        }
    }
    let entries: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    raw_tar(&entries)
}

/// Docker 25+ `docker save`: an OCI layout plus a `manifest.json` whose
/// paths point into `blobs/sha256/`.
pub fn docker_save_v25(img: &PlatformImage, tag: &str) -> Vec<u8> {
    let hex = |d: &str| d.trim_start_matches("sha256:").to_string();
    let mut entry = img.manifest.descriptor();
    entry["annotations"] = json!({"io.containerd.image.name": tag, "org.opencontainers.image.ref.name": tag.rsplit(':').next().unwrap()});
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [entry]});
    let manifest = json!([{
        "Config": format!("blobs/sha256/{}", hex(&img.config.digest)),
        "RepoTags": [tag],
        "Layers": img.layers.iter().map(|l| format!("blobs/sha256/{}", hex(&l.blob.digest))).collect::<Vec<_>>(),
    }]);
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".into(), serde_json::to_vec(&index).unwrap()),
        (
            "manifest.json".into(),
            serde_json::to_vec(&manifest).unwrap(),
        ),
    ];
    for b in std::iter::once(&img.manifest)
        .chain(std::iter::once(&img.config))
        .chain(img.layers.iter().map(|l| &l.blob))
    {
        files.push((format!("blobs/sha256/{}", hex(&b.digest)), b.bytes.clone()));
    }
    let entries: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    raw_tar(&entries)
}
