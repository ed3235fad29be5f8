//! `make bench`: kiln against the tools users would otherwise use, side by
//! side in one run, on a generated image set of about 1 GiB served by a
//! loopback registry:
//!   (a) kiln build into a fresh rootfs (and a no-op re-run; and into
//!       another fresh rootfs, the cache warm, the first rootfs kept, then
//!       deleted: a deleted link moves a lent entry's ctime, so it is re-read);
//!   (b) containerd's own `ctr content fetch --label …` per image into a fresh
//!       root: the fetch-only floor of `ctr images pull --label`;
//!   (c) the kind way: each image pulled, exported to an archive, then
//!       `ctr images import --no-unpack` and labelled pinned;
//!   (d) the physical floor: every blob read once over parallel HTTP and hashed;
//!   (e) `kiln build --base` of a ~300 MiB kind-style base plus the set into an
//!       `oci-archive:` (gzip, and zstd), with its phases and its floor (the
//!       base's and the set's blobs read once, the archive written once);
//!   (f) the same node image built again, its cache warm;
//!   (g) a node image of the next version (one image changed: the shared
//!       64 MiB layer and a new 32 MiB one), the cache warm from (e);
//!   (h) (e) with `--no-cache`; with `KILN_BASELINE=/path/to/kiln`, (e),
//!       (f), (g) and the warm (a) rows by that other kiln (`baseline.rs`);
//!   (k) (e)'s and (g)'s node images pushed one after the other, bytes
//!       uploaded counted at the registry (a proxy in front of it), and a
//!       no-op push; (l) both pulled one after the other by `ctr content
//!       fetch` and by `skopeo copy` into one layout, bytes pulled counted
//!       the same way; (m) the next version's bundle, full and `--since`
//!       the first version's; (n) both pulled one after the other by
//!       Docker 28, with its classic store and its containerd store, bytes
//!       counted the same way; (o) both pulled and unpacked by containerd
//!       (`ctr images pull`), the snapshots made for the next version
//!       against its new layers;
//!   (p) an image loaded into a running two-node kind cluster on Docker,
//!       `kiln load --kind-cluster` beside the kind way (`kind_load.rs`);
//!   (q) the next version on a fresh runner (empty cache and HOME)
//!       following the first, signed, by digest, bytes fetched and pushed
//!       counted at the registry's door, beside a warm runner, the unsigned
//!       path and the floor (`fresh.rs`; `BENCH_ONLY=q` runs it alone);
//!   (r) a real Kubernetes v1.35.4 node image built by kiln beside its
//!       floor, and `kind create cluster` on it to Ready (`cluster.rs`;
//!       as root; `BENCH_ONLY=r` runs it alone).
//! Each cached row names its cache directory (a fresh one for a cold run);
//! every other kiln run uses a cache of the bench's own (`KILN_CACHE_DIR`),
//! never the user's.
//! Prints times, throughput, ratios and kiln's peak RSS; writes out/bench.md.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kiln_testkit::image::{host_platform, ImageSet};
use kiln_testkit::registry::Registry;
use kiln_testkit::tools;

mod baseline;
mod cluster;
mod emulated;
mod fixtures;
mod floors;
mod fresh;
mod kind_load;
mod kind_way;
mod shipping;
use emulated::emulated_verify;
use floors::{floor, settle, write_once};
use kind_load::kind_load;
use kind_way::kind_way;
use shipping::shipping;

fn kiln_bin() -> PathBuf {
    std::env::var_os("KILN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_exe().unwrap().with_file_name("kiln"))
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One timed run of a kiln (`bin`) with `args` and `PATH` = `path`, after
/// `settle`: the seconds it took and what it printed.
fn timed(bin: &Path, args: &[String], path: &str) -> (f64, std::process::Output) {
    settle();
    let t = Instant::now();
    let out = run(Command::new(bin).args(args).env("PATH", path));
    (t.elapsed().as_secs_f64(), out)
}

fn ctr(sock: &Path, args: &[&str]) -> std::process::Output {
    run(Command::new(tools::ctr())
        .arg("--address")
        .arg(sock)
        .args(["--namespace", "k8s.io"])
        .args(args))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let ws = tools::workspace();
    // BENCH_ONLY=r: row (r) alone (it needs none of the set).
    if std::env::var("BENCH_ONLY").as_deref() == Ok("r") {
        let (work, path) = (
            tempfile::tempdir()?,
            std::env::var("PATH").unwrap_or_default(),
        );
        let path = format!("{}:{path}", tools::containerd().parent().unwrap().display());
        println!("{}", cluster::kind_cluster(work.path(), &path, runs)?);
        return Ok(());
    }
    let set = ImageSet::load(&ws.join("images/bench.yaml"))?;
    let platform = host_platform();
    eprintln!(
        "bench: building and pushing the image set ({} images)...",
        set.images.len()
    );
    let registry = Registry::start()?;
    let built = registry.seed(&set)?;
    let reg = registry.addr.clone();
    // Unique blobs (config + layers) and bytes.
    let mut blobs: Vec<(String, String)> = Vec::new();
    let mut bytes = 0u64;
    for img in &built {
        for b in img.blobs() {
            if !blobs.iter().any(|(_, d)| *d == b.digest) {
                blobs.push((img.repo.clone(), b.digest.clone()));
                bytes += b.bytes.len() as u64;
            }
        }
    }
    // (g)'s image: the apiserver of the next version, sharing the 64 MiB
    // layer and bringing a new 32 MiB one.
    let next = fixtures::next_apiserver(&built, &platform);
    registry.push(&next)?;
    let mut g_new: Vec<(String, String)> = Vec::new();
    let mut g_new_bytes = 0u64;
    for b in next.blobs() {
        if !blobs.iter().any(|(_, d)| *d == b.digest) {
            g_new.push(("bench/apiserver".to_string(), b.digest.clone()));
            g_new_bytes += b.bytes.len() as u64;
        }
    }
    drop((built, next));
    let mib = bytes as f64 / (1 << 20) as f64;
    eprintln!(
        "bench: {} unique blobs, {:.0} MiB at {reg}",
        blobs.len(),
        mib
    );

    let base = fixtures::bench_base(&platform);
    registry.push(&base)?;
    let crowded = fixtures::crowded_base(&base, &platform);
    registry.push(&crowded)?;
    drop(crowded);
    let mut node_blobs = blobs.clone();
    let mut base_bytes = 0u64;
    for b in base.blobs() {
        node_blobs.push(("bench/base".to_string(), b.digest.clone()));
        base_bytes += b.bytes.len() as u64;
    }
    drop(base);
    eprintln!(
        "bench: base {:.0} MiB",
        base_bytes as f64 / (1 << 20) as f64
    );

    let work = tempfile::Builder::new()
        .prefix("kiln-bench-")
        .tempdir_in(ws.join("out").tap_mkdir())?;
    let manifest = work.path().join("bench-node.yaml");
    let mut text = "apiVersion: kiln/v1\nkind: NodeImageManifest\nsandboxImage: bench.local/bench/apiserver:1\nimages:\n".to_string();
    for i in &set.images {
        text.push_str(&format!("  - bench.local/{}:{}\n", i.repo, i.tag));
    }
    std::fs::write(&manifest, &text)?;
    let manifest_next = work.path().join("bench-node-next.yaml");
    std::fs::write(
        &manifest_next,
        text.replace("bench/apiserver:1", "bench/apiserver:2"),
    )?;
    // Runs that name no cache use the bench's own, never the user's.
    let cache_of = |name: &str| work.path().join(format!("cache-{name}"));
    std::env::set_var("KILN_CACHE_DIR", cache_of("other"));
    let fresh_cache = |name: &str| {
        let dir = cache_of(name);
        let _ = std::fs::remove_dir_all(&dir);
        dir.display().to_string()
    };
    let refs: Vec<String> = set
        .images
        .iter()
        .map(|i| format!("{reg}/{}:{}", i.repo, i.tag))
        .collect();
    let rt = tokio::runtime::Runtime::new()?;
    let deps_path = format!(
        "{}:{}",
        tools::containerd().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // BENCH_ONLY=p: row (p) alone (it needs the set, not the rest); q:
    // row (q) alone.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("p") {
        println!("{}", kind_load(&registry, work.path(), &deps_path, runs)?);
        return Ok(());
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("q") {
        let fresh = fresh::fresh_runner(
            &registry,
            work.path(),
            (&manifest, &manifest_next),
            &deps_path,
            (&g_new, g_new_bytes),
        )?;
        println!("{fresh}");
        return Ok(());
    }

    // Warm the registry's files into the page cache, so no run pays for it alone.
    rt.block_on(floor(&reg, &blobs));

    let (mut a, mut a_noop, mut b, mut c, mut d) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut a_warm, mut a_nocache) = (vec![], vec![]);
    let (mut g, mut h, mut g_floor) = (vec![], vec![], vec![]);
    let (mut e, mut e_zstd, mut f, mut e_floor) = (vec![], vec![], vec![], vec![]);
    let (mut i, mut i_phases) = (vec![], vec![]);
    let mut e_phases: Vec<serde_json::Value> = vec![];
    let mut f_phases: Vec<serde_json::Value> = vec![];
    let mut theirs = baseline::Times::default();
    let (mut a_warm_kept, mut a_copy) = (vec![], vec![]);
    let mut e_rss = vec![];
    let mut archive_mib = 0.0;
    let (mut rss, mut rss_all) = (vec![], vec![]);
    for n in 0..runs {
        eprintln!("bench: run {}/{runs}", n + 1);
        d.push(rt.block_on(floor(&reg, &blobs)).as_secs_f64());

        let rootfs = work.path().join("rootfs");
        let _ = std::fs::remove_dir_all(&rootfs);
        settle();
        let t = Instant::now();
        let mirror = format!("bench.local=http://{reg}");
        let cache_a = fresh_cache("a");
        let build_args_with = |cache: &'static str| {
            let mut v = vec![
                "build".to_string(),
                "--json".into(),
                "--manifest".into(),
                manifest.display().to_string(),
                "--rootfs".into(),
                rootfs.display().to_string(),
                "--mirror".into(),
                mirror.clone(),
                "--platform".into(),
                platform.clone(),
            ];
            match cache {
                "none" => v.push("--no-cache".into()),
                _ => v.extend(["--cache-dir".into(), cache_a.clone()]),
            }
            v
        };
        let build_args = build_args_with("a");
        let out = run(Command::new("/usr/bin/time")
            .arg("-v")
            .arg(kiln_bin())
            .args(&build_args)
            .env("PATH", &deps_path));
        a.push(t.elapsed().as_secs_f64());
        let err = String::from_utf8_lossy(&out.stderr);
        let kb: f64 = err
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("Maximum resident set size (kbytes): ")
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        rss_all.push(kb / 1024.0);
        // kiln's own peak, from its report (time -v above includes its containerd).
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        rss.push(report["peakRssKib"].as_f64().unwrap_or(0.0) / 1024.0);
        let t = Instant::now();
        run(Command::new(kiln_bin())
            .args(&build_args)
            .env("PATH", &deps_path));
        a_noop.push(t.elapsed().as_secs_f64());
        // (a) into a fresh rootfs, the cache warm, the first rootfs kept
        // aside (renamed: its links, and so the lent entries' ctimes, as
        // they were); then (below) after both were deleted.
        let kept = rootfs.with_extension("kept");
        std::fs::rename(&rootfs, &kept)?;
        a_warm_kept.push(timed(&kiln_bin(), &build_args, &deps_path).0);
        std::fs::remove_dir_all(&rootfs)?;
        std::fs::remove_dir_all(&kept)?;
        // The warm rows' floor: the cache's blobs copied once, synced.
        let copy = work.path().join("copy-floor");
        settle();
        let t = Instant::now();
        run(Command::new("cp")
            .arg("-r")
            .arg(Path::new(&cache_a).join("blobs"))
            .arg(&copy));
        settle();
        a_copy.push(t.elapsed().as_secs_f64());
        std::fs::remove_dir_all(&copy)?;
        // (a) into a fresh rootfs, the cache warm; and with --no-cache.
        for (cache, times) in [("a", &mut a_warm), ("none", &mut a_nocache)] {
            times.push(timed(&kiln_bin(), &build_args_with(cache), &deps_path).0);
            std::fs::remove_dir_all(&rootfs)?;
        }

        // (b) ctr content fetch --label, one image after another, fresh root.
        rt.block_on(async {
            let root = work.path().join("ctr-fetch");
            let daemon = kiln::adapters::daemon::Daemon::start(
                &tools::containerd(),
                &root,
                &Default::default(),
            )
            .await
            .unwrap();
            settle();
            let t = Instant::now();
            for r in &refs {
                ctr(
                    &daemon.socket,
                    &[
                        "content",
                        "fetch",
                        "--plain-http",
                        "--platform",
                        &platform,
                        "--label",
                        "io.cri-containerd.pinned=pinned",
                        r,
                    ],
                );
            }
            b.push(t.elapsed().as_secs_f64());
            daemon.stop().unwrap();
            std::fs::remove_dir_all(&root).unwrap();
        });

        // (c) the kind way: pull, save to an archive, import --no-unpack, label.
        c.push(rt.block_on(kind_way(work.path(), &refs, &platform)));

        // (e) a node image from the base, gzip (the default) and zstd; (f) again.
        let archive = work.path().join("node.tar");
        let node_args_in = |manifest: &Path, base: &str, compression: &str, cache: &str| {
            let mut v: Vec<String> = vec![
                "build".into(),
                "--json".into(),
                "--manifest".into(),
                manifest.display().to_string(),
                "--base".into(),
                format!("{reg}/{base}"),
                "--mirror".into(),
                format!("bench.local=http://{reg}"),
                "--platform".into(),
                platform.clone(),
                "--layer-compression".into(),
                compression.into(),
                "--output".into(),
                format!("oci-archive:{}", archive.display()),
            ];
            match cache {
                "none" => v.push("--no-cache".into()),
                dir => v.extend(["--cache-dir".into(), dir.into()]),
            }
            v
        };
        let node_args_from = |base: &str, compression: &str, cache: &str| {
            node_args_in(&manifest, base, compression, cache)
        };
        let cache_e = fresh_cache("e");
        let node_args =
            |compression: &str, cache: &str| node_args_from("bench/base:1", compression, cache);
        for (compression, times) in [("gzip", &mut e), ("zstd", &mut e_zstd)] {
            let _ = std::fs::remove_file(&archive);
            let cache = match compression {
                "gzip" => cache_e.clone(),
                _ => fresh_cache("e-zstd"),
            };
            let (took, out) = timed(&kiln_bin(), &node_args(compression, &cache), &deps_path);
            times.push(took);
            let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            if compression == "gzip" {
                e_phases.push(report["phases"].clone());
                e_rss.push(report["peakRssKib"].as_f64().unwrap_or(0.0) / 1024.0);
                archive_mib = std::fs::metadata(&archive)?.len() as f64 / (1 << 20) as f64;
                let (took, out) = timed(&kiln_bin(), &node_args(compression, &cache_e), &deps_path);
                f.push(took);
                let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
                f_phases.push(report["phases"].clone());
            }
        }
        // Its floor: the base's and the set's blobs read once, the archive written once.
        let size = std::fs::metadata(&archive)?.len();
        std::fs::remove_file(&archive)?;
        settle();
        let read = rt.block_on(floor(&reg, &node_blobs));
        let t = Instant::now();
        write_once(&work.path().join("floor.tar"), size)?;
        e_floor.push(read.as_secs_f64() + t.elapsed().as_secs_f64());
        // (h) (e) without the cache.
        let _ = std::fs::remove_file(&archive);
        h.push(timed(&kiln_bin(), &node_args("gzip", "none"), &deps_path).0);
        // (g) the next version, (e)'s cache warm; its floor: its new bytes
        // fetched, the archive written once.
        std::fs::remove_file(&archive)?;
        let next = node_args_in(&manifest_next, "bench/base:1", "gzip", &cache_e);
        g.push(timed(&kiln_bin(), &next, &deps_path).0);
        let g_size = std::fs::metadata(&archive)?.len();
        std::fs::remove_file(&archive)?;
        settle();
        let read = rt.block_on(floor(&reg, &g_new));
        let t = Instant::now();
        write_once(&work.path().join("floor.tar"), g_size)?;
        g_floor.push((
            read.as_secs_f64(),
            read.as_secs_f64() + t.elapsed().as_secs_f64(),
        ));
        // The same rows by the baseline kiln, right after.
        if let Some(bin) = std::env::var_os("KILN_BASELINE") {
            let (cache_e, cache_a) = (cache_of("b-e"), cache_of("b-a"));
            let mut rootfs_build = build_args.clone();
            let at = rootfs_build
                .iter()
                .position(|a| a == "--cache-dir")
                .unwrap();
            rootfs_build[at + 1] = cache_a.display().to_string();
            let e_cache = cache_e.display().to_string();
            theirs.run(
                Path::new(&bin),
                &baseline::Args {
                    node: node_args("gzip", &e_cache),
                    next: node_args_in(&manifest_next, "bench/base:1", "gzip", &e_cache),
                    rootfs_build,
                    archive: &archive,
                    rootfs: &rootfs,
                    caches: vec![&cache_e, &cache_a],
                    path: &deps_path,
                },
            )?;
        }
        // Each run's rows start from empty caches.
        for name in ["a", "e", "e-zstd", "e-baseline"] {
            let _ = std::fs::remove_dir_all(cache_of(name));
        }
        let _ = std::fs::remove_file(work.path().join("floor.tar"));
        // (i) (e) from the crowded base: what 100,000 entries cost.
        let _ = std::fs::remove_file(&archive);
        let (took, out) = timed(
            &kiln_bin(),
            &node_args_from("bench/crowded:1", "gzip", "none"),
            &deps_path,
        );
        i.push(took);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        i_phases.push(report["phases"].clone());
        std::fs::remove_file(&archive)?;
    }
    let phase_of = |phases: &[serde_json::Value], k: &str| {
        median(
            phases
                .iter()
                .map(|p| p[k].as_f64().unwrap_or(0.0))
                .collect(),
        )
    };
    let phase = |k: &str| phase_of(&e_phases, k);
    let (i_extract, i_pack) = (phase_of(&i_phases, "extract"), phase_of(&i_phases, "pack"));
    let i = median(i);
    let (pull, extract, bake, pack) = (
        phase("pullBase"),
        phase("extract"),
        phase("bake"),
        phase("pack"),
    );
    let f_phase = |k: &str| phase_of(&f_phases, k);
    let (f_pull, f_extract, f_bake, f_pack) = (
        f_phase("pullBase"),
        f_phase("extract"),
        f_phase("bake"),
        f_phase("pack"),
    );
    let (a_warm, a_nocache, g, h) = (median(a_warm), median(a_nocache), median(g), median(h));
    let (a_warm_kept, a_copy) = (median(a_warm_kept), median(a_copy));
    let g_fetch = median(g_floor.iter().map(|x| x.0).collect());
    let g_floor = median(g_floor.iter().map(|x| x.1).collect());
    let (e, e_zstd, f, e_floor, e_rss) = (
        median(e),
        median(e_zstd),
        median(f),
        median(e_floor),
        median(e_rss),
    );
    let (a, a_noop, b, c, d, rss) = (
        median(a),
        median(a_noop),
        median(b),
        median(c),
        median(d),
        median(rss),
    );
    let rss_all = median(rss_all);
    let row = |name: &str, s: f64| {
        format!(
            "| {name} | {s:.2} s | {:.0} MiB/s | {:.2} |",
            mib / s,
            s / a
        )
    };
    let report = format!(
        "Image set: {} images, {} unique blobs, {mib:.0} MiB (one 256 MiB layer, one 64 MiB layer shared by four images), loopback registry, {platform}. Median of {runs} runs.\n\n\
         | run | time | throughput | time / kiln |\n|---|---|---|---|\n{}\n{}\n{}\n{}\n| (a') kiln build again (no-op) | {a_noop:.2} s | | |\n| (a) into a fresh rootfs, the cache warm, the first rootfs kept | {a_warm_kept:.2} s | | {:.2} |\n| (a) into a fresh rootfs, the cache warm, the first rootfs deleted | {a_warm:.2} s | | {:.2} |\n| (a) warm rows' floor: the cache's blobs copied once (cp -r, synced) | {a_copy:.2} s | | {:.2} |\n| (a) with --no-cache | {a_nocache:.2} s | | {:.2} |\n\n\
         Ratios: kiln/(b) = {:.2}, kiln/(c) = {:.2}, kiln/(d) = {:.2}; warm, first rootfs kept / copy = {:.2}, deleted / copy = {:.2}. kiln peak RSS: {rss:.0} MiB (its private containerd included: {rss_all:.0} MiB).\n",
        set.images.len(),
        blobs.len(),
        row("(a) kiln build", a),
        row("(b) ctr content fetch --label, per image", b),
        row("(c) kind way: pull, export, ctr import --no-unpack, label", c),
        row("(d) floor: parallel HTTP read + sha256", d),
        a_warm_kept / a,
        a_warm / a,
        a_copy / a,
        a_nocache / a,
        a / b,
        a / c,
        a / d,
        a_warm_kept / a_copy,
        a_warm / a_copy,
    );
    let g_new_mib = g_new_bytes as f64 / (1 << 20) as f64;
    let node = format!(
        "\nNode image from a {:.0} MiB base plus the set, into an oci-archive ({archive_mib:.0} MiB):\n\n| run | time | time / floor |\n|---|---|---|\n| (e) kiln build --base, gzip layer (default) | {e:.2} s | {:.2} |\n| (e) kiln build --base, --layer-compression zstd | {e_zstd:.2} s | {:.2} |\n| (f) the same node image again, the cache warm | {f:.2} s | {:.2} |\n| (g) the next version (one image changed, {g_new_mib:.0} MiB new), the cache warm | {g:.2} s | {:.2} |\n| (h) (e) with --no-cache | {h:.2} s | {:.2} |\n| floor: base and set read once, archive written once | {e_floor:.2} s | 1.00 |\n\n(g)'s own floor: its new bytes fetched ({g_fetch:.2} s) and its archive written once: {g_floor:.2} s; (g) / that floor = {:.2}; (g) − (fetching its new bytes + 1 s) = {:+.2} s.\n\nPhases of (e), gzip: pull base {pull:.2} s, extract {extract:.2} s, bake {bake:.2} s, pack {pack:.2} s; of (f): pull base {f_pull:.2} s, extract {f_extract:.2} s (the base's parts replayed from the cache), bake {f_bake:.2} s, pack {f_pack:.2} s. kiln peak RSS: {e_rss:.0} MiB.\n\n\
         (i) (e) from a base holding 100,000 more entries under var/lib/containerd (a hostile base's shape): {i:.2} s, of which extract {i_extract:.2} s, pack {i_pack:.2} s.\n",
        base_bytes as f64 / (1 << 20) as f64,
        e / e_floor,
        e_zstd / e_floor,
        f / e_floor,
        g / e_floor,
        h / e_floor,
        g / g_floor,
        g - (g_fetch + 1.0),
    );
    let shipped = shipping(
        &registry,
        work.path(),
        (&manifest, &manifest_next),
        &deps_path,
        g_new_bytes,
    )?;
    let fresh = fresh::fresh_runner(
        &registry,
        work.path(),
        (&manifest, &manifest_next),
        &deps_path,
        (&g_new, g_new_bytes),
    )?;
    let baseline = if std::env::var_os("KILN_BASELINE").is_some() {
        theirs.table([e, f, g, a_warm_kept, a_warm])
    } else {
        String::new()
    };
    let node = format!("{node}{baseline}");
    let emulated = emulated_verify(&registry, work.path(), &deps_path, runs)?;
    let loaded = kind_load(&registry, work.path(), &deps_path, runs)?;
    let cluster = if nix::unistd::geteuid().is_root() {
        cluster::kind_cluster(work.path(), &deps_path, runs)?
    } else {
        "\n\n(r) not run: Docker's kind nodes need root.\n".to_string()
    };
    let report = format!("{report}{node}{shipped}{fresh}{emulated}{loaded}{cluster}");
    println!("{report}");
    std::fs::write(ws.join("out/bench.md"), &report)?;
    Ok(())
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}
impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}
