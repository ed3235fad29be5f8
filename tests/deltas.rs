//! Node images that ship only what changed: two node versions whose
//! manifests differ only in the kube-* images, pushed to a real registry
//! through a proxy that counts the bytes at the registry's door, and pulled
//! by containerd's own `ctr` through it.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::releases::{
    blobs, manifest, manifest_with, release_set, seed_two_releases, with_etcd, MIB,
};
use crate::common::*;
use kiln_testkit::base::kind_base;
use kiln_testkit::docker::{Dockerd, Store};
use kiln_testkit::image::host_platform;
use kiln_testkit::proxy::{
    blob_bytes_pulled, blob_bytes_uploaded, blob_uploads, counting_proxy, Crossed,
};

/// kiln's layers in the order the manifest lists them.
fn layer_order(report: &serde_json::Value) -> Vec<String> {
    report["kilnLayers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// How many snapshots containerd's native snapshotter holds.
fn snapshots(socket: &std::path::Path) -> usize {
    let o = std::process::Command::new(kiln_testkit::tools::ctr())
        .arg("--address")
        .arg(socket)
        .args(["snapshots", "--snapshotter", "native", "ls"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A header line (KEY PARENT KIND), then one line per snapshot.
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// containerd's own `ctr images pull` (fetch and unpack) of `reference`.
fn ctr_pull(socket: &std::path::Path, reference: &str) {
    let o = std::process::Command::new(kiln_testkit::tools::ctr())
        .arg("--address")
        .arg(socket)
        .args(["images", "pull", "--plain-http", "--snapshotter", "native"])
        .arg(reference)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ctr images pull {reference}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `kiln build --json` of `manifest` on `base`, pushed to `node:tag`,
/// following `node:previous` when given.
fn push_build(
    env: &Env,
    (manifest, base): (&std::path::Path, &str),
    (node, tag, previous): (&str, &str, Option<&str>),
    envs: &[(&str, &str)],
) -> std::process::Output {
    let previous = previous.map(|p| format!("{node}:{p}"));
    crate::common::push_build(
        (manifest, base),
        (&format!("{node}:{tag}"), previous.as_deref()),
        &env.mirror(),
        &[],
        envs,
    )
}

fn layer_sizes(report: &serde_json::Value) -> BTreeMap<String, (u64, String)> {
    report["kilnLayers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["digest"].as_str().unwrap().to_string(),
                (
                    l["size"].as_u64().unwrap(),
                    l["holds"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

#[test]
fn the_next_patch_release_ships_only_what_changed() {
    let env = Env::new();
    let (v1, v2) = seed_two_releases(&env);
    let proxy = counting_proxy(env.registry.url());
    let base = format!("{}/kindest/base:test", proxy.addr());
    // `tag` builds from its manifest: `v1.31.3-etcd` is v1.31.3 with the
    // next etcd.
    let run_after = |tag: &str, epoch: &str, previous: Option<&str>| {
        let m = match tag.strip_suffix("-etcd") {
            Some(kube) => manifest_with(&env, kube, "3.5.17-0"),
            None => manifest(&env, tag),
        };
        let node = format!("{}/kiln/node", proxy.addr());
        // One cache for the test's builds, as a release machine keeps.
        let cache = env.path("cache");
        push_build(
            &env,
            (&m, &base),
            (&node, tag, previous),
            &[
                ("SOURCE_DATE_EPOCH", epoch),
                ("KILN_CACHE_DIR", cache.to_str().unwrap()),
            ],
        )
    };
    let build_after = |tag: &str, epoch: &str, previous: Option<&str>| {
        let o = run_after(tag, epoch, previous);
        assert_ok(&o);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let build = |tag: &str, epoch: &str| build_after(tag, epoch, None);

    // A `--previous` the user names that cannot be read is refused before
    // anything is fetched or pushed, not built on as if it were a first
    // build (the `--push` tag's own image may be missing: that is a first push).
    let o = run_after("v1.31.2", "1700000000", Some("v0.0.0"));
    assert_fails(
        &o,
        2,
        &["--previous", "cannot be read", "--previous REF@sha256:"],
    );
    assert!(
        proxy
            .take()
            .iter()
            .all(|c| c.method == "GET" || c.method == "HEAD"),
        "a refused build wrote to the registry"
    );

    // v1: the base's two layers are mounted from kindest/base, not uploaded.
    let r1 = build("v1.31.2", "1700000000");
    let log1 = proxy.take();
    let mounted: Vec<&Crossed> = log1
        .iter()
        .filter(|c| c.method == "POST" && c.target.contains("mount=") && c.status == 201)
        .collect();
    assert_eq!(mounted.len(), 2, "{log1:#?}");
    assert_eq!(r1["pushed"]["mounted"], 2);
    let l1 = layer_sizes(&r1);
    let up1 = blob_uploads(&log1);
    for d in l1.keys() {
        assert!(up1.contains_key(d), "kiln layer {d} was not uploaded");
    }

    // v2, a day later, following v1 (`--previous`): every layer of only
    // unchanged blobs is the same, and the layers both share come first,
    // in v1's order (issue 44.1: Docker and containerd reuse by chain).
    let r2 = build_after("v1.31.3", "1700086400", Some("v1.31.2"));
    let log2 = proxy.take();
    let l2 = layer_sizes(&r2);
    let (o1, o2) = (layer_order(&r1), layer_order(&r2));
    let shared: Vec<&String> = o2.iter().filter(|d| o1.contains(d)).collect();
    assert!(!shared.is_empty());
    assert_eq!(
        o2[..shared.len()].iter().collect::<Vec<_>>(),
        shared,
        "a new layer before a shared one"
    );
    assert_eq!(
        o1[..shared.len()].iter().collect::<Vec<_>>(),
        shared,
        "the shared layers are not v1's first ones, in its order"
    );
    let own = |l: &BTreeMap<String, (u64, String)>| -> BTreeMap<String, String> {
        l.iter()
            .filter_map(|(d, (_, holds))| {
                holds
                    .strip_prefix("kiln: content blob ")
                    .map(|b| (b.to_string(), d.clone()))
            })
            .collect()
    };
    let (own1, own2) = (own(&l1), own(&l2));
    let unchanged: Vec<&String> = own2.keys().filter(|b| own1.contains_key(*b)).collect();
    // The shared base and etcd's binary layer: two large blobs unchanged
    // (of four; the kube-* binary layers are new).
    assert_eq!(unchanged.len(), 2, "{own1:?} {own2:?}");
    for b in unchanged {
        assert_eq!(own1[b], own2[b], "the layer of unchanged {b} moved");
    }
    // The registry received exactly the new layers, the config and the
    // build record (its contributions, the base's, went up with v1).
    let up2 = blob_uploads(&log2);
    let new_layers: BTreeSet<&String> = l2.keys().filter(|d| !l1.contains_key(*d)).collect();
    let uploaded: BTreeSet<&String> = up2.keys().collect();
    assert!(
        new_layers.is_subset(&uploaded),
        "{new_layers:?} {uploaded:?}"
    );
    let record: serde_json::Value = env
        .registry
        .get(
            "/v2/kiln/node/manifests/v1.31.3",
            "application/vnd.oci.image.manifest.v1+json",
        )
        .unwrap()
        .json()
        .unwrap();
    let record = record["annotations"]["io.kiln.record"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(uploaded.contains(&record), "{uploaded:?}");
    assert_eq!(uploaded.len(), new_layers.len() + 2, "{uploaded:?}");
    // Every upload counted: no blob went up twice.
    let uploaded_bytes = blob_bytes_uploaded(&log2);
    assert_eq!(
        uploaded_bytes,
        up2.values().sum::<u64>(),
        "a blob uploaded twice"
    );
    // What changed between the two releases' images.
    let (b1, b2) = (blobs(&v1), blobs(&v2));
    let changed: u64 = b2
        .iter()
        .filter(|(d, _)| !b1.contains_key(*d))
        .map(|(_, n)| n)
        .sum();
    eprintln!("v2 push: {uploaded_bytes} bytes uploaded at the registry; {changed} bytes changed");
    assert!(
        uploaded_bytes as f64 <= 1.05 * changed as f64 + (2 * MIB) as f64,
        "uploaded {uploaded_bytes}, changed {changed}"
    );
    assert_eq!(r2["pushed"]["uploadedBytes"], uploaded_bytes);

    // The same v2 again: nothing uploaded at all.
    let again = build("v1.31.3", "1700086400");
    assert_eq!(again["digest"], r2["digest"]);
    let up3 = blob_uploads(&proxy.take());
    assert!(up3.is_empty(), "a no-op push uploaded {up3:?}");
    assert_eq!(again["pushed"]["uploaded"], 0);

    // v3: v2 with the next etcd, an image not tagged with the Kubernetes
    // version, so its layer sits early in the chain. v2's etcd layer stays
    // in its place (kept, whited out above): without it every layer after
    // it has a new chain (make bench (n), (o)).
    let v3 = env
        .registry
        .seed(&with_etcd("v1.31.3", 42, ("3.5.17-0", 33)))
        .expect("seed v3");
    let r3 = build_after("v1.31.3-etcd", "1700172800", Some("v1.31.3"));
    let log3 = proxy.take();
    let o3 = layer_order(&r3);
    let l3 = layer_sizes(&r3);
    let kept: Vec<&String> = l3
        .iter()
        .filter(|(_, (_, holds))| holds.starts_with("kiln: kept from the previous node image"))
        .map(|(d, _)| d)
        .collect();
    // v2's etcd layer (and its small layers', which changed too).
    let kept_blobs: Vec<String> = own(&l2)
        .into_iter()
        .filter(|(_, d)| kept.contains(&d))
        .map(|(b, _)| b)
        .collect();
    assert_eq!(kept_blobs.len(), 1, "{l3:#?}");
    let etcd_v2 = &kept_blobs[0];
    // v2's layers up to its last one v3 shares are v3's first, in order.
    let last_shared = o2.iter().rposition(|d| o3.contains(d)).unwrap();
    assert_eq!(o3[..=last_shared], o2[..=last_shared], "{o2:?} {o3:?}");
    // The same v3 again, following v2: the kept layer comes from the
    // cache, not the registry, and the image is the same.
    let again3 = build_after("v1.31.3-etcd", "1700172800", Some("v1.31.3"));
    assert_eq!(again3["digest"], r3["digest"]);
    let read_again: Vec<Crossed> = proxy
        .take()
        .into_iter()
        .filter(|c| c.method == "GET" && kept.iter().any(|d| c.target.ends_with(d.as_str())))
        .collect();
    assert!(read_again.is_empty(), "{read_again:#?}");
    let changed3: u64 = blobs(&v3)
        .iter()
        .filter(|(d, _)| !b2.contains_key(*d))
        .map(|(_, n)| n)
        .sum();
    let uploaded3 = blob_bytes_uploaded(&log3);
    eprintln!("v3 push: {uploaded3} bytes uploaded; {changed3} bytes changed");
    assert!(
        uploaded3 as f64 <= 1.05 * changed3 as f64 + (2 * MIB) as f64,
        "uploaded {uploaded3}, changed {changed3}"
    );

    // The many-layer node, a kept layer in it, reads as before: verify
    // unpacks it from the registry, a real containerd opens its store,
    // CRI reports every image pinned.
    let v = kiln(&[
        "verify",
        "--image",
        &format!("{}/kiln/node:v1.31.3-etcd", proxy.addr()),
    ]);
    assert_ok(&v);
    proxy.take();

    // containerd that pulled v1 fetches only v2's new blobs.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let root = env.path("ctr-root");
        let d = kiln::adapters::daemon::Daemon::start(
            &kiln_testkit::tools::containerd(),
            &root,
            &Default::default(),
        )
        .await
        .unwrap();
        let fetch =
            |tag: &str| ctr_fetch(&d.socket, &format!("{}/kiln/node:{tag}", proxy.addr()), &[]);
        fetch("v1.31.2");
        proxy.take();
        fetch("v1.31.3");
        let pulled: u64 = blob_bytes_pulled(&proxy.take());
        let expected: u64 = l2
            .iter()
            .filter(|(d, _)| !l1.contains_key(*d))
            .map(|(_, (n, _))| n)
            .sum();
        eprintln!("v2 pull after v1: {pulled} blob bytes from the registry; new layers {expected}");
        // The new layers and the config (a few KiB).
        assert!(
            pulled >= expected && pulled < expected + 64 * 1024,
            "{pulled} {expected}"
        );
        assert!(
            pulled as f64 <= 1.05 * changed as f64 + (2 * MIB) as f64,
            "pulled {pulled}, changed {changed}"
        );
        // The same containerd unpacks v1, then v2: only v2's new layers get
        // a snapshot, as its unpacker keys them by chain (issue 44.1, make
        // bench (o)); the content is there already, which decides nothing.
        let made = |tag: &str| -> usize {
            let before = snapshots(&d.socket);
            ctr_pull(&d.socket, &format!("{}/kiln/node:{tag}", proxy.addr()));
            snapshots(&d.socket) - before
        };
        let (n1, n2, n3) = (made("v1.31.2"), made("v1.31.3"), made("v1.31.3-etcd"));
        let new_in_v2 = o2.iter().filter(|d| !o1.contains(d)).count();
        let new_in_v3 = o3.iter().filter(|d| !o2.contains(d)).count();
        eprintln!(
            "containerd unpacked {n1} snapshots for v1, then {n2} for v2 ({new_in_v2} new layers), then {n3} for v3 ({new_in_v3} new layers)"
        );
        // The base's two layers and kiln's.
        assert_eq!(n1, 2 + o1.len());
        assert_eq!(n2, new_in_v2, "a layer v1 had was unpacked again");
        assert_eq!(n3, new_in_v3, "a layer v2 had was unpacked again");
        d.stop().unwrap();
    });
    proxy.take();
    // Docker, as kind's users pull: v1, then v2, into each image store,
    // the bytes counted at the registry's door (issue 44.1; make bench
    // (n)). The classic store downloads every layer after the first one
    // it lacks (by chain): the order decides what it fetches again.
    for store in [Store::Classic, Store::Containerd] {
        let d = Dockerd::start(store, &[&proxy.addr()]).unwrap();
        d.run(&["pull", &format!("{}/kiln/node:v1.31.2", proxy.addr())]);
        proxy.take();
        for (tag, changed, what) in [
            ("v1.31.3", changed, "v2 after v1"),
            ("v1.31.3-etcd", changed3, "v3 after v2"),
        ] {
            d.run(&["pull", &format!("{}/kiln/node:{tag}", proxy.addr())]);
            let pulled: u64 = blob_bytes_pulled(&proxy.take());
            eprintln!("docker pull of {what} ({store:?} store): {pulled} blob bytes from the registry; {changed} bytes changed");
            assert!(
                pulled as f64 <= 1.05 * changed as f64 + (2 * MIB) as f64,
                "{store:?}: docker pulled {pulled} for {what}, changed {changed}"
            );
        }
        // What Docker unpacked: v2's etcd blob, kept in its layer, is
        // whited out; v3's is there.
        let export = env.path(&format!("export-{store:?}.tar"));
        let image = format!("{}/kiln/node:v1.31.3-etcd", proxy.addr());
        let id = d.run(&["create", "--entrypoint", "/kiln-none", &image]);
        d.run(&["export", "-o", export.to_str().unwrap(), id.trim()]);
        let mut tar = tar::Archive::new(std::fs::File::open(&export).unwrap());
        let blobs_in: BTreeSet<String> = tar
            .entries()
            .unwrap()
            .filter_map(|e| {
                let e = e.unwrap();
                let p = e.path().unwrap().display().to_string();
                p.strip_prefix("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256/")
                    .map(|h| format!("sha256:{h}"))
            })
            .collect();
        assert!(
            !blobs_in.contains(etcd_v2),
            "{store:?}: v2's etcd blob in v3's tree"
        );
        for b in blobs(&v3).keys().filter(|b| !b2.contains_key(*b)) {
            assert!(
                blobs_in.contains(b),
                "{store:?}: v3's {b} is not in its tree"
            );
        }
        let _ = std::fs::remove_file(&export);
    }

    // skopeo into one OCI layout: the same, from the other side.
    let layout = env.path("skopeo-layout");
    let copy = |tag: &str| {
        let o = kiln_testkit::tools::skopeo()
            .args([
                "--insecure-policy",
                "copy",
                "--src-tls-verify=false",
                &format!("docker://{}/kiln/node:{tag}", proxy.addr()),
                &format!("oci:{}:{tag}", layout.display()),
            ])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    copy("v1.31.2");
    proxy.take();
    copy("v1.31.3");
    let pulled: u64 = blob_bytes_pulled(&proxy.take());
    eprintln!("v2 skopeo copy after v1: {pulled} blob bytes from the registry");
    assert!(
        pulled as f64 <= 1.05 * changed as f64 + (2 * MIB) as f64,
        "skopeo pulled {pulled}, changed {changed}"
    );
}

/// A differential bundle holds the new release's layers and every
/// document; built from with the bundle before it, offline; refused alone,
/// naming what it lacks and the bundle that holds it.
#[test]
fn a_differential_bundle_carries_only_the_new_layers_and_builds_with_the_old_one() {
    let mut env = Env::new();
    let v1 = env.registry.seed(&release_set("v1.31.2", 51)).expect("v1");
    let v2 = env.registry.seed(&release_set("v1.31.3", 52)).expect("v2");
    let (m1, m2) = (manifest(&env, "v1.31.2"), manifest(&env, "v1.31.3"));
    let mirror = env.mirror();
    let bundle = |m: &std::path::Path, out: &std::path::Path, since: Option<&std::path::Path>| {
        let mut args = vec![
            "bundle",
            "--manifest",
            m.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--mirror",
            &mirror,
            "--json",
        ];
        if let Some(s) = since {
            args.extend(["--since", s.to_str().unwrap()]);
        }
        let o = kiln(&args);
        assert_ok(&o);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (old, new, full) = (
        env.path("v1.tar"),
        env.path("v2-since-v1.tar"),
        env.path("v2.tar"),
    );
    bundle(&m1, &old, None);
    // A `docker save` archive is no bundle to leave layers to: refused
    // before anything is fetched.
    let saved = env.path("saved.tar");
    let etcd = v1.iter().find(|i| i.repo == "delta/etcd").unwrap();
    std::fs::write(
        &saved,
        kiln_testkit::archive::docker_save_legacy(&[(
            &etcd.platforms[0],
            &["registry.k8s.io/delta/etcd:3.5.16-0"],
        )]),
    )
    .unwrap();
    let refused = kiln(&[
        "bundle",
        "--manifest",
        m2.to_str().unwrap(),
        "--output",
        env.path("never.tar").to_str().unwrap(),
        "--mirror",
        &mirror,
        "--since",
        saved.to_str().unwrap(),
    ]);
    assert_fails(&refused, 2, &["--since", "saved.tar", "not a bundle"]);
    assert!(!env.path("never.tar.kiln-staging").exists());
    let r = bundle(&m2, &new, Some(&old));
    bundle(&m2, &full, None);
    // v1's layers the new release keeps are left out: the shared base,
    // etcd's binary layer, and pause's and etcd's own (unchanged tags).
    assert_eq!(r["since"]["layersLeftOut"], 4, "{r:#}");
    assert_eq!(r["since"]["bundle"], "v1.tar");
    let size = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    let (b1, b2) = (blobs(&v1), blobs(&v2));
    let changed: u64 = b2
        .iter()
        .filter(|(d, _)| !b1.contains_key(*d))
        .map(|(_, n)| n)
        .sum();
    eprintln!(
        "differential bundle {} bytes, full {} bytes, changed {changed} bytes",
        size(&new),
        size(&full)
    );
    assert!(
        (size(&new) as f64) <= 1.05 * changed as f64 + (2 * MIB) as f64,
        "differential {} vs changed {changed}",
        size(&new)
    );
    assert!(size(&new) + 3 * MIB < size(&full));

    // An OLD whose copy of a layer is damaged (same name and size, one
    // byte changed): that layer is verified, found wrong, and carried in
    // NEW rather than left to a copy that is nowhere (issue 44.7).
    let etcd_kept = &v1
        .iter()
        .find(|i| i.repo == "delta/etcd")
        .unwrap()
        .platforms[0]
        .layers[1]
        .blob
        .digest;
    let bad = env.path("v1-damaged.tar");
    std::fs::copy(&old, &bad).unwrap();
    let at = {
        let mut ar = tar::Archive::new(std::fs::File::open(&bad).unwrap());
        let name = format!("blobs/sha256/{}", etcd_kept.trim_start_matches("sha256:"));
        let e = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.path().unwrap().to_string_lossy() == name)
            .expect("the layer is in v1.tar");
        e.raw_file_position() + e.size() / 2
    };
    let mut bytes = std::fs::read(&bad).unwrap();
    bytes[at as usize] ^= 0xff;
    std::fs::write(&bad, &bytes).unwrap();
    let r_bad = bundle(&m2, &env.path("v2-since-damaged.tar"), Some(&bad));
    assert_eq!(r_bad["since"]["layersLeftOut"], 3, "{r_bad:#}");

    // Offline from here on.
    env.registry.stop();
    let rootfs = env.path("rootfs");
    let build = |from: &[&std::path::Path]| {
        let mut args = vec![
            "build".to_string(),
            "--manifest".into(),
            m2.display().to_string(),
            "--rootfs".into(),
            rootfs.display().to_string(),
        ];
        for f in from {
            args.extend(["--from".into(), f.display().to_string()]);
        }
        kiln(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let alone = build(&[&new]);
    assert_eq!(alone.status.code(), Some(2), "{}", stderr(&alone));
    let err = stderr(&alone);
    // The same in v2: etcd did not change.
    let etcd_layer = etcd_kept;
    assert!(
        err.contains("registry.k8s.io/delta/etcd:3.5.16-0")
            && err.contains(etcd_layer.as_str())
            && err.contains("pass --from v1.tar too"),
        "{err}"
    );
    assert!(
        !rootfs.exists(),
        "a refused build wrote {}",
        rootfs.display()
    );
    // Its since.json names v1.tar's index: another bundle beside it (here
    // v2's full one, which holds every blob) is refused by name.
    let other = build(&[&new, &full]);
    assert_eq!(other.status.code(), Some(2), "{}", stderr(&other));
    assert!(
        stderr(&other).contains("was made --since a bundle whose index.json is"),
        "{}",
        stderr(&other)
    );
    // Two copies of the etcd layer, the later one damaged: the one that
    // verifies is taken, whatever the order of --from.
    let damaged_pair = build(&[&env.path("v2-since-damaged.tar"), &bad]);
    assert_ok(&damaged_pair);
    std::fs::remove_dir_all(&rootfs).unwrap();
    let both = build(&[&new, &old]);
    assert_ok(&both);
    let view = inspect(&rootfs);
    for name in [
        "registry.k8s.io/delta/pause:3.10",
        "registry.k8s.io/delta/etcd:3.5.16-0",
        "registry.k8s.io/delta/kube-apiserver:v1.31.3",
        "registry.k8s.io/delta/kube-proxy:v1.31.3",
    ] {
        let r = report(&view, name).unwrap_or_else(|| panic!("{name}: {view:#}"));
        assert_eq!(
            (r["pinned"].as_bool(), r["complete"].as_bool()),
            (Some(true), Some(true)),
            "{r}"
        );
    }
}

/// A warm rebuild compresses nothing twice: zstd layers of blobs come from
/// the cache, byte for byte the same; a cached layer changed on disk is
/// noticed and compressed again.
#[test]
fn a_warm_rebuild_takes_compressed_layers_from_the_cache() {
    let env = Env::new();
    env.registry
        .seed(&release_set("v1.31.2", 61))
        .expect("seed");
    env.registry
        .push(&kind_base(&[&host_platform()]))
        .expect("base");
    let m = manifest(&env, "v1.31.2");
    let cache = env.path("cache");
    let build = |out: &str| {
        let mirror = env.mirror();
        let base = format!("{}/kindest/base:test", env.registry.addr);
        let o = kiln_env(
            &[
                "build",
                "--manifest",
                m.to_str().unwrap(),
                "--base",
                &base,
                "--mirror",
                &mirror,
                "--layer-compression",
                "zstd",
                "--cache-dir",
                cache.to_str().unwrap(),
                "--output",
                &format!("oci-archive:{}", env.path(out).display()),
                "--json",
            ],
            &[("SOURCE_DATE_EPOCH", "1700000000")],
        );
        assert_ok(&o);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let cold = build("cold.tar");
    let warm = build("warm.tar");
    assert_eq!(cold["digest"], warm["digest"]);
    let layers = |r: &serde_json::Value| -> Vec<(String, bool, String)> {
        r["kilnLayers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["digest"].as_str().unwrap().to_string(),
                    l["cached"].as_bool().unwrap(),
                    l["holds"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let (c, w) = (layers(&cold), layers(&warm));
    assert!(c.iter().all(|(_, cached, _)| !cached), "{c:?}");
    // Every blob layer from the cache; documents and the node's records,
    // cheap or new every build, written again.
    for (digest, cached, holds) in &w {
        let blobs = holds.contains("content blob") || holds.contains("small image layers");
        assert_eq!(*cached, blobs, "{holds} {digest}");
    }
    assert!(w.iter().filter(|l| l.1).count() >= 4, "{w:?}");
    // A cached layer changed on disk (same size, mode and kiln's mtime
    // mark set back, so only the re-hash can tell) is compressed again and
    // its entry replaced (issue 44.6).
    let (digest, _, _) = w.iter().find(|l| l.1).unwrap();
    let entry = cache
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let original = std::fs::read(&entry).unwrap();
    let mut bytes = original.clone();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let mut perm = std::fs::metadata(&entry).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o644);
    std::fs::set_permissions(&entry, perm.clone()).unwrap();
    std::fs::write(&entry, &bytes).unwrap();
    // kiln's mark (sink::cache::MARK): 1 s and 802,071,150 ns.
    let mark = std::time::UNIX_EPOCH + std::time::Duration::new(1, 802_071_150);
    std::fs::File::options()
        .write(true)
        .open(&entry)
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(mark))
        .unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o444);
    std::fs::set_permissions(&entry, perm).unwrap();
    let again = build("again.tar");
    assert_eq!(again["digest"], cold["digest"]);
    let redone = layers(&again);
    let l = redone.iter().find(|l| l.0 == *digest).unwrap();
    assert!(!l.1, "a changed cache entry was used: {l:?}");
    assert_eq!(
        std::fs::read(&entry).unwrap(),
        original,
        "the corrupt entry was kept"
    );
}
