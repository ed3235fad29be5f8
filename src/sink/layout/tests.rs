use super::*;
use crate::sink::Sink;

/// Issue 39.3: a "small" read of a stored blob is refused by its size
/// before it is read whole (a reused or hostile directory may hold
/// gigabytes under a digest a document names).
#[tokio::test]
async fn a_document_read_refuses_a_blob_over_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let layout = OciLayout::open(dir.path()).unwrap();
    let big = vec![b' '; crate::primitives::oci::MAX_DOCUMENT_BYTES as usize + 1];
    let d = Digest::of(&big);
    std::fs::create_dir_all(layout.blobs_dir()).unwrap();
    std::fs::write(layout.blob_path(&d), &big).unwrap();
    let e = layout.read(&d).await.unwrap_err();
    assert!(
        format!("{e:#}").contains("where a manifest or config was expected"),
        "{e:#}"
    );
    let small = b"{}".to_vec();
    let s = Digest::of(&small);
    std::fs::write(layout.blob_path(&s), &small).unwrap();
    assert_eq!(layout.read(&s).await.unwrap().unwrap(), &small[..]);
}

/// Issue 39.4: a staging directory kept from a failed run is reused
/// only for blobs whose bytes are their names (it was trusted by size).
#[tokio::test]
async fn a_reused_staging_keeps_only_blobs_that_hash_to_their_names() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("b.tar.kiln-staging");
    let (layout, kept) = OciLayout::reopen_verified(&staging).unwrap();
    assert_eq!(kept, 0);
    let mode = std::fs::metadata(&staging).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let good = b"good".to_vec();
    let g = Digest::of(&good);
    std::fs::write(layout.blob_path(&g), &good).unwrap();
    // Same size, other bytes, under a name: what `has` trusted.
    let planted = Digest::of(b"real");
    std::fs::write(layout.blob_path(&planted), b"fake").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", layout.blobs_dir().join("x")).unwrap();
    drop(layout);
    let (layout, kept) = OciLayout::reopen_verified(&staging).unwrap();
    assert_eq!(kept, 1);
    let desc = |d: &Digest| Descriptor::new("application/octet-stream", d.clone(), 4);
    assert!(layout.has(&desc(&g)).await.unwrap());
    assert!(!layout.has(&desc(&planted)).await.unwrap());
    assert!(std::fs::symlink_metadata(layout.blobs_dir().join("x")).is_err());
    // A staging others can write is refused in one line.
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o777)).unwrap();
    let Err(e) = OciLayout::reopen_verified(&staging) else {
        panic!("a staging others can write was reused");
    };
    let e = format!("{e:#}");
    assert!(e.contains("writable by others"), "{e}");
}
