//! A layout at either end of the copy engine: a source (what it records is
//! copied on, e.g. pushed) and a sink (what is copied in is recorded).

use super::*;

/// A layout is also a source: what it records can be copied on (e.g. pushed).
impl crate::source::Source for OciLayout {
    async fn resolve(
        &self,
        image: &crate::primitives::reference::ImageRef,
    ) -> anyhow::Result<crate::primitives::handoff::Resolved> {
        let name = image.tagged_name().unwrap_or_else(|| image.to_string());
        let rec = self
            .records
            .lock()
            .unwrap()
            .get(&name)
            .cloned()
            .ok_or_else(|| anyhow!("{name} is not in the layout"))?;
        let bytes = Bytes::from(self.read_blob(&rec.digest)?);
        Ok(crate::primitives::handoff::Resolved {
            descriptor: rec,
            bytes,
        })
    }

    async fn manifest(
        &self,
        _image: &crate::primitives::reference::ImageRef,
        desc: &Descriptor,
    ) -> anyhow::Result<Bytes> {
        Ok(Bytes::from(self.read_blob(&desc.digest).with_context(
            || format!("{} is not in the layout", desc.digest),
        )?))
    }

    async fn blob(
        &self,
        _image: &crate::primitives::reference::ImageRef,
        desc: &Descriptor,
    ) -> anyhow::Result<BlobStream> {
        let (path, offset, len) = self
            .in_archive(&desc.digest)
            .unwrap_or_else(|| (self.blob_path(&desc.digest), 0, desc.size));
        let mut f = tokio::fs::File::open(&path).await.with_context(|| {
            format!(
                "{} is not in the layout (a layer reused by digest from the previous node image: the target registry must hold it, or mount it from the previous image's repository)",
                desc.digest
            )
        })?;
        tokio::io::AsyncSeekExt::seek(&mut f, std::io::SeekFrom::Start(offset)).await?;
        let f = tokio::io::AsyncReadExt::take(f, len);
        Ok(Box::pin(
            tokio_util::io::ReaderStream::with_capacity(f, 256 << 10).map_err(anyhow::Error::from),
        ))
    }

    fn describe(&self, _image: &crate::primitives::reference::ImageRef) -> String {
        format!("layout {}", self.dir.shown().display())
    }
}

impl Sink for OciLayout {
    async fn has(&self, desc: &Descriptor) -> anyhow::Result<bool> {
        if let Some((_, _, len)) = self.in_archive(&desc.digest) {
            return Ok(len == desc.size);
        }
        Ok(std::fs::metadata(self.blob_path(&desc.digest)).is_ok_and(|m| m.len() == desc.size))
    }

    async fn put_stream(&self, desc: &Descriptor, mut data: BlobStream) -> anyhow::Result<u64> {
        let dest = self.blob_path(&desc.digest);
        let tmp = tempfile::NamedTempFile::new_in(self.blobs.path())?;
        let mut file = tokio::fs::File::from_std(tmp.reopen()?);
        let mut n = 0u64;
        while let Some(chunk) = data.next().await {
            // An error here (including a failed verification) drops `tmp`: nothing stays.
            let chunk = chunk?;
            tokio::io::AsyncWriteExt::write_all(&mut file, &chunk).await?;
            n += chunk.len() as u64;
        }
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        tmp.persist(&dest)
            .map_err(|e| anyhow!("storing {}: {e}", desc.digest))?;
        Ok(n)
    }

    /// A layout is kiln's staging (packed, pushed or read, never run):
    /// cache entries are hard-linked in.
    async fn put_file(
        &self,
        desc: &Descriptor,
        path: &crate::sink::cache::Kept,
    ) -> anyhow::Result<u64> {
        let dest = self.blob_path(&desc.digest);
        let tmp = tempfile::Builder::new()
            .make_in(self.blobs.path(), |p| {
                crate::sink::cache::place(path, p, crate::sink::cache::Share::Link).map(|_| ())
            })
            .with_context(|| format!("storing {}", desc.digest))?;
        tmp.persist(&dest)
            .map_err(|e| anyhow!("storing {}: {e}", desc.digest))?;
        Ok(0)
    }

    /// The layout does not hold it: a push of the layout finds it in the
    /// target registry, or mounts it (`take_without_bytes`); a layout that
    /// is packed into an archive never takes absent blobs (an archive needs
    /// every byte, so such a build fetches them).
    async fn put_absent(&self, _desc: &Descriptor) -> anyhow::Result<()> {
        Ok(())
    }

    async fn read(&self, digest: &Digest) -> anyhow::Result<Option<Bytes>> {
        match self.read_blob(digest) {
            Ok(b) => Ok(Some(Bytes::from(b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn record(&self, name: &str, target: &Descriptor) -> anyhow::Result<()> {
        self.records
            .lock()
            .unwrap()
            .insert(name.to_string(), target.clone());
        Ok(())
    }
}
