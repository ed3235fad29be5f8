//! Every integration suite, one module each, in one test binary: one
//! compile of `common` and one link instead of one per suite (on CI's two
//! cores, 29 links of the whole dependency tree were minutes of `make
//! test`). nextest still runs each test in its own process, so a suite's
//! daemons, environment and umask stay its own. One suite:
//! `cargo nextest run -E 'test(/^deltas::/)'` or `cargo test --test suites deltas::`.

mod common;

mod airgap;
mod answers;
mod build;
mod cache;
mod crash;
mod deltas;
mod docs;
mod elf_version;
mod faults;
mod fresh_runner;
mod hostile;
mod hostile_nodes;
mod install;
mod kind_cluster;
mod kind_docker;
mod kind_podman;
mod kubelet;
mod kubelet_gc;
mod kubernetes;
mod layer_oracle;
mod layers;
mod load;
mod lockfile;
mod manifests;
mod newcomer;
mod node_image;
mod parser_props;
mod pins;
mod previous;
mod registries;
mod reproducible;
mod resolver_props;
mod sbom;
mod shared_machine;
mod signals;
mod signatures;
mod verify;
