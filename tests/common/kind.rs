//! kind clusters in the suites that load into them (`kind_docker`,
//! `kind_podman`): the user images, kiln's node image, and each node's
//! view through its CRI and `ctr`.

use std::collections::BTreeMap;

use super::*;
use kiln_testkit::image::{host_platform, Format, ImageDef, ImageSet, LayerDef};
use kiln_testkit::kind::{docker_node_base, Cluster};

pub const CLUSTER: &str = "kiln-test";
pub const BUNDLED: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/etcd:3.5.16-0",
    "registry.k8s.io/coredns/coredns:v1.11.3",
];

/// A multi-platform image with attestation entries, as `docker buildx`
/// pushes them: what kind #3795 fails on under the containerd store.
pub fn user_images() -> ImageSet {
    let def = |repo: &str| ImageDef {
        repo: repo.into(),
        tag: "1.0".into(),
        format: Format::OciIndex,
        platforms: vec![host_platform(), kiln_testkit::tools::other_platform().0],
        attestations: true,
        layers: vec![format!("{repo}-layer")],
        runnable: false,
    };
    let layer = |seed| LayerDef {
        files: BTreeMap::new(),
        random_bytes: 1 << 20,
        seed,
    };
    ImageSet {
        layers: BTreeMap::from([
            ("app/web-layer".to_string(), layer(461)),
            ("app/api-layer".to_string(), layer(462)),
        ]),
        images: vec![def("app/web"), def("app/api")],
    }
}

/// The images CRI lists in `node`: name -> pinned.
pub fn cri_view(cluster: &Cluster, node: &str) -> BTreeMap<String, bool> {
    let socket = cluster.socket(node);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let images = rt
        .block_on(kiln_testkit::cri::images_at(&socket))
        .unwrap_or_else(|e| panic!("CRI in {node}: {e:#}"));
    images
        .into_iter()
        .flat_map(|i| {
            let pinned = i.pinned;
            i.repo_tags.into_iter().map(move |t| (t, pinned))
        })
        .collect()
}

/// `ctr images ls` in `node`: name -> its LABELS column.
pub fn ctr_view(cluster: &Cluster, node: &str) -> BTreeMap<String, String> {
    cluster
        .exec(node, &["ctr", "--namespace=k8s.io", "images", "ls"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() > 4).then(|| (t[0].to_string(), t[t.len() - 1].to_string()))
        })
        .collect()
}

/// Every bundled image pinned, and `loaded` there, managed and unpinned,
/// in every node, as CRI and ctr see them.
pub fn assert_nodes_hold(cluster: &Cluster, loaded: &[&str]) {
    for node in &cluster.nodes {
        let cri = cri_view(cluster, node);
        for b in BUNDLED {
            assert_eq!(cri.get(*b), Some(&true), "{node}: {b} not pinned: {cri:?}");
        }
        let ctr = ctr_view(cluster, node);
        for l in loaded {
            assert_eq!(
                cri.get(*l),
                Some(&false),
                "{node}: {l} not there unpinned: {cri:?}"
            );
            let labels = &ctr[*l];
            assert!(
                labels.contains("io.cri-containerd.image=managed"),
                "{node}: {l}: {labels}"
            );
            assert!(!labels.contains("pinned"), "{node}: {l}: {labels}");
        }
    }
}

/// kiln's node image of [`BUNDLED`], built on the node base and pushed to
/// `env`'s registry, with the user images seeded: (registry, image).
pub fn node_image(env: &Env) -> (String, String) {
    env.registry.seed(&user_images()).expect("seed");
    env.registry
        .push(&docker_node_base(&host_platform()))
        .expect("base");
    let addr = env.registry.url().trim_start_matches("http://").to_string();
    let m = env.manifest("node.yaml", BUNDLED[0], BUNDLED);
    let node_image = format!("{addr}/kiln/node:v1.31.2");
    let base = format!("{addr}/kiln/docker-node-base:test");
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        &base,
        "--mirror",
        &env.mirror(),
        "--push",
        &node_image,
    ]);
    assert_ok(&o);
    (addr, node_image)
}
