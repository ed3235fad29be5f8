//! `make bench` (j): `kiln verify` of a node image for the platform that is
//! not this machine's, under qemu user-mode emulation and without it.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kiln_testkit::image::host_platform;
use kiln_testkit::registry::Registry;
use kiln_testkit::tools;

use super::{kiln_bin, median, run};

/// (j) `kiln verify` of a node image for the platform that is not this
/// machine's: the node's own containerd under qemu user-mode emulation,
/// against the same verify without emulation (the CRI checks not run).
pub fn emulated_verify(
    pusher: &Registry,
    work: &Path,
    deps_path: &str,
    runs: usize,
) -> anyhow::Result<String> {
    let reg = &pusher.addr;
    use kiln_testkit::base::{foreign_kind_base, image_of, kind_version_layer};
    let (other, arch) = tools::other_platform();
    let registry_base = foreign_kind_base();
    let version = kind_version_layer("v1.31.2");
    let mut layers = registry_base.platforms[0].layers.clone();
    layers.push(version);
    let base = image_of("bench/foreign", "1", &[&other], layers);
    pusher.push(&base)?;
    let names = ["pause", "etcd", "coredns", "apiserver"];
    for n in names {
        let layer = kiln_testkit::image::Layer::build(
            &kiln_testkit::image::LayerDef {
                files: Default::default(),
                random_bytes: 4 << 20,
                seed: n.len() as u64,
            },
            kiln_testkit::image::OCI_LAYER_GZIP,
        );
        pusher.push(&image_of(
            &format!("bench/{arch}-{n}"),
            "1",
            &[&other],
            vec![layer],
        ))?;
    }
    let manifest = work.join("foreign.yaml");
    let mut text = format!(
        "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: bench.local/bench/{arch}-pause:1\nimages:\n"
    );
    for n in names {
        text.push_str(&format!("  - bench.local/bench/{arch}-{n}:1\n"));
    }
    std::fs::write(&manifest, text)?;
    let archive = work.join("foreign.tar");
    run(Command::new(kiln_bin())
        .args(["build", "--manifest"])
        .arg(&manifest)
        .args([
            "--base",
            &format!("{reg}/bench/foreign:1"),
            "--platform",
            &other,
        ])
        .args(["--mirror", &format!("bench.local=http://{reg}"), "--output"])
        .arg(format!("oci-archive:{}", archive.display()))
        .env("PATH", deps_path));
    let (qemu_name, qemu) = tools::qemu(&other);
    let image = format!("oci-archive:{}", archive.display());
    let (mut with, mut without) = (vec![], vec![]);
    for _ in 0..runs {
        let t = Instant::now();
        run(Command::new(kiln_bin())
            .args([
                "verify",
                "--image",
                &image,
                "--platform",
                &other,
                "--trust-node-binaries",
                "--qemu",
            ])
            .arg(&qemu)
            .env("PATH", deps_path));
        with.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let o = Command::new(kiln_bin())
            .args(["verify", "--image", &image, "--platform", &other])
            .env("PATH", deps_path)
            .output()?;
        anyhow::ensure!(
            o.status.code() == Some(3),
            "verify without emulation: {o:?}"
        );
        without.push(t.elapsed().as_secs_f64());
    }
    let size = std::fs::metadata(&archive)?.len() as f64 / (1 << 20) as f64;
    Ok(format!(
        "\n(j) kiln verify of a {other} node image ({size:.0} MiB, 4 images) on this {} machine: {:.2} s with the node's containerd under {qemu_name} (every check run); {:.2} s without emulation (CRI checks not run, exit 3).\n",
        host_platform(),
        median(with),
        median(without)
    ))
}
