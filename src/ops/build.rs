//! `kiln build --rootfs`: a manifest's images into a rootfs's store, pinned.
//! The work is the domain's ([`crate::domain::bake`]), which node-image
//! builds run too; this is the command's entry point and report.

pub use crate::domain::bake::{build_rootfs, BuildReport, BuildSpec, Unpinned};
