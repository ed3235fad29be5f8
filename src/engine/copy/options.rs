//! What a copy is asked to do: which platforms, how many transfers at
//! once, the cache, the gate, the blobs recorded without their bytes.

use std::sync::Arc;

use crate::primitives::digest::Digest;
use crate::primitives::platform::Platform;
use crate::sink::cache::Cache;

#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub platforms: Vec<Platform>,
    /// Blob transfers in flight at once.
    pub jobs: usize,
    /// Where verified blobs are kept across runs and taken from first.
    pub cache: Option<Cache>,
    /// Asked before anything of an image is stored (`--verify-signatures`).
    pub gate: Option<Arc<dyn crate::engine::gate::Gate>>,
    /// Layer blobs the sink records without their bytes
    /// ([`crate::sink::Sink::put_absent`]): a node-image build that reuses, by digest, a
    /// layer of its previous image holding them (`domain::node_image::record`).
    pub absent: Option<Arc<std::collections::HashSet<Digest>>>,
}

impl CopyOptions {
    /// For copying single blobs (`Engine::copy_layer`): no image is
    /// walked, so no platforms, no gate, nothing recorded absent.
    pub fn blobs(jobs: usize, cache: Option<Cache>) -> CopyOptions {
        CopyOptions {
            platforms: Vec::new(),
            jobs,
            cache,
            gate: None,
            absent: None,
        }
    }
}
