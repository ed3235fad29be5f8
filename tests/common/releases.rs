//! Release sets for the suites that ship node images from one version to
//! the next (`deltas`, `fresh_runner`): a patch release's component images
//! and the manifest naming them.

use std::collections::BTreeMap;

use super::Env;
use kiln_testkit::image::{host_platform, BuiltImage, Format, ImageDef, ImageSet, LayerDef};

pub const MIB: u64 = 1 << 20;

/// A patch release's images: etcd and pause unchanged, the two kube-*
/// images on the same base with a new binary layer (as real patch
/// releases are), 2 MiB incompressible layers.
pub fn release_set(kube: &str, seed: u64) -> ImageSet {
    with_etcd(kube, seed, ("3.5.16-0", 32))
}

/// Two patch releases, v1.31.2 and v1.31.3, and the kind base, in the
/// suite's registry: the images of each.
pub fn seed_two_releases(env: &Env) -> (Vec<BuiltImage>, Vec<BuiltImage>) {
    let v1 = env
        .registry
        .seed(&release_set("v1.31.2", 41))
        .expect("seed v1");
    let v2 = env
        .registry
        .seed(&release_set("v1.31.3", 42))
        .expect("seed v2");
    env.registry
        .push(&kiln_testkit::base::kind_base(&[&host_platform()]))
        .expect("base");
    (v1, v2)
}

/// [`release_set`] with etcd at `etcd` (tag, its binary layer's seed).
pub fn with_etcd(kube: &str, seed: u64, etcd: (&str, u64)) -> ImageSet {
    let random = |seed| LayerDef {
        files: BTreeMap::new(),
        random_bytes: 2 * MIB,
        seed,
    };
    let image = |repo: &str, tag: &str, layers: &[&str]| ImageDef {
        repo: repo.into(),
        tag: tag.into(),
        format: Format::Oci,
        platforms: vec![host_platform()],
        attestations: false,
        layers: layers.iter().map(|l| l.to_string()).collect(),
        runnable: false,
    };
    ImageSet {
        layers: BTreeMap::from([
            ("base".to_string(), random(31)),
            (format!("etcd-{}", etcd.0), random(etcd.1)),
            (format!("apiserver-{kube}"), random(seed)),
            (format!("proxy-{kube}"), random(seed + 100)),
        ]),
        images: vec![
            image("delta/pause", "3.10", &[]),
            image("delta/etcd", etcd.0, &["base", &format!("etcd-{}", etcd.0)]),
            image(
                "delta/kube-apiserver",
                kube,
                &["base", &format!("apiserver-{kube}")],
            ),
            image(
                "delta/kube-proxy",
                kube,
                &["base", &format!("proxy-{kube}")],
            ),
        ],
    }
}

pub fn manifest(env: &Env, kube: &str) -> std::path::PathBuf {
    manifest_with(env, kube, "3.5.16-0")
}

pub fn manifest_with(env: &Env, kube: &str, etcd: &str) -> std::path::PathBuf {
    env.write(
        &format!("node-{kube}-{etcd}.yaml"),
        &format!(
            "apiVersion: kiln/v1\nkind: NodeImageManifest\nkubernetesVersion: {kube}\nsandboxImage: registry.k8s.io/delta/pause:3.10\nimages:\n  - registry.k8s.io/delta/pause:3.10\n  - registry.k8s.io/delta/etcd:{etcd}\n  - registry.k8s.io/delta/kube-apiserver:{kube}\n  - registry.k8s.io/delta/kube-proxy:{kube}\n"
        ),
    )
}

/// Every blob of the images, by digest, with its size.
pub fn blobs(images: &[BuiltImage]) -> BTreeMap<String, u64> {
    images
        .iter()
        .flat_map(|i| i.blobs())
        .map(|b| (b.digest.clone(), b.bytes.len() as u64))
        .collect()
}
