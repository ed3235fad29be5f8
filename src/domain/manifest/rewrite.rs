//! Manifests derived from a manifest: pinned by digest (`kiln lock
//! --write`), completed by a Kubernetes release's control-plane images or
//! by kind's addon images, with the text rewritten to match (comments,
//! order and spelling kept) so a node's record lists what it bundles.

use super::{line_of, ManifestError, NodeManifest, API_VERSION, KIND};
use crate::primitives::reference::ImageRef;

impl NodeManifest {
    /// The manifest text with each entry at `pins[i]`'s digest, everything
    /// else (comments, order, spelling) kept; `None` keeps an entry as is.
    pub fn with_digests(&self, pins: &[Option<crate::primitives::digest::Digest>]) -> String {
        let mut lines: Vec<String> = self.text.lines().map(str::to_string).collect();
        for ((line, entry), pin) in self.entries.iter().zip(pins) {
            let (Some(pin), Some(l)) = (pin, line.checked_sub(1).and_then(|i| lines.get_mut(i)))
            else {
                continue;
            };
            let bare = entry.split('@').next().unwrap_or(entry);
            *l = l.replacen(entry.as_str(), &format!("{bare}@{pin}"), 1);
        }
        let mut out = lines.join("\n");
        if self.text.ends_with('\n') {
            out.push('\n');
        }
        out
    }

    /// This manifest completed by a Kubernetes release at `version` that
    /// supplies `supplied` (its control-plane images): `kubernetesVersion`
    /// must agree (or is taken from the release), entries for the supplied
    /// images are dropped when they name the release's tag and refused when
    /// they name another, and the supplied images are added. The text is
    /// rewritten so the node's record lists every bundled image.
    pub fn with_release(
        &self,
        version: &str,
        supplied: &[ImageRef],
    ) -> Result<NodeManifest, ManifestError> {
        let err = |line: Option<usize>, message: String| ManifestError {
            path: self.path.display().to_string(),
            line,
            message,
        };
        if let Some(v) = &self.kubernetes_version {
            if v != version {
                return Err(err(
                    line_of(&self.text, "kubernetesVersion"),
                    format!("kubernetesVersion {v} disagrees with the Kubernetes release ({version}); set it to {version} or remove it"),
                ));
            }
        }
        let mut kept = Vec::new();
        for (i, ((line, entry), image)) in self.entries.iter().zip(&self.images).enumerate() {
            match supplied.iter().find(|s| s.name() == image.name()) {
                Some(s) if s.tag == image.tag && image.digest.is_none() => {}
                Some(s) => {
                    return Err(err(
                        Some(*line),
                        format!("{entry} is supplied by the Kubernetes release as {s}; remove the entry (the release's image is bundled and pinned)"),
                    ))
                }
                None => kept.push(self.entry_line(i)),
            }
        }
        let mut text = format!(
            "{}apiVersion: {API_VERSION}\nkind: {KIND}\nkubernetesVersion: {version}\nsandboxImage: {}\nimages:\n",
            self.completed_header(&format!("Kubernetes {version}'s control-plane images")),
            self.sandbox_image
        );
        for e in kept
            .iter()
            .cloned()
            .chain(supplied.iter().map(|s| s.to_string()))
        {
            text.push_str(&format!("  - {e}\n"));
        }
        NodeManifest::parse(&self.path, &text)
    }

    /// This manifest with `extra` images added (those it does not already
    /// name at that tag), so they are bundled and pinned like the rest; the
    /// text is rewritten so the node's record lists every bundled image.
    pub fn with_images(
        &self,
        extra: &[ImageRef],
        why: &str,
    ) -> Result<NodeManifest, ManifestError> {
        let missing: Vec<&ImageRef> = extra
            .iter()
            .filter(|e| {
                !self
                    .images
                    .iter()
                    .any(|i| i.name() == e.name() && i.tag == e.tag)
            })
            .collect();
        if missing.is_empty() {
            return Ok(self.clone());
        }
        let mut text = format!(
            "{}apiVersion: {API_VERSION}\nkind: {KIND}\n",
            self.completed_header(why)
        );
        if let Some(v) = &self.kubernetes_version {
            text.push_str(&format!("kubernetesVersion: {v}\n"));
        }
        text.push_str(&format!("sandboxImage: {}\nimages:\n", self.sandbox_image));
        for i in 0..self.entries.len() {
            text.push_str(&format!("  - {}\n", self.entry_line(i)));
        }
        for e in missing {
            text.push_str(&format!("  - {e}\n"));
        }
        NodeManifest::parse(&self.path, &text)
    }

    /// The first line of a manifest kiln completed: it names the manifest
    /// given and its bytes' sha256, so the node it goes into can still be
    /// held to a lock of that manifest ([`Self::source_sha256`]).
    fn completed_header(&self, with: &str) -> String {
        format!(
            "# {} (sha256:{}) completed by kiln with {with}.\n",
            self.path.display(),
            self.source_sha256()
        )
    }

    /// Entry `i` as a list item's text, in the form it was given.
    fn entry_line(&self, i: usize) -> String {
        if self.pinned[i] {
            self.entries[i].1.clone()
        } else {
            format!("{{image: {}, pinned: false}}", self.entries[i].1)
        }
    }
}
