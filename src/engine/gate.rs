//! A gate the engine asks before it stores anything of an image: a policy
//! (signatures, today) that may refuse it. The engine knows no policy; it
//! hands the gate the image's resolved top document and a way to read
//! more documents from the same source, every byte of them verified here.

use std::fmt::Debug;

use anyhow::{anyhow, bail};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};

use crate::primitives::digest::{Digest, Verifier};
use crate::primitives::oci::Descriptor;
use crate::primitives::reference::ImageRef;
use crate::source::{Resolved, Source};

/// What a gate may read from the source an image comes from.
pub trait Fetch: Send + Sync {
    /// The top document `image` (by tag or digest) resolves to, its bytes
    /// checked against its digest.
    fn document<'a>(&'a self, image: &'a ImageRef) -> BoxFuture<'a, anyhow::Result<Resolved>>;
    /// A blob of `image` of at most `max` bytes, checked against `desc`.
    fn small_blob<'a>(
        &'a self,
        image: &'a ImageRef,
        desc: &'a Descriptor,
        max: u64,
    ) -> BoxFuture<'a, anyhow::Result<Bytes>>;
    /// The referrers API's index for `subject`, where the source serves it.
    fn referrers<'a>(
        &'a self,
        image: &'a ImageRef,
        subject: &'a Digest,
    ) -> BoxFuture<'a, Option<Bytes>>;
}

impl<S: Source> Fetch for S {
    fn document<'a>(&'a self, image: &'a ImageRef) -> BoxFuture<'a, anyhow::Result<Resolved>> {
        async move {
            let r = self.resolve(image).await?;
            let actual = Digest::of(&r.bytes);
            if actual != r.descriptor.digest {
                bail!(
                    "manifest digest mismatch: the source says {}, content is {actual}",
                    r.descriptor.digest
                );
            }
            if let Some(want) = &image.digest {
                if *want != actual {
                    bail!("asked for {want}, the source gave {actual}");
                }
            }
            Ok(r)
        }
        .boxed()
    }

    fn small_blob<'a>(
        &'a self,
        image: &'a ImageRef,
        desc: &'a Descriptor,
        max: u64,
    ) -> BoxFuture<'a, anyhow::Result<Bytes>> {
        async move {
            if desc.size > max {
                bail!(
                    "blob {} is {} bytes, over the {max}-byte limit",
                    desc.digest,
                    desc.size
                );
            }
            let mut stream = self.blob(image, desc).await?;
            let mut check = Verifier::new(desc.digest.clone(), desc.size);
            let mut out = Vec::with_capacity(desc.size as usize);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                check
                    .update(&chunk)
                    .map_err(|e| anyhow!("blob {}: {e}", desc.digest))?;
                out.extend_from_slice(&chunk);
            }
            check
                .finish()
                .map_err(|e| anyhow!("blob {}: {e}", desc.digest))?;
            Ok(Bytes::from(out))
        }
        .boxed()
    }

    fn referrers<'a>(
        &'a self,
        image: &'a ImageRef,
        subject: &'a Digest,
    ) -> BoxFuture<'a, Option<Bytes>> {
        Source::referrers(self, image, subject).boxed()
    }
}

/// Admits or refuses an image before anything of it is stored.
pub trait Gate: Send + Sync + Debug {
    /// `Ok` admits `image`, resolved to `top`, with what vouched for it if
    /// anything did (reported with the image); an error refuses it, saying why.
    fn admit<'a>(
        &'a self,
        source: &'a dyn Fetch,
        image: &'a ImageRef,
        top: &'a Descriptor,
    ) -> BoxFuture<'a, anyhow::Result<Option<String>>>;
}

/// A gate that admits some images without asking the one behind it: a
/// Kubernetes release's own images, trusted by the release's checksum.
#[derive(Debug)]
pub struct Except {
    pub inner: std::sync::Arc<dyn Gate>,
    /// Admitted by name and tag.
    pub images: Vec<ImageRef>,
}

impl Gate for Except {
    fn admit<'a>(
        &'a self,
        source: &'a dyn Fetch,
        image: &'a ImageRef,
        top: &'a Descriptor,
    ) -> BoxFuture<'a, anyhow::Result<Option<String>>> {
        if self
            .images
            .iter()
            .any(|i| i.name() == image.name() && i.tag == image.tag)
        {
            return async { Ok(None) }.boxed();
        }
        self.inner.admit(source, image, top)
    }
}
