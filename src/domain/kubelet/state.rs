//! The kubelet's image-manager state, which a node image must not carry.
//!
//! Facts from the kubelet's source (kubernetes/kubernetes,
//! `pkg/kubelet/images/pullmanager/`, `fs_pullrecords.go` at 788b7ab,
//! `image_pull_manager.go` at a02748c), on by default since v1.35
//! (feature gate `KubeletEnsureSecretPulledImages`: alpha, off, in
//! v1.33–v1.34; beta, on, from v1.35):
//!
//! - `/var/lib/kubelet/image_manager/pulled/` holds one record per image
//!   the kubelet pulled, named `sha256-` and the hex SHA-256 of the image's
//!   CRI id (its `imageRef`); `pulling/` one intent per pull in flight,
//!   named the same way from the image as the pod names it.
//! - An image with neither is "pulled by something else than the kubelet"
//!   (preloaded). With a record the kubelet checks the pod's credentials
//!   against the ones recorded; with an intent it counts as kubelet-pulled;
//!   a record it cannot read makes it verify again (`MustAttemptImagePull`
//!   returns "must pull" on any error). Verifying means pulling, which on
//!   a node with no registry fails.
//!
//! - A record is found by its file name and believed only if its
//!   `imageRef` is the image's CRI id; one the kubelet cannot decode makes
//!   it pull whatever the policy (`fs_pullrecords.go` at v1.35.4). Its
//!   `credentialMapping` is keyed by the image's name without tag or
//!   digest; `nodePodsAccessible: true` there (pulled with no credentials)
//!   lets every pod run it unverified (`MustAttemptImagePull`).
//!
//! So a base that ran a kubelet (a node snapshotted after `kubeadm init`)
//! hands every node built from it records that turn the bundled images
//! into "pulled by the kubelet", checked again under the default policy.
//! The real kubelet shows it (tests/kubelet_gc.rs): an intent and a record
//! with a Secret stop a static pod offline; a `nodePodsAccessible` record
//! does not. kiln reads the records only to say which bundled images would
//! start (`kiln verify`); it removes the directory whatever they say, and a
//! node image gets a whiteout over the base's.

use std::io;
use std::path::Path;

use serde::Serialize;

use crate::primitives::inroot::{self, Parents, Root};

/// Where the kubelet keeps it, inside a rootfs.
pub const DIR: &str = "var/lib/kubelet/image_manager";

/// Whether `rel` is the state or one of its parents (what an extract of a
/// base must bring in to see it).
pub fn covers(rel: &Path) -> bool {
    rel.starts_with(DIR) || Path::new(DIR).starts_with(rel)
}

/// The state found in a rootfs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    /// `/var/lib/kubelet/image_manager`.
    pub path: String,
    /// Names of the files in `pulled/` (records) and `pulling/` (intents).
    pub pulled: Vec<String>,
    pub pulling: Vec<String>,
    /// Anything else there (another file type, other names).
    pub other: usize,
    /// The records of `pulled/`, as the kubelet would read them.
    #[serde(skip)]
    pub records: Vec<Record>,
}

/// One pull record (`ImagePulledRecord`), as far as the credential checks
/// need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its file name in `pulled/`.
    pub file: String,
    /// The CRI id it says it is for; `None` if the kubelet could not
    /// decode it (too big for kiln to read counts as that too).
    pub image_ref: Option<String>,
    /// Image names (no tag or digest) it maps to `nodePodsAccessible: true`.
    pub open_to_all: Vec<String>,
}

/// What the kubelet finds when it looks a record up.
pub enum Lookup<'a> {
    None,
    Found(&'a Record),
    /// It cannot decode it, and so pulls whatever the policy.
    Undecodable,
}

/// The most of a record kiln reads: the kubelet writes a few hundred bytes.
const RECORD_MAX: u64 = 1 << 20;

impl Record {
    fn parse(file: String, bytes: Option<&[u8]>) -> Record {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Raw {
            kind: String,
            image_ref: String,
            #[serde(default)]
            credential_mapping: std::collections::BTreeMap<String, Creds>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Creds {
            #[serde(default)]
            node_pods_accessible: bool,
        }
        let raw = bytes
            .and_then(|b| serde_json::from_slice::<Raw>(b).ok())
            .filter(|r| r.kind == "ImagePulledRecord");
        match raw {
            Some(r) => Record {
                file,
                image_ref: Some(r.image_ref),
                open_to_all: r
                    .credential_mapping
                    .into_iter()
                    .filter(|(_, c)| c.node_pods_accessible)
                    .map(|(n, _)| n)
                    .collect(),
            },
            None => Record {
                file,
                image_ref: None,
                open_to_all: vec![],
            },
        }
    }
}

impl Found {
    /// Whether the kubelet holds a pull record for the image whose CRI id
    /// is `image_ref`.
    pub fn has_record(&self, image_ref: &str) -> bool {
        self.pulled.contains(&file_name(image_ref))
    }

    /// The record the kubelet would look up for the image whose CRI id is
    /// `image_ref`.
    pub fn record(&self, image_ref: &str) -> Lookup<'_> {
        let name = file_name(image_ref);
        match self.records.iter().find(|r| r.file == name) {
            None => Lookup::None,
            Some(r) => match &r.image_ref {
                None => Lookup::Undecodable,
                Some(i) if i == image_ref => Lookup::Found(r),
                // About another image: the kubelet takes it as absent.
                Some(_) => Lookup::None,
            },
        }
    }

    /// Whether it holds a pull intent for `image`, named as a pod names it.
    pub fn has_intent(&self, image: &str) -> bool {
        self.pulling.contains(&file_name(image))
    }

    /// One phrase: what is there.
    pub fn summary(&self) -> String {
        format!(
            "/{DIR}: {} pull record(s), {} pull intent(s), {} other entr(ies)",
            self.pulled.len(),
            self.pulling.len(),
            self.other
        )
    }
}

/// The file the kubelet keeps for `s` (`cacheFilename`).
pub fn file_name(s: &str) -> String {
    format!(
        "sha256-{}",
        crate::primitives::digest::Digest::of(s.as_bytes()).hex()
    )
}

/// The state under `root`, if any; read through the in-root resolver,
/// never following a link out of it.
pub fn read(root: &Root) -> io::Result<Option<Found>> {
    let Some(st) = root.lstat(Path::new(DIR)) else {
        return Ok(None);
    };
    let mut found = Found {
        path: format!("/{DIR}"),
        ..Found::default()
    };
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        found.other = 1;
        return Ok(Some(found));
    }
    let e = root.resolve(Path::new(DIR), Parents::Existing, false)?;
    let dir = inroot::open_dir_at(&e.dir, &e.name)?;
    for name in inroot::dir_names(&dir)? {
        let list = match name.to_str() {
            Some("pulled") => &mut found.pulled,
            Some("pulling") => &mut found.pulling,
            _ => {
                found.other += 1;
                continue;
            }
        };
        if !inroot::is_dir_at(&dir, &name) {
            found.other += 1;
            continue;
        }
        let sub = inroot::open_dir_at(&dir, &name)?;
        for n in inroot::dir_names(&sub)? {
            list.push(n.to_string_lossy().into_owned());
        }
        list.sort();
    }
    let pulled = Path::new(DIR).join("pulled");
    for n in &found.pulled {
        let bytes = root.open_file(&pulled.join(n)).ok().and_then(|f| {
            let mut v = Vec::new();
            io::Read::read_to_end(&mut io::Read::take(f, RECORD_MAX + 1), &mut v).ok()?;
            (v.len() as u64 <= RECORD_MAX).then_some(v)
        });
        found
            .records
            .push(Record::parse(n.clone(), bytes.as_deref()));
    }
    Ok(Some(found))
}

/// Removes the state under `root` (by fd, never following a link);
/// returns what it was.
pub fn remove(root: &Root) -> io::Result<Option<Found>> {
    let found = read(root)?;
    if found.is_some() {
        let e = root.resolve(Path::new(DIR), Parents::Existing, false)?;
        inroot::remove_at(&e.dir, &e.name)?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_named_as_the_kubelet_names_them() {
        // sha256("sha256:abc"), as Go's fmt %x of sha256.Sum256 writes it.
        let n = file_name("sha256:abc");
        assert!(n.starts_with("sha256-") && n.len() == 7 + 64, "{n}");
        assert_eq!(n, file_name("sha256:abc"));
        assert_ne!(n, file_name("sha256:abd"));
    }

    #[test]
    fn state_is_read_and_removed_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::open(t.path()).unwrap();
        assert_eq!(read(&root).unwrap(), None);
        let pulled = t.path().join(DIR).join("pulled");
        std::fs::create_dir_all(&pulled).unwrap();
        std::fs::create_dir_all(t.path().join(DIR).join("pulling")).unwrap();
        std::fs::write(pulled.join(file_name("sha256:abc")), b"{}").unwrap();
        // A link inside points out of the root: removed, not followed.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join(DIR).join("out")).unwrap();
        let f = read(&root).unwrap().unwrap();
        assert!(f.has_record("sha256:abc") && !f.has_record("sha256:abd"));
        assert_eq!((f.pulled.len(), f.pulling.len(), f.other), (1, 0, 1));
        assert_eq!(remove(&root).unwrap(), Some(f));
        assert!(!t.path().join(DIR).exists());
        assert!(t.path().join("var/lib/kubelet").is_dir());
        assert!(outside.path().join("keep").is_file());
    }

    #[test]
    fn covers_the_state_and_its_parents_only() {
        assert!(covers(Path::new("var/lib/kubelet")));
        assert!(covers(Path::new("var/lib/kubelet/image_manager/pulled/x")));
        assert!(!covers(Path::new("var/lib/kubelet/pods")));
    }
}
