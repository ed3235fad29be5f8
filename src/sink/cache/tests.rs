use super::lending::lend;
use super::*;

fn desc(bytes: &[u8]) -> Descriptor {
    Descriptor::new(
        "application/octet-stream",
        Digest::of(bytes),
        bytes.len() as u64,
    )
}

fn stream(bytes: &'static [u8]) -> BlobStream {
    Box::pin(futures_util::stream::once(async move {
        Ok(Bytes::from_static(bytes))
    }))
}

#[tokio::test]
async fn an_entry_is_used_until_anything_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let d = desc(b"layer bytes");
    assert!(cache.get(&d).is_none());
    let path = cache.put_stream(&d, stream(b"layer bytes")).await.unwrap();
    assert_eq!(cache.get(&d), Some(path.clone()));
    assert_eq!(std::fs::read(&path).unwrap(), b"layer bytes");
    // Someone makes it writable and rewrites it: no longer trusted.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&path, b"layer bytez").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    assert!(cache.get(&d).is_none());
    assert!(!cache.list(false).unwrap().entries[0].intact);
}

/// Issue 39.4: a cache another user can write is refused (it could
/// plant an entry that passes the cheap check), and an entry another
/// user owns is not used.
#[tokio::test]
async fn a_cache_others_can_write_is_refused_and_their_entries_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    let cache = Cache::open(&c).unwrap();
    for sub in ["", "blobs", "blobs/sha256", "tmp"] {
        let mode = std::fs::metadata(c.join(sub)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{sub}");
    }
    let d = desc(b"planted");
    let path = cache.put_stream(&d, stream(b"planted")).await.unwrap();
    drop(cache);
    for (sub, mode) in [("", 0o777), ("blobs/sha256", 0o770), ("tmp", 0o702)] {
        std::fs::set_permissions(c.join(sub), std::fs::Permissions::from_mode(mode)).unwrap();
        let e = format!("{:#}", Cache::open(&c).unwrap_err());
        assert!(
            e.contains("writable by others") && e.contains("chmod go-w"),
            "{e}"
        );
        std::fs::set_permissions(c.join(sub), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let cache = Cache::open(&c).unwrap();
    assert_eq!(cache.get(&d), Some(path.clone()));
    if rustix::process::geteuid().is_root() {
        // Another user's file, every other mark right: not used.
        let other = Some(rustix::fs::Uid::from_raw(4242));
        rustix::fs::chown(&*path, other, None).unwrap();
        assert!(cache.get(&d).is_none());
        rustix::fs::chown(c.join("tmp"), other, None).unwrap();
        let e = format!("{:#}", Cache::open(&c).unwrap_err());
        assert!(e.contains("belongs to uid 4242"), "{e}");
    }
}

#[tokio::test]
async fn a_stream_that_fails_leaves_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let d = desc(b"whole");
    let bad: BlobStream = Box::pin(futures_util::stream::iter(vec![
        Ok(Bytes::from_static(b"who")),
        Err(anyhow!("digest mismatch")),
    ]));
    assert!(cache.put_stream(&d, bad).await.is_err());
    assert!(cache.get(&d).is_none());
    assert_eq!(
        std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
        0
    );
}

#[tokio::test]
async fn prune_keeps_the_most_recently_used_and_waits_for_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let (a, b) = (desc(b"aaaa"), desc(b"bbbb"));
    cache.put_stream(&a, stream(b"aaaa")).await.unwrap();
    cache.put_stream(&b, stream(b"bbbb")).await.unwrap();
    let old = SystemTime::now() - Duration::from_secs(3600);
    File::open(cache.entry(&a.digest))
        .unwrap()
        .set_times(FileTimes::new().set_accessed(old))
        .unwrap();
    // A run holds the cache: a prune that does not wait leaves it.
    assert!(Cache::prune(dir.path(), 4, false).unwrap().is_none());
    drop(cache);
    let p = Cache::prune(dir.path(), 4, false).unwrap().unwrap();
    assert_eq!((p.removed, p.kept, p.kept_bytes), (1, 1, 4));
    let cache = Cache::open(dir.path()).unwrap();
    assert!(cache.get(&a).is_none());
    assert!(cache.get(&b).is_some());
}

/// Issue 45.2: a directory that is not a kiln cache (an OCI layout, a
/// content store) is refused before anything in it is made or pruned;
/// an empty one is tagged; a cache from before the tag is adopted.
#[tokio::test]
async fn a_directory_that_is_not_a_kiln_cache_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::set_permissions(&layout, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(layout.join("blobs/sha256/aa"), b"theirs").unwrap();
    std::fs::write(layout.join("oci-layout"), b"{}").unwrap();
    let e = format!("{:#}", Cache::open(&layout).unwrap_err());
    assert!(e.contains("is not a kiln cache"), "{e}");
    assert!(Cache::prune(&layout, 0, true).is_err());
    assert_eq!(
        std::fs::read(layout.join("blobs/sha256/aa")).unwrap(),
        b"theirs"
    );
    let mut names: Vec<_> = std::fs::read_dir(&layout)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["blobs", "oci-layout"]);
    assert!(check(&layout).is_err());
    // A new directory is tagged; an old untagged cache is adopted.
    let fresh = dir.path().join("fresh");
    drop(Cache::open(&fresh).unwrap());
    assert!(std::fs::read_to_string(fresh.join(TAG))
        .unwrap()
        .starts_with("Signature: 8a477f597d28d172789f06886806bc55"));
    std::fs::remove_file(fresh.join(TAG)).unwrap();
    drop(Cache::open(&fresh).unwrap());
    assert!(fresh.join(TAG).exists());
}

/// Several kilns opening one new cache at once: the moment one has made
/// its tag's temporary file and not yet renamed it (the race
/// `several_kilns_share_one_cold_cache` once lost), another still opens
/// the directory as the empty one it is.
#[test]
fn another_kilns_tag_in_progress_is_not_someone_elses_file() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    std::fs::create_dir(&c).unwrap();
    std::fs::set_permissions(&c, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(c.join(".CACHEDIR.TAG.x7Qz"), b"Signature").unwrap();
    drop(Cache::open(&c).unwrap());
    assert!(std::fs::read_to_string(c.join(TAG))
        .unwrap()
        .contains("created by kiln"));
    // Anything else beside it is still refused.
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(d.join(".CACHEDIR.TAG.x7Qz"), b"").unwrap();
    std::fs::write(d.join("notes.txt"), b"mine").unwrap();
    let e = format!("{:#}", Cache::open(&d).unwrap_err());
    assert!(e.contains("is not a kiln cache"), "{e}");
}

/// Issue 45.5 and 45.7: `layers/` is checked as the others are, and
/// the doctor's look creates nothing.
#[test]
fn layers_is_checked_and_the_doctor_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    check(&c).unwrap();
    assert!(!c.exists());
    drop(Cache::open(&c).unwrap());
    std::fs::set_permissions(c.join("layers"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = format!("{:#}", Cache::open(&c).unwrap_err());
    assert!(e.contains("layers is writable by others"), "{e}");
    assert!(format!("{:#}", check(&c).unwrap_err()).contains("layers"));
    std::fs::set_permissions(c.join("layers"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::remove_dir(c.join("lent")).unwrap();
    std::fs::remove_file(c.join("lock")).unwrap();
    check(&c).unwrap();
    assert!(!c.join("lent").exists() && !c.join("lock").exists());
}

/// Issue 45.9: an entry whose mode is not kiln's 0444 is not intact
/// (a setuid bit would travel into node-image tars).
#[tokio::test]
async fn an_entry_with_another_mode_is_not_intact() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let d = desc(b"mode");
    let path = cache.put_stream(&d, stream(b"mode")).await.unwrap();
    assert!(cache.get(&d).is_some());
    for mode in [0o6555, 0o555, 0o440] {
        std::fs::set_permissions(&*path, std::fs::Permissions::from_mode(mode)).unwrap();
        assert!(cache.get(&d).is_none(), "{mode:o}");
        assert!(!cache.list(false).unwrap().entries[0].intact);
    }
}

/// Issue 45.9: a lent mark stays through a run's use (a concurrent run
/// may be lending the entry) and goes only in a prune, once no rootfs
/// shares the inode.
#[tokio::test]
async fn lent_marks_go_only_in_a_prune() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&dir.path().join("c")).unwrap();
    let d = desc(b"lent bytes");
    let kept = cache.put_stream(&d, stream(b"lent bytes")).await.unwrap();
    let rootfs_file = dir.path().join("in-a-rootfs");
    lend(&kept).unwrap();
    std::fs::hard_link(&*kept, &rootfs_file).unwrap();
    let mark = dir.path().join("c/lent").join(d.digest.hex());
    assert!(cache.get(&d).is_some());
    std::fs::remove_file(&rootfs_file).unwrap();
    assert!(cache.get(&d).is_some());
    assert!(mark.exists(), "a run dropped a mark");
    drop((cache, kept));
    Cache::prune(&dir.path().join("c"), u64::MAX, true).unwrap();
    assert!(!mark.exists());
}

/// Issue 44.6: a cached layer that fails its re-hash is removed, so the
/// next keep writes it again (the cheap check passes: only the re-hash
/// can catch it).
#[tokio::test]
async fn a_corrupt_layer_entry_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let bytes = b"compressed layer".to_vec();
    let d = desc(&bytes);
    let key = Digest::of(b"key");
    cache
        .keep_layer(&key, &d, serde_json::json!({"diffId": "x"}), &bytes[..])
        .unwrap();
    assert!(cache.layer(&key).is_some());
    // Same size, mode and mtime mark: only the bytes differ.
    let path = dir.path().join("blobs/sha256").join(d.digest.hex());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&path, b"compressed lazer").unwrap();
    let f = File::options().write(true).open(&path).unwrap();
    f.set_times(FileTimes::new().set_modified(SystemTime::UNIX_EPOCH + MARK))
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o444))
        .unwrap();
    drop(f);
    assert!(cache.layer(&key).is_none());
    assert!(!path.exists(), "the corrupt entry stayed");
    cache
        .keep_layer(&key, &d, serde_json::json!({"diffId": "x"}), &bytes[..])
        .unwrap();
    assert!(cache.layer(&key).is_some());
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}
