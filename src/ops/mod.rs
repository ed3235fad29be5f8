//! What kiln does, as library calls that return typed reports. `cli/`
//! parses flags into these calls and renders the reports (text or JSON),
//! the way cargo's commands call `cargo::ops`.

pub mod build;
pub mod bundle;
pub mod check;
pub mod index;
pub mod load;
pub mod lock;
pub mod node_image;
pub mod start;
pub mod verify;

use serde::Serialize;

use crate::copy::CopiedImage;
use crate::reference::ImageRef;

/// One image that failed, and why (one line).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failed {
    pub reference: String,
    pub error: String,
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
            Err(e) => failed.push(Failed {
                reference: image.to_string(),
                error: crate::text::one_line(&format!("{e:#}")),
            }),
        }
    }
    (ok, failed)
}
