//! What a copy reports: per image what it became in the sink (or why it
//! failed, in one line), and the bytes fetched and found present.

use serde::Serialize;

use crate::primitives::digest::Digest;
use crate::primitives::oci::Descriptor;
use crate::primitives::reference::ImageRef;

/// What one image became in the sink.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopiedImage {
    pub reference: String,
    pub digest: Digest,
    pub media_type: String,
    pub platforms: Vec<String>,
    /// Bytes of everything stored for the selected platforms.
    pub size: u64,
    pub records: Vec<String>,
    /// The platform manifests stored (the top itself for a single manifest).
    pub manifests: Vec<Digest>,
    /// What vouched for it before it was stored (`--verify-signatures`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_by: Option<String>,
    #[serde(skip)]
    pub top: Descriptor,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub blobs_fetched: u64,
    pub bytes_fetched: u64,
    pub blobs_present: u64,
    /// Blobs taken from the shared cache rather than fetched.
    pub blobs_cached: u64,
    pub bytes_cached: u64,
}

impl Stats {
    pub fn add(&mut self, other: &Stats) {
        self.blobs_fetched += other.blobs_fetched;
        self.bytes_fetched += other.bytes_fetched;
        self.blobs_present += other.blobs_present;
        self.blobs_cached += other.blobs_cached;
        self.bytes_cached += other.bytes_cached;
    }
}

/// One image that failed, and why (one line).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failed {
    pub reference: String,
    pub error: String,
    /// Every place that answered has no such tag or digest: the input is
    /// wrong, not the network (exit 2 when every failure is this).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_found: bool,
}

impl Failed {
    /// One image's failure: a "no such tag or digest" says only that (the
    /// engine's context would bury it mid-line); anything else whole.
    pub fn of(image: &ImageRef, e: &anyhow::Error) -> Failed {
        let missing = e
            .chain()
            .find_map(|c| c.downcast_ref::<crate::primitives::error::NotFound>());
        let error = match missing {
            Some(nf) => format!("{image}: {nf}"),
            None => format!("{e:#}"),
        };
        Failed {
            reference: image.to_string(),
            error: crate::primitives::text::one_line(&error),
            not_found: missing.is_some(),
        }
    }
}

/// Splits per-image results into what was stored and what failed.
pub fn split(
    images: &[ImageRef],
    results: Vec<anyhow::Result<CopiedImage>>,
) -> (Vec<CopiedImage>, Vec<Failed>) {
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (image, r) in images.iter().zip(results) {
        match r {
            Ok(c) => ok.push(c),
            Err(e) => failed.push(Failed::of(image, &e)),
        }
    }
    (ok, failed)
}
