//! Provenance of a node image: an in-toto Statement v1 whose predicate is
//! SLSA Provenance v1, saying what built the image (kiln and its version)
//! from what (the manifest's bytes, the base, every bundled image and the
//! Kubernetes release, each with its digest: the lock's inputs).
//!
//! Field names and meanings are from the in-toto attestation spec
//! (github.com/in-toto/attestation, spec/v1/statement.md and
//! resource_descriptor.md) and SLSA (slsa.dev/spec/v1.0/provenance):
//! `subject[].digest` maps algorithm to hex; `buildDefinition` holds
//! `buildType`, `externalParameters` (what the user asked for) and
//! `resolvedDependencies` (what those resolved to); `runDetails.builder.id`
//! names the builder. No timestamps: the same inputs give the same bytes.

use serde_json::{json, Value};

use super::manifest::NodeManifest;
use super::sbom::Sbom;
use crate::primitives::digest::Digest;

/// What kiln's builds are, as SLSA's `buildType` (a URI naming the
/// meaning of `externalParameters`).
pub const BUILD_TYPE: &str = "https://kiln.invalid/provenance/node-image/v1";

/// `oci://REFERENCE` for an image reference, as in-toto resource URIs name
/// OCI artifacts.
fn oci(reference: &str) -> String {
    format!("oci://{reference}")
}

fn sha256(d: &Digest) -> Value {
    json!({ "sha256": d.hex() })
}

/// The media type an in-toto statement is attached under.
pub const MEDIA_TYPE: &str = "application/vnd.in-toto+json";

/// The statement as written: pretty JSON, one trailing newline.
pub fn render(sbom: &Sbom, manifest: &NodeManifest, platforms: &[String]) -> String {
    let mut text =
        serde_json::to_string_pretty(&statement(sbom, manifest, platforms)).expect("serialises");
    text.push('\n');
    text
}

/// The statement for the node image `sbom` describes, built from
/// `manifest` for `platforms`.
pub fn statement(sbom: &Sbom, manifest: &NodeManifest, platforms: &[String]) -> Value {
    let mut deps = vec![json!({
        "name": "manifest",
        "uri": format!("file:{}", manifest.path.display()),
        "digest": sha256(&Digest::of(manifest.text.as_bytes())),
    })];
    if let Some((reference, digest)) = &sbom.base {
        deps.push(json!({"name": "base", "uri": oci(reference), "digest": sha256(digest)}));
    }
    if let Some((reference, digest)) = &sbom.previous {
        deps.push(json!({"name": "previous", "uri": oci(reference), "digest": sha256(digest)}));
    }
    let mut images = sbom.images.clone();
    images.sort();
    for i in &images {
        deps.push(json!({
            "name": i.reference,
            "uri": oci(&i.reference),
            "digest": sha256(&i.digest),
            "annotations": {"pinned": i.pinned, "platforms": i.platforms},
        }));
    }
    let mut external = json!({
        "manifest": manifest.path.display().to_string(),
        "platforms": platforms,
    });
    if let Some((reference, _)) = &sbom.base {
        external["base"] = json!(reference);
    }
    if let Some((reference, _)) = &sbom.previous {
        external["previous"] = json!(reference);
    }
    if let Some(r) = &sbom.kubernetes {
        external["kubernetes"] = json!(r.source);
        let mut release =
            json!({"name": "kubernetes", "uri": r.source, "annotations": {"version": r.version}});
        if let Some(sum) = &r.sha512 {
            release["digest"] = json!({ "sha512": sum });
        }
        deps.push(release);
    }
    json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{
            "name": sbom.subject,
            "digest": sbom.subject_digest.as_ref().map(sha256).unwrap_or_else(|| json!({})),
        }],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {
                    "id": "https://kiln.invalid/builder/kiln",
                    "version": {"kiln": env!("CARGO_PKG_VERSION")},
                },
            },
        },
    })
}
