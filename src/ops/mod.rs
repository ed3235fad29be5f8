//! What kiln does, as library calls that return typed reports. `cli/`
//! parses flags into these calls and renders the reports (text or JSON),
//! the way cargo's commands call `cargo::ops`.

pub mod build;
pub mod bundle;
pub mod cache;
pub mod check;
pub mod doctor;
pub mod index;
pub mod load;
pub mod load_cluster;
pub mod lock;
pub mod node_image;
pub mod start;
pub(crate) mod unpack;
pub mod verify;
