//! What the images a node image is built on and after hold: the base's
//! manifests and depth (checked before anything is fetched), the previous
//! node image (`--previous`): resolved once, by digest, read whole.

use super::*;

/// Refuses a base too deep for kiln's layers and the headroom above them
/// ([`plan::budget`]), from its manifests alone: before any of its layers,
/// or any image, is fetched. Anything else wrong with the base is left to
/// the copy, which says it as it always does.
pub async fn check_base_depth<S: crate::source::Source>(
    source: &S,
    base: &crate::primitives::reference::ImageRef,
    platforms: &[Platform],
) -> anyhow::Result<()> {
    let Ok(top) = source.resolve(base).await else {
        return Ok(());
    };
    for (_, m) in manifests_of(source, base, &top, platforms)
        .await
        .unwrap_or_default()
    {
        // Context keeps the BadInput in the chain (exit 2).
        plan::budget(m.layers.len()).with_context(|| format!("base {base}"))?;
    }
    Ok(())
}

/// The node image a build follows (`--previous`, or the `--push` tag's
/// image), resolved once: every later read goes by its digest, so a tag
/// that moves mid-build changes nothing, and the digest is what the new
/// image records of it (annotations, SBOM, provenance).
#[derive(Debug, Clone)]
pub struct PreviousImage {
    /// Its repository (normalised; a tag is not part of what it is).
    pub name: String,
    /// Its top document's digest.
    pub digest: Digest,
    /// `name` pinned to `digest`: where its documents and layers are read.
    pub pinned: crate::primitives::reference::ImageRef,
    /// Its layers by platform, for [`order::arrange`] and [`kept::Keep::choose`].
    pub layers: std::collections::HashMap<String, Vec<Descriptor>>,
    /// What it recorded as its own previous image: per platform (its
    /// manifests' annotations) and at its top (an index's), for a rebuild
    /// ([`PreviousImage::recorded_by`]).
    pub recorded: std::collections::HashMap<String, Option<(String, Digest)>>,
    pub top_recorded: Option<(String, Digest)>,
    /// Each platform manifest's build record, as its annotations name it.
    pub records: std::collections::HashMap<String, Descriptor>,
    /// Its top document, for its signature ([`previous_trust`]).
    pub top: Descriptor,
}

/// Whether the previous image's build record may stand in for bytes (a
/// layer taken by digest, a kept layer judged from the record's entries,
/// the extract replayed from recorded contributions), and why: decided
/// once, by [`previous_trust`], and reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviousTrust {
    /// The record is used.
    pub record_used: bool,
    /// Who signed the previous image, its signature verified under the
    /// build's signature policy (`--verify-signatures`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// Why the record is not used: then every layer the build takes from
    /// the previous image is fetched and judged by its bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
}

impl PreviousTrust {
    /// The one line a build says of it, for `previous` (`name@digest`).
    pub fn line(&self, previous: &str) -> String {
        match (&self.signed_by, &self.why_not) {
            (Some(by), None) => format!(
                "previous image {previous}: signed ({by}): its build record stands in for the bytes of the layers it lists"
            ),
            (_, Some(why)) => format!(
                "previous image {previous}: its build record is not used ({why}): every layer taken from it is fetched and judged by its bytes"
            ),
            (None, None) => format!("previous image {previous}"),
        }
    }
}

/// Whether `previous`'s build record may be used ([`PreviousTrust`]): the
/// one place this is decided. A digest names bytes, not who made them, so
/// being named by digest or through a lock is not enough: the record is
/// used only when the previous image carries a cosign signature that
/// verifies under the build's signature policy (`gate`, a rule naming the
/// node image's repository with keys or keyless signers; `unsigned: true`
/// lets an image in, it does not make its record trusted). And only where
/// a layer can be taken without its bytes: a push (`push`) to the
/// previous image's registry, not an archive (`archive`), which needs
/// every byte.
pub async fn previous_trust<S: crate::source::Source>(
    source: &S,
    previous: &PreviousImage,
    gate: Option<&dyn crate::engine::gate::Gate>,
    push: Option<&crate::primitives::reference::ImageRef>,
    archive: bool,
) -> PreviousTrust {
    let not = |why: String| PreviousTrust {
        record_used: false,
        signed_by: None,
        why_not: Some(why),
    };
    match push {
        _ if archive => return not("an archive (--output) needs every byte".into()),
        None => return not("nothing is pushed".into()),
        Some(t) if t.domain != previous.pinned.domain => {
            return not(format!(
                "the push goes to {}, and its layers are on {}",
                t.domain, previous.pinned.domain
            ))
        }
        Some(_) => {}
    }
    let Some(gate) = gate else {
        return not(
            "no signature policy: pass --verify-signatures POLICY with a rule naming its repository and your signing key"
                .into(),
        );
    };
    match gate.admit(source, &previous.pinned, &previous.top).await {
        Ok(Some(by)) => PreviousTrust {
            record_used: true,
            signed_by: Some(by),
            why_not: None,
        },
        Ok(None) => not(format!(
            "the signature policy lets {} in unsigned, and a record is trusted only when signed",
            previous.name
        )),
        Err(e) => not(format!("its signature: {e:#}")),
    }
}

/// The previous image an image's `annotations` record, if they name one
/// well formed (a reference and a digest).
fn recorded_in(a: &std::collections::BTreeMap<String, String>) -> Option<(String, Digest)> {
    let name = a.get(PREVIOUS_NAME)?;
    crate::primitives::reference::ImageRef::parse(name).ok()?;
    Some((name.clone(), Digest::parse(a.get(PREVIOUS_DIGEST)?).ok()?))
}

impl PreviousImage {
    /// `name@digest`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.digest)
    }

    /// What an image built after this one records as its previous, where
    /// `same` says whether it is this image again (the same layers: a
    /// rebuild of the same inputs): then what this one recorded, so
    /// rebuilding and pushing to the same tag gives the same image every
    /// time; else this image. `platform`: `None` for the top (an index).
    pub fn recorded_by(&self, same: bool, platform: Option<&Platform>) -> Option<(String, Digest)> {
        if !same {
            return Some((self.name.clone(), self.digest.clone()));
        }
        match platform {
            Some(p) => self.recorded.get(&p.to_string()).cloned().flatten(),
            None => self.top_recorded.clone(),
        }
    }
}

/// The previous node image, read for `platforms`. One the user `named`
/// must be read whole: any failure, or a platform it lacks, is bad input
/// (exit 2), before anything is fetched or pushed. The `--push` tag's
/// image (followed by default) may not exist yet: only the registry's
/// "no such manifest" means a first push (`Ok(None)`, said in one line);
/// any other answer (401, 5xx, a timeout) is an error naming it, as
/// building on would quietly break every upgrader's chain.
pub async fn previous_image<S: crate::source::Source>(
    source: &S,
    image: &crate::primitives::reference::ImageRef,
    platforms: &[Platform],
    named: bool,
) -> anyhow::Result<Option<PreviousImage>> {
    let bad = |what: String| -> anyhow::Error {
        let how = if named {
            format!("--previous {image}")
        } else {
            format!("{image} (the --push tag's image, which a build follows unless --previous names another)")
        };
        crate::primitives::error::BadInput(format!(
            "{how}: {what}; name the node image this one follows with --previous REF@sha256:… (as pushed or archived)"
        ))
        .into()
    };
    let top = match source.resolve(image).await {
        Ok(t) => t,
        Err(e) if !named && e.is::<crate::primitives::error::NotFound>() => {
            // A warning, not a note: with per-version tags this is every
            // release, and every upgrader then pulls the whole image.
            tracing::warn!(
                "{image} has no image yet: this build follows nothing (its layer order is its own); pass --previous REF@sha256:… to follow the last release"
            );
            return Ok(None);
        }
        // The push registry is down: the network's fault, not the input's,
        // and found before anything is built.
        Err(e) if !named && e.is::<crate::primitives::error::Unreachable>() => {
            return Err(e.context(format!(
                "the --push registry cannot be reached to read {image}, the image this build follows: nothing was built; check the registry and the network, then rerun"
            )));
        }
        Err(e) => return Err(bad(format!("cannot be read ({e:#})"))),
    };
    let found = manifests_of(source, image, &top, platforms)
        .await
        .map_err(|e| bad(format!("{e:#}")))?;
    // The repository, not the tag: the same image named by tag or by
    // digest is the same input and gives the same bytes.
    let name = image.name();
    let pinned = crate::primitives::reference::ImageRef {
        digest: Some(top.descriptor.digest.clone()),
        ..image.clone()
    };
    let top_recorded = match crate::primitives::oci::Document::parse(&top.bytes) {
        Ok((_, crate::primitives::oci::Document::Index(i))) => recorded_in(&i.annotations),
        Ok((_, crate::primitives::oci::Document::Manifest(m))) => recorded_in(&m.annotations),
        Err(_) => None,
    };
    Ok(Some(PreviousImage {
        name,
        digest: top.descriptor.digest.clone(),
        pinned,
        recorded: found
            .iter()
            .map(|(p, m)| (p.to_string(), recorded_in(&m.annotations)))
            .collect(),
        top_recorded,
        records: found
            .iter()
            .filter_map(|(p, m)| Some((p.to_string(), super::record::named_by(&m.annotations)?)))
            .collect(),
        top: top.descriptor.clone(),
        layers: found
            .into_iter()
            .map(|(p, m)| (p.to_string(), m.layers))
            .collect(),
    }))
}

/// `image`'s manifest (`top`, resolved) for each of `platforms`, each
/// document checked against its digest; a platform it lacks, or a
/// document that cannot be had, is an error.
async fn manifests_of<S: crate::source::Source>(
    source: &S,
    image: &crate::primitives::reference::ImageRef,
    top: &crate::primitives::handoff::Resolved,
    platforms: &[Platform],
) -> anyhow::Result<Vec<(Platform, ImageManifest)>> {
    use crate::primitives::oci::Document;
    let mut out = Vec::new();
    match Document::parse(&top.bytes).map_err(|e| anyhow!("{e}"))?.1 {
        Document::Manifest(m) if platforms.len() == 1 => out.push((platforms[0].clone(), m)),
        Document::Manifest(_) => bail!(
            "a single-platform image, and this build is for {}",
            platforms
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Document::Index(idx) => {
            for p in platforms {
                let i = crate::primitives::oci::select_platform(&idx.manifests, p)
                    .ok_or_else(|| anyhow!("no {p} image in it"))?;
                let d = &idx.manifests[i];
                let bytes = source.manifest(image, d).await?;
                if Digest::of(&bytes) != d.digest {
                    bail!("its {p} manifest does not match its digest {}", d.digest);
                }
                match Document::parse(&bytes).map_err(|e| anyhow!("{e}"))?.1 {
                    Document::Manifest(m) => out.push((p.clone(), m)),
                    Document::Index(_) => bail!("its {p} entry is a nested index"),
                }
            }
        }
    }
    Ok(out)
}

/// The base's manifest for each platform asked for.
pub(super) fn base_manifests(
    layout: &crate::sink::layout::OciLayout,
    base_ref: &crate::primitives::reference::ImageRef,
    base_top: &Descriptor,
    platforms: &[Platform],
) -> anyhow::Result<Vec<(Platform, ImageManifest)>> {
    use crate::primitives::oci::Document;
    let top = read_blob(layout, &base_top.digest)?;
    match Document::parse(&top)
        .map_err(|e| anyhow!("base {base_ref}: {e}"))?
        .1
    {
        Document::Index(idx) => platforms
            .iter()
            .map(|p| {
                let d = crate::primitives::oci::select_platform(&idx.manifests, p)
                    .map(|i| &idx.manifests[i])
                    .ok_or_else(|| anyhow!("base {base_ref} has no {p} image"))?;
                match Document::parse(&read_blob(layout, &d.digest)?)
                    .map_err(|e| anyhow!("{e}"))?
                    .1
                {
                    Document::Manifest(m) => Ok((p.clone(), m)),
                    Document::Index(_) => bail!("base {base_ref}: nested index"),
                }
            })
            .collect(),
        Document::Manifest(m) => {
            if platforms.len() != 1 {
                bail!("base {base_ref} is a single-platform image; build one --platform from it");
            }
            Ok(vec![(platforms[0].clone(), m)])
        }
    }
}

/// The previous image's build records, by platform, for a build that may
/// use them ([`previous_trust`]): each fetched from its repository by the
/// digest its signed manifest names, read ([`super::record::Record::read`]),
/// and its contributions fetched into `records` (verified, through the
/// cache). Where one cannot be used, the build fetches what it needs as
/// without it, and one line says why; nothing here fails the build.
pub async fn previous_records<S: crate::source::Source>(
    source: &S,
    previous: &PreviousImage,
    platforms: &[Platform],
    compression: &str,
    records: &crate::sink::layout::OciLayout,
    cache: Option<&crate::sink::cache::Cache>,
) -> std::collections::HashMap<String, super::record::Record> {
    let mut out = std::collections::HashMap::new();
    let engine = crate::engine::copy::Engine::new(
        source,
        records,
        1,
        crate::primitives::progress::Progress::hidden(),
    );
    let opts = crate::engine::copy::CopyOptions::blobs(1, cache.cloned());
    for p in platforms {
        let read = async {
            let desc = previous.records.get(&p.to_string()).ok_or_else(|| {
                anyhow!("its manifest names no build record (built by an earlier kiln?)")
            })?;
            if desc.size > super::record::MAX_BYTES {
                bail!(
                    "its build record is over {} bytes",
                    super::record::MAX_BYTES
                );
            }
            // Verified by the digest the signed manifest names.
            engine.copy_layer(&previous.pinned, desc, &opts).await?;
            let bytes = std::fs::read(records.blob_path(&desc.digest))?;
            let r = super::record::Record::read(&bytes, &p.to_string(), compression)?;
            for c in r.contributions().values() {
                engine.copy_layer(&previous.pinned, c, &opts).await?;
            }
            anyhow::Ok(r)
        };
        match read.await {
            Ok(r) => {
                out.insert(p.to_string(), r);
            }
            Err(e) => tracing::warn!(
                "{}: its {p} build record cannot be used ({e:#}); its layers are fetched and checked",
                previous.reference()
            ),
        }
    }
    out
}
