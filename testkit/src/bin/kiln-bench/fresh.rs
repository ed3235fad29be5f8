//! `make bench` (q): the next version built on a fresh runner (an empty
//! cache, a HOME of its own) following the first, signed, by digest and
//! pushed; bytes fetched and pushed counted at the registry's door (a
//! proxy in front of it: the base, the images and the previous image all
//! come through it), against the floor of fetching and pushing the
//! changed bytes once, against the same build on a warm runner, and
//! against the unsigned path (no signature policy: the previous image's
//! record is not used, every layer is fetched and judged by its bytes).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kiln_testkit::registry::Registry;

use super::{kiln_bin, run, settle};

/// The row and its floor; `new` are the next version's new blobs (repo,
/// digest), `changed` their bytes.
pub fn fresh_runner(
    registry: &Registry,
    work: &Path,
    (manifest, manifest_next): (&Path, &Path),
    deps_path: &str,
    (new, changed): (&[(String, String)], u64),
) -> anyhow::Result<String> {
    let proxy = kiln_testkit::proxy::counting_proxy(registry.url());
    let front = proxy.addr();
    let keys =
        kiln_testkit::sigstore::node_signing(&work.join("q-keys"), &format!("{front}/bench/fresh"));
    let signed = [
        "--sign-key".to_string(),
        keys.key.display().to_string(),
        "--verify-signatures".to_string(),
        keys.policy.display().to_string(),
    ];
    let build = |m: &Path, tag: &str, previous: Option<&str>, runner: &str, extra: &[String]| {
        let (home, cache) = (
            work.join(format!("q-{runner}-home")),
            work.join(format!("q-{runner}-cache")),
        );
        std::fs::create_dir_all(&home).unwrap();
        let mut cmd = Command::new(kiln_bin());
        cmd.args([
            "build",
            "--json",
            "--manifest",
            m.to_str().unwrap(),
            "--base",
            &format!("{front}/bench/base:1"),
            "--mirror",
            &format!("bench.local=http://{front}"),
            "--push",
            &format!("{front}/bench/fresh:{tag}"),
        ]);
        if let Some(p) = previous {
            cmd.args(["--previous", p]);
        }
        cmd.args(extra);
        cmd.env("PATH", deps_path)
            .env("HOME", &home)
            .env("KILN_CACHE_DIR", &cache)
            .env("SOURCE_DATE_EPOCH", "1700000000");
        settle();
        let t = Instant::now();
        let out = run(&mut cmd);
        let took = t.elapsed().as_secs_f64();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (took, report)
    };
    eprintln!("bench: (q) the next version on a fresh runner...");
    let (_, first) = build(manifest, "1", None, "a", &signed);
    let previous = format!("{front}/bench/fresh@{}", first["digest"].as_str().unwrap());
    proxy.take();
    let (fresh, report) = build(manifest_next, "2", Some(&previous), "b", &signed);
    let log = proxy.take();
    let fetched: u64 = log.iter().map(|c| c.received).sum();
    let pushed: u64 = log.iter().map(|c| c.sent).sum();
    let (warm, warm_report) = build(manifest_next, "2-warm", Some(&previous), "a", &signed);
    proxy.take();
    // The unsigned path: another fresh runner, no signature policy.
    let (unsigned, unsigned_report) = build(manifest_next, "2-unsigned", Some(&previous), "c", &[]);
    let log = proxy.take();
    let fetched_u: u64 = log.iter().map(|c| c.received).sum();
    let pushed_u: u64 = log.iter().map(|c| c.sent).sum();
    let same_u = unsigned_report["digest"] == report["digest"];
    let same = report["digest"] == warm_report["digest"];
    let reused = report["kilnLayers"]
        .as_array()
        .map_or(0, |ls| ls.iter().filter(|l| l["reused"] == true).count());
    // The floor: the changed blobs fetched and pushed once.
    let rt = tokio::runtime::Runtime::new()?;
    settle();
    let floor = rt.block_on(fetch_and_push_once(&registry.addr, new));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let target = 1.05 * changed as f64 + (2 << 20) as f64;
    Ok(format!(
        "\nThe next version on a fresh runner (an empty cache and HOME), following the first (signed with `--sign-key`) by digest and pushed; bytes counted at the registry's door; {:.1} MiB changed (target ≤ 1.05 × changed + 2 MiB = {:.1} MiB):\n\n| run | fetched | pushed | time | time / floor |\n|---|---|---|---|---|\n| (q) fresh runner, `--previous REPO@sha256:…`, its signature verified ({reused} layers reused, {} base layers replayed) | {:.1} MiB | {:.1} MiB | {fresh:.2} s | {:.2} |\n| (q) the same build on a warm runner | | | {warm:.2} s | {:.2} |\n| (q) fresh runner, no signature policy: the record not used, every layer fetched and judged | {:.1} MiB | {:.1} MiB | {unsigned:.2} s | {:.2} |\n| floor: the changed blobs fetched and pushed once | {:.1} MiB | {:.1} MiB | {floor:.2} s | 1.00 |\n\nThe fresh and warm runners' images are {}; the unsigned path's is {}.\n",
        mib(changed),
        target / (1 << 20) as f64,
        report["baseLayersReplayed"],
        mib(fetched),
        mib(pushed),
        fresh / floor,
        warm / floor,
        mib(fetched_u),
        mib(pushed_u),
        unsigned / floor,
        mib(changed),
        mib(changed),
        if same { "the same (one manifest digest)" } else { "NOT the same" },
        if same_u { "the same" } else { "NOT the same" },
    ))
}

/// Each blob fetched once and pushed once (monolithic uploads into a
/// repository of its own), over parallel HTTP: seconds.
async fn fetch_and_push_once(registry: &str, blobs: &[(String, String)]) -> f64 {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (repo, digest) in blobs {
        let (client, get, put) = (
            client.clone(),
            format!("http://{registry}/v2/{repo}/blobs/{digest}"),
            format!("http://{registry}/v2/bench/floor/blobs/uploads/?digest={digest}"),
        );
        tasks.push(tokio::spawn(async move {
            let body = client
                .get(&get)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            let r = client
                .post(&put)
                .header("content-type", "application/octet-stream")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{put}: {}", r.status());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed().as_secs_f64()
}
