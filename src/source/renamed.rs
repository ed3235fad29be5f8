//! A source that answers for images under other names: a Kubernetes
//! release's archives say `registry.k8s.io/kube-apiserver-amd64:v1.34.1`,
//! kubeadm asks for `registry.k8s.io/kube-apiserver:v1.34.1`. Names it does
//! not know go to the source behind it ([`Overlay`]).

use bytes::Bytes;

use super::{archive::ArchiveSource, BlobStream, Resolved, Source};
use crate::primitives::oci::Descriptor;
use crate::primitives::reference::ImageRef;

pub struct Renamed {
    inner: ArchiveSource,
    /// (the name asked for, the name in the archive)
    names: Vec<(ImageRef, ImageRef)>,
}

impl Renamed {
    pub fn new(inner: ArchiveSource, names: Vec<(ImageRef, ImageRef)>) -> Self {
        Renamed { inner, names }
    }

    /// The archive's name for `image`, if this source supplies it.
    fn saved(&self, image: &ImageRef) -> Option<&ImageRef> {
        self.names
            .iter()
            .find(|(n, _)| n.name() == image.name() && n.tag == image.tag)
            .map(|(_, s)| s)
    }

    /// The names this source answers for.
    pub fn names(&self) -> impl Iterator<Item = &ImageRef> {
        self.names.iter().map(|(n, _)| n)
    }
}

/// `first`'s images first (by name), everything else from `rest`.
pub struct Overlay<'a, S> {
    pub first: Option<&'a Renamed>,
    pub rest: &'a S,
}

impl<S: Source> Overlay<'_, S> {
    fn pick(&self, image: &ImageRef) -> Option<(&Renamed, ImageRef)> {
        let first = self.first?;
        let saved = first.saved(image)?;
        // A digest in the request still has to match: the engine verifies it.
        Some((
            first,
            ImageRef {
                digest: image.digest.clone(),
                ..saved.clone()
            },
        ))
    }
}

impl<S: Source> Source for Overlay<'_, S> {
    async fn resolve(&self, image: &ImageRef) -> anyhow::Result<Resolved> {
        match self.pick(image) {
            Some((r, saved)) => r.inner.resolve(&saved).await,
            None => self.rest.resolve(image).await,
        }
    }

    async fn manifest(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<Bytes> {
        match self.pick(image) {
            Some((r, saved)) => r.inner.manifest(&saved, desc).await,
            None => self.rest.manifest(image, desc).await,
        }
    }

    async fn blob(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<BlobStream> {
        match self.pick(image) {
            Some((r, saved)) => r.inner.blob(&saved, desc).await,
            None => self.rest.blob(image, desc).await,
        }
    }

    fn describe(&self, image: &ImageRef) -> String {
        match self.pick(image) {
            Some((r, saved)) => format!("{} (as {saved})", r.inner.describe(&saved)),
            None => self.rest.describe(image),
        }
    }

    async fn referrers(
        &self,
        image: &ImageRef,
        subject: &crate::primitives::digest::Digest,
    ) -> Option<Bytes> {
        match self.pick(image) {
            Some(_) => None,
            None => self.rest.referrers(image, subject).await,
        }
    }
}
