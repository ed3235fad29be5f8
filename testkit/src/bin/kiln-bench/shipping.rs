//! `make bench` (k) to (o): the next version shipped, bytes counted where
//! they arrive (the registry's door), by kiln's pushes and bundles and by
//! every consumer that pulls: containerd, skopeo, Docker (both stores).

use std::path::Path;
use std::process::Command;

use kiln_testkit::docker::{Dockerd, Store};
use kiln_testkit::registry::Registry;
use kiln_testkit::tools;

use super::{ctr, kiln_bin, run};

/// (k) the next version's node image pushed after the previous one, and a
/// no-op push; (l) it pulled after the previous one by containerd's `ctr
/// content fetch` and by `skopeo copy` into one OCI layout. Bytes counted
/// at the registry's door (a proxy in front of it), not from kiln's report;
/// they do not vary between runs, so this is measured once.
pub fn shipping(
    registry: &Registry,
    work: &Path,
    (manifest, manifest_next): (&Path, &Path),
    deps_path: &str,
    changed: u64,
) -> anyhow::Result<String> {
    let proxy = kiln_testkit::proxy::counting_proxy(registry.url());
    let front = proxy.addr();
    let reg = &registry.addr;
    // The next version follows the first (`--previous`), as a release
    // pipeline's does.
    let push = |m: &Path, tag: &str| -> anyhow::Result<serde_json::Value> {
        let mut cmd = Command::new(kiln_bin());
        cmd.args([
            "build",
            "--json",
            "--no-cache",
            "--manifest",
            m.to_str().unwrap(),
            "--base",
            &format!("{front}/bench/base:1"),
            "--mirror",
            &format!("bench.local=http://{reg}"),
            "--push",
            &format!("{front}/bench/node:{tag}"),
        ]);
        if tag != "1" {
            cmd.args(["--previous", &format!("{front}/bench/node:1")]);
        }
        let out = run(cmd.env("PATH", deps_path));
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let uploaded = kiln_testkit::proxy::blob_bytes_uploaded;
    let pulled = kiln_testkit::proxy::blob_bytes_pulled;
    eprintln!("bench: (k) pushing two node versions through a counting proxy...");
    let first = push(manifest, "1")?;
    let first_bytes = uploaded(&proxy.take());
    let image_bytes: u64 = first["kilnLayers"]
        .as_array()
        .map(|ls| ls.iter().filter_map(|l| l["size"].as_u64()).sum())
        .unwrap_or(0);
    let layers = first["kilnLayers"].as_array().map_or(0, |l| l.len());
    let next_report = push(manifest_next, "2")?;
    let log = proxy.take();
    let k = uploaded(&log);
    // What kiln read of the previous image to build the next one: its
    // documents and the layers it kept in place (`--previous`).
    let k_read = pulled(
        &log.into_iter()
            .filter(|c| c.target.starts_with("/v2/bench/node/"))
            .collect::<Vec<_>>(),
    );
    push(manifest_next, "2")?;
    let noop = uploaded(&proxy.take());
    // (l) ctr into one containerd, then skopeo into one layout.
    let rt = tokio::runtime::Runtime::new()?;
    let root = work.join("l-ctr");
    let (ctr_first, ctr_next) = rt.block_on(async {
        let d =
            kiln::adapters::daemon::Daemon::start(&tools::containerd(), &root, &Default::default())
                .await
                .unwrap();
        let fetch = |tag: &str| {
            ctr(
                &d.socket,
                &[
                    "content",
                    "fetch",
                    "--plain-http",
                    &format!("{front}/bench/node:{tag}"),
                ],
            )
        };
        fetch("1");
        let first = pulled(&proxy.take());
        fetch("2");
        let next = pulled(&proxy.take());
        d.stop().unwrap();
        (first, next)
    });
    let _ = std::fs::remove_dir_all(&root);
    let layout = work.join("l-skopeo");
    let copy = |tag: &str| {
        run(tools::skopeo().args([
            "--insecure-policy",
            "copy",
            "--src-tls-verify=false",
            &format!("docker://{front}/bench/node:{tag}"),
            &format!("oci:{}:{tag}", layout.display()),
        ]));
    };
    copy("1");
    let skopeo_first = pulled(&proxy.take());
    copy("2");
    let skopeo_next = pulled(&proxy.take());
    let _ = std::fs::remove_dir_all(&layout);
    // A first pull of the next version: what the layers it keeps cost.
    copy("2");
    let skopeo_fresh = pulled(&proxy.take());
    let _ = std::fs::remove_dir_all(&layout);
    // (m) the next version's bundle, full and --since the first one's.
    eprintln!("bench: (m) bundles...");
    let bundle = |m: &Path, out: &Path, since: Option<&Path>| {
        let mut args = vec![
            "bundle".to_string(),
            "--no-cache".into(),
            "--manifest".into(),
            m.display().to_string(),
            "--output".into(),
            out.display().to_string(),
            "--mirror".into(),
            format!("bench.local=http://{reg}"),
        ];
        if let Some(s) = since {
            args.extend(["--since".into(), s.display().to_string()]);
        }
        run(Command::new(kiln_bin()).args(&args).env("PATH", deps_path));
        std::fs::metadata(out).map(|m| m.len()).unwrap_or(0)
    };
    let (first_bundle, next_full, next_diff) = (
        work.join("m-1.tar"),
        work.join("m-2.tar"),
        work.join("m-2-since-1.tar"),
    );
    bundle(manifest, &first_bundle, None);
    let full = bundle(manifest_next, &next_full, None);
    let diff = bundle(manifest_next, &next_diff, Some(&first_bundle));
    for p in [&first_bundle, &next_full, &next_diff] {
        let _ = std::fs::remove_file(p);
    }
    // (n) Docker, as kind's users pull, with each image store.
    eprintln!("bench: (n) docker pull, both stores...");
    let mut docker = Vec::new();
    for store in [Store::Classic, Store::Containerd] {
        let d = Dockerd::start(store, &[&front])?;
        d.run(&["pull", &format!("{front}/bench/node:1")]);
        let first = pulled(&proxy.take());
        d.run(&["pull", &format!("{front}/bench/node:2")]);
        docker.push((store, first, pulled(&proxy.take())));
    }
    // (o) containerd's unpacker: snapshots made for the next version.
    eprintln!("bench: (o) ctr images pull (unpacked)...");
    let root = work.join("o-ctr");
    let made = rt.block_on(async {
        let d =
            kiln::adapters::daemon::Daemon::start(&tools::containerd(), &root, &Default::default())
                .await
                .unwrap();
        let snapshots = || {
            let out = ctr(&d.socket, &["snapshots", "--snapshotter", "native", "ls"]);
            String::from_utf8_lossy(&out.stdout).lines().skip(1).count()
        };
        let pull = |tag: &str| {
            ctr(
                &d.socket,
                &[
                    "images",
                    "pull",
                    "--plain-http",
                    "--snapshotter",
                    "native",
                    &format!("{front}/bench/node:{tag}"),
                ],
            )
        };
        pull("1");
        let before = snapshots();
        pull("2");
        let made = snapshots() - before;
        d.stop().unwrap();
        made
    });
    let _ = std::fs::remove_dir_all(&root);
    let digests = |r: &serde_json::Value| -> Vec<String> {
        r["kilnLayers"]
            .as_array()
            .map(|ls| {
                ls.iter()
                    .filter_map(|l| l["digest"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (first_layers, next_layers) = (digests(&first), digests(&next_report));
    let kept: Vec<u64> = next_report["kilnLayers"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .filter(|l| {
                    l["holds"]
                        .as_str()
                        .is_some_and(|h| h.starts_with("kiln: kept from the previous"))
                })
                .filter_map(|l| l["size"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    let fresh = next_layers
        .iter()
        .filter(|d| !first_layers.contains(d))
        .count();
    let m = |b: u64| b as f64 / (1 << 20) as f64;
    let target = 1.05 * m(changed) + 2.0;
    let docker_rows: String = docker
        .iter()
        .map(|(store, first, next)| {
            format!(
                "| (n) docker pull ({} store), bytes pulled | {:.1} MiB | {:.1} MiB | {:.2} |\n",
                match store {
                    Store::Classic => "classic",
                    Store::Containerd => "containerd",
                },
                m(*first),
                m(*next),
                *next as f64 / changed as f64
            )
        })
        .collect();
    Ok(format!(
        "\nShipping the next version (the same two node images as (e) and (g), kiln's part in {layers} layers, {:.1} MiB; bytes counted at the registry by a proxy in front of it; target ≤ 1.05 × changed + 2 MiB = {target:.1} MiB):\n\n| run | first version | next version | next / changed ({:.1} MiB) |\n|---|---|---|---|\n| (k) kiln build --push, bytes uploaded | {:.1} MiB | {:.1} MiB | {:.2} |\n| (k) the next version pushed again (no-op) | | {:.1} MiB | |\n| (k) the previous image read by the next version's build (its documents; the {} layers it kept in place, {:.1} MiB) | | {:.1} MiB | |\n| (l) ctr content fetch into one containerd, bytes pulled | {:.1} MiB | {:.1} MiB | {:.2} |\n| (l) skopeo copy into one OCI layout, bytes pulled | {:.1} MiB | {:.1} MiB | {:.2} |\n| (l) skopeo copy of the next version into an empty layout (a first pull) | | {:.1} MiB | |\n| (m) kiln bundle of the next version: full / --since the first | {:.1} MiB | {:.1} MiB | {:.2} |\n{}| (o) ctr images pull (unpacked): snapshots made for the next version / its new layers | | {made} / {fresh} | |\n",
        m(image_bytes),
        m(changed),
        m(first_bytes),
        m(k),
        k as f64 / changed as f64,
        m(noop),
        kept.len(),
        m(kept.iter().sum()),
        m(k_read),
        m(ctr_first),
        m(ctr_next),
        ctr_next as f64 / changed as f64,
        m(skopeo_first),
        m(skopeo_next),
        skopeo_next as f64 / changed as f64,
        m(skopeo_fresh),
        m(full),
        m(diff),
        diff as f64 / changed as f64,
        docker_rows,
    ))
}
