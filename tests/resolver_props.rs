//! Property tests for the in-root resolver: random layers of directories,
//! files, symlinks (relative, absolute, `..`-laden, pointing at a directory
//! outside), hard links and whiteouts, applied in random order, never write,
//! chmod or open anything outside the root.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use kiln::primitives::inroot::{Parents, Root};
use proptest::prelude::*;
use tar::EntryType;

#[derive(Debug, Clone)]
enum Op {
    Dir(String, u32),
    File(String, u32),
    Symlink(String, String),
    Hard(String, String),
    Whiteout(String),
    Opaque(String),
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("c".to_string()),
        Just("..".to_string()),
        Just("etc".to_string()),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(name(), 1..4).prop_map(|v| v.join("/"))
}

/// `@` stands for the outside directory's absolute path.
fn target() -> impl Strategy<Value = String> {
    prop_oneof![
        path(),
        path().prop_map(|p| format!("/{p}")),
        Just("@".to_string()),
        path().prop_map(|p| format!("@/{p}")),
        Just("../../../../../..@".to_string()),
        Just("/".to_string()),
        Just(".".to_string()),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (path(), prop::sample::select(vec![0o755u32, 0o777, 0o700]))
            .prop_map(|(p, m)| Op::Dir(p, m)),
        (path(), prop::sample::select(vec![0o644u32, 0o4755, 0o600]))
            .prop_map(|(p, m)| Op::File(p, m)),
        (path(), target()).prop_map(|(p, t)| Op::Symlink(p, t)),
        (path(), target()).prop_map(|(p, t)| Op::Hard(p, t)),
        path().prop_map(Op::Whiteout),
        path().prop_map(Op::Opaque),
    ]
}

fn layer(ops: &[Op], outside: &str, dir: &Path, n: usize) -> std::path::PathBuf {
    let mut b = tar::Builder::new(Vec::new());
    let fix = |t: &str| t.replace('@', outside);
    for op in ops {
        let (name, kind, link, mode) = match op {
            Op::Dir(p, m) => (format!("{p}/"), EntryType::Directory, String::new(), *m),
            Op::File(p, m) => (p.clone(), EntryType::Regular, String::new(), *m),
            Op::Symlink(p, t) => (p.clone(), EntryType::Symlink, fix(t), 0o777),
            Op::Hard(p, t) => (p.clone(), EntryType::Link, fix(t), 0o644),
            Op::Whiteout(p) => {
                let (d, f) = p.rsplit_once('/').unwrap_or(("", p));
                (
                    format!("{d}/.wh.{f}"),
                    EntryType::Regular,
                    String::new(),
                    0o644,
                )
            }
            Op::Opaque(p) => (
                format!("{p}/.wh..wh..opq"),
                EntryType::Regular,
                String::new(),
                0o644,
            ),
        };
        let mut h = tar::Header::new_gnu();
        {
            let g = h.as_gnu_mut().unwrap();
            let nb = name.as_bytes();
            if nb.len() > 99 || link.len() > 99 {
                continue;
            }
            g.name[..nb.len()].copy_from_slice(nb);
            g.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        let data: &[u8] = if kind == EntryType::Regular {
            b"data"
        } else {
            b""
        };
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    let p = dir.join(format!("layer{n}.tar"));
    std::fs::write(&p, b.into_inner().unwrap()).unwrap();
    p
}

fn snapshot(dir: &Path) -> Vec<(String, u32, u32, i64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    for e in walk(dir) {
        let m = std::fs::symlink_metadata(&e).unwrap();
        let data = if m.is_file() {
            std::fs::read(&e).unwrap()
        } else {
            vec![]
        };
        out.push((
            e.display().to_string(),
            m.mode(),
            m.uid(),
            m.mtime_nsec(),
            m.nlink(),
            data,
        ));
    }
    out
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        names.sort();
        for n in names {
            out.extend(walk(&n));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn layers_never_touch_anything_outside_the_root(
        layers in prop::collection::vec(prop::collection::vec(op(), 1..12), 1..4)
    ) {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("root");
        let outside = work.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(outside.join("a/b")).unwrap();
        std::fs::write(outside.join("a/file"), "keep").unwrap();
        std::fs::write(outside.join("etc"), "keep").unwrap();
        let before = snapshot(&outside);
        for (i, ops) in layers.iter().enumerate() {
            let l = layer(ops, &outside.display().to_string(), work.path(), i);
            // Errors (a hard link to nothing) are fine; escapes are not.
            let _ = kiln::primitives::unpack::apply_layer(&root, &l);
        }
        prop_assert_eq!(snapshot(&outside), before);
    }

    #[test]
    fn resolved_entries_are_inside_the_root(
        ops in prop::collection::vec(op(), 1..12),
        probes in prop::collection::vec(path(), 1..6),
    ) {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("root");
        let outside = work.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let l = layer(&ops, &outside.display().to_string(), work.path(), 0);
        let _ = kiln::primitives::unpack::apply_layer(&root, &l);
        let r = Root::open(&root).unwrap();
        let canon = root.canonicalize().unwrap();
        for p in probes {
            for follow in [false, true] {
                if let Ok(e) = r.resolve(Path::new(&p), Parents::Existing, follow) {
                    // The parent directory fd, as the kernel names it, lies in the root.
                    let fd = std::os::fd::AsRawFd::as_raw_fd(&e.dir);
                    let real = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
                    prop_assert!(real.starts_with(&canon), "{} -> {}", p, real.display());
                    prop_assert!(!e.real.is_absolute());
                }
            }
        }
        prop_assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }
}
