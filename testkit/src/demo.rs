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

/// What the registry serves, and the release beside it.
pub struct Demo<'a> {
    /// Image sets to push (`images/demo.yaml`).
    pub images: Vec<&'a Path>,
    /// A plain base (containerd and its config, no kind entrypoint) as REPO:TAG.
    pub base: Option<&'a str>,
    /// A kindest/base-style base (kind's entrypoint too) as REPO:TAG, for
    /// linux/amd64 and linux/arm64.
    pub kind_base: Option<&'a str>,
    /// A directory to write the stand-in release into
    /// (`kubernetes-server-linux-ARCH.tar.gz` and its `.sha512`, amd64 and arm64).
    pub release: Option<&'a Path>,
}

impl<'a> Demo<'a> {
    /// The demo: the image set `images` (`images/demo.yaml`), the base `kiln/base:demo`,
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
        let base_of = |kind| {
            crate::base::kind_base_custom(
                &crate::tools::containerd(),
                &[&host],
                crate::base::BASE_CONFIG_TOML,
                kind,
            )
        };
        if let Some(name) = self.base {
            let mut base = base_of(false);
            (base.repo, base.tag) = split(name);
            registry.push(&base)?;
            n += 1;
        }
        // The kind base for this machine's platform and the other one
        // (amd64 and arm64), each with its own platform's containerd.
        if let Some(name) = self.kind_base {
            let (repo, tag) = split(name);
            let both = crate::base::index_of(
                &repo,
                &tag,
                vec![base_of(true), crate::base::foreign_kind_base()],
            );
            registry.push(&both)?;
            n += 1;
        }
        if let Some(dir) = self.release {
            std::fs::create_dir_all(dir)?;
            let (other, _) = crate::tools::other_platform();
            for platform in [host.as_str(), other.as_str()] {
                let arch = platform.rsplit('/').next().unwrap_or("amd64");
                crate::release::release_tarball_of(
                    dir,
                    arch,
                    &crate::release::runnable_release_files(KUBERNETES, arch),
                );
            }
        }
        Ok(n)
    }
}

/// REPO:TAG as (repo, tag).
fn split(name: &str) -> (String, String) {
    let (repo, tag) = name.rsplit_once(':').unwrap_or((name, "latest"));
    (repo.to_string(), tag.to_string())
}
