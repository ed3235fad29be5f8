//! Row (c), the kind way of filling a node's store: each image pulled by
//! one containerd, exported to an archive, imported `--no-unpack` into the
//! node's containerd and labelled pinned, one after another.

use std::path::Path;
use std::time::Instant;

use kiln_testkit::tools;

use crate::ctr;
use crate::floors::settle;

/// The seconds the kind way takes for `refs`, from fresh roots under `work`.
pub async fn kind_way(work: &Path, refs: &[String], platform: &str) -> f64 {
    let scratch = work.join("kind-pull");
    let target = work.join("kind-node");
    let archives = work.join("archives");
    std::fs::create_dir_all(&archives).unwrap();
    let pull =
        kiln::adapters::daemon::Daemon::start(&tools::containerd(), &scratch, &Default::default())
            .await
            .unwrap();
    let node =
        kiln::adapters::daemon::Daemon::start(&tools::containerd(), &target, &Default::default())
            .await
            .unwrap();
    settle();
    let t = Instant::now();
    for (i, r) in refs.iter().enumerate() {
        let tar = archives.join(format!("{i}.tar"));
        ctr(
            &pull.socket,
            &[
                "content",
                "fetch",
                "--plain-http",
                "--platform",
                platform,
                r,
            ],
        );
        ctr(
            &pull.socket,
            &[
                "images",
                "export",
                "--platform",
                platform,
                tar.to_str().unwrap(),
                r,
            ],
        );
        ctr(
            &node.socket,
            &[
                "images",
                "import",
                "--no-unpack",
                "--platform",
                platform,
                tar.to_str().unwrap(),
            ],
        );
        ctr(
            &node.socket,
            &["images", "label", r, "io.cri-containerd.pinned=pinned"],
        );
    }
    let took = t.elapsed().as_secs_f64();
    pull.stop().unwrap();
    node.stop().unwrap();
    for p in [&scratch, &target, &archives] {
        std::fs::remove_dir_all(p).unwrap();
    }
    took
}
