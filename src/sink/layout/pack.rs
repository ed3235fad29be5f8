//! The layout packed into one deterministic tarball (sorted entries, zero
//! mtimes, root owner), or begun as one that blobs are written straight into.

use super::*;

/// An archive entry's header as kiln writes every one (the same bytes the
/// tar crate would write: every name here is at most `blobs/sha256/<64
/// hex>`, 77 bytes, a plain ustar name): mode 0644, mtime 0, owner root.
pub(super) fn entry_header(name: &str, len: u64) -> anyhow::Result<tar::Header> {
    let mut h = tar::Header::new_ustar();
    h.set_size(len);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_path(name)?;
    h.set_cksum();
    Ok(h)
}

/// Zeros that end an entry of `len` bytes on a 512-byte block.
pub(super) fn padding(len: u64) -> &'static [u8] {
    &[0u8; 512][..((512 - len % 512) % 512) as usize]
}

impl OciLayout {
    /// Begins the archive `out` (`pack(out, ..)` finishes it): blobs
    /// written with [`OciLayout::new_blob`] from here on go straight into it.
    pub fn archive_to(&self, out: &Path) -> anyhow::Result<()> {
        let tmp = crate::primitives::atomic::temp_beside(out)
            .with_context(|| format!("creating a temporary file beside {}", out.display()))?;
        let (file, temp) = tmp.into_parts();
        *self.draft.lock().unwrap() = Some(Draft {
            out: out.to_path_buf(),
            at: temp.to_path_buf(),
            temp: Some(temp),
            file: Some(file),
            end: 0,
            blobs: BTreeMap::new(),
            packed: false,
        });
        Ok(())
    }

    /// Packs the layout into `out` (sorted entries, zero mtimes, root owner),
    /// via a temporary file so `out` is never half-written. Only blobs that
    /// `index.json` reaches are packed: leftovers of an earlier run stay out.
    ///
    /// If [`OciLayout::archive_to`] began `out`, the blobs already in it
    /// come first and the rest is appended.
    pub fn pack(&self, out: &Path, extra: &[&str]) -> anyhow::Result<u64> {
        let keep = self.reachable()?;
        let mut draft = self.draft.lock().unwrap();
        match draft.as_ref() {
            Some(d) if !d.packed && d.out != out => bail!(
                "{} was begun as the archive, not {}",
                d.out.display(),
                out.display()
            ),
            Some(d) if d.packed && !d.blobs.is_empty() => bail!(
                "{} holds blobs this layout does not: pack it once",
                d.out.display()
            ),
            Some(d) if !d.packed => {}
            _ => {
                // None begun: begin it, with nothing in it yet.
                drop(draft);
                self.archive_to(out)?;
                draft = self.draft.lock().unwrap();
            }
        }
        let d = draft.as_mut().expect("begun above");
        let file = d
            .file
            .take()
            .ok_or_else(|| anyhow!("a blob is still being written into {}", out.display()))?;
        let size = self.pack_into(file, d, extra, &keep)?;
        let temp = d
            .temp
            .take()
            .expect("an unpacked draft has its temporary file");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&temp)?;
        crate::primitives::atomic::persist(tempfile::NamedTempFile::from_parts(file, temp), out)
            .with_context(|| format!("writing {}", out.display()))?;
        d.at = out.to_path_buf();
        d.packed = true;
        Ok(size)
    }

    /// Appends every entry not yet in the draft and syncs it.
    fn pack_into(
        &self,
        mut file: std::fs::File,
        draft: &Draft,
        extra: &[&str],
        keep: &std::collections::BTreeSet<Digest>,
    ) -> anyhow::Result<u64> {
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(draft.end))?;
        file.set_len(draft.end)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        let mut add = |name: &str, path: &Path| -> anyhow::Result<()> {
            crate::primitives::interrupt::check()?;
            let mut f = std::fs::File::open(path)?;
            let len = f.metadata()?.len();
            w.write_all(entry_header(name, len)?.as_bytes())?;
            // File to file, `io::copy` is `copy_file_range`: the bytes move
            // in the kernel (tar's own copy goes through an 8 KiB buffer, a
            // system call pair per 8 KiB).
            let copied = std::io::copy(&mut f, &mut w)?;
            if copied != len {
                bail!("{} changed while it was packed", path.display());
            }
            w.write_all(padding(len))?;
            Ok(())
        };
        let dir = self.dir.path();
        add("oci-layout", &dir.join("oci-layout"))?;
        add("index.json", &dir.join("index.json"))?;
        for name in extra {
            add(name, &dir.join(name))?;
        }
        for d in keep.iter().filter(|d| !draft.blobs.contains_key(d)) {
            add(&blob_name(d), &self.blob_path(d))?;
        }
        // The end of the archive: two zero blocks, as tar writes.
        w.write_all(&[0u8; 1024])?;
        w.flush()?;
        let f = w.into_inner().map_err(|e| anyhow!("{e}"))?;
        f.sync_all()?;
        Ok(f.metadata()?.len())
    }
}

impl OciLayout {
    /// Every blob the records reach and the layout holds (an index's entries
    /// for platforms not bundled are absent by design), sorted.
    fn reachable(&self) -> anyhow::Result<std::collections::BTreeSet<Digest>> {
        let mut out = std::collections::BTreeSet::new();
        let mut todo: Vec<Digest> = self
            .records
            .lock()
            .unwrap()
            .values()
            .map(|t| t.digest.clone())
            .collect();
        while let Some(d) = todo.pop() {
            if self.in_archive(&d).is_some() {
                out.insert(d); // kiln's own layer, already in the archive
                continue;
            }
            let path = self.blob_path(&d);
            if !path.exists() || !out.insert(d.clone()) {
                continue;
            }
            if std::fs::metadata(&path)?.len() > crate::primitives::oci::MAX_DOCUMENT_BYTES {
                continue; // a layer
            }
            let bytes = std::fs::read(&path)?;
            match crate::primitives::oci::Document::parse(&bytes) {
                Ok((_, crate::primitives::oci::Document::Index(i))) => {
                    todo.extend(i.manifests.into_iter().map(|m| m.digest))
                }
                Ok((_, crate::primitives::oci::Document::Manifest(m))) => {
                    todo.push(m.config.digest);
                    todo.extend(m.layers.into_iter().map(|l| l.digest));
                }
                Err(_) => {}
            }
        }
        Ok(out)
    }
}
