//! What an image record says: the CRI labels (managed, pinned, and kiln's
//! own mark on its pins), the pin policy that decides them, and the GC
//! labels that keep a document's children, as containerd's own client adds
//! them. The only place kiln writes a GC label.

use std::collections::BTreeMap;

use crate::primitives::oci::{Descriptor, Document};

/// The namespace kubelet's images live in (CRI's namespace).
pub const K8S_NAMESPACE: &str = "k8s.io";
pub const LABEL_MANAGED: &str = "io.cri-containerd.image";
pub const LABEL_PINNED: &str = "io.cri-containerd.pinned";
/// kiln's mark on every pin it makes, so it knows its pins from anyone
/// else's (k3s marks its own with `io.cattle.k3s.pinned` the same way).
pub const LABEL_KILN_PINNED: &str = "io.kiln.pinned";
/// Every label key with this prefix keeps the digest it names (containerd's GC).
pub(super) const GC_REF_CONTENT: &str = "containerd.io/gc.ref.content";
const GC_LABEL_CONFIG: &str = "containerd.io/gc.ref.content.config";
const GC_LABEL_MANIFEST_PREFIX: &str = "containerd.io/gc.ref.content.m.";
const GC_LABEL_LAYER_PREFIX: &str = "containerd.io/gc.ref.content.l.";

/// What the image records say to kubelet's GC: kiln's pinning rule, kept
/// with the store that enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinPolicy {
    /// The bundled set (`kiln build`): managed and pinned.
    Pin,
    /// User images (`kiln load`): managed, never pinned by kiln, and never
    /// unpinning a bundled image; replacing one needs `force`.
    Unpinned { force: bool },
    /// Bundled but reclaimable (a manifest entry with `pinned: false`):
    /// managed, and the pin label removed if an earlier build of kiln's set
    /// it (its own mark says so); a pin someone else made stays, said.
    Preload,
}

/// An image record as containerd keeps it.
#[derive(Debug, Clone)]
pub struct ImageRecord {
    pub name: String,
    pub target: Descriptor,
    pub labels: Labels,
}

pub type Labels = BTreeMap<String, String>;

/// The record `name` should become, given what the store has under it.
pub fn plan_record(
    name: &str,
    target: &Descriptor,
    existing: Option<&ImageRecord>,
    policy: PinPolicy,
) -> Result<ImageRecord, String> {
    let mut labels = existing.map(|e| e.labels.clone()).unwrap_or_default();
    labels.insert(LABEL_MANAGED.to_string(), "managed".to_string());
    match policy {
        PinPolicy::Pin => {
            labels.insert(LABEL_PINNED.to_string(), "pinned".to_string());
            labels.insert(LABEL_KILN_PINNED.to_string(), "pinned".to_string());
        }
        PinPolicy::Preload => {
            if labels.remove(LABEL_KILN_PINNED).is_some() {
                labels.remove(LABEL_PINNED);
            } else if labels.contains_key(LABEL_PINNED) {
                tracing::warn!(
                    "{name} is pinned, not by kiln: kept pinned (pinned: false only takes back kiln's pins); unpin it yourself (ctr -n k8s.io images label {name} {LABEL_PINNED}=) if it should be reclaimable"
                );
            }
        }
        PinPolicy::Unpinned { force } => {
            if let Some(e) =
                existing.filter(|e| e.labels.get(LABEL_PINNED).is_some_and(|v| v == "pinned"))
            {
                if e.target.digest != target.digest && !force {
                    return Err(format!(
                        "{name} is a bundled (pinned) image at {}; loading {} under its name would replace it. Load it under another name, or pass --force to replace it (it stays pinned)",
                        e.target.digest, target.digest
                    ));
                }
            }
        }
    }
    Ok(ImageRecord {
        name: name.to_string(),
        target: target.clone(),
        labels,
    })
}

/// The GC labels that keep a document's stored children, as containerd's
/// `images.SetChildrenLabels` adds them: a manifest keeps its config and
/// layers; an index keeps the manifests that were stored, each under its
/// position in the index (`m.<i>`), so labels added by a build for another
/// platform never overwrite those of a platform the store already holds.
pub fn children_labels(bytes: &[u8], children: &[Descriptor]) -> Labels {
    match Document::parse(bytes) {
        Ok((_, Document::Index(idx))) => children
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let at = idx
                    .manifests
                    .iter()
                    .position(|m| m.digest == d.digest)
                    .unwrap_or(idx.manifests.len() + i);
                (
                    format!("{GC_LABEL_MANIFEST_PREFIX}{at}"),
                    d.digest.to_string(),
                )
            })
            .collect(),
        Ok((_, Document::Manifest(m))) => {
            let mut labels = Labels::new();
            labels.insert(GC_LABEL_CONFIG.to_string(), m.config.digest.to_string());
            for (i, l) in m.layers.iter().enumerate() {
                labels.insert(format!("{GC_LABEL_LAYER_PREFIX}{i}"), l.digest.to_string());
            }
            labels
        }
        _ => children
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    format!("{GC_LABEL_MANIFEST_PREFIX}{i}"),
                    d.digest.to_string(),
                )
            })
            .collect(),
    }
}
