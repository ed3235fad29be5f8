//! A registry as a source: the pull side of [`crate::adapters::registry::RegistryClient`]
//! (auth, retries, mirrors, resumable downloads live there, shared with the
//! push sink).

use bytes::Bytes;

use super::{BlobStream, Resolved, Source};
pub use crate::adapters::registry::RegistryClient;
use crate::primitives::oci::Descriptor;
use crate::primitives::reference::ImageRef;

impl Source for RegistryClient {
    async fn resolve(&self, image: &ImageRef) -> anyhow::Result<Resolved> {
        RegistryClient::resolve(self, image).await
    }

    async fn manifest(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<Bytes> {
        RegistryClient::manifest(self, image, desc).await
    }

    async fn blob(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<BlobStream> {
        RegistryClient::blob(self, image, desc).await
    }

    fn describe(&self, image: &ImageRef) -> String {
        RegistryClient::describe(self, image)
    }

    async fn referrers(
        &self,
        image: &ImageRef,
        subject: &crate::primitives::digest::Digest,
    ) -> Option<Bytes> {
        RegistryClient::referrers(self, image, subject).await
    }
}
