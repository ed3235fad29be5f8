//! The node manifest: which component images a node image bundles (and pins).
//! Errors name the file and line, because a manifest is edited by hand.

mod rewrite;

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::primitives::reference::ImageRef;

pub const API_VERSION: &str = "kiln/v1";
pub const KIND: &str = "NodeImageManifest";

/// Where a node (rootfs or image) records the manifest it was built from.
pub const MANIFEST_RECORD: &str = "kind/kiln-manifest.yaml";

#[derive(Debug, Clone)]
pub struct NodeManifest {
    /// Where it was read from, for messages.
    pub path: std::path::PathBuf,
    pub text: String,
    pub kubernetes_version: Option<String>,
    pub sandbox_image: ImageRef,
    pub images: Vec<ImageRef>,
    /// Per image: pinned (the default), or only preloaded, managed and
    /// reclaimable by kubelet's GC (`{image: REF, pinned: false}`; kind
    /// issue 2160: users' own images preloaded but reclaimable).
    pub pinned: Vec<bool>,
    /// Each image entry as written, with its 1-based line (for `kiln lock`).
    pub entries: Vec<(usize, String)>,
}

#[derive(Debug, thiserror::Error)]
#[error("{path}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ManifestError {
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    api_version: String,
    kind: String,
    #[serde(default)]
    kubernetes_version: Option<String>,
    sandbox_image: String,
    images: Vec<RawEntry>,
}

/// An `images:` entry: a reference, or a reference with `pinned: false`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawEntry {
    Ref(String),
    Detailed(Detailed),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Detailed {
    image: String,
    #[serde(default = "yes")]
    pinned: bool,
}

fn yes() -> bool {
    true
}

impl RawEntry {
    fn image(&self) -> &str {
        match self {
            RawEntry::Ref(s) => s,
            RawEntry::Detailed(d) => &d.image,
        }
    }
    fn pinned(&self) -> bool {
        match self {
            RawEntry::Ref(_) => true,
            RawEntry::Detailed(d) => d.pinned,
        }
    }
}

impl NodeManifest {
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError {
            path: path.display().to_string(),
            line: None,
            message: format!("cannot read manifest: {e}"),
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ManifestError> {
        let err = |line: Option<usize>, message: String| ManifestError {
            path: path.display().to_string(),
            line,
            message,
        };
        let raw: Raw = serde_yaml_ng::from_str(text).map_err(|e| {
            let line = e.location().map(|l| l.line());
            // serde_yaml_ng appends "at line N column M"; the line is already in the prefix.
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            let tab = line
                .and_then(|l| text.lines().nth(l.saturating_sub(1)))
                .is_some_and(|l| {
                    l.starts_with('\t') || l.trim_start_matches(' ').starts_with('\t')
                });
            if msg.contains("untagged enum RawEntry") {
                // serde says only that no form fit: ask the entries one by
                // one for the real reason, on the key's own line.
                let (at, why) = entry_error(text).unwrap_or((
                    line,
                    "an images entry is a reference, or {image: REF, pinned: false}".into(),
                ));
                return err(at.or(line), why);
            }
            let msg = if tab {
                format!("{msg}: YAML indents with spaces, not tabs")
            } else if msg.starts_with("missing field") {
                // Only here is the list of fields news.
                format!("{msg} (fields: apiVersion, kind, kubernetesVersion, sandboxImage, images)")
            } else {
                msg
            };
            err(line, msg)
        })?;
        if raw.api_version != API_VERSION {
            return Err(err(
                line_of(text, "apiVersion"),
                format!(
                    "apiVersion {:?} is not supported; use {API_VERSION}",
                    raw.api_version
                ),
            ));
        }
        if raw.kind != KIND {
            return Err(err(
                line_of(text, "kind"),
                format!("kind {:?} is not supported; use {KIND}", raw.kind),
            ));
        }
        if raw.images.is_empty() {
            return Err(err(
                line_of(text, "images"),
                "images is empty; list at least the sandbox image".into(),
            ));
        }
        let mut images = Vec::with_capacity(raw.images.len());
        let mut pinned = Vec::with_capacity(raw.images.len());
        let mut entries = Vec::with_capacity(raw.images.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        let names: Vec<String> = raw.images.iter().map(|e| e.image().to_string()).collect();
        for (i, entry) in names.iter().enumerate() {
            let nth = names[..i].iter().filter(|e| *e == entry).count();
            let line = line_of_entry(text, entry, nth);
            let r = ImageRef::parse(entry).map_err(|e| err(line, e.to_string()))?;
            if let Some(hint) = kubeadm_on_docker_hub(entry, &r) {
                tracing::warn!(
                    "{}:{}: {entry} means {r} (Docker Hub); {hint}",
                    path.display(),
                    line.unwrap_or(0)
                );
            }
            // Two entries naming the same repository and tag (or digest) are one image twice.
            let key = r.tagged_name().unwrap_or_else(|| r.to_string());
            if let Some(first) = seen.get(&key) {
                return Err(err(
                    line,
                    format!("duplicate image {key} (first listed on line {first}); list each image once"),
                ));
            }
            seen.insert(key, line.unwrap_or(0));
            entries.push((line.unwrap_or(0), entry.clone()));
            images.push(r);
            pinned.push(raw.images[i].pinned());
        }
        let sandbox_line = line_of(text, "sandboxImage");
        let sandbox =
            ImageRef::parse(&raw.sandbox_image).map_err(|e| err(sandbox_line, e.to_string()))?;
        let sandbox_image = images
            .iter()
            .find(|i| i.name() == sandbox.name() && i.tag == sandbox.tag && (sandbox.digest.is_none() || i.digest == sandbox.digest))
            .cloned()
            .ok_or_else(|| {
                err(
                    sandbox_line,
                    format!("sandboxImage {sandbox} is not one of images; add it to images so it is bundled and pinned"),
                )
            })?;
        if let Some(i) = images.iter().position(|i| *i == sandbox_image) {
            if !pinned[i] {
                return Err(err(
                    Some(entries[i].0),
                    format!("{} is the sandbox image: every pod needs it, so it is always pinned; drop pinned: false", entries[i].1),
                ));
            }
        }
        Ok(NodeManifest {
            path: path.to_path_buf(),
            text: text.to_string(),
            kubernetes_version: raw.kubernetes_version,
            sandbox_image,
            images,
            pinned,
            entries,
        })
    }
}

impl NodeManifest {
    /// The sha256 (hex) of the manifest as the user wrote it: of these
    /// bytes, or, for a manifest kiln completed, the one its first line
    /// names. (Only `kiln verify --lock` reads it, beside its per-image
    /// checks, which do not depend on it.)
    pub fn source_sha256(&self) -> String {
        let named = self.text.lines().next().and_then(|l| {
            let l = l.strip_prefix("# ")?;
            let (_, rest) = l.split_once(" (sha256:")?;
            let (hex, tail) = rest.split_once(')')?;
            (tail.starts_with(" completed by kiln with ")
                && hex.len() == 64
                && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| hex.to_string())
        });
        named.unwrap_or_else(|| {
            crate::primitives::digest::Digest::of(self.text.as_bytes())
                .hex()
                .to_string()
        })
    }

    /// Whether `image` (one of [`Self::images`]) is to be pinned.
    pub fn is_pinned(&self, image: &ImageRef) -> bool {
        self.images
            .iter()
            .position(|i| i == image)
            .is_none_or(|i| self.pinned[i])
    }

    /// Entries without a digest, with their lines.
    pub fn unpinned(&self) -> Vec<(usize, &ImageRef)> {
        self.entries
            .iter()
            .zip(&self.images)
            .filter(|(_, i)| i.digest.is_none())
            .map(|((l, _), i)| (*l, i))
            .collect()
    }
}

/// 1-based line of a top-level `key:`.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

/// 1-based line of the `nth` list entry equal to `entry` (quotes and comments ignored).
/// The first `images` entry no form fits, and why, on its key's line:
/// an unknown key (`pined`), a value of the wrong type (`pinned: flase`).
fn entry_error(text: &str) -> Option<(Option<usize>, String)> {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
    let entries = v.get("images")?.as_sequence()?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for e in entries {
        if e.is_string() {
            let s = e.as_str().unwrap_or_default().to_string();
            *seen.entry(s).or_default() += 1;
            continue;
        }
        let generic = "an images entry is a reference, or {image: REF, pinned: false}";
        let Some(m) = e.as_mapping() else {
            return Some((None, generic.into()));
        };
        let image = m.get("image").and_then(|i| i.as_str()).map(str::to_string);
        let nth = image.as_ref().map(|i| {
            let n = seen.get(i).copied().unwrap_or(0);
            seen.insert(i.clone(), n + 1);
            n
        });
        let Err(why) = serde_yaml_ng::from_value::<Detailed>(e.clone()) else {
            continue;
        };
        let why = why.to_string();
        let why = why.split(" at line ").next().unwrap_or(&why).to_string();
        // The key it is about: the one named in backticks, else the one
        // whose value is of the wrong type.
        let key = match why.split('`').nth(1) {
            Some(k) if why.starts_with("unknown field") => k.to_string(),
            _ if why.contains("boolean") => "pinned".to_string(),
            _ => "image".to_string(),
        };
        let start = image
            .as_deref()
            .zip(nth)
            .and_then(|(i, n)| line_of_entry(text, i, n));
        let line = start.and_then(|s| {
            text.lines()
                .enumerate()
                .skip(s - 1)
                .take_while(|(n, l)| *n == s - 1 || !l.trim_start().starts_with('-'))
                .find(|(_, l)| {
                    let l = l.trim_start().trim_start_matches('-').trim_start();
                    l.trim_start_matches('{')
                        .trim_start()
                        .starts_with(&format!("{key}:"))
                        || l.contains(&format!(", {key}:"))
                })
                .map(|(n, _)| n + 1)
        });
        let what = match &image {
            Some(i) => format!("the images entry {i}"),
            None => "an images entry".to_string(),
        };
        let fix = if why.starts_with("unknown field") {
            "; an entry has image and pinned only"
        } else {
            ""
        };
        return Some((line.or(start), format!("{what}, key {key}: {why}{fix}")));
    }
    None
}

fn line_of_entry(text: &str, entry: &str, nth: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let Some(item) = l.trim_start().strip_prefix('-') else {
                return false;
            };
            let item = item.split(" #").next().unwrap_or(item).trim();
            // `- REF`, `- image: REF`, `- {image: REF, pinned: false}`.
            let item = item.trim_start_matches('{').trim_start();
            let item = match item.strip_prefix("image:") {
                Some(rest) => rest.split([',', '}']).next().unwrap_or(rest).trim(),
                None => item,
            };
            item.trim_matches(|c| c == '"' || c == '\'') == entry
        })
        .nth(nth)
        .map(|(i, _)| i + 1)
}

/// A bare name (no registry) of one of kubeadm's images: Docker's rules
/// make `pause` `docker.io/library/pause:latest`, almost never what a node
/// manifest means; the hint names registry.k8s.io's.
fn kubeadm_on_docker_hub(entry: &str, r: &ImageRef) -> Option<String> {
    let first = entry.split('/').next().unwrap_or("");
    let has_domain =
        entry.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_domain || r.domain != "docker.io" {
        return None;
    }
    let repo = r.path.strip_prefix("library/").unwrap_or(&r.path);
    let known = [
        "pause",
        "etcd",
        "coredns",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
    ];
    known.contains(&repo).then(|| {
        let path = if repo == "coredns" {
            "coredns/coredns"
        } else {
            repo
        };
        format!("did you mean registry.k8s.io/{path}?")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completed_manifest_names_the_one_given_by_its_bytes() {
        let given = NodeManifest::parse(Path::new("m.yaml"), GOOD).unwrap();
        let sha = crate::primitives::digest::Digest::of(GOOD.as_bytes());
        assert_eq!(given.source_sha256(), sha.hex());
        let extra = [ImageRef::parse("registry.k8s.io/coredns/coredns:v1.11.3").unwrap()];
        let once = given.with_images(&extra, "kind's addon images").unwrap();
        assert_ne!(once.text, given.text);
        assert_eq!(once.source_sha256(), sha.hex());
        let apiserver = [ImageRef::parse("registry.k8s.io/kube-apiserver:v1.31.2").unwrap()];
        let twice = once.with_release("v1.31.2", &apiserver).unwrap();
        assert_eq!(twice.source_sha256(), sha.hex(), "{}", twice.text);
    }

    const GOOD: &str = "apiVersion: kiln/v1
kind: NodeImageManifest
kubernetesVersion: v1.31.2
sandboxImage: registry.k8s.io/pause:3.10
images:
  - registry.k8s.io/pause:3.10
  - registry.k8s.io/etcd:3.5.16-0 # comment
  - nginx
";

    fn parse(t: &str) -> Result<NodeManifest, ManifestError> {
        NodeManifest::parse(Path::new("m.yaml"), t)
    }

    #[test]
    fn yaml_errors_say_what_to_fix_and_nothing_else() {
        let head = "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: registry.k8s.io/pause:3.10\n";
        let e = parse(&format!("{head}images:\n\t- registry.k8s.io/pause:3.10\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m.yaml:5") && e.ends_with("YAML indents with spaces, not tabs"),
            "{e}"
        );
        let e = parse(&format!("{head}images: [a, b\n"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("(fields:"), "{e}");
        let e = parse("apiVersion: kiln/v1\nkind: NodeImageManifest\nimages: [a]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field `sandboxImage` (fields: "), "{e}");
        let e = parse(&format!("{head}images:\n  - registry.k8s.io/Pause:3.10\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the repository \"Pause\" must be lowercase"),
            "{e}"
        );
    }

    #[test]
    fn a_bare_kubeadm_name_gets_a_hint() {
        let hint = |e: &str| super::kubeadm_on_docker_hub(e, &ImageRef::parse(e).unwrap());
        assert_eq!(
            hint("pause").as_deref(),
            Some("did you mean registry.k8s.io/pause?")
        );
        assert_eq!(
            hint("coredns:v1.11.3").as_deref(),
            Some("did you mean registry.k8s.io/coredns/coredns?")
        );
        assert_eq!(hint("nginx"), None);
        assert_eq!(hint("registry.k8s.io/pause:3.10"), None);
        assert_eq!(hint("docker.io/library/pause"), None, "written out: meant");
    }

    #[test]
    fn parses_good_manifest() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.images.len(), 3);
        assert_eq!(m.images[2].to_string(), "docker.io/library/nginx:latest");
        assert_eq!(m.sandbox_image.to_string(), "registry.k8s.io/pause:3.10");
        assert_eq!(m.kubernetes_version.as_deref(), Some("v1.31.2"));
    }

    #[test]
    fn adds_digests_keeping_everything_else() {
        let m = parse(GOOD).unwrap();
        let d = crate::primitives::digest::Digest::of(b"x");
        let out = m.with_digests(&[Some(d.clone()), None, Some(d.clone())]);
        assert!(
            out.contains(&format!("  - registry.k8s.io/pause:3.10@{d}\n")),
            "{out}"
        );
        assert!(
            out.contains("  - registry.k8s.io/etcd:3.5.16-0 # comment\n"),
            "{out}"
        );
        assert!(out.contains(&format!("  - nginx@{d}\n")), "{out}");
        assert!(out.contains("sandboxImage: registry.k8s.io/pause:3.10\n"));
        let again = parse(&out).unwrap();
        assert_eq!(again.images[0].digest.as_ref(), Some(&d));
        assert_eq!(
            again.with_digests(&[Some(d.clone()), None, Some(d.clone())]),
            out
        );
        assert_eq!(again.unpinned().len(), 1);
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(&GOOD.replace("kubernetesVersion", "kubernetesVersoin")).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.to_string().contains("kubernetesVersoin"), "{e}");

        let e = parse(&format!("{GOOD}  - registry.k8s.io/etcd:3.5.16-0\n")).unwrap_err();
        assert_eq!(e.line, Some(9), "{e}");
        assert!(
            e.to_string().contains("duplicate") && e.to_string().contains("line 7"),
            "{e}"
        );

        let e = parse(&GOOD.replace(
            "sandboxImage: registry.k8s.io/pause:3.10",
            "sandboxImage: registry.k8s.io/pause:3.9",
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("not one of images"), "{e}");

        let e = parse(&GOOD.replace("  - nginx", "  - Nginx:latest")).unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        assert!(
            e.to_string()
                .starts_with("m.yaml:8: invalid image reference"),
            "{e}"
        );

        let e = parse(&GOOD.replace("kiln/v1", "kiln/v2")).unwrap_err();
        assert_eq!(e.line, Some(1));
        let e = parse("images: [").unwrap_err();
        assert!(e.line.is_some());
    }

    #[test]
    fn preloaded_entries_keep_their_form_and_the_sandbox_stays_pinned() {
        let text = "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: registry.k8s.io/pause:3.10\nimages:\n  - registry.k8s.io/pause:3.10\n  - {image: docker.io/library/nginx:1.27, pinned: false}\n  - image: registry.k8s.io/etcd:3.5.16-0\n";
        let m = NodeManifest::parse(Path::new("m.yaml"), text).unwrap();
        assert_eq!(m.pinned, [true, false, true]);
        assert_eq!(m.entries[1].0, 6);
        assert_eq!(m.entries[2].0, 7);
        let d = crate::primitives::digest::Digest::of(b"x");
        let locked = m.with_digests(&[None, Some(d.clone()), None]);
        assert!(locked.contains(&format!(
            "{{image: docker.io/library/nginx:1.27@{d}, pinned: false}}"
        )));
        let more = m
            .with_images(
                &[ImageRef::parse("docker.io/kindest/kindnetd:v1").unwrap()],
                "test",
            )
            .unwrap();
        assert_eq!(more.pinned, [true, false, true, true]);
        let bad = text.replace(
            "- registry.k8s.io/pause:3.10",
            "- {image: registry.k8s.io/pause:3.10, pinned: false}",
        );
        let e = NodeManifest::parse(Path::new("m.yaml"), &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("m.yaml:5") && e.contains("sandbox image"), "{e}");
        let odd = text.replace("pinned: false", "pined: false");
        let e = NodeManifest::parse(Path::new("m.yaml"), &odd)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m.yaml:6: the images entry docker.io/library/nginx:1.27, key pined: unknown field `pined`"),
            "{e}"
        );
    }
}
