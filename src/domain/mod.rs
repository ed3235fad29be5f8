//! What kiln knows of Kubernetes nodes: the manifest, the node store and how
//! a manifest is baked into it, node images, kind's contract, Kubernetes
//! releases and kubeadm's image set, the node's containerd config, what the kubelet keeps and reads of images.

pub mod bake;
pub mod inspect;
pub mod kind;
pub mod kube_version;
pub mod kubeadm;
pub mod kubelet;
pub mod kubernetes;
pub mod lockfile;
pub mod manifest;
pub mod node_config;
pub mod node_image;
pub mod provenance;
pub mod sbom;
pub mod signatures;
pub mod store;
