//! The content store side: blob info and reads, and writes either through
//! containerd's ingest API (chunked, resumable, verified by containerd on
//! commit) or straight into the backing directory with only the record
//! committed through containerd.

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use containerd_client::services::v1::Info;
use containerd_client::services::v1::{
    content_client::ContentClient, AbortRequest, InfoRequest, ReadContentRequest, WriteAction,
    WriteContentRequest, WriteContentResponse,
};
use containerd_client::tonic::{self, Code};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{ContainerdStore, Labels, WRITE_CHUNK};
use crate::primitives::digest::Digest;
use crate::primitives::handoff::BlobStream;
use crate::primitives::oci::Descriptor;

impl ContainerdStore {
    pub async fn info(&self, digest: &Digest) -> anyhow::Result<Option<Info>> {
        match self
            .content()
            .info(self.req(InfoRequest {
                digest: digest.to_string(),
            }))
            .await
        {
            Ok(r) => Ok(r.into_inner().info),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(anyhow!("containerd content info {digest}: {}", s.message())),
        }
    }

    /// Reads a whole (small) blob: manifests and configs.
    pub async fn read_blob(&self, digest: &Digest) -> anyhow::Result<Bytes> {
        let mut stream = self
            .content()
            .read(self.req(ReadContentRequest {
                digest: digest.to_string(),
                offset: 0,
                size: 0,
            }))
            .await
            .map_err(|s| anyhow!("reading {digest} from containerd: {}", s.message()))?
            .into_inner();
        let mut buf = Vec::new();
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|s| anyhow!("reading {digest}: {}", s.message()))?
        {
            buf.extend_from_slice(&msg.data);
            // The record's size is a claim; the bytes are counted.
            crate::primitives::oci::check_document_size(digest, buf.len() as u64)?;
        }
        Ok(Bytes::from(buf))
    }

    pub(super) async fn abort(&self, r#ref: &str) {
        let _ = self
            .content()
            .abort(self.req(AbortRequest {
                r#ref: r#ref.to_string(),
            }))
            .await;
    }

    /// Opens a write stream for `ref`, clearing an ingest an interrupted run left.
    async fn open_ingest(
        &self,
        r#ref: &str,
    ) -> anyhow::Result<(
        mpsc::Sender<WriteContentRequest>,
        tonic::Streaming<WriteContentResponse>,
    )> {
        let mut stale_cleared = false;
        for attempt in 0.. {
            let (tx, rx) = mpsc::channel::<WriteContentRequest>(1);
            let stat = WriteContentRequest {
                action: WriteAction::Stat as i32,
                r#ref: r#ref.to_string(),
                ..Default::default()
            };
            tx.send(stat)
                .await
                .map_err(|_| anyhow!("containerd closed the write stream"))?;
            let pick = r#ref
                .bytes()
                .fold(0usize, |a, b| a.wrapping_mul(31).wrapping_add(b as usize))
                % self.writers.len();
            let mut writer = ContentClient::new(self.writers[pick].clone());
            let mut responses = match writer.write(self.req(ReceiverStream::new(rx))).await {
                Ok(r) => r.into_inner(),
                Err(s) => bail!("containerd refused ingest {ref}: {}", s.message()),
            };
            let offset = match recv_status(&mut responses).await {
                Ok(r) => r.offset,
                // Another writer (a concurrent kiln) holds the ref: wait for it, up to ~30 s.
                Err(s) if s.code() == Code::Unavailable && attempt < 150 => {
                    drop((tx, responses));
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    continue;
                }
                Err(s) => bail!("containerd refused ingest {ref}: {}", s.message()),
            };
            if offset == 0 {
                return Ok((tx, responses));
            }
            if stale_cleared {
                break;
            }
            drop((tx, responses));
            self.abort(r#ref).await;
            stale_cleared = true;
        }
        bail!("containerd keeps a stale ingest {ref}; remove it with `ctr -n k8s.io content active` / `content rm`")
    }

    /// Stores a blob: into the backing directory and then its record, or
    /// (a daemon kiln does not run) through containerd's write API.
    pub(super) async fn write(
        &self,
        desc: &Descriptor,
        data: BlobStream,
        labels: &Labels,
    ) -> anyhow::Result<u64> {
        let Some(dir) = &self.direct else {
            return self.write_through(desc, data, labels).await;
        };
        let n = dir.put(desc, data).await?;
        crate::primitives::fault::point("blob-renamed");
        self.commit_present(desc, labels).await?;
        Ok(n)
    }

    /// Stores a blob from a proven file (a cache entry): shared into the
    /// backing directory and then its record, or streamed through
    /// containerd's write API.
    pub(super) async fn write_file(
        &self,
        desc: &Descriptor,
        path: &crate::sink::cache::Kept,
    ) -> anyhow::Result<u64> {
        let Some(dir) = &self.direct else {
            let f = tokio::fs::File::open(&**path).await?;
            let data: BlobStream = Box::pin(
                tokio_util::io::ReaderStream::with_capacity(f, 256 << 10)
                    .map(|c| c.map_err(anyhow::Error::from)),
            );
            return self.write_through(desc, data, &Labels::new()).await;
        };
        let n = dir.put_file(desc, path).await?;
        crate::primitives::fault::point("blob-renamed");
        self.commit_present(desc, &Labels::new()).await?;
        Ok(n)
    }

    /// Records a blob without its bytes: a stand-in in the backing
    /// directory ([`crate::sink::blobdir::BlobDir::put_absent`]), then the
    /// record, as for a blob written there.
    pub(super) async fn write_absent(&self, desc: &Descriptor) -> anyhow::Result<()> {
        let Some(dir) = &self.direct else {
            anyhow::bail!(
                "{}: only a store kiln writes directly can record a blob absent",
                desc.digest
            );
        };
        dir.put_absent(desc)?;
        self.commit_present(desc, &Labels::new()).await
    }

    /// Records a blob already in the backing directory: a writer opened with
    /// its digest and size finds it there (containerd's shared content
    /// policy) and commits without data, labels included.
    async fn commit_present(&self, desc: &Descriptor, labels: &Labels) -> anyhow::Result<()> {
        static COMMITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COMMITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r#ref = format!("kiln-{}-c{n}-{}", std::process::id(), desc.digest.hex());
        let (tx, rx) = mpsc::channel::<WriteContentRequest>(1);
        tx.send(WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: r#ref.clone(),
            total: desc.size as i64,
            offset: desc.size as i64,
            expected: desc.digest.to_string(),
            labels: labels.clone().into_iter().collect(),
            ..Default::default()
        })
        .await
        .map_err(|_| anyhow!("containerd closed the write stream"))?;
        let mut writer = ContentClient::new(self.channel.clone());
        let result = match writer.write(self.req(ReceiverStream::new(rx))).await {
            Ok(r) => recv(&mut r.into_inner()).await.map(|_| ()),
            Err(s) => Err(CallFailed::from(s).into()),
        };
        drop(tx);
        match result {
            Ok(()) => Ok(()),
            // Already recorded (a concurrent writer, or a record a GC kept): add our labels.
            Err(e) if already_exists(&e) => self.add_labels(desc, labels.clone()).await,
            Err(e) => {
                self.abort(&r#ref).await;
                Err(e.context(format!("recording {} in containerd", desc.digest)))
            }
        }
    }

    async fn write_through(
        &self,
        desc: &Descriptor,
        mut data: BlobStream,
        labels: &Labels,
    ) -> anyhow::Result<u64> {
        // A ref of its own per write: never one a cancelled writer still holds.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r#ref = format!("kiln-{}-{n}-{}", std::process::id(), desc.digest.hex());
        let (tx, mut responses) = self.open_ingest(&r#ref).await?;
        let result = async {
            let mut offset: u64 = 0;
            let mut buf: Vec<u8> = Vec::with_capacity(WRITE_CHUNK.min(desc.size as usize));
            loop {
                let chunk = data.next().await.transpose()?;
                if let Some(c) = &chunk {
                    buf.extend_from_slice(c);
                }
                if buf.len() >= WRITE_CHUNK || (chunk.is_none() && !buf.is_empty()) {
                    let n = buf.len() as u64;
                    let msg = WriteContentRequest {
                        action: WriteAction::Write as i32,
                        r#ref: r#ref.clone(),
                        total: desc.size as i64,
                        offset: offset as i64,
                        data: std::mem::take(&mut buf),
                        ..Default::default()
                    };
                    tx.send(msg)
                        .await
                        .map_err(|_| anyhow!("containerd closed the write stream"))?;
                    recv(&mut responses)
                        .await
                        .with_context(|| format!("writing {} to containerd", desc.digest))?;
                    offset += n;
                    crate::primitives::fault::point("mid-blob");
                }
                if chunk.is_none() {
                    break;
                }
            }
            // Only now has the verifying stream ended cleanly: commit.
            let commit = WriteContentRequest {
                action: WriteAction::Commit as i32,
                r#ref: r#ref.clone(),
                total: desc.size as i64,
                offset: offset as i64,
                expected: desc.digest.to_string(),
                labels: labels.clone().into_iter().collect(),
                ..Default::default()
            };
            tx.send(commit)
                .await
                .map_err(|_| anyhow!("containerd closed the write stream"))?;
            match recv(&mut responses).await {
                Ok(_) => Ok((offset, false)),
                Err(e) if already_exists(&e) => Ok((offset, true)),
                Err(e) => Err(e.context(format!("committing {} to containerd", desc.digest))),
            }
        }
        .await;
        drop((tx, responses));
        match result {
            Ok((n, existed)) => {
                // A concurrent writer won the commit and kept its labels: add ours.
                if existed {
                    self.add_labels(desc, labels.clone()).await?;
                }
                Ok(n)
            }
            Err(e) => {
                self.abort(&r#ref).await;
                Err(e)
            }
        }
    }
}

async fn recv_status(
    responses: &mut tonic::Streaming<WriteContentResponse>,
) -> Result<WriteContentResponse, tonic::Status> {
    match responses.message().await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(tonic::Status::aborted(
            "containerd ended the write stream early",
        )),
        Err(s) => Err(s),
    }
}

async fn recv(
    responses: &mut tonic::Streaming<WriteContentResponse>,
) -> anyhow::Result<WriteContentResponse> {
    recv_status(responses)
        .await
        .map_err(|s| CallFailed::from(s).into())
}

/// A content call containerd refused: its message as the error's text, its
/// gRPC code kept for decisions (never the message's wording, which
/// containerd versions are free to change).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct CallFailed {
    code: Code,
    message: String,
}

impl From<tonic::Status> for CallFailed {
    fn from(s: tonic::Status) -> Self {
        CallFailed {
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}

/// Whether containerd said the blob is already committed (`AlreadyExists`).
fn already_exists(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<CallFailed>())
        .any(|c| c.code == Code::AlreadyExists)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39.6g: "already exists" is containerd's gRPC code, whatever
    /// its message says (it was matched by the message's text).
    #[test]
    fn already_exists_is_the_code_not_the_words() {
        let said =
            |code, msg: &str| anyhow::Error::from(CallFailed::from(tonic::Status::new(code, msg)));
        assert!(already_exists(&said(
            Code::AlreadyExists,
            "content sha256:ab: exists"
        )));
        assert!(already_exists(
            &said(Code::AlreadyExists, "x").context("committing")
        ));
        assert!(!already_exists(&said(
            Code::Internal,
            "blob already exists elsewhere"
        )));
        assert!(!already_exists(&anyhow!("already exists")));
    }
}
