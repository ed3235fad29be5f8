//! What kiln changed in a rootfs: a snapshot of file metadata under the
//! paths kiln owns before it writes, and the sorted list of what was added,
//! changed or deleted after (each deletion a whiteout in the layer).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{OWNED, OWNED_FILES};

/// File metadata before kiln touched the rootfs.
#[derive(Debug, Default)]
pub struct Snapshot(BTreeMap<PathBuf, (u64, i64, i64, u32, u64)>);

fn stamp(m: &std::fs::Metadata) -> (u64, i64, i64, u32, u64) {
    (m.size(), m.mtime(), m.mtime_nsec(), m.mode(), m.ino())
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let full = root.join(rel);
    let Ok(meta) = std::fs::symlink_metadata(&full) else {
        return Ok(());
    };
    out.push(rel.to_path_buf());
    if meta.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(&full)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for n in names {
            walk(root, &rel.join(n), out)?;
        }
    }
    Ok(())
}

/// Everything under [`OWNED`], walked without following links; an owned
/// path (or a parent of one) that is a symlink is refused, so nothing
/// outside the rootfs is ever read into the layer.
fn owned_paths(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let r = crate::primitives::inroot::Root::open(root)?;
    let mut out = Vec::new();
    for o in OWNED {
        r.check_owned(Path::new(o))?;
        walk(root, Path::new(o), &mut out)?;
    }
    for f in OWNED_FILES {
        let f = Path::new(f);
        r.check_owned(f.parent().expect("has a parent"))?;
        walk(root, f, &mut out)?;
    }
    out.sort();
    Ok(out)
}

/// Whether kiln's layer may carry `rel`: a path under what kiln owns, or a
/// parent of one. Their owners are noted while the base is unpacked.
pub fn tracked(rel: &Path) -> bool {
    OWNED
        .iter()
        .chain(OWNED_FILES)
        .map(Path::new)
        .any(|o| rel.starts_with(o) || o.starts_with(rel))
}

/// What a node-image build extracts from its base: what kiln owns (and
/// the parents), plus the node's containerd binary (its version decides
/// the config's form), kind's entrypoint (it marks a kind base) and the
/// kubelet's image-manager state (whited out if there).
pub fn extracted(rel: &Path) -> bool {
    tracked(rel)
        || crate::domain::kubelet::state::covers(rel)
        || crate::adapters::rootfs::OWN_BINARIES
            .iter()
            .chain([&crate::domain::kind::ENTRYPOINT])
            .map(Path::new)
            .any(|b| b.starts_with(rel))
}

pub fn snapshot(root: &Path) -> anyhow::Result<Snapshot> {
    let mut s = Snapshot::default();
    for p in owned_paths(root)? {
        s.0.insert(p.clone(), stamp(&std::fs::symlink_metadata(root.join(&p))?));
    }
    Ok(s)
}

/// What changed under [`OWNED`] since `before`, sorted: (path, is a
/// whiteout). New and changed entries come with their parents, so modes
/// and owners of new directories travel; what disappeared gets a whiteout.
pub(super) fn changes(root: &Path, before: &Snapshot) -> anyhow::Result<Vec<(PathBuf, bool)>> {
    let now = owned_paths(root)?;
    let mut changed: Vec<PathBuf> = Vec::new();
    for p in &now {
        let m = std::fs::symlink_metadata(root.join(p))?;
        let differs = before.0.get(p).is_none_or(|b| *b != stamp(&m));
        if differs && !(m.is_dir() && before.0.contains_key(p)) {
            changed.push(p.clone());
        }
    }
    let mut with_parents: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
    for p in &changed {
        let mut a = p.parent();
        while let Some(d) = a.filter(|d| !d.as_os_str().is_empty()) {
            with_parents.insert(d.to_path_buf());
            a = d.parent();
        }
        with_parents.insert(p.clone());
    }
    // `now` is sorted ([`owned_paths`]): a lookup is a binary search, so the
    // whole diff stays n log n in what a base holds under what kiln owns.
    // One whiteout per deleted tree, none beneath it: a layer holding a
    // whiteout for a directory and whiteouts of its children is one that
    // Docker's overlay2 applier fails on (ENOTDIR: the directory is gone
    // when the children's whiteouts are made) and containerd's applier
    // answers by making the directory again (issue 44.5). `before` is
    // sorted, so a deleted directory comes right before what it held.
    let mut deleted: Vec<&PathBuf> = Vec::new();
    for p in before.0.keys().filter(|p| now.binary_search(p).is_err()) {
        if deleted.last().is_some_and(|top| p.starts_with(top)) {
            continue;
        }
        deleted.push(p);
    }
    let mut names: Vec<(PathBuf, bool)> = with_parents.into_iter().map(|p| (p, false)).collect();
    for d in deleted {
        names.push((whiteout(d), true));
    }
    names.sort();
    Ok(names)
}

/// The whiteout entry that deletes `rel` in a layer: `.wh.NAME` beside it.
pub(super) fn whiteout(rel: &Path) -> PathBuf {
    let name = format!(
        ".wh.{}",
        rel.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    rel.parent().unwrap_or(Path::new("")).join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44.5: a deleted directory gets one whiteout, and nothing
    /// beneath it gets another.
    #[test]
    fn a_deleted_tree_gets_one_whiteout() {
        let root = tempfile::tempdir().unwrap();
        let store = root.path().join("var/lib/containerd");
        std::fs::create_dir_all(store.join(".kiln-ingest/sub")).unwrap();
        std::fs::write(store.join(".kiln-ingest/a"), b"a").unwrap();
        std::fs::write(store.join(".kiln-ingest/sub/b"), b"b").unwrap();
        std::fs::write(store.join("gone"), b"g").unwrap();
        let before = snapshot(root.path()).unwrap();
        std::fs::remove_dir_all(store.join(".kiln-ingest")).unwrap();
        std::fs::remove_file(store.join("gone")).unwrap();
        let wh: Vec<PathBuf> = changes(root.path(), &before)
            .unwrap()
            .into_iter()
            .filter(|(_, w)| *w)
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            wh,
            [
                PathBuf::from("var/lib/containerd/.wh..kiln-ingest"),
                PathBuf::from("var/lib/containerd/.wh.gone"),
            ]
        );
    }
}
