//! What a store holds, as kubelet would judge it: per image, which platforms
//! are complete, how big it is, and whether it is managed and pinned.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::engine::closure::{self, Select};
use crate::primitives::digest::Digest;
use crate::primitives::oci::Descriptor;
use crate::sink::containerd::{ContainerdStore, LABEL_MANAGED, LABEL_PINNED};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReport {
    /// The image's name (`name:tag`, or `name@digest` when it has no tag).
    pub name: String,
    /// Every record that points at this image under this repository.
    pub references: Vec<String>,
    pub digest: String,
    pub media_type: String,
    /// Platforms whose manifest, config and layers are all present and kept by GC labels.
    pub platforms: Vec<String>,
    /// Bytes present in the store for this image.
    pub size: u64,
    /// Every platform the store holds any part of is whole (the same walk
    /// build and load run before they report success).
    pub complete: bool,
    pub pinned: bool,
    pub managed: bool,
}

/// Reports every image in the store, grouped by repository and target.
pub async fn inspect(store: &ContainerdStore) -> anyhow::Result<Vec<ImageReport>> {
    let images = store.list_images().await?;
    // repository name + target digest -> records
    let mut groups: BTreeMap<(String, String), Vec<&containerd_client::services::v1::Image>> =
        BTreeMap::new();
    for img in &images {
        let Some(target) = &img.target else { continue };
        let repo = repository_of(&img.name);
        groups
            .entry((repo, target.digest.clone()))
            .or_default()
            .push(img);
    }
    let mut reports = Vec::new();
    for ((_, digest), records) in groups {
        let target = records[0].target.clone().expect("grouped by target");
        let mut references: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
        references.sort_by_key(|n| (n.contains('@') || n.starts_with("sha256:"), n.clone()));
        let label = |k: &str, v: &str| {
            records
                .iter()
                .any(|r| r.labels.get(k).is_some_and(|x| x == v))
        };
        let (platforms, size, complete) = match Digest::parse(&digest) {
            Ok(d) => {
                let top = Descriptor::new(&target.media_type, d, target.size.max(0) as u64);
                let w = closure::walk(store, &top, Select::Present).await?;
                (w.platforms(), w.size, w.complete())
            }
            Err(_) => (Vec::new(), 0, false),
        };
        reports.push(ImageReport {
            name: references[0].clone(),
            references,
            digest,
            media_type: target.media_type,
            platforms,
            size,
            complete,
            pinned: label(LABEL_PINNED, "pinned"),
            managed: label(LABEL_MANAGED, "managed"),
        });
    }
    reports.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(reports)
}

/// `name:tag` / `name@digest` -> `name`; CRI's `sha256:<id>` records stay whole.
fn repository_of(record: &str) -> String {
    if record.starts_with("sha256:") {
        return record.to_string();
    }
    if let Some((n, _)) = record.split_once('@') {
        return n.to_string();
    }
    let slash = record.rfind('/').unwrap_or(0);
    match record[slash..].rfind(':') {
        Some(i) => record[..slash + i].to_string(),
        None => record.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories() {
        assert_eq!(
            repository_of("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause"
        );
        assert_eq!(
            repository_of("127.0.0.1:5000/pause"),
            "127.0.0.1:5000/pause"
        );
        assert_eq!(
            repository_of(&format!("registry.k8s.io/pause@sha256:{}", "a".repeat(64))),
            "registry.k8s.io/pause"
        );
    }
}
