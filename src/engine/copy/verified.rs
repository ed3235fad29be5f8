//! A blob stream that fails unless its bytes are what its descriptor
//! says: how every blob the engine (or a node image's kept layer) moves is
//! verified while it streams.

use futures_util::{stream, StreamExt};

use crate::primitives::digest::Verifier;
use crate::primitives::oci::Descriptor;
use crate::primitives::progress::Progress;
use crate::source::BlobStream;

/// Wraps a blob stream so that it fails, before it ends, unless the content
/// is exactly `desc`'s; a sink that commits only on a clean end thus never
/// records unverified bytes.
pub fn verified(inner: BlobStream, desc: &Descriptor, progress: Progress) -> BlobStream {
    let verifier = Some(Verifier::new(desc.digest.clone(), desc.size));
    Box::pin(stream::unfold(
        (inner, verifier, progress),
        |(mut inner, verifier, progress)| async move {
            let mut v = verifier?;
            match inner.next().await {
                Some(Ok(chunk)) => match v.update(&chunk) {
                    Ok(()) => {
                        progress.advance(chunk.len() as u64);
                        Some((Ok(chunk), (inner, Some(v), progress)))
                    }
                    Err(e) => Some((Err(e.into()), (inner, None, progress))),
                },
                Some(Err(e)) => Some((Err(e), (inner, None, progress))),
                None => match v.finish() {
                    Ok(()) => None,
                    Err(e) => Some((Err(e.into()), (inner, None, progress))),
                },
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::digest::Digest;
    use bytes::Bytes;
    use futures_util::TryStreamExt;

    async fn drain(chunks: Vec<&'static [u8]>, desc: &Descriptor) -> anyhow::Result<Vec<u8>> {
        let inner: BlobStream = Box::pin(stream::iter(
            chunks.into_iter().map(|c| Ok(Bytes::from_static(c))),
        ));
        let parts: Vec<Bytes> = verified(inner, desc, Progress::hidden())
            .try_collect()
            .await?;
        Ok(parts.concat())
    }

    #[tokio::test]
    async fn verified_stream_fails_before_it_ends() {
        let desc = Descriptor::new(
            crate::primitives::oci::media::OCI_LAYER,
            Digest::of(b"abcdef"),
            6,
        );
        assert_eq!(drain(vec![b"abc", b"def"], &desc).await.unwrap(), b"abcdef");
        let e = drain(vec![b"abc", b"deF"], &desc).await.unwrap_err();
        assert!(e.to_string().contains("digest mismatch"), "{e}");
        assert!(drain(vec![b"abc"], &desc)
            .await
            .unwrap_err()
            .to_string()
            .contains("3 bytes"));
        assert!(drain(vec![b"abcdefg"], &desc).await.is_err());
    }
}
