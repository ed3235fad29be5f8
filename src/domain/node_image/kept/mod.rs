//! The previous node image's layers this one no longer needs, kept where
//! they were, so the layers after them keep their chain (`order`): when an
//! image of the set drops a large blob, its layer sits mid-chain, and
//! leaving it out changes the ChainID of every layer after it, which
//! Docker's classic store then downloads again and containerd unpacks
//! again (`make bench` (n), (o)).
//!
//! The previous image is untrusted input that flows byte for byte into the
//! new one, so a kept layer is one kiln could have written and holds only
//! what kiln's blob layers hold (`check`); which to keep is chosen from
//! the documents as a whole, worth its cost to first pulls (`choose`).
//! The rooms: `choose`, `check`; the fetch is here. What is kept depends
//! only on the previous image's bytes: a layer that cannot be fetched is
//! an error, not a smaller choice (a warm cache and a cold one give the
//! same image).

mod check;
mod choose;
#[cfg(test)]
mod simulate;

pub use check::Kept;
pub use choose::{Choice, Keep};

/// Kept bytes at most this percentage of kiln's own layers' bytes, unless
/// `--keep-previous-layers` says otherwise. The twenty-release simulation
/// (`simulate`, docs/performance.md) has first pulls paying +7.6 % at 25 %
/// and +8.9 % at 50 % (the choice refuses sets that cost more than they
/// save, so the share seldom binds), while 50 % saves upgraders 15 % more;
/// and one image dropping a large layer (`make bench` (n): 270 MiB of
/// kiln's 842, 32 %) is kept only above a third.
pub const KEEP_PREVIOUS: u8 = 50;

/// What keeping came to for one platform.
#[derive(Debug, Default)]
pub struct Outcome {
    pub kept: Vec<Kept>,
    pub choice: Choice,
    /// Layers refused by [`check::check`] (digest, why), in order.
    pub refused: Vec<(crate::primitives::digest::Digest, String)>,
}

/// The previous image's layers to keep in place ([`Keep::choose`]), each
/// fetched from `from` (verified by its digest, through the cache) and
/// read through ([`check::check`], spending `budget`). A layer refused
/// cuts the choice there, and it is made again; a fetch that fails is an
/// error (module doc). `holds` names the previous image by digest.
#[allow(clippy::too_many_arguments)]
pub(super) async fn keep_previous(
    layout: &crate::sink::layout::OciLayout,
    (source, image): (
        &crate::source::AnySource<'_>,
        &crate::primitives::reference::ImageRef,
    ),
    keep: Keep<'_>,
    layers: &[(super::plan::Part, super::LayerBlob)],
    root: &crate::primitives::inroot::Root,
    owners: &crate::primitives::unpack::Owners,
    budget: &mut crate::primitives::unpack::Budget,
    cache: Option<&crate::sink::cache::Cache>,
    holds: &str,
    record: Option<&super::record::Record>,
) -> anyhow::Result<Outcome> {
    // The copy engine's own blob copy: verified as it streams, through the
    // cache (a rebuild reads it from there), retried as every blob is.
    let engine = crate::engine::copy::Engine::new(
        source,
        layout,
        1,
        crate::primitives::progress::Progress::hidden(),
    );
    let opts = crate::engine::copy::CopyOptions::blobs(1, cache.cloned());
    let mut out = Outcome::default();
    let mut limit = usize::MAX;
    'choose: loop {
        let choice = keep.choose(layers.iter().map(|(_, l)| l), limit);
        for (i, d) in choice.keep.iter().enumerate() {
            if i < out.kept.len() {
                continue;
            }
            // With the previous image's signed record, judged from
            // the entries it lists: nothing fetched.
            if let Some(r) = record {
                let judged = match r.layer(&d.digest) {
                    Some(l) => check::check_recorded(l, root, owners, holds),
                    None => Err(anyhow::anyhow!("its record does not list it")),
                };
                match judged {
                    Ok(k) => out.kept.push(k),
                    Err(e) => {
                        refuse(&mut out, image, &d.digest, e);
                        limit = i;
                        continue 'choose;
                    }
                }
                continue;
            }
            engine
                .copy_layer(image, d, &opts)
                .await
                .map_err(|e| {
                    crate::primitives::error::BadInput(format!(
                        "the previous node image {image}: its layer {} cannot be had ({e:#}); a build does not keep less because of the network (the image would depend on it): retry, or name another image with --previous",
                        d.digest
                    ))
                })?;
            let blob = layout.open_blob(&d.digest)?;
            // Spent only if kept: a refused layer leaves the budget as it was.
            let mut trial = budget.clone();
            let checked = crate::primitives::blocking::off_runtime(|| {
                check::check(blob, d, root, owners, &mut trial, holds)
            });
            match checked {
                Ok(k) => {
                    *budget = trial;
                    out.kept.push(k);
                }
                Err(e) => {
                    refuse(&mut out, image, &d.digest, e);
                    limit = i;
                    continue 'choose;
                }
            }
        }
        out.kept.truncate(choice.keep.len());
        out.choice = choice;
        return Ok(out);
    }
}

/// A layer that cannot be kept: said in one line, listed in the report.
fn refuse(
    out: &mut Outcome,
    image: &crate::primitives::reference::ImageRef,
    layer: &crate::primitives::digest::Digest,
    e: anyhow::Error,
) {
    tracing::warn!(
        "{image}: its layer {layer} is not kept in place ({e:#}); the layers after it are fetched again by Docker and unpacked again by containerd"
    );
    out.refused.push((layer.clone(), format!("{e:#}")));
}

/// What keeping did on one platform, for the report: which image the
/// layers came from (by digest), what they save and cost, where the chain
/// breaks for upgraders now, and the layers refused and why.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptReport {
    pub platform: String,
    /// The image followed: `name@sha256:…`.
    pub previous: String,
    /// Its layers kept in place.
    pub layers: Vec<crate::primitives::digest::Digest>,
    /// Shared bytes upgraders reuse because of them.
    pub saves: u64,
    /// What first pulls pay for them.
    pub costs: u64,
    /// The first of its layers not kept, where upgraders' chain breaks,
    /// and the shared bytes after it they pull again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaks_at: Option<crate::primitives::digest::Digest>,
    pub pulled_again: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refused>,
    /// Why nothing was weighed (another base).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub none_because: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    pub layer: crate::primitives::digest::Digest,
    pub why: String,
}

impl KeptReport {
    pub(in crate::domain::node_image) fn new(
        platform: &crate::primitives::platform::Platform,
        previous: &super::PreviousImage,
        outcome: &Outcome,
    ) -> Self {
        let c = &outcome.choice;
        KeptReport {
            platform: platform.to_string(),
            previous: previous.reference(),
            layers: outcome
                .kept
                .iter()
                .map(|k| k.layer.digest.clone())
                .collect(),
            saves: c.saves,
            costs: c.costs,
            breaks_at: c.breaks.as_ref().map(|(d, _)| d.clone()),
            pulled_again: c.breaks.as_ref().map_or(0, |(_, n)| *n),
            refused: outcome
                .refused
                .iter()
                .map(|(layer, why)| Refused {
                    layer: layer.clone(),
                    why: why.clone(),
                })
                .collect(),
            none_because: c.none_because.map(str::to_string),
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        use crate::primitives::text::human_bytes;
        if let Some(why) = &self.none_because {
            return format!(
                "{}: follows {}; nothing kept: {why}",
                self.platform, self.previous
            );
        }
        let mut s = format!("{}: follows {}", self.platform, self.previous);
        if !self.layers.is_empty() {
            s += &format!(
                "; kept {} of its layers in place ({} for first pulls, saving upgraders {})",
                self.layers.len(),
                human_bytes(self.costs),
                human_bytes(self.saves)
            );
        }
        if let Some(at) = &self.breaks_at {
            s += &format!(
                "; upgraders' chain breaks at its layer {} ({} after it pulled again)",
                at,
                human_bytes(self.pulled_again)
            );
        }
        s
    }
}
