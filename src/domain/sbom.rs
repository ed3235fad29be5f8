//! The SBOM of a build: an SPDX 2.3 JSON document naming what went in (the
//! base image, every bundled image with its digest, platforms and whether
//! it is pinned, the Kubernetes release and its binaries with their
//! SHA-256, and the containerd the store was written for).
//!
//! Why SPDX 2.3 rather than CycloneDX 1.6: it is the format the Kubernetes
//! project publishes its own release SBOMs in (`bom`), and the SPDX
//! project's own validator (`pyspdxtools`, from PyPI) checks it in the
//! tests. Field meanings are from the SPDX 2.3 specification (spdx.github.io
//! /spdx-spec/v2.3): packages carry `SPDXID`, `name`, `downloadLocation`
//! (`NOASSERTION` where kiln has no URL to vouch for), `filesAnalyzed:
//! false` (kiln lists no files inside them) and checksums by algorithm;
//! images carry a `purl` (`pkg:oci/...`, the package-url spec's OCI type).
//!
//! Reproducible: the same inputs give the same bytes. Packages are sorted,
//! the creation time is `SOURCE_DATE_EPOCH` (else the epoch), and the
//! namespace is derived from the content.

use serde_json::{json, Value};

use crate::primitives::digest::Digest;

/// The media type an SPDX JSON document is attached under.
pub const MEDIA_TYPE: &str = "application/spdx+json";

/// What a build put into its subject.
#[derive(Debug, Clone, Default)]
pub struct Sbom {
    /// The node image's name (for a rootfs, the manifest's digest: never a
    /// local path) and its digest, if any.
    pub subject: String,
    pub subject_digest: Option<Digest>,
    /// The base image: reference and digest.
    pub base: Option<(String, Digest)>,
    /// The node image this one followed (`--previous`): name and digest.
    pub previous: Option<(String, Digest)>,
    pub images: Vec<Image>,
    pub kubernetes: Option<Release>,
    /// containerd's version the store was written for (the node's own, else
    /// the writer's).
    pub containerd: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Image {
    pub reference: String,
    pub digest: Digest,
    pub platforms: Vec<String>,
    pub pinned: bool,
    /// What vouched for it when it was stored (a verified signature).
    pub admitted_by: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Release {
    pub version: String,
    pub source: String,
    pub sha512: Option<String>,
    /// (path in the node, its SHA-256, platform).
    pub binaries: Vec<(String, Digest, String)>,
}

/// `pkg:oci/NAME@DIGEST?repository_url=REPO&tag=TAG`, the package-url for
/// an OCI image (the name is the repository's last part).
fn purl(reference: &str, digest: &Digest) -> String {
    let (repo, tag) = match reference.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, Some(t)),
        _ => (reference, None),
    };
    let repo = repo.split('@').next().unwrap_or(repo);
    let name = repo.rsplit('/').next().unwrap_or(repo).to_ascii_lowercase();
    let mut p = format!(
        "pkg:oci/{name}@sha256%3A{}?repository_url={repo}",
        digest.hex()
    );
    if let Some(t) = tag {
        p.push_str(&format!("&tag={t}"));
    }
    p
}

fn image_package(id: &str, name: &str, digest: &Digest, comment: String) -> Value {
    json!({
        "SPDXID": id,
        "name": name,
        "versionInfo": digest.to_string(),
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "primaryPackagePurpose": "CONTAINER",
        "checksums": [{"algorithm": "SHA256", "checksumValue": digest.hex()}],
        "externalRefs": [{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": purl(name, digest),
        }],
        "comment": comment,
    })
}

impl Sbom {
    /// The SPDX 2.3 JSON document, `created` at that many seconds since the
    /// epoch.
    pub fn document(&self, created: i64) -> Value {
        let mut packages = Vec::new();
        let mut relationships = vec![json!({
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": "SPDXRef-Subject",
        })];
        let contains = |id: &str| {
            json!({
                "spdxElementId": "SPDXRef-Subject",
                "relationshipType": "CONTAINS",
                "relatedSpdxElement": id,
            })
        };
        let mut subject = json!({
            "SPDXID": "SPDXRef-Subject",
            "name": self.subject,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "primaryPackagePurpose": "CONTAINER",
        });
        if let Some(d) = &self.subject_digest {
            subject["versionInfo"] = json!(d.to_string());
            subject["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": d.hex()}]);
        }
        packages.push(subject);
        if let Some((reference, digest)) = &self.base {
            packages.push(image_package(
                "SPDXRef-Base",
                reference,
                digest,
                "the base image".into(),
            ));
            relationships.push(json!({
                "spdxElementId": "SPDXRef-Subject",
                "relationshipType": "DESCENDANT_OF",
                "relatedSpdxElement": "SPDXRef-Base",
            }));
        }
        if let Some((reference, digest)) = &self.previous {
            packages.push(image_package(
                "SPDXRef-Previous",
                reference,
                digest,
                "the node image this one follows: it decides the layers' order, and layers of it may be kept in place".into(),
            ));
            relationships.push(json!({
                "spdxElementId": "SPDXRef-Previous",
                "relationshipType": "BUILD_DEPENDENCY_OF",
                "relatedSpdxElement": "SPDXRef-Subject",
            }));
        }
        let mut images = self.images.clone();
        images.sort();
        for (n, i) in images.iter().enumerate() {
            let id = format!("SPDXRef-Image-{n}");
            packages.push(image_package(
                &id,
                &i.reference,
                &i.digest,
                format!(
                    "bundled image, {}; platforms: {}{}",
                    if i.pinned {
                        "pinned (io.cri-containerd.pinned=pinned)"
                    } else {
                        "managed, not pinned"
                    },
                    i.platforms.join(", "),
                    i.admitted_by
                        .as_deref()
                        .map(|a| format!("; {a}"))
                        .unwrap_or_default()
                ),
            ));
            relationships.push(contains(&id));
        }
        if let Some(r) = &self.kubernetes {
            let mut release = json!({
                "SPDXID": "SPDXRef-Kubernetes",
                "name": "kubernetes-server",
                "versionInfo": r.version,
                "downloadLocation": if r.source.starts_with("https://") { r.source.clone() } else { "NOASSERTION".into() },
                "filesAnalyzed": false,
                "primaryPackagePurpose": "ARCHIVE",
                "comment": format!("the release built in, from {}", r.source),
            });
            if let Some(sum) = &r.sha512 {
                release["checksums"] = json!([{"algorithm": "SHA512", "checksumValue": sum}]);
            }
            packages.push(release);
            relationships.push(contains("SPDXRef-Kubernetes"));
            let mut binaries = r.binaries.clone();
            binaries.sort();
            for (n, (path, sha, platform)) in binaries.iter().enumerate() {
                let id = format!("SPDXRef-Binary-{n}");
                let name = path.rsplit('/').next().unwrap_or(path);
                packages.push(json!({
                    "SPDXID": id,
                    "name": name,
                    "versionInfo": r.version,
                    "packageFileName": path,
                    "downloadLocation": "NOASSERTION",
                    "filesAnalyzed": false,
                    "primaryPackagePurpose": "APPLICATION",
                    "checksums": [{"algorithm": "SHA256", "checksumValue": sha.hex()}],
                    "comment": format!("{path} ({platform})"),
                }));
                relationships.push(contains(&id));
                relationships.push(json!({
                    "spdxElementId": id,
                    "relationshipType": "GENERATED_FROM",
                    "relatedSpdxElement": "SPDXRef-Kubernetes",
                }));
            }
        }
        if let Some(v) = &self.containerd {
            packages.push(json!({
                "SPDXID": "SPDXRef-containerd",
                "name": "containerd",
                "versionInfo": v,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": false,
                "primaryPackagePurpose": "APPLICATION",
                "comment": "the containerd the image store was written for",
            }));
            relationships.push(json!({
                "spdxElementId": "SPDXRef-Subject",
                "relationshipType": "DEPENDS_ON",
                "relatedSpdxElement": "SPDXRef-containerd",
            }));
        }
        let body = json!({"packages": packages, "relationships": relationships});
        let ns = Digest::of(body.to_string().as_bytes());
        let when = chrono::DateTime::from_timestamp(created, 0)
            .unwrap_or_default()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        json!({
            "spdxVersion": "SPDX-2.3",
            "dataLicense": "CC0-1.0",
            "SPDXID": "SPDXRef-DOCUMENT",
            "name": format!("kiln build of {}", self.subject),
            "documentNamespace": format!("https://kiln.invalid/spdx/{}", ns.hex()),
            "creationInfo": {
                "created": when,
                "creators": [format!("Tool: kiln-{}", env!("CARGO_PKG_VERSION"))],
            },
            "packages": body["packages"],
            "relationships": body["relationships"],
        })
    }

    /// The document as written, created at `SOURCE_DATE_EPOCH` (else the
    /// epoch), so the same inputs give the same bytes.
    pub fn render(&self) -> anyhow::Result<String> {
        let created = crate::primitives::epoch::source_date_epoch()?.unwrap_or(0);
        Ok(self.to_json(created))
    }

    /// The document as written: pretty JSON, one trailing newline.
    pub fn to_json(&self, created: i64) -> String {
        let mut s = serde_json::to_string_pretty(&self.document(created)).expect("serialises");
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_inputs_give_the_same_bytes_in_any_order() {
        let img = |r: &str, c: u8| Image {
            reference: r.into(),
            digest: Digest::of(&[c]),
            platforms: vec!["linux/amd64".into()],
            pinned: true,
            admitted_by: None,
        };
        let mut a = Sbom {
            subject: "kindest/node:v1".into(),
            images: vec![
                img("registry.k8s.io/pause:3.10", 1),
                img("registry.k8s.io/etcd:3.5.16-0", 2),
            ],
            containerd: Some("2.1.4".into()),
            ..Default::default()
        };
        let one = a.to_json(1_700_000_000);
        a.images.reverse();
        assert_eq!(one, a.to_json(1_700_000_000));
        assert!(
            one.contains("\"created\": \"2023-11-14T22:13:20Z\""),
            "{one}"
        );
        assert!(one.contains(&format!(
            "pkg:oci/pause@sha256%3A{}?repository_url=registry.k8s.io/pause&tag=3.10",
            Digest::of(&[1]).hex()
        )));
        a.images[0].pinned = false;
        assert_ne!(one, a.to_json(1_700_000_000));
    }
}
