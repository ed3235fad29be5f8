//! An OCI distribution registry (or a `--mirror` of one), through oci-client.

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures_util::TryStreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::{BlobStream, Resolved, Source};
use crate::digest::Digest;
use crate::oci::{media, Descriptor, Document};
use crate::reference::ImageRef;

/// Manifests larger than this are not images; refuse before buffering them.
const MAX_MANIFEST_BYTES: usize = 8 << 20;

/// A registry endpoint: `host[:port]` and whether it speaks plain HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub plain_http: bool,
}

impl Endpoint {
    /// Plain HTTP only for loopback registries; everything else is HTTPS.
    pub fn upstream(domain: &str) -> Self {
        let host = domain.rsplit_once(':').map(|(h, _)| h).unwrap_or(domain);
        let loopback = host == "localhost" || host.starts_with("127.") || host == "[::1]";
        Endpoint {
            host: domain.to_string(),
            plain_http: loopback,
        }
    }
}

/// `--mirror HOST=URL`: fetch HOST's images from URL, record them under HOST.
#[derive(Debug, Clone, Default)]
pub struct Mirrors(HashMap<String, Endpoint>);

impl Mirrors {
    pub fn parse(specs: &[String]) -> Result<Self, String> {
        let mut map = HashMap::new();
        for spec in specs {
            let (host, url) = spec
                .split_once('=')
                .ok_or_else(|| format!("invalid --mirror {spec:?}: want HOST=URL, e.g. registry.k8s.io=http://127.0.0.1:5000"))?;
            let (plain_http, rest) = if let Some(r) = url.strip_prefix("http://") {
                (true, r)
            } else if let Some(r) = url.strip_prefix("https://") {
                (false, r)
            } else {
                (false, url)
            };
            let rest = rest.trim_end_matches('/');
            if host.is_empty() || rest.is_empty() || rest.contains('/') {
                return Err(format!(
                    "invalid --mirror {spec:?}: URL must be scheme://host[:port] with no path"
                ));
            }
            let host = if host == "index.docker.io" {
                "docker.io"
            } else {
                host
            };
            map.insert(
                host.to_string(),
                Endpoint {
                    host: rest.to_string(),
                    plain_http,
                },
            );
        }
        Ok(Mirrors(map))
    }

    pub fn endpoint(&self, domain: &str) -> Endpoint {
        self.0
            .get(domain)
            .cloned()
            .unwrap_or_else(|| Endpoint::upstream(domain))
    }
}

pub struct RegistrySource {
    mirrors: Mirrors,
    clients: Mutex<HashMap<String, Client>>,
}

impl RegistrySource {
    pub fn new(mirrors: Mirrors) -> Self {
        RegistrySource {
            mirrors,
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn client(&self, ep: &Endpoint) -> Client {
        let mut clients = self.clients.lock().unwrap();
        clients
            .entry(ep.host.clone())
            .or_insert_with(|| {
                let protocol = if ep.plain_http {
                    ClientProtocol::Http
                } else {
                    ClientProtocol::Https
                };
                Client::new(ClientConfig {
                    protocol,
                    connect_timeout: Some(std::time::Duration::from_secs(15)),
                    read_timeout: Some(std::time::Duration::from_secs(60)),
                    user_agent: concat!("kiln/", env!("CARGO_PKG_VERSION")),
                    ..Default::default()
                })
            })
            .clone()
    }

    /// The oci-client reference at the endpoint that serves `image`.
    fn remote(&self, image: &ImageRef, digest: Option<&Digest>) -> (Client, Endpoint, Reference) {
        let ep = self.mirrors.endpoint(&image.domain);
        let r = match (digest.or(image.digest.as_ref()), &image.tag) {
            (Some(d), _) => {
                Reference::with_digest(ep.host.clone(), image.path.clone(), d.to_string())
            }
            (None, Some(t)) => Reference::with_tag(ep.host.clone(), image.path.clone(), t.clone()),
            (None, None) => {
                Reference::with_tag(ep.host.clone(), image.path.clone(), "latest".into())
            }
        };
        (self.client(&ep), ep, r)
    }

    async fn fetch_document(
        &self,
        image: &ImageRef,
        digest: Option<&Digest>,
    ) -> anyhow::Result<(Bytes, Digest)> {
        let (client, ep, remote) = self.remote(image, digest);
        let (bytes, digest) = client
            .pull_manifest_raw(&remote, &RegistryAuth::Anonymous, media::ACCEPT)
            .await
            .map_err(|e| {
                anyhow!(
                    "{}: {}",
                    endpoint_url(&ep, &remote),
                    one_line(&e.to_string())
                )
            })?;
        if bytes.len() > MAX_MANIFEST_BYTES {
            bail!(
                "manifest of {image} is {} bytes, over the {MAX_MANIFEST_BYTES}-byte limit",
                bytes.len()
            );
        }
        let digest = Digest::parse(&digest)
            .with_context(|| format!("registry sent a bad digest for {image}"))?;
        Ok((bytes, digest))
    }
}

impl Source for RegistrySource {
    async fn resolve(&self, image: &ImageRef) -> anyhow::Result<Resolved> {
        let (bytes, digest) = self.fetch_document(image, None).await?;
        // oci-client checked the body against the digest the registry (or the
        // reference) names; the engine checks it again against the pin.
        let (media_type, _) = Document::parse(&bytes).map_err(|e| anyhow!("{image}: {e}"))?;
        let descriptor = Descriptor::new(&media_type, digest, bytes.len() as u64);
        Ok(Resolved { descriptor, bytes })
    }

    async fn manifest(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<Bytes> {
        let (bytes, _) = self.fetch_document(image, Some(&desc.digest)).await?;
        Ok(bytes)
    }

    async fn blob(&self, image: &ImageRef, desc: &Descriptor) -> anyhow::Result<BlobStream> {
        let (client, ep, remote) = self.remote(image, None);
        let layer = OciDescriptor {
            media_type: desc.media_type.clone(),
            digest: desc.digest.to_string(),
            size: desc.size as i64,
            urls: None,
            annotations: None,
            artifact_type: None,
        };
        let stream = client
            .pull_blob_stream(&remote, &layer)
            .await
            .map_err(|e| {
                anyhow!(
                    "{}: blob {}: {}",
                    endpoint_url(&ep, &remote),
                    desc.digest,
                    one_line(&e.to_string())
                )
            })?;
        Ok(Box::pin(stream.stream.map_err(|e| {
            anyhow!("reading blob: {}", one_line(&e.to_string()))
        })))
    }

    fn describe(&self, image: &ImageRef) -> String {
        let ep = self.mirrors.endpoint(&image.domain);
        let scheme = if ep.plain_http { "http" } else { "https" };
        format!("{scheme}://{}/v2/{}", ep.host, image.path)
    }
}

fn endpoint_url(ep: &Endpoint, r: &Reference) -> String {
    let scheme = if ep.plain_http { "http" } else { "https" };
    format!("{scheme}://{}/v2/{}", ep.host, r.repository())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_parse() {
        let m = Mirrors::parse(&[
            "registry.k8s.io=http://127.0.0.1:5000".into(),
            "docker.io=https://mirror.example".into(),
        ])
        .unwrap();
        assert_eq!(
            m.endpoint("registry.k8s.io"),
            Endpoint {
                host: "127.0.0.1:5000".into(),
                plain_http: true
            }
        );
        assert_eq!(
            m.endpoint("docker.io"),
            Endpoint {
                host: "mirror.example".into(),
                plain_http: false
            }
        );
        assert_eq!(
            m.endpoint("quay.io"),
            Endpoint {
                host: "quay.io".into(),
                plain_http: false
            }
        );
        assert!(m.endpoint("localhost:5000").plain_http);
        assert!(Mirrors::parse(&["registry.k8s.io".into()]).is_err());
        assert!(Mirrors::parse(&["a=http://h/path".into()]).is_err());
    }
}
