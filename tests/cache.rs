//! The content cache builds share (`--cache-dir`, `kiln cache`): a second
//! build of digest-pinned images needs no registry; what it stores is the
//! same; a damaged entry is never used; several kilns share one cache; a
//! node image built from the cache is byte-identical to one built without.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common::*;
use kiln_testkit::base::kind_base;
use kiln_testkit::image::host_platform;

/// Nothing listens here: a build that reaches for the network fails.
const DEAD: &str = "registry.k8s.io=http://127.0.0.1:1";

const REPOS: &[(&str, &str)] = &[
    ("pause", "3.10"),
    ("etcd", "3.5.16-0"),
    ("coredns/coredns", "v1.11.3"),
];

/// A manifest of the fixture images pinned by digest (tag and digest).
fn pinned_manifest(env: &Env) -> std::path::PathBuf {
    let refs: Vec<String> = REPOS
        .iter()
        .map(|(r, t)| format!("registry.k8s.io/{r}:{t}@{}", env.image(r).top.digest))
        .collect();
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    env.manifest("pinned.yaml", refs[0], &refs)
}

fn stats(o: &std::process::Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["stats"].clone()
}

fn entries(cache: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(cache.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

/// Every blob in a rootfs's store holds the bytes its name says.
fn assert_blobs_hash_to_their_names(rootfs: &Path) {
    let dir = rootfs.join("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256");
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let d = kiln::primitives::digest::Digest::of(&std::fs::read(&p).unwrap());
        assert_eq!(
            d.hex(),
            p.file_name().unwrap().to_str().unwrap(),
            "{}",
            p.display()
        );
    }
}

#[test]
fn a_second_build_of_pinned_images_needs_no_registry_and_stores_the_same() {
    let env = Env::new();
    let m = pinned_manifest(&env);
    let cache = env.path("cache");
    let c = cache.to_str().unwrap();
    let (r1, r2) = (env.path("r1"), env.path("r2"));
    let first = env.build(&m, &r1, &["--cache-dir", c, "--json"]);
    assert_ok(&first);
    assert_eq!(stats(&first)["blobsCached"], 0);
    assert!(stats(&first)["bytesFetched"].as_u64().unwrap() > 0);

    // The registry is out of reach: everything comes from the cache.
    let second = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        r2.to_str().unwrap(),
        "--mirror",
        DEAD,
        "--cache-dir",
        c,
        "--json",
    ]);
    assert_ok(&second);
    let s = stats(&second);
    assert_eq!(
        (s["blobsFetched"].as_u64(), s["bytesFetched"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    assert!(s["blobsCached"].as_u64().unwrap() > 0, "{s}");
    let (a, b) = (
        assert_all_pinned_complete(&r1, Some(REPOS.len())),
        assert_all_pinned_complete(&r2, Some(REPOS.len())),
    );
    let digests = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| format!("{} {}", r["name"], r["digest"]))
            .collect()
    };
    assert_eq!(digests(&a), digests(&b));
    // A user's rootfs shares an inode with the cache only where the entry
    // is marked lent (re-hashed before any run uses it: the rootfs's root
    // could write through it); a clone or a copy shares none.
    let blobs = r2.join("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256");
    for entry in entries(&cache) {
        let name = entry.file_name().unwrap();
        let stored = blobs.join(name);
        if let Ok(m) = std::fs::metadata(&stored) {
            if m.ino() == std::fs::metadata(&entry).unwrap().ino() {
                assert!(
                    cache.join("lent").join(name).exists(),
                    "{} shared, unmarked",
                    stored.display()
                );
            }
        }
    }
    assert_blobs_hash_to_their_names(&r2);

    let ls = kiln(&["cache", "ls", "--cache-dir", c, "--json"]);
    assert_ok(&ls);
    let listing: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(
        listing["entries"].as_array().unwrap().len(),
        entries(&cache).len()
    );
    let pruned = kiln(&[
        "cache",
        "prune",
        "--cache-dir",
        c,
        "--max-size",
        "0",
        "--json",
    ]);
    assert_ok(&pruned);
    let p: serde_json::Value = serde_json::from_slice(&pruned.stdout).unwrap();
    assert_eq!(
        (p["kept"].as_u64(), p["keptBytes"].as_u64()),
        (Some(0), Some(0)),
        "{p}"
    );
    assert!(entries(&cache).is_empty());
}

/// Issue 38.1: a cold build with the cache writes each byte once (on a
/// filesystem without clones, the rootfs gets a hard link to the entry,
/// marked lent), and the cache stays trustworthy: a lent entry rewritten
/// through the rootfs, its mtime set back to kiln's mark (all a booted
/// node's root could do), is re-hashed before use and fetched again.
#[test]
fn a_cold_build_writes_once_and_a_lent_entry_changed_in_the_rootfs_is_caught() {
    let env = Env::new();
    let m = pinned_manifest(&env);
    let cache = env.path("cache");
    let c = cache.to_str().unwrap();
    let r1 = env.path("r1");
    assert_ok(&env.build(&m, &r1, &["--cache-dir", c]));
    let blobs = r1.join("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256");
    let layer = env.image("etcd").platforms[0].layers[0].blob.digest.clone();
    let hex = layer.trim_start_matches("sha256:");
    let (stored, entry) = (blobs.join(hex), cache.join("blobs/sha256").join(hex));
    let shared =
        std::fs::metadata(&stored).unwrap().ino() == std::fs::metadata(&entry).unwrap().ino();
    if !shared {
        // A filesystem with clones: nothing is shared, nothing to attack.
        eprintln!("this filesystem clones: the rootfs shares no inode with the cache");
        return;
    }
    assert!(cache.join("lent").join(hex).exists());
    // Issue 47.5: a warm build into another rootfs reads no lent entry
    // again (their inodes unchanged since kiln linked them), and fetches
    // nothing.
    let rehashed = |o: &std::process::Output| {
        stderr(o)
            .lines()
            .filter(|l| l.contains("re-hashing a lent cache entry"))
            .count()
    };
    let build_logged = |r: &str| {
        let rootfs = env.path(r);
        kiln_env(
            &[
                "build",
                "--manifest",
                m.to_str().unwrap(),
                "--rootfs",
                rootfs.to_str().unwrap(),
                "--mirror",
                &env.mirror(),
                "--cache-dir",
                c,
                "--json",
            ],
            &[("RUST_LOG", "kiln=debug")],
        )
    };
    let warm = build_logged("r1b");
    assert_ok(&warm);
    assert_eq!(
        stats(&warm)["blobsFetched"].as_u64(),
        Some(0),
        "{}",
        stats(&warm)
    );
    assert_eq!(rehashed(&warm), 0, "{}", stderr(&warm));
    // The node's root rewrites its blob in place and covers its tracks.
    let before = std::fs::metadata(&entry).unwrap();
    std::fs::set_permissions(&stored, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&stored, &bytes).unwrap();
    std::fs::set_permissions(&stored, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::File::open(&stored)
        .unwrap()
        .set_times(
            std::fs::FileTimes::new()
                .set_modified(before.modified().unwrap())
                .set_accessed(before.accessed().unwrap()),
        )
        .unwrap();
    assert_eq!(
        std::fs::metadata(&entry).unwrap().modified().unwrap(),
        before.modified().unwrap()
    );
    let again = build_logged("r2");
    assert_ok(&again);
    assert!(
        stats(&again)["blobsFetched"].as_u64().unwrap() >= 1,
        "{}",
        stats(&again)
    );
    // Only the changed entry was read again: its ctime moved.
    assert_eq!(rehashed(&again), 1, "{}", stderr(&again));
    assert!(stderr(&again).contains("was changed there; fetching it again"));
    assert_blobs_hash_to_their_names(&env.path("r2"));
    assert_ok(&kiln(&["cache", "ls", "--check", "--cache-dir", c]));
}

#[test]
fn a_damaged_entry_is_never_used_and_is_reported() {
    let env = Env::new();
    let m = pinned_manifest(&env);
    let cache = env.path("cache");
    let c = cache.to_str().unwrap();
    assert_ok(&env.build(&m, &env.path("r1"), &["--cache-dir", c]));
    // Rewritten in place, same size, read-only again: what a tool writing
    // through a hard link would leave.
    let damage = |p: &Path| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut bytes = std::fs::read(p).unwrap();
        bytes[0] ^= 0xff;
        std::fs::write(p, &bytes).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o444)).unwrap();
    };
    let layer = &env.image("etcd").platforms[0].layers[0].blob.digest;
    let entry = cache
        .join("blobs/sha256")
        .join(layer.trim_start_matches("sha256:"));
    damage(&entry);
    let again = env.build(&m, &env.path("r2"), &["--cache-dir", c, "--json"]);
    assert_ok(&again);
    assert!(
        stats(&again)["blobsFetched"].as_u64().unwrap() >= 1,
        "{}",
        stats(&again)
    );
    assert_all_pinned_complete(&env.path("r2"), Some(REPOS.len()));
    assert_blobs_hash_to_their_names(&env.path("r2"));
    // The build wrote the entry again: the cache is whole.
    assert_ok(&kiln(&["cache", "ls", "--check", "--cache-dir", c]));

    damage(&entry);
    let name = entry.file_name().unwrap().to_str().unwrap().to_string();
    let ls = kiln(&["cache", "ls", "--cache-dir", c]);
    assert_fails(&ls, 1, &["1 cache entries are damaged", "kiln cache prune"]);
    assert!(
        stdout(&ls).contains(&format!("sha256:{name}")) && stdout(&ls).contains("DAMAGED"),
        "{}",
        stdout(&ls)
    );
    let p = kiln(&["cache", "prune", "--cache-dir", c, "--json"]);
    assert_ok(&p);
    let p: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(p["removed"], 1, "{p}");
    assert!(!entry.exists());
    assert_ok(&kiln(&["cache", "ls", "--check", "--cache-dir", c]));
}

#[test]
fn several_kilns_share_one_cold_cache() {
    let env = Env::new();
    let m = pinned_manifest(&env);
    let cache = env.path("cache");
    let c = cache.to_str().unwrap();
    let mirror = env.mirror();
    let outputs: Vec<_> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..3)
            .map(|n| {
                let rootfs = env.path(&format!("r{n}"));
                let (m, mirror) = (&m, &mirror);
                scope.spawn(move || {
                    kiln(&[
                        "build",
                        "--manifest",
                        m.to_str().unwrap(),
                        "--rootfs",
                        rootfs.to_str().unwrap(),
                        "--mirror",
                        mirror,
                        "--cache-dir",
                        c,
                    ])
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for o in &outputs {
        assert_ok(o);
    }
    for n in 0..3 {
        assert_all_pinned_complete(&env.path(&format!("r{n}")), Some(REPOS.len()));
    }
    // Every entry whole, no temporary file left visible.
    assert_ok(&kiln(&["cache", "ls", "--check", "--cache-dir", c]));
    assert_eq!(std::fs::read_dir(cache.join("tmp")).unwrap().count(), 0);
}

#[test]
fn the_default_cache_is_under_xdg_cache_home() {
    let env = Env::new();
    let m = pinned_manifest(&env);
    let xdg = env.path("xdg");
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            env.path("r").to_str().unwrap(),
            "--mirror",
            &env.mirror(),
        ],
        &[
            ("XDG_CACHE_HOME", xdg.to_str().unwrap()),
            ("KILN_NO_CACHE", ""),
        ],
    );
    assert_ok(&o);
    assert!(!entries(&xdg.join("kiln")).is_empty());
    let ls = kiln_env(
        &["cache", "ls"],
        &[("XDG_CACHE_HOME", xdg.to_str().unwrap())],
    );
    assert_ok(&ls);
    assert!(
        stdout(&ls).contains(&format!("cache {}", xdg.join("kiln").display())),
        "{}",
        stdout(&ls)
    );
}

#[test]
fn a_node_image_from_the_cache_is_byte_identical_to_one_without() {
    let env = Env::new();
    let base = kind_base(&[&host_platform()]);
    env.registry.push(&base).unwrap();
    let base_ref = format!(
        "{}/kindest/base:test@{}",
        env.registry.addr, base.top.digest
    );
    let m = pinned_manifest(&env);
    let cache = env.path("cache");
    let c = cache.to_str().unwrap();
    let mirror = env.mirror();
    let node = |out: &str, mirror: &str, extra: &[&str]| {
        let archive = env.path(out);
        let mut args = vec![
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--base",
            &base_ref,
            "--mirror",
            mirror,
            "--output",
        ];
        let output = format!("oci-archive:{}", archive.display());
        args.push(&output);
        args.extend(extra);
        assert_ok(&kiln_env(&args, &[("SOURCE_DATE_EPOCH", "1700000000")]));
        std::fs::read(archive).unwrap()
    };
    let cold = node("cold.tar", &mirror, &["--cache-dir", c]);
    // The base is pinned by digest too: the warm build reaches nothing.
    let warm = node("warm.tar", DEAD, &["--cache-dir", c]);
    let none = node("none.tar", &mirror, &["--no-cache"]);
    let sum = |b: &[u8]| kiln::primitives::digest::Digest::of(b).to_string();
    assert_eq!(sum(&cold), sum(&none));
    assert_eq!(sum(&warm), sum(&none));
    // The base's layers are cached too.
    for layer in base.platforms[0].layers.iter() {
        assert!(
            cache
                .join("blobs/sha256")
                .join(layer.blob.digest.trim_start_matches("sha256:"))
                .exists(),
            "base layer {} not cached",
            layer.blob.digest
        );
    }
}
