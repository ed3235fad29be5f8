//! The kubelet's credential-verification policies for images already on a
//! node (`imagePullCredentialsVerificationPolicy`), and whether each lets
//! a bundled image run with no registry.
//!
//! Facts from the kubelet's source (kubernetes/kubernetes,
//! `pkg/kubelet/images/pullmanager/image_pull_policies.go` at 5ce2290,
//! `image_pull_manager.go` at a02748c, `pkg/kubelet/images/image_manager.go`):
//!
//! - `NeverVerify`: never verifies. `NeverVerifyPreloadedImages` (the
//!   default): verifies only images the kubelet pulled itself (a pull
//!   record or intent, `state`). `NeverVerifyAllowlistedImages`: verifies
//!   every image `preloadedImagesVerificationAllowlist` does not match,
//!   pulled or not. `AlwaysVerify`: always.
//! - The allowlist is matched against the image *as the pod names it*
//!   (`requestedImage`, tag included): an entry without `/*` must equal
//!   that string, so it matches only a pod that names the image without
//!   tag or digest; an entry `PREFIX/*` matches every image string that
//!   starts with `PREFIX/`.
//! - Entries are checked when the kubelet starts (`getAllowlistImagePattern`):
//!   no surrounding spaces; `*` only as a final `/*`, and not `/*` alone;
//!   an entry without it must be a fully normalised name with neither tag
//!   nor digest (`docker.io/library/busybox`, not `busybox` or `x:1`).
//! - An image that must be verified and has no record is pulled, even if
//!   present: offline, the pull fails and the container does not start. A
//!   record mapping the image's name to `nodePodsAccessible` spares it; one
//!   with only Secrets or service accounts does not (offline, no pod of a
//!   static manifest carries them). A record the kubelet cannot decode
//!   makes it pull under every policy (`MustAttemptImagePull` at v1.35.4).
//! - The sandbox image is never asked about: the kubelet names no image
//!   for a sandbox, containerd runs its own (tests/kubelet_gc.rs shows a
//!   pod starting on a pause image the kubelet holds a Secret record for).

use serde::Serialize;

use super::state::{Found, Lookup};

/// One policy, as the kubelet's configuration spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Policy {
    NeverVerify,
    NeverVerifyPreloadedImages,
    NeverVerifyAllowlistedImages,
    AlwaysVerify,
}

impl Policy {
    pub const ALL: [Policy; 4] = [
        Policy::NeverVerify,
        Policy::NeverVerifyPreloadedImages,
        Policy::NeverVerifyAllowlistedImages,
        Policy::AlwaysVerify,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::NeverVerify => "NeverVerify",
            Policy::NeverVerifyPreloadedImages => "NeverVerifyPreloadedImages",
            Policy::NeverVerifyAllowlistedImages => "NeverVerifyAllowlistedImages",
            Policy::AlwaysVerify => "AlwaysVerify",
        }
    }

    /// Whether the policy asks for credentials for `image`
    /// (`RequireCredentialVerificationForImage`).
    fn requires(self, image: &str, pulled_by_kubelet: bool, allowlist: &[String]) -> bool {
        match self {
            Policy::NeverVerify => false,
            Policy::NeverVerifyPreloadedImages => pulled_by_kubelet,
            Policy::NeverVerifyAllowlistedImages => !matches(allowlist, image),
            Policy::AlwaysVerify => true,
        }
    }

    /// Whether a container of `image` (as the pod names it, tagged) starts
    /// with no registry and no pull Secret (`MustAttemptImagePull` says no
    /// pull): `image_ref` its CRI id when known, `state` the kubelet's
    /// image-manager state on the node, `allowlist` the configured entries.
    /// With records there and no CRI id, any record may be the image's and
    /// is taken as one that does not spare it.
    pub fn runs_offline(
        self,
        image: &str,
        image_ref: Option<&str>,
        state: Option<&Found>,
        allowlist: &[String],
    ) -> bool {
        let Some(state) = state else {
            return !self.requires(image, false, allowlist);
        };
        let record = match image_ref {
            Some(r) => match state.record(r) {
                Lookup::Found(rec) => Some(rec),
                Lookup::None => None,
                Lookup::Undecodable => return false,
            },
            None if !state.pulled.is_empty() => return !self.requires(image, true, allowlist),
            None => None,
        };
        let pulled_by_kubelet = record.is_some() || state.has_intent(image);
        if !self.requires(image, pulled_by_kubelet, allowlist) {
            return true;
        }
        let name = crate::primitives::reference::ImageRef::parse(image).map(|r| r.name());
        record
            .zip(name.ok())
            .is_some_and(|(r, n)| r.open_to_all.contains(&n))
    }
}

/// The kubelet's allowlist match (`imageMatches`): exact, or a `/*` prefix.
pub fn matches(allowlist: &[String], image: &str) -> bool {
    allowlist.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) if p.ends_with("/*") => image.starts_with(prefix),
        _ => p == image,
    })
}

/// An entry as the kubelet checks it at start (module doc).
pub fn check_entry(p: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("allowlist entry {p:?}: {why}"));
    if p != p.trim() {
        return bad("leading or trailing spaces");
    }
    let (trimmed, wildcard) = match p.strip_suffix("/*") {
        Some(t) => (t, true),
        None => (p, false),
    };
    if trimmed.is_empty() {
        return bad("too short (a registry host at least)");
    }
    if trimmed.contains('*') {
        return bad("only a final /* is allowed");
    }
    if !wildcard {
        let r = crate::primitives::reference::ImageRef::parse(trimmed)
            .map_err(|e| format!("allowlist entry {p:?}: {e}"))?;
        // kiln's parse gives an untagged name `latest`: the text decides.
        let last = trimmed.rsplit('/').next().unwrap_or(trimmed);
        if last.contains(':') || trimmed.contains('@') || r.name() != trimmed {
            return bad("must be a full image name with neither tag nor digest");
        }
    }
    Ok(())
}

/// The entries that let the bundled `images` (as pods name them: full
/// names with their tags) run offline under `NeverVerifyAllowlistedImages`:
/// per image the narrowest `/*` prefix that matches it tagged (its parent
/// path; an exact entry never matches a tagged name), and none that a
/// broader one already covers. Sorted.
pub fn allowlist_for(images: &[crate::primitives::reference::ImageRef]) -> Vec<String> {
    let prefixes: std::collections::BTreeSet<String> = images
        .iter()
        .filter_map(|i| i.name().rsplit_once('/').map(|(p, _)| format!("{p}/*")))
        .collect();
    let covered = |e: &String| {
        prefixes
            .iter()
            .any(|p| p != e && e.starts_with(p.trim_end_matches('*')))
    };
    prefixes.iter().filter(|e| !covered(e)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::reference::ImageRef;

    /// The kubelet's own cases (image_pull_policies_test.go), restated.
    #[test]
    fn entries_are_judged_and_matched_as_the_kubelet_does() {
        for bad in [
            "image.repo/pokus*/imagename",
            "image.repo/pokus*",
            "image.repo/*/imagename",
            "/*",
            "image.repo/",
            "",
            "*",
            "test.io/test/image1:tagged",
            "test.io/test/image1@sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd",
            "test.io/test/image1 ",
            "busybox",
        ] {
            assert!(check_entry(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["test.io/test/image1", "test.io/test/*", "test.io/*"] {
            check_entry(good).unwrap();
        }
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(matches(
            &l(&["test.io/test/image1", "test.io/test/*"]),
            "test.io/test/test-image"
        ));
        assert!(matches(&l(&["test.io/*"]), "test.io/test/test-image"));
        assert!(!matches(
            &l(&["different.repo/test/*"]),
            "test.io/test/test-image"
        ));
        // An exact entry never matches the image named with its tag.
        assert!(!matches(
            &l(&["registry.k8s.io/pause"]),
            "registry.k8s.io/pause:3.10"
        ));
    }

    #[test]
    fn the_generated_allowlist_is_valid_and_admits_every_bundled_image() {
        let images: Vec<ImageRef> = [
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/coredns/coredns:v1.11.3",
            "docker.io/kindest/kindnetd:v20250214-acbabc1a",
        ]
        .iter()
        .map(|s| ImageRef::parse(s).unwrap())
        .collect();
        let list = allowlist_for(&images);
        for e in &list {
            check_entry(e).unwrap();
        }
        for i in &images {
            let tagged = i.tagged_name().unwrap();
            assert!(matches(&list, &tagged), "{tagged}");
            assert!(matches(&list, &i.name()), "{i}");
            assert!(Policy::NeverVerifyAllowlistedImages.runs_offline(&tagged, None, None, &list));
        }
        // registry.k8s.io/* covers registry.k8s.io/coredns/*.
        assert_eq!(list, ["docker.io/kindest/*", "registry.k8s.io/*"]);
        assert!(!Policy::AlwaysVerify.runs_offline("x", None, None, &list));
        assert!(Policy::NeverVerifyPreloadedImages.runs_offline("x", None, None, &list));
    }

    /// What the kubelet v1.35.4 did on a node with such state
    /// (tests/kubelet_gc.rs), restated: kiln's rule must say the same.
    #[test]
    fn records_and_intents_are_judged_as_the_kubelet_judged_them() {
        use super::super::state::{file_name, Record};
        let list = vec!["registry.k8s.io/*".to_string()];
        let rec = |id: &str, open: &[&str]| Record {
            file: file_name(id),
            image_ref: Some(id.into()),
            open_to_all: open.iter().map(|s| s.to_string()).collect(),
        };
        let mut found = Found {
            pulled: vec![
                file_name("sha256:a"),
                file_name("sha256:c"),
                file_name("sha256:x"),
            ],
            pulling: vec![file_name("registry.k8s.io/etcd:3.6.6-0")],
            records: vec![
                rec("sha256:a", &[]),
                rec("sha256:c", &["registry.k8s.io/coredns/coredns"]),
                // Named for sha256:x, saying another image: not believed.
                Record {
                    image_ref: Some("sha256:y".into()),
                    ..rec("sha256:x", &[])
                },
            ],
            ..Found::default()
        };
        let runs = |p: Policy, image: &str, id: &str, f: &Found| {
            p.runs_offline(image, Some(id), Some(f), &list)
        };
        let api = "registry.k8s.io/kube-apiserver:v1.35.4";
        let dns = "registry.k8s.io/coredns/coredns:v1.13.1";
        let etcd = "registry.k8s.io/etcd:3.6.6-0";
        let other = "registry.k8s.io/kube-proxy:v1.35.4";
        for p in Policy::ALL {
            // A record mapping the name to nodePodsAccessible: always runs.
            assert!(runs(p, dns, "sha256:c", &found), "{p:?}");
        }
        let preloaded = Policy::NeverVerifyPreloadedImages;
        assert!(!runs(preloaded, api, "sha256:a", &found));
        assert!(!runs(preloaded, etcd, "sha256:e", &found));
        assert!(runs(preloaded, other, "sha256:x", &found));
        assert!(runs(
            Policy::NeverVerifyAllowlistedImages,
            api,
            "sha256:a",
            &found
        ));
        assert!(!runs(Policy::AlwaysVerify, other, "sha256:x", &found));
        // A record the kubelet cannot decode: it pulls under every policy.
        found.records[0].image_ref = None;
        for p in Policy::ALL {
            assert!(!runs(p, api, "sha256:a", &found), "{p:?}");
        }
        // No CRI id to match records to: every record may be the image's.
        assert!(!preloaded.runs_offline(other, None, Some(&found), &list));
        assert!(Policy::NeverVerify.runs_offline(other, None, Some(&found), &list));
    }
}
