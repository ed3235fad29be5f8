//! The unpack walk's unit tests.
use super::*;
use std::path::PathBuf;

fn layer(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> tempfile::NamedTempFile {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data, link) in entries {
        let mut h = tar::Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(if *kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), b.into_inner().unwrap()).unwrap();
    f
}

use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as S};

#[test]
fn whiteouts_opaque_dirs_and_links() {
    let root = tempfile::tempdir().unwrap();
    let l1 = layer(&[
        ("etc/", D, b"", ""),
        ("etc/old", F, b"old", ""),
        ("etc/keep", F, b"keep", ""),
        ("opq/a", F, b"a", ""),
        ("opq/b", F, b"b", ""),
        ("lnk", S, b"", "etc/keep"),
        ("hard", H, b"", "etc/keep"),
    ]);
    let l2 = layer(&[
        ("opq/c", F, b"c", ""),
        ("etc/.wh.old", F, b"", ""),
        ("opq/.wh..wh..opq", F, b"", ""),
    ]);
    apply_layer(root.path(), l1.path()).unwrap();
    apply_layer(root.path(), l2.path()).unwrap();
    let r = root.path();
    assert!(!r.join("etc/old").exists());
    assert_eq!(std::fs::read(r.join("etc/keep")).unwrap(), b"keep");
    let mut opq: Vec<String> = std::fs::read_dir(r.join("opq"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    opq.sort();
    assert_eq!(opq, ["c"], "opaque dir keeps only this layer's entries");
    assert_eq!(
        std::fs::read_link(r.join("lnk")).unwrap(),
        PathBuf::from("etc/keep")
    );
    assert_eq!(std::fs::read(r.join("hard")).unwrap(), b"keep");
}

#[test]
fn a_part_is_extracted_with_its_whiteouts_and_owners() {
    fn only(p: &Path) -> bool {
        Path::new("etc/containerd").starts_with(p) || p.starts_with("etc/containerd")
    }
    let root = tempfile::tempdir().unwrap();
    let l1 = layer(&[
        ("etc/", D, b"", ""),
        ("etc/containerd/", D, b"", ""),
        ("etc/containerd/config.toml", F, b"v=2", ""),
        ("etc/containerd/old", F, b"old", ""),
        ("etc/passwd", F, b"root", ""),
        ("usr/share/doc", F, b"doc", ""),
    ]);
    let l2 = layer(&[
        ("etc/containerd/.wh.old", F, b"", ""),
        ("etc/.wh.passwd", F, b"", ""),
    ]);
    let mut owners = Owners::new(only);
    for l in [&l1, &l2] {
        let mut budget = Budget::new(Limits::default(), only);
        apply_layer_part(root.path(), l.path(), &mut owners, only, &mut budget, None).unwrap();
    }
    let r = root.path();
    assert_eq!(
        std::fs::read(r.join("etc/containerd/config.toml")).unwrap(),
        b"v=2"
    );
    assert!(!r.join("etc/containerd/old").exists());
    assert!(!r.join("etc/passwd").exists() && !r.join("usr").exists());
    assert_eq!(
        owners.get(Path::new("etc/containerd/config.toml")),
        Some((0, 0))
    );
    assert_eq!(
        owners.get(Path::new("etc/containerd/old")),
        None,
        "whited out"
    );
    assert_eq!(owners.get(Path::new("etc/passwd")), None, "not tracked");
}

#[test]
fn limits_end_an_image_that_holds_too_much_where_kiln_unpacks() {
    fn counted(p: &Path) -> bool {
        p.starts_with("store")
    }
    let deep: String = (0..10).map(|i| format!("d{i}/")).collect();
    let deep = format!("store/{deep}");
    let big = vec![0u8; 3000];
    let l = layer(&[
        ("elsewhere/a", F, b"x", ""),
        ("elsewhere/b", F, b"x", ""),
        ("elsewhere/c", F, b"x", ""),
        ("store/", D, b"", ""),
        ("store/a", F, &big, ""),
        ("store/b", F, b"x", ""),
        (&deep, D, b"", ""),
    ]);
    let run = |limits: Limits| {
        let root = tempfile::tempdir().unwrap();
        let mut budget = Budget::new(limits, counted);
        let r = apply_layer_guarded(root.path(), l.path(), counted, &mut budget);
        r.map_err(|e| {
            assert!(
                e.chain()
                    .any(|c| c.is::<crate::primitives::error::BadInput>()),
                "{e:#}"
            );
            format!("{e:#}")
        })
    };
    let plenty = Limits {
        entries: 4,
        bytes: 3001,
        depth: 11,
    };
    run(plenty).expect("entries elsewhere do not count");
    let e = run(Limits {
        entries: 3,
        ..plenty
    })
    .unwrap_err();
    assert!(
        e.contains("more than 3 entries") && e.contains("--max-entries"),
        "{e}"
    );
    let e = run(Limits {
        bytes: 3000,
        ..plenty
    })
    .unwrap_err();
    assert!(e.contains("store/b") && e.contains("--max-bytes"), "{e}");
    let e = run(Limits {
        depth: 10,
        ..plenty
    })
    .unwrap_err();
    assert!(e.contains("10 levels") && e.contains("--max-depth"), "{e}");
}

/// Issue 39.1: the budget charges what an entry writes. A PAX `size`
/// record overrides a ustar size of 0, and a GNU sparse entry is
/// written at its logical size; both were charged their header's size.
#[test]
fn the_budget_charges_pax_and_sparse_sizes_as_written() {
    fn counted(_: &Path) -> bool {
        true
    }
    let limits = Limits {
        bytes: 1000,
        ..Limits::default()
    };
    let pax = kiln_testkit::base::pax_sized_tar("store/pax", &[7u8; 4096]);
    let sparse = kiln_testkit::base::sparse_tar("store/sparse", 1 << 20, &[1u8; 512]);
    for (tar, name) in [(pax, "store/pax"), (sparse, "store/sparse")] {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &tar).unwrap();
        let root = tempfile::tempdir().unwrap();
        let mut budget = Budget::new(limits, counted);
        let e = apply_layer_guarded(root.path(), f.path(), counted, &mut budget).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains(name)
                && text.contains("more than 1000 bytes")
                && text.contains("--max-bytes"),
            "{text}"
        );
        assert!(!root.path().join(name).exists(), "{name} was written");
        // Within the limit, the same entries are written at that size.
        let root = tempfile::tempdir().unwrap();
        let mut budget = Budget::new(Limits::default(), counted);
        apply_layer_guarded(root.path(), f.path(), counted, &mut budget).unwrap();
        let len = std::fs::metadata(root.path().join(name)).unwrap().len();
        assert_eq!(len, if name.ends_with("pax") { 4096 } else { 1 << 20 });
    }
}

#[test]
fn hostile_entries_stay_inside() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let o = outside.path().display().to_string();
    let dotdot = format!("../../../../../../../../../..{o}/dotdot");
    let rel = format!("../../../../../../../../..{o}");
    let absolute = format!("{o}/absolute");
    let l1 = layer(&[
        (&dotdot, F, b"x", ""),
        ("escape", S, b"", &o),
        ("rel", S, b"", &rel),
        (&absolute, F, b"x", ""),
    ]);
    let l2 = layer(&[
        ("escape/pwned", F, b"x", ""),
        ("rel/pwned2", F, b"x", ""),
        ("hl", H, b"", "escape/../../../etc/passwd"),
    ]);
    apply_layer(root.path(), l1.path()).unwrap();
    let _ = apply_layer(root.path(), l2.path());
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "something was written outside the rootfs"
    );
    // Clamped inside instead.
    assert!(root
        .path()
        .join(o.trim_start_matches('/'))
        .join("pwned")
        .exists());
    assert!(root
        .path()
        .join(o.trim_start_matches('/'))
        .join("dotdot")
        .exists());
}
