//! Test and demo harness for kiln. Everything here is real: a real
//! distribution registry on loopback, real containerd daemons, CRI v1 over
//! gRPC. The images are built here, so no outside registry is needed.

pub mod archive;
pub mod base;
pub mod cluster;
pub mod crafted;
pub mod cri;
pub mod demo;
pub mod docker;
pub mod http;
pub mod image;
pub mod kind;
pub mod kubelet;
pub mod layer_oracle;
pub mod podman;
pub mod proxy;
pub mod registry;
pub mod release;
pub mod sigstore;
pub mod tls;
pub mod tools;
pub mod unpacked;
