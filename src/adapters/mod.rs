//! Adapters to the programs and formats kiln talks to: the registry client
//! (HTTP, auth, mirrors), the private containerd daemon, the bbolt reader,
//! the store lock, and where a rootfs keeps its containerd. They know no
//! image copy and no node image.

pub mod bolt;
pub mod daemon;
pub mod kubeadm;
pub mod node_provider;
pub mod registry;
pub mod rootfs;
pub mod storelock;
pub mod version;
