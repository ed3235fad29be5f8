//! An OCI image layout directory as a source (`oci:DIR[:TAG]`, as skopeo
//! names one): read in place, each blob file a span of its own.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context};
use bytes::Bytes;

use super::{layouts, open_regular, read_span, ArchiveSource, Span, MAX_DOC_BYTES};
use crate::primitives::digest::Digest;

impl ArchiveSource {
    /// An OCI image layout directory (`oci:DIR`): its `index.json` and each
    /// regular file of `blobs/sha256/` named by a digest are read in place
    /// (each file a span of its own; no copy), as a layout tarball's are.
    pub(super) fn add_dir(&mut self, dir: &Path, select: Option<&str>) -> anyhow::Result<()> {
        let label = dir.display().to_string();
        let index_path = dir.join("index.json");
        if std::fs::symlink_metadata(&index_path).is_err() {
            bail!("has no index.json: is it an OCI image layout?");
        }
        let index_file = open_regular(&index_path, false).context("its index.json")?;
        let mut entries: HashMap<String, Span> = HashMap::new();
        let add_file = |src: &mut ArchiveSource, file: std::fs::File| -> anyhow::Result<Span> {
            let size = file.metadata()?.len();
            let archive = src.files.len();
            src.files.push(std::sync::Arc::new(file));
            src.labels.push(label.clone());
            Ok(Span {
                archive,
                offset: 0,
                size,
            })
        };
        let index_span = add_file(self, index_file)?;
        entries.insert("index.json".into(), index_span);
        let blobs = dir.join("blobs/sha256");
        for e in
            std::fs::read_dir(&blobs).with_context(|| format!("reading {}", blobs.display()))?
        {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(d) = Digest::parse(&format!("sha256:{name}")) else {
                continue;
            };
            // Opened now, once, and read only through this descriptor: a
            // FIFO, device or link here (or swapped in later) is refused.
            let file = open_regular(&e.path(), false).with_context(|| format!("blob {d}"))?;
            let span = add_file(self, file)?;
            self.add_blob(d, span);
            entries.insert(format!("blobs/sha256/{name}"), span);
        }
        let files = self.files.clone();
        let read = |name: &str| -> anyhow::Result<Option<Bytes>> {
            match entries.get(name) {
                Some(span) => Ok(Some(
                    read_span(&files[span.archive], *span, MAX_DOC_BYTES)
                        .with_context(|| format!("reading {name}"))?,
                )),
                None => Ok(None),
            }
        };
        let index = read("index.json")?.expect("listed");
        // Its digest where archives keep theirs (one per file here).
        self.indexes.push(Some(Digest::of(&index)));
        while self.indexes.len() < self.files.len() {
            self.indexes.push(None);
        }
        let index = layouts::narrowed(&index, select)?;
        if self.add_oci(&index, &read)? || self.add_single_unnamed(&index, &read, dir)? {
            return Ok(());
        }
        bail!("index.json lists images without full names; name one (oci:DIR:TAG)")
    }
}
