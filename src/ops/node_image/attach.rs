//! What is attached to a pushed node image as its referrers (OCI 1.1):
//! the SBOM and provenance asked for, and each platform manifest's build
//! record with its contributions (`domain::node_image::record`).

use super::*;

/// Uploads one small blob; again, up to [`SEND_AGAIN`] times in all, while
/// the registry renewed an expired token on the way
/// ([`crate::primitives::error::SendAgain`]): a slow link can outlast a
/// short-lived token more than once over a build's several small uploads.
pub(super) async fn push_bytes(
    registry: &RegistryClient,
    target: &ImageRef,
    desc: &Descriptor,
    data: bytes::Bytes,
) -> anyhow::Result<()> {
    let mut attempt = 1;
    loop {
        let d = data.clone();
        let stream: crate::source::BlobStream =
            Box::pin(futures_util::stream::once(async move { Ok(d) }));
        match registry.push_blob(target, desc, stream, None).await {
            Err(e) if attempt < SEND_AGAIN && e.is::<crate::primitives::error::SendAgain>() => {
                tracing::debug!("{e:#}");
                attempt += 1;
            }
            r => return r.map(|_| ()),
        }
    }
}

/// How many times a small upload is sent while its token keeps expiring.
const SEND_AGAIN: u32 = 4;

/// The base's layers recorded absent in the staging layout: every one,
/// when each platform's record holds what it gave the extract and the
/// node's binaries need not be whole.
pub(super) fn base_replayed(
    opts: &NodeImageOptions<'_>,
    records: &std::collections::HashMap<String, crate::domain::node_image::record::Record>,
) -> Option<std::sync::Arc<std::collections::HashSet<Digest>>> {
    if opts.daemon.trust_node_binaries
        || opts
            .platforms
            .iter()
            .any(|p| !records.contains_key(&p.to_string()))
    {
        return None;
    }
    let mut all = std::collections::HashSet::new();
    for r in records.values() {
        let given = r.contributions();
        if r.base.iter().any(|l| !given.contains_key(l)) {
            return None;
        }
        all.extend(r.base.iter().cloned());
    }
    Some(std::sync::Arc::new(all))
}

/// Attaches each platform manifest's build record, with the contributions
/// it names, as a referrer of the manifest (`record`); says what it sent.
pub(super) async fn attach_records(
    opts: &NodeImageOptions<'_>,
    target: &ImageRef,
    node: &NodeImage,
    records: &OciLayout,
) -> anyhow::Result<(Vec<Attached>, Tally)> {
    use crate::domain::node_image::record;
    let (mut out, mut sent) = (Vec::new(), Tally::default());
    for (manifest, rec, contributions) in &node.records {
        let mut blobs = vec![(rec.clone(), "record.json".to_string())];
        blobs.extend(
            contributions
                .iter()
                .map(|c| (c.clone(), format!("extract-{}.tar", c.digest.hex()))),
        );
        blobs.dedup_by(|a, b| a.0.digest == b.0.digest);
        let (doc, config, empty) =
            crate::primitives::oci::artifact_manifest_of(record::ARTIFACT_TYPE, &blobs, manifest);
        let failed = |e: anyhow::Error| anyhow!("attaching the build record to {target}: {e:#}");
        // Each blob once: what the registry has (the contributions of an
        // unchanged base, the empty config) is not sent again.
        for b in std::iter::once(&config).chain(blobs.iter().map(|(b, _)| b)) {
            if opts
                .registry
                .exists(target, "blobs", &b.digest)
                .await
                .unwrap_or(false)
            {
                continue;
            }
            let data = if b.digest == config.digest {
                bytes::Bytes::from_static(empty)
            } else {
                bytes::Bytes::from(std::fs::read(records.blob_path(&b.digest))?)
            };
            push_bytes(opts.registry, target, b, data)
                .await
                .map_err(failed)?;
            sent.uploaded += 1;
            sent.uploaded_bytes += b.size;
        }
        let digest = Digest::of(&doc);
        let index = opts
            .registry
            .push_referrer(target, doc.into(), record::ARTIFACT_TYPE, &manifest.digest)
            .await
            .map_err(failed)?;
        out.push(Attached {
            artifact_type: record::ARTIFACT_TYPE.to_string(),
            digest,
            index,
        });
    }
    Ok((out, sent))
}

/// Pushes the SBOM and the provenance asked for as artifacts whose
/// subject is the pushed node image.
pub(super) async fn attach(
    opts: &NodeImageOptions<'_>,
    target: &ImageRef,
    node: &NodeImage,
    sbom: &crate::domain::sbom::Sbom,
) -> anyhow::Result<Vec<Attached>> {
    let mut docs = Vec::new();
    if opts.attach_sbom {
        docs.push((
            crate::domain::sbom::MEDIA_TYPE,
            "sbom.spdx.json",
            sbom.render()?,
        ));
    }
    if opts.attach_provenance {
        let platforms: Vec<String> = node.manifests.iter().map(|(p, _)| p.to_string()).collect();
        docs.push((
            crate::domain::provenance::MEDIA_TYPE,
            "provenance.intoto.json",
            crate::domain::provenance::render(sbom, opts.manifest, &platforms),
        ));
    }
    let mut attached = Vec::new();
    for (artifact_type, title, text) in docs {
        let bytes = bytes::Bytes::from(text.into_bytes());
        let blob = Descriptor::new(artifact_type, Digest::of(&bytes), bytes.len() as u64);
        let (manifest, config, empty) =
            crate::primitives::oci::artifact_manifest(artifact_type, &blob, title, &node.top);
        for (desc, data) in [(&config, bytes::Bytes::from_static(empty)), (&blob, bytes)] {
            push_bytes(opts.registry, target, desc, data)
                .await
                .map_err(|e| anyhow!("attaching {artifact_type} to {target}: {e:#}"))?;
        }
        let digest = Digest::of(&manifest);
        let index = opts
            .registry
            .push_referrer(target, manifest.into(), artifact_type, &node.top.digest)
            .await
            .map_err(|e| anyhow!("attaching {artifact_type} to {target}: {e:#}"))?;
        attached.push(Attached {
            artifact_type: artifact_type.to_string(),
            digest,
            index,
        });
    }
    Ok(attached)
}
