//! kiln bakes Kubernetes node images: it copies a manifest's component
//! images from registries into a rootfs's containerd store, labelled so that
//! kubelet's image GC never removes them.
//!
//! The layers, each importing only those below it (`ARCHITECTURE.md`):
//! [`cli`] (parse, render) → [`ops`] (one call per command, typed reports)
//! → [`domain`] (node images, kind, Kubernetes releases, the node store) →
//! [`engine`] (the copy engine) → [`source`] and [`sink`] (where images
//! come from and go) → [`adapters`] (registry client, containerd daemon,
//! bbolt) → [`primitives`] (OCI documents, digests, references, the in-root
//! resolver, ...).

/// `println!` that never panics: a closed stdout ends kiln quietly.
macro_rules! out {
    ($($t:tt)*) => { $crate::primitives::text::write_line(true, format_args!($($t)*)) };
}
/// `eprintln!` that never panics: a closed stderr ends kiln quietly.
macro_rules! say {
    ($($t:tt)*) => { $crate::primitives::text::write_line(false, format_args!($($t)*)) };
}

pub mod cli;
pub mod ops;

pub mod domain;
pub mod engine;
pub mod sink;
pub mod source;

pub mod adapters;
pub mod primitives;
