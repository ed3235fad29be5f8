//! verify's look at what the kubelet itself keeps of the node's images
//! (`domain::kubelet`): no image-manager state, and per credential policy
//! whether the bundled images start with no registry.

use std::collections::BTreeMap;
use std::path::Path;

use crate::domain::kubelet::policy::{allowlist_for, Policy};
use crate::domain::kubelet::state;
use crate::domain::manifest::NodeManifest;
use crate::ops::check::Check;
use crate::primitives::inroot::Root;

pub(super) const KUBELET_STATE: &str =
    "no kubelet image-manager state: every bundled image counts as preloaded (kubelet 1.35's credential checks)";

/// The check, on the node's files at `files`: `ids` the CRI id of each
/// bundled image by its tagged name (when CRI could be read), `sandbox`
/// the sandbox image the node's containerd runs (never checked by the
/// kubelet).
pub(super) fn check(
    files: &Path,
    manifest: &NodeManifest,
    ids: Option<&BTreeMap<String, String>>,
    sandbox: Option<&str>,
) -> anyhow::Result<Check> {
    let found = state::read(&Root::open(files)?)?;
    let images: Vec<String> = manifest
        .images
        .iter()
        .map(|i| i.tagged_name().unwrap_or_else(|| i.to_string()))
        .collect();
    let allowlist = allowlist_for(&manifest.images);
    let mut details = Vec::new();
    if let Some(f) = &found {
        details.push(format!(
            "{} is on the node ({}): under the default policy a kubelet of 1.35 or later re-verifies against their registries the images it names as pulled by itself, unless a record says they were pulled with no credentials; remove the directory (kiln build removes it from what it builds)",
            f.path,
            f.summary()
        ));
    }
    let per_policy: Vec<String> = Policy::ALL
        .iter()
        .map(|p| {
            let offline = images
                .iter()
                .filter(|i| {
                    Some(i.as_str()) == sandbox
                        || p.runs_offline(
                            i,
                            ids.and_then(|m| m.get(*i)).map(String::as_str),
                            found.as_ref(),
                            &allowlist,
                        )
                })
                .count();
            let how = match p {
                Policy::NeverVerifyPreloadedImages => " (the default from 1.35)",
                Policy::NeverVerifyAllowlistedImages => {
                    " (kiln generate kubelet-config's allowlist)"
                }
                _ => "",
            };
            format!("{}{how} {offline}/{}", p.name(), images.len())
        })
        .collect();
    details.push(format!(
        "bundled images that start offline, per credential policy: {} (the sandbox image counts under each: containerd runs it, the kubelet never checks it)",
        per_policy.join(", ")
    ));
    Ok(Check {
        name: KUBELET_STATE.into(),
        ok: found.is_none(),
        ran: true,
        details,
    })
}
