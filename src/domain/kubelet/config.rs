//! The kubelet configuration a cluster of kiln nodes needs to turn image
//! GC on safely (`kiln generate kubelet-config`), as a kind cluster
//! config's `kubeadmConfigPatches` entry.
//!
//! Facts, from the sources named:
//! - kind's kubeadm config turns image GC off by disk use
//!   (`imageGCHighThresholdPercent: 100`, evictionHard at 0%) because "the
//!   kubelet will see the host disk" (kubernetes-sigs/kind
//!   `pkg/cluster/internal/kubeadm/config.go` at fed2688); it applies a
//!   `kubeadmConfigPatches` entry as a merge patch to the document of the
//!   same `kind` (and `apiVersion`, when the patch names one:
//!   `pkg/internal/patch/resource.go` `matches`).
//! - `imageMaximumGCAge` (KEP-4210) removes images unused for that long,
//!   whatever the disk; the kubelet needs the `ImageMaximumGCAge` gate for
//!   it (alpha, off, in v1.29; beta, on, from v1.30; stable in v1.35) and
//!   wants it above `imageMinimumGCAge`; `imageGCLowThresholdPercent` must
//!   be below `imageGCHighThresholdPercent`
//!   (`pkg/kubelet/apis/config/validation/validation.go`). The GC never
//!   removes an image CRI reports pinned: kiln's bundled set.
//! - `imagePullCredentialsVerificationPolicy` and
//!   `preloadedImagesVerificationAllowlist` exist from v1.33 and may be set
//!   only with the `KubeletEnsureSecretPulledImages` gate on (alpha, off,
//!   v1.33–v1.34; beta, on, from v1.35); the allowlist only with the
//!   policy `NeverVerifyAllowlistedImages` (same file).

use serde::Serialize;
use serde_json::json;

use super::policy::{self, Policy};
use super::Minor;
use crate::primitives::reference::ImageRef;

/// What to generate.
#[derive(Debug, Clone)]
pub struct Options {
    /// The kubelet the cluster runs.
    pub kubelet: Minor,
    /// `imageMaximumGCAge` (Go duration).
    pub max_age: String,
    /// `imageMinimumGCAge` (Go duration).
    pub min_age: String,
    /// Disk-use GC thresholds (percent).
    pub high: u8,
    pub low: u8,
    /// The credential policy for v1.35 and later.
    pub policy: Policy,
    /// More allowlist entries (images loaded later, by repository).
    pub allow: Vec<String>,
}

/// The generated configuration.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Generated {
    pub kubelet_version: String,
    /// The KubeletConfiguration patch.
    pub kubelet_configuration: serde_json::Value,
    /// The kind cluster config holding it, as text.
    #[serde(skip)]
    pub kind_config: String,
    /// What the user should know (fields left out for this kubelet, what
    /// the allowlist admits).
    pub notes: Vec<String>,
}

/// The first kubelet with `imageMaximumGCAge`, and with it on by default.
const MAX_AGE_FIELD: Minor = Minor(1, 29);
const MAX_AGE_ON: Minor = Minor(1, 30);
/// The first kubelet with the credential-verification fields, and with
/// them on by default.
const VERIFY_FIELDS: Minor = Minor(1, 33);
const VERIFY_ON: Minor = Minor(1, 35);

/// A Go duration of hours, minutes and seconds (`168h`, `2m`, `1h30m`),
/// in seconds; kiln writes back what the user wrote.
pub fn go_duration_seconds(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration like 168h, 90m or 1h30m");
    let (mut total, mut digits) = (0u64, String::new());
    for c in s.chars() {
        match c {
            '0'..='9' => digits.push(c),
            'h' | 'm' | 's' if !digits.is_empty() => {
                let n: u64 = digits.parse().map_err(|_| bad())?;
                let unit = match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                total = n
                    .checked_mul(unit)
                    .and_then(|v| total.checked_add(v))
                    .ok_or_else(bad)?;
                digits.clear();
            }
            _ => return Err(bad()),
        }
    }
    if !digits.is_empty() || s.is_empty() {
        return Err(bad());
    }
    Ok(total)
}

/// The configuration for `images` (the bundled set, as pods name them).
pub fn generate(images: &[ImageRef], o: &Options) -> Result<Generated, String> {
    let v = o.kubelet;
    if v < MAX_AGE_FIELD {
        return Err(format!(
            "kubelet {v} has no age-based image GC (imageMaximumGCAge came in v1.29); with it, image GC can only run by disk use, which kind turns off (docs/pinning.md)"
        ));
    }
    let (max, min) = (
        go_duration_seconds(&o.max_age)?,
        go_duration_seconds(&o.min_age)?,
    );
    // The kubelet reads a zero imageMinimumGCAge as unset and gives it its
    // default, 2m (pkg/kubelet/apis/config/v1beta1/defaults.go, v1.35.4):
    // shown by tests/kubelet_gc.rs's real kubelet, which kept every image
    // "less than the policy's minAge ... minAge=2m0s" under 0s.
    if min == 0 {
        return Err(format!(
            "--min-age {}: the kubelet reads 0 as unset and uses its default, 2m; give a positive age (1s for the smallest)",
            o.min_age
        ));
    }
    if max <= min {
        return Err(format!(
            "--max-age {} must be longer than --min-age {} (the kubelet refuses it)",
            o.max_age, o.min_age
        ));
    }
    if o.low >= o.high || o.high > 100 {
        return Err(format!(
            "--disk-low {} must be below --disk-high {}, and both at most 100 (the kubelet refuses it)",
            o.low, o.high
        ));
    }
    for e in &o.allow {
        policy::check_entry(e)?;
    }
    let mut notes = Vec::new();
    let mut c = json!({
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "imageMaximumGCAge": o.max_age,
        "imageMinimumGCAge": o.min_age,
        "imageGCHighThresholdPercent": o.high,
        "imageGCLowThresholdPercent": o.low,
    });
    if v < MAX_AGE_ON {
        c["featureGates"] = json!({"ImageMaximumGCAge": true});
        notes.push(format!(
            "kubelet {v}: imageMaximumGCAge needs the alpha ImageMaximumGCAge feature gate, turned on here"
        ));
    }
    if v >= VERIFY_ON {
        c["imagePullCredentialsVerificationPolicy"] = json!(o.policy.name());
        if o.policy == Policy::NeverVerifyAllowlistedImages {
            let mut list = policy::allowlist_for(images);
            list.extend(o.allow.iter().cloned());
            list.sort();
            list.dedup();
            for e in &list {
                policy::check_entry(e)?;
            }
            notes.push(format!(
                "the kubelet matches the allowlist against the image as the pod names it, tag included, so a bundled image is admitted only by a PREFIX/* entry: {} admit every image under them, bundled or not",
                list.join(", ")
            ));
            notes.push("under NeverVerifyAllowlistedImages every image the allowlist does not match is verified (pulled) even when present: cover images you load later with --allow PREFIX/* (e.g. example.com/team/*), or generate with --credential-policy NeverVerifyPreloadedImages".into());
            for e in o.allow.iter().filter(|e| !e.ends_with("/*")) {
                let parent = e.rsplit_once('/').map_or(e.as_str(), |(p, _)| p);
                notes.push(format!(
                    "--allow {e} matches only pods that name {e} with no tag or digest (the kubelet compares an exact entry with the image string as the pod names it); for {e}:TAG use --allow {parent}/*"
                ));
            }
            c["preloadedImagesVerificationAllowlist"] = json!(list);
        }
    } else if v >= VERIFY_FIELDS {
        notes.push(format!(
            "kubelet {v}: credentials of images on the node are not re-verified unless the alpha KubeletEnsureSecretPulledImages gate is on; the policy and allowlist are left out (the kubelet refuses them with the gate off)"
        ));
    }
    // kind and apiVersion first, then the fields, as people write it.
    let mut ordered = serde_yaml_ng::Mapping::new();
    for k in ["kind", "apiVersion"] {
        ordered.insert(
            k.into(),
            serde_yaml_ng::to_value(&c[k]).map_err(|e| e.to_string())?,
        );
    }
    for (k, v) in c.as_object().expect("an object") {
        if k != "kind" && k != "apiVersion" {
            ordered.insert(
                k.as_str().into(),
                serde_yaml_ng::to_value(v).map_err(|e| e.to_string())?,
            );
        }
    }
    let patch = serde_yaml_ng::to_string(&ordered).map_err(|e| e.to_string())?;
    let indented: String = patch
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect::<String>();
    let kind_config = format!(
        "# kiln generate kubelet-config: kubelet {v}, {} bundled image(s).\n# Image GC by age on; the bundled set is pinned, so GC never removes it.\nkind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nkubeadmConfigPatches:\n  - |\n{indented}",
        images.len()
    );
    Ok(Generated {
        kubelet_version: v.to_string(),
        kubelet_configuration: c,
        kind_config,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: Minor) -> Options {
        Options {
            kubelet: v,
            max_age: "168h".into(),
            min_age: "2m".into(),
            high: 100,
            low: 80,
            policy: Policy::NeverVerifyAllowlistedImages,
            allow: vec![],
        }
    }

    #[test]
    fn fields_follow_the_kubelet_version() {
        let images = vec![ImageRef::parse("registry.k8s.io/pause:3.10").unwrap()];
        assert!(generate(&images, &opts(Minor(1, 28))).is_err());
        let g = generate(&images, &opts(Minor(1, 29))).unwrap();
        assert_eq!(
            g.kubelet_configuration["featureGates"]["ImageMaximumGCAge"],
            true
        );
        let g = generate(&images, &opts(Minor(1, 34))).unwrap();
        assert!(g.kubelet_configuration["preloadedImagesVerificationAllowlist"].is_null());
        assert!(g.kubelet_configuration["featureGates"].is_null());
        let g = generate(&images, &opts(Minor(1, 35))).unwrap();
        assert_eq!(
            g.kubelet_configuration["preloadedImagesVerificationAllowlist"],
            json!(["registry.k8s.io/*"])
        );
        let mut o = opts(Minor(1, 35));
        o.max_age = "1m".into();
        assert!(generate(&images, &o).is_err());
        // A zero minimum age is the kubelet's unset: refused, not written.
        let mut o = opts(Minor(1, 35));
        o.min_age = "0s".into();
        assert!(generate(&images, &o).unwrap_err().contains("default, 2m"));
        assert_eq!(go_duration_seconds("1h30m"), Ok(5400));
        assert!(go_duration_seconds("7d").is_err());
    }

    /// An exact --allow entry is kept (the kubelet accepts it) and said to
    /// match untagged pods only, with the prefix that covers tagged ones:
    /// the real kubelet pulled a tagged image an exact entry named
    /// (tests/kind_cluster.rs's first runs).
    #[test]
    fn an_exact_allow_entry_is_said_to_match_untagged_pods_only() {
        let images = vec![ImageRef::parse("registry.k8s.io/pause:3.10").unwrap()];
        let mut o = opts(Minor(1, 35));
        o.allow = vec!["example.com/team/app".into(), "example.com/ops/*".into()];
        let g = generate(&images, &o).unwrap();
        let notes: Vec<&String> = g
            .notes
            .iter()
            .filter(|n| n.starts_with("--allow"))
            .collect();
        assert_eq!(notes.len(), 1, "{:?}", g.notes);
        assert!(
            notes[0].contains("with no tag or digest")
                && notes[0].contains("--allow example.com/team/*")
        );
        let list: Vec<String> = serde_json::from_value(
            g.kubelet_configuration["preloadedImagesVerificationAllowlist"].clone(),
        )
        .unwrap();
        assert!(policy::matches(&list, "example.com/team/app"));
        assert!(!policy::matches(&list, "example.com/team/app:1.0"));
        assert!(policy::matches(&list, "example.com/ops/x:1.0"));
    }
}
