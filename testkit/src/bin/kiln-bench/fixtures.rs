//! The bench's images beyond its set (`images/bench.yaml`): (g)'s next
//! version, the node image's ~300 MiB kind-style base, and (i)'s crowded base.

use kiln_testkit::image::BuiltImage;
use kiln_testkit::tools;

/// (g)'s image: the apiserver of the next version, sharing the 64 MiB
/// layer and bringing a new 32 MiB one.
pub fn next_apiserver(built: &[BuiltImage], platform: &str) -> BuiltImage {
    let api = built
        .iter()
        .find(|i| i.repo == "bench/apiserver")
        .expect("the set has bench/apiserver");
    let fresh = kiln_testkit::image::Layer::build(
        &kiln_testkit::image::LayerDef {
            files: Default::default(),
            random_bytes: 32 << 20,
            seed: 17,
        },
        kiln_testkit::image::OCI_LAYER_GZIP,
    );
    let shared = api.platforms[0].layers[0].clone();
    kiln_testkit::base::image_of("bench/apiserver", "2", &[platform], vec![shared, fresh])
}

/// A kind-style base of about 300 MiB: containerd and its config, and a
/// 256 MiB incompressible layer standing in for the rest of the OS.
pub fn bench_base(platform: &str) -> BuiltImage {
    // A kind-style base of about 300 MiB: containerd and its config, and a
    // 256 MiB incompressible layer standing in for the rest of the OS.
    let base = kiln_testkit::base::kind_base_custom(
        &tools::containerd(),
        &[platform],
        kiln_testkit::base::BASE_CONFIG_TOML,
        true,
    );
    let os = kiln_testkit::image::Layer::build(
        &kiln_testkit::image::LayerDef {
            files: Default::default(),
            random_bytes: 256 << 20,
            seed: 21,
        },
        kiln_testkit::image::OCI_LAYER_GZIP,
    );
    // /kind/version: a kindest/node-like base (kiln refuses a kind base
    // with no Kubernetes; the bench measures baking, not a release).
    let version = kiln_testkit::base::kind_version_layer("v1.31.2");
    let layers: Vec<_> = base.platforms[0]
        .layers
        .iter()
        .cloned()
        .chain([os, version])
        .collect();
    kiln_testkit::base::image_of("bench/base", "1", &[platform], layers)
}

/// (i)'s base: the same plus a layer of 100,000 empty files under the
/// store, the shape of a hostile base (or of a store with many blobs).
pub fn crowded_base(base: &BuiltImage, platform: &str) -> BuiltImage {
    let mut names = vec![
        "var/lib/containerd/".to_string(),
        "var/lib/containerd/crowd/".into(),
    ];
    for d in 0..100 {
        names.push(format!("var/lib/containerd/crowd/{d:03}/"));
        names.extend((0..1000).map(|f| format!("var/lib/containerd/crowd/{d:03}/{f:04}")));
    }
    let entries: Vec<kiln_testkit::base::Entry> = names
        .iter()
        .map(|n| {
            let kind = if n.ends_with('/') {
                tar::EntryType::Directory
            } else {
                tar::EntryType::Regular
            };
            (n.as_str(), kind, &b""[..], "", 0o644)
        })
        .collect();
    let mut layers = base.platforms[0].layers.clone();
    layers.push(kiln_testkit::base::layer_of(&entries));
    kiln_testkit::base::image_of("bench/crowded", "1", &[platform], layers)
}
