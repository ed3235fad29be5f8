//! The lock file: every input of a node image pinned in one place, so a
//! build can be repeated exactly or refused: the kiln that builds it, the
//! manifest's bytes, each image's digest, the base image's digest, each
//! platform's Kubernetes release (source and SHA-512), and the kindest/node
//! kind's manifests come from. YAML in the Kubernetes style, like the
//! manifest it locks.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::manifest::NodeManifest;
use crate::primitives::digest::Digest;
use crate::primitives::reference::ImageRef;

pub const KIND: &str = "NodeImageLock";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lock {
    pub api_version: String,
    pub kind: String,
    /// The kiln that made the lock: another may bake differently.
    pub kiln_version: String,
    pub manifest: LockedManifest,
    pub images: Vec<LockedImage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<LockedImage>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes: Vec<LockedRelease>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind_node: Option<LockedImage>,
    /// The node image a build follows (`--previous`): it decides the
    /// layers' order and may give layers, so it is an input like the base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<LockedImage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LockedManifest {
    /// As given to `kiln lock`, for people.
    pub path: String,
    /// sha256 of its bytes.
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LockedImage {
    /// The reference without a digest, normalised (`docker.io/library/...`).
    pub reference: String,
    pub digest: Digest,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LockedRelease {
    pub platform: String,
    /// The tarball's URL or path, `{arch}` filled in.
    pub source: String,
    pub sha512: String,
    /// Each binary the release installs (`/usr/bin/kubelet`...) and its
    /// SHA-512, for `kiln verify --lock` (a node does not record the
    /// tarball it came from, but holds its binaries).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub binaries: std::collections::BTreeMap<String, String>,
}

/// What a reference is locked as: normalised, without its digest.
pub fn key(image: &ImageRef) -> String {
    ImageRef {
        digest: None,
        ..image.clone()
    }
    .to_string()
}

impl Lock {
    pub fn new(manifest: &NodeManifest) -> Lock {
        Lock {
            api_version: super::manifest::API_VERSION.to_string(),
            kind: KIND.to_string(),
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: LockedManifest {
                path: manifest.path.display().to_string(),
                sha256: Digest::of(manifest.text.as_bytes()).hex().to_string(),
            },
            images: Vec::new(),
            base: None,
            kubernetes: Vec::new(),
            kind_node: None,
            previous: None,
        }
    }

    /// Reads a lock; errors name the file (and line, from the parser).
    pub fn load(path: &Path) -> Result<Lock, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let lock: Lock = serde_yaml_ng::from_str(&text).map_err(|e| {
            let line = e
                .location()
                .map(|l| format!(":{}", l.line()))
                .unwrap_or_default();
            format!("{}{line}: {e}", path.display())
        })?;
        if lock.api_version != super::manifest::API_VERSION || lock.kind != KIND {
            return Err(format!(
                "{}: apiVersion {} kind {} is not a kiln lock (want {} {KIND}); write one with kiln lock --lock-file",
                path.display(),
                lock.api_version,
                lock.kind,
                super::manifest::API_VERSION
            ));
        }
        Ok(lock)
    }

    pub fn to_yaml(&self) -> String {
        let body = serde_yaml_ng::to_string(self).expect("a lock serialises");
        format!("# Written by `kiln lock --lock-file`: every input of the node image.\n# `kiln build --lock` refuses to build if any of them changed.\n{body}")
    }

    /// The inputs a build has now that differ from the lock's, in one line
    /// each: the input, its locked value and what it is now. Checked before
    /// anything is fetched; images and the base are then fetched by their
    /// locked digests ([`Lock::pin`]), so a registry that now serves other
    /// bytes is refused by the copy itself, naming both digests.
    pub fn drift(&self, manifest: &NodeManifest) -> Vec<String> {
        let mut out = Vec::new();
        let here = env!("CARGO_PKG_VERSION");
        if self.kiln_version != here {
            out.push(format!(
                "kiln: locked {}, this is {here}",
                self.kiln_version
            ));
        }
        let sha = Digest::of(manifest.text.as_bytes()).hex().to_string();
        if self.manifest.sha256 != sha {
            out.push(format!(
                "manifest {}: locked sha256:{}, now sha256:{sha}",
                manifest.path.display(),
                self.manifest.sha256
            ));
        }
        let locked: BTreeMap<&str, &Digest> = self
            .images
            .iter()
            .map(|i| (i.reference.as_str(), &i.digest))
            .collect();
        for image in &manifest.images {
            match (locked.get(key(image).as_str()), &image.digest) {
                (None, _) => out.push(format!("image {image}: not in the lock")),
                (Some(l), Some(d)) if *l != d => out.push(format!(
                    "image {}: locked {l}, the manifest pins {d}",
                    key(image)
                )),
                _ => {}
            }
        }
        out
    }

    /// As [`Lock::drift`], for a node image's other inputs: the base, the
    /// kindest/node, the `--previous` image, whether a Kubernetes release is
    /// built in (its source and sum are checked per platform:
    /// [`Lock::releases`]).
    pub fn drift_inputs(
        &self,
        base: Option<&ImageRef>,
        kind_node: Option<&ImageRef>,
        previous: Option<&ImageRef>,
        kubernetes: bool,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let locked = !self.kubernetes.is_empty();
        if kubernetes != locked {
            out.push(match self.kubernetes.first() {
                Some(r) => format!("kubernetes: locked {}, none given", r.source),
                None => "kubernetes: --kubernetes given, the lock has no release".to_string(),
            });
        }
        for (what, want, have) in [
            ("base", &self.base, base),
            ("kind node", &self.kind_node, kind_node),
            ("previous", &self.previous, previous),
        ] {
            match (want, have) {
                (Some(w), Some(h)) if w.reference != key(h) => out.push(format!(
                    "{what}: locked {}@{}, given {h}",
                    w.reference, w.digest
                )),
                (Some(w), Some(h)) if h.digest.as_ref().is_some_and(|d| *d != w.digest) => out
                    .push(format!(
                        "{what} {}: locked {}, given {h}",
                        w.reference, w.digest
                    )),
                (None, Some(h)) => out.push(format!("{what} {h}: not in the lock")),
                (Some(w), None) => out.push(format!(
                    "{what}: locked {}@{}, none given",
                    w.reference, w.digest
                )),
                _ => {}
            }
        }
        out
    }

    /// `image` pinned to its locked digest (the lock's base and kind node
    /// included); unchanged if the lock does not name it.
    pub fn pin(&self, image: &ImageRef) -> ImageRef {
        let k = key(image);
        let found = self
            .images
            .iter()
            .chain(self.base.iter())
            .chain(self.kind_node.iter())
            .chain(self.previous.iter())
            .find(|i| i.reference == k);
        match found {
            Some(i) => ImageRef {
                digest: Some(i.digest.clone()),
                ..image.clone()
            },
            None => image.clone(),
        }
    }

    /// Per platform, the locked release: what `--kubernetes` must be.
    pub fn releases(&self) -> BTreeMap<String, (String, String)> {
        self.kubernetes
            .iter()
            .map(|r| (r.platform.clone(), (r.source.clone(), r.sha512.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(text: &str) -> NodeManifest {
        NodeManifest::parse(Path::new("m.yaml"), text).unwrap()
    }

    const M: &str = "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n  - registry.k8s.io/pause:3.10\n";

    fn digest(c: u8) -> Digest {
        Digest::of(&[c])
    }

    #[test]
    fn a_lock_round_trips_and_names_each_drift() {
        let m = manifest(M);
        let mut lock = Lock::new(&m);
        let pause = ImageRef::parse("registry.k8s.io/pause:3.10").unwrap();
        lock.images.push(LockedImage {
            reference: key(&pause),
            digest: digest(1),
        });
        let base = ImageRef::parse("kindest/base:v1").unwrap();
        lock.base = Some(LockedImage {
            reference: key(&base),
            digest: digest(2),
        });
        let back = Lock::load_str(&lock.to_yaml()).unwrap();
        assert_eq!(back, lock);
        assert!(lock.drift(&m).is_empty());
        assert!(lock.drift_inputs(Some(&base), None, None, false).is_empty());
        assert_eq!(lock.pin(&pause).digest, Some(digest(1)));
        assert_eq!(lock.pin(&base).digest, Some(digest(2)));

        let changed = manifest(&format!("{M}  - registry.k8s.io/etcd:3.5.16-0\n"));
        let other = ImageRef::parse("kindest/base:v2").unwrap();
        let drift = lock.drift(&changed);
        assert_eq!(drift.len(), 2, "{drift:?}");
        assert!(
            drift[0].starts_with("manifest m.yaml: locked sha256:"),
            "{drift:?}"
        );
        assert!(
            drift[1].contains("etcd:3.5.16-0: not in the lock"),
            "{drift:?}"
        );
        let drift = lock.drift_inputs(Some(&other), None, None, true);
        assert_eq!(drift.len(), 2, "{drift:?}");
        assert!(drift[0].contains("the lock has no release"), "{drift:?}");
        assert!(
            drift[1].contains("locked docker.io/kindest/base:v1@sha256:"),
            "{drift:?}"
        );
        lock.kiln_version = "0.0.1".into();
        assert!(lock.drift(&m)[0].starts_with("kiln: locked 0.0.1, this is"));
    }

    impl Lock {
        fn load_str(text: &str) -> Result<Lock, String> {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("kiln.lock");
            std::fs::write(&p, text).unwrap();
            Lock::load(&p)
        }
    }
}
