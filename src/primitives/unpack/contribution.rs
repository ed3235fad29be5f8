//! What a layer gave a partial unpack ([`super::apply_layer_part`]), as a
//! tar of its own: every entry the unpack acted on (files, directories,
//! links, whiteouts and opaque markers over the paths it takes), with the
//! layer's header fields (mode, owner, link target, xattr records), not
//! the builder's disk (so a root and a non-root builder note the same
//! bytes). Applied in the layer's place it gives the same tree and the same
//! owners: the node-image extract replays it from the cache, or from a
//! previous image's record, instead of inflating the whole layer.
//!
//! Some files are wanted only for what can be read from them (the node's
//! containerd binary, for its version): with [`Elide`], such a file is
//! noted empty with a PAX record [`ELIDED`] holding what was read from it,
//! and its replay gives an empty stand-in and that note, not megabytes.

use std::io::Write;
use std::path::Path;

/// The PAX record an elided file carries: what was read from it.
pub const ELIDED: &str = "KILN.elided";

/// Which regular files' bytes a contribution leaves out, and what it
/// notes of each instead.
#[derive(Clone, Copy)]
pub struct Elide {
    pub paths: fn(&Path) -> bool,
    pub note: fn(&std::fs::File) -> String,
}

/// A contribution being written.
pub struct Contribution<W: Write> {
    tar: tar::Builder<W>,
    entries: usize,
    elide: Option<Elide>,
}

impl<W: Write> Contribution<W> {
    pub fn new(out: W, elide: Option<Elide>) -> Self {
        let mut tar = tar::Builder::new(out);
        tar.mode(tar::HeaderMode::Complete);
        Contribution {
            tar,
            entries: 0,
            elide,
        }
    }

    /// How many entries it holds.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Ends the tar and gives the writer back.
    pub fn finish(self) -> std::io::Result<W> {
        self.tar.into_inner()
    }

    /// One entry at `path` (the unpack's cleaned path) as the layer's
    /// header `h` says, a regular file's data from `data` (the file the
    /// unpack just wrote, opened without following), its PAX xattr records
    /// `xattrs` before it.
    pub(super) fn note(
        &mut self,
        path: &Path,
        h: &tar::Header,
        data: Option<std::fs::File>,
        xattrs: &[(String, Vec<u8>)],
    ) -> anyhow::Result<()> {
        let elided = match (&data, self.elide) {
            (Some(f), Some(e)) if (e.paths)(path) => Some((e.note)(f)),
            _ => None,
        };
        let mut records: Vec<(&str, &[u8])> = xattrs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        if let Some(note) = &elided {
            records.push((ELIDED, note.as_bytes()));
        }
        if !records.is_empty() {
            self.tar.append_pax_extensions(records)?;
        }
        let data = if elided.is_some() { None } else { data };
        let mut out = tar::Header::new_gnu();
        let kind = h.entry_type();
        out.set_entry_type(kind);
        out.set_mode(h.mode().unwrap_or(0o644));
        out.set_uid(h.uid().unwrap_or(0));
        out.set_gid(h.gid().unwrap_or(0));
        out.set_mtime(h.mtime().unwrap_or(0));
        match (kind, data) {
            (tar::EntryType::Symlink | tar::EntryType::Link, _) => {
                let target = h.link_name()?.ok_or_else(|| {
                    anyhow::anyhow!("{}: a link without a target", path.display())
                })?;
                out.set_size(0);
                self.tar.append_link(&mut out, path, target)?;
            }
            (_, Some(file)) => {
                // Sparse and continuous entries are regular files once written.
                out.set_entry_type(tar::EntryType::Regular);
                out.set_size(file.metadata()?.len());
                self.tar.append_data(&mut out, path, file)?;
            }
            (_, None) => {
                if elided.is_some() {
                    out.set_entry_type(tar::EntryType::Regular);
                }
                out.set_size(0);
                self.tar.append_data(&mut out, path, std::io::empty())?;
            }
        }
        self.entries += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{apply_contribution, apply_layer_part, Budget, Limits, Owners};
    use super::*;

    fn only(p: &Path) -> bool {
        p.starts_with("keep") || Path::new("keep").starts_with(p)
    }

    fn layer(entries: &[(&str, tar::EntryType, &[u8], &str, u64)]) -> tempfile::NamedTempFile {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data, link, uid) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o4755);
            h.set_uid(*uid);
            h.set_gid(*uid);
            if link.is_empty() {
                b.append_data(&mut h, name, *data).unwrap();
            } else {
                b.append_link(&mut h, name, link).unwrap();
            }
        }
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b.into_inner().unwrap()).unwrap();
        f
    }

    fn tree(root: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in walk(root) {
            let rel = e.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&e).unwrap();
            let what = if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&e).unwrap().display())
            } else if m.is_dir() {
                "dir".into()
            } else {
                format!("file {:?}", std::fs::read(&e).unwrap())
            };
            out.push((rel, what));
        }
        out.sort();
        out
    }

    fn walk(root: &Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(root).unwrap() {
            let p = e.unwrap().path();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
        out
    }

    /// A layer's contribution, applied in its place, gives the part the
    /// same tree and owners (whiteouts across layers included), and holds
    /// nothing outside the part.
    #[test]
    fn a_contribution_replays_what_its_layer_gave() {
        use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as S};
        let l1 = layer(&[
            ("keep/", D, b"", "", 0),
            ("keep/a", F, b"aaa", "", 7),
            ("keep/gone", F, b"x", "", 0),
            ("keep/opq/old", F, b"o", "", 0),
            ("skip/big", F, &[9u8; 4096], "", 0),
            ("keep/ln", S, b"", "a", 0),
        ]);
        let l2 = layer(&[
            ("keep/.wh.gone", F, b"", "", 0),
            ("keep/opq/.wh..wh..opq", F, b"", "", 0),
            ("keep/opq/new", F, b"n", "", 3),
            ("keep/hard", H, b"", "keep/a", 0),
            ("skip/other", F, b"s", "", 0),
        ]);
        let (direct, replayed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut o1, mut o2) = (Owners::new(only), Owners::new(only));
        let mut contributions = Vec::new();
        for l in [&l1, &l2] {
            let mut noted = Contribution::new(tempfile::tempfile().unwrap(), None);
            let mut budget = Budget::new(Limits::default(), only);
            apply_layer_part(
                direct.path(),
                l.path(),
                &mut o1,
                only,
                &mut budget,
                Some(&mut noted),
            )
            .unwrap();
            let c = tempfile::NamedTempFile::new().unwrap();
            let mut f = noted.finish().unwrap();
            std::io::Seek::rewind(&mut f).unwrap();
            std::io::copy(&mut f, &mut std::fs::File::create(c.path()).unwrap()).unwrap();
            contributions.push(c);
        }
        for c in &contributions {
            let mut budget = Budget::new(Limits::default(), only);
            apply_contribution(replayed.path(), c.path(), &mut o2, only, &mut budget).unwrap();
            // Nothing of the layers outside the part is in it.
            let mut t = tar::Archive::new(std::fs::File::open(c.path()).unwrap());
            for e in t.entries().unwrap() {
                assert!(only(&e.unwrap().path().unwrap()));
            }
        }
        assert_eq!(tree(direct.path()), tree(replayed.path()));
        assert!(!replayed.path().join("skip").exists());
        assert!(!replayed.path().join("keep/gone").exists());
        for p in ["keep/a", "keep/opq/new"] {
            assert_eq!(o1.get(Path::new(p)), o2.get(Path::new(p)), "{p}");
        }
        assert_eq!(o2.get(Path::new("keep/a")), Some((7, 7)));
    }
}
