use super::*;

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
