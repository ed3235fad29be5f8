//! Where images come from. The copy engine asks a source for documents and
//! blob streams; it verifies everything itself, so a source may be naive.

pub mod archive;
pub mod registry;
pub mod renamed;

use std::future::Future;

use bytes::Bytes;

use crate::primitives::oci::Descriptor;
use crate::primitives::reference::ImageRef;

pub use crate::primitives::handoff::{BlobStream, Resolved};

pub trait Source: Send + Sync {
    /// Resolves `image` (by tag or digest) to its top-level document.
    fn resolve(&self, image: &ImageRef) -> impl Future<Output = anyhow::Result<Resolved>> + Send;
    /// Fetches a manifest named by a descriptor of `image`'s index.
    fn manifest(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
    ) -> impl Future<Output = anyhow::Result<Bytes>> + Send;
    /// Opens a config or layer blob of `image` as a stream of chunks.
    fn blob(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
    ) -> impl Future<Output = anyhow::Result<BlobStream>> + Send;
    /// Where `image` is fetched from, for messages.
    fn describe(&self, image: &ImageRef) -> String;
    /// The OCI 1.1 referrers API's index of what refers to `subject`, where
    /// the source serves one (registries may); `None` otherwise.
    fn referrers(
        &self,
        _image: &ImageRef,
        _subject: &crate::primitives::digest::Digest,
    ) -> impl Future<Output = Option<Bytes>> + Send {
        async { None }
    }
}

/// Whichever source a command was given, so the command has one code path
/// whether images come from registries or from an archive.
pub enum AnySource<'a> {
    Registry(&'a registry::RegistryClient),
    Archive(&'a archive::ArchiveSource),
}

impl Source for AnySource<'_> {
    async fn resolve(&self, image: &ImageRef) -> anyhow::Result<Resolved> {
        match self {
            AnySource::Registry(s) => s.resolve(image).await,
            AnySource::Archive(s) => s.resolve(image).await,
        }
    }

    async fn manifest(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<Bytes> {
        match self {
            AnySource::Registry(s) => s.manifest(image, desc).await,
            AnySource::Archive(s) => s.manifest(image, desc).await,
        }
    }

    async fn blob(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<BlobStream> {
        match self {
            AnySource::Registry(s) => s.blob(image, desc).await,
            AnySource::Archive(s) => s.blob(image, desc).await,
        }
    }

    fn describe(&self, image: &ImageRef) -> String {
        match self {
            AnySource::Registry(s) => s.describe(image),
            AnySource::Archive(s) => s.describe(image),
        }
    }

    async fn referrers(
        &self,
        image: &ImageRef,
        subject: &crate::primitives::digest::Digest,
    ) -> Option<Bytes> {
        match self {
            AnySource::Registry(s) => Source::referrers(*s, image, subject).await,
            AnySource::Archive(s) => s.referrers(image, subject).await,
        }
    }
}
