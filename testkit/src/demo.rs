//! What the demo registry serves, written once: `kiln-testkit registry`
//! (so `make demo` and `make demo-registry`) and the tests that run the
//! docs' examples (tests/docs.rs) start the same registry, so an example
//! that runs in the tests runs as written in a user's demo shell.

use std::path::Path;

use crate::image::{host_platform, ImageSet};
use crate::registry::Registry;

/// The Kubernetes version of the demo's stand-in release
/// (`images/demo.yaml`'s kube-* tags, `manifests/demo.yaml`'s version).
pub const KUBERNETES: &str = "v1.31.2";

/// What to put in place besides the registry's images.
#[derive(Default)]
pub struct Demo<'a> {
    /// Image sets to push (`images/demo.yaml`).
    pub images: Vec<&'a Path>,
    /// A plain base (containerd and its config, no kind entrypoint) as REPO:TAG.
    pub base: Option<&'a str>,
    /// A kindest/base-style base (kind's entrypoint too) as REPO:TAG.
    pub kind_base: Option<&'a str>,
    /// A directory to write the stand-in release into
    /// (`kubernetes-server-linux-ARCH.tar.gz` and its `.sha512`, this host's ARCH).
    pub release: Option<&'a Path>,
}

impl<'a> Demo<'a> {
    /// The demo: `images/demo.yaml` under `root`, the base `kiln/base:demo`,
    /// the kind base `kindest/base:demo`, the release in `release`
    /// (`kiln-testkit registry --demo` writes it to `out/release`).
    pub fn standard(images: &'a Path, release: &'a Path) -> Demo<'a> {
        Demo {
            images: vec![images],
            base: Some("kiln/base:demo"),
            kind_base: Some("kindest/base:demo"),
            release: Some(release),
        }
    }

    /// Seeds `registry` and writes the release; returns how many images it pushed.
    pub fn seed(&self, registry: &Registry) -> anyhow::Result<usize> {
        let mut n = 0;
        for file in &self.images {
            n += registry.seed(&ImageSet::load(file)?)?.len();
        }
        let host = host_platform();
        let bases = [(self.base, false), (self.kind_base, true)];
        for (name, kind) in bases {
            let Some(name) = name else { continue };
            let (repo, tag) = name.rsplit_once(':').unwrap_or((name, "latest"));
            let mut base = crate::base::kind_base_custom(
                &crate::tools::containerd(),
                &[&host],
                crate::base::BASE_CONFIG_TOML,
                kind,
            );
            base.repo = repo.to_string();
            base.tag = tag.to_string();
            registry.push(&base)?;
            n += 1;
        }
        if let Some(dir) = self.release {
            std::fs::create_dir_all(dir)?;
            let arch = host.rsplit('/').next().unwrap_or("amd64");
            crate::release::release_tarball(dir, KUBERNETES, arch);
        }
        Ok(n)
    }
}
