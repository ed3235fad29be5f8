//! kiln bakes Kubernetes node images: it copies a manifest's component
//! images from registries into a rootfs's containerd store, labelled so that
//! kubelet's image GC never removes them.
//!
//! The pieces: [`source`] (where images come from), [`sink`] (where they
//! go), and the one [`copy`] engine between them; [`daemon`] runs the
//! private containerd that writes a store; [`cli`] is the command line.

/// `println!` that never panics: a closed stdout ends kiln quietly.
macro_rules! out {
    ($($t:tt)*) => { $crate::text::write_line(true, format_args!($($t)*)) };
}
/// `eprintln!` that never panics: a closed stderr ends kiln quietly.
macro_rules! say {
    ($($t:tt)*) => { $crate::text::write_line(false, format_args!($($t)*)) };
}

pub mod bolt;
pub mod cli;
pub mod closure;
pub mod copy;
pub mod credentials;
pub mod daemon;
pub mod digest;
pub mod epoch;
pub mod error;
pub mod fault;
pub mod gzip;
pub mod hosts;
pub mod inroot;
pub mod inspect;
pub mod interrupt;
pub mod kind;
pub mod kubeadm;
pub mod kubernetes;
pub mod layout;
pub mod manifest;
pub mod node_config;
pub mod node_image;
pub mod oci;
pub mod ops;
pub mod platform;
pub mod progress;
pub mod reference;
pub mod registry;
pub mod rootfs;
pub mod sink;
pub mod source;
pub mod stall;
pub mod store;
pub mod storelock;
pub mod text;
pub mod unpack;
pub mod version;
