//! `--kind-node`: the files kind's own node image carries (its
//! `/kind/manifests`), taken from a published kindest/node.

use super::*;

/// A kindest/node to take kind's manifests from, and where it is.
/// An image kiln reads documents or files from (a kindest/node, the
/// previous node image), and where it is.
pub struct KindNode<'a> {
    pub source: crate::source::AnySource<'a>,
    pub image: ImageRef,
}

/// What a kindest/node gave: its two manifests (in `dir`), the images they run.
pub(super) struct KindNodeFiles {
    _work: tempfile::TempDir,
    pub(super) dir: PathBuf,
    pub(super) label: String,
    pub(super) images: Vec<ImageRef>,
}

/// `kind/manifests/` and its parents: all a build reads of a kindest/node.
pub(super) fn kind_manifests_path(rel: &std::path::Path) -> bool {
    let m = std::path::Path::new("kind/manifests");
    rel.starts_with(m) || m.starts_with(rel)
}

/// Pulls the kindest/node for `platform` into a private layout and unpacks
/// only `/kind/manifests/` (nothing of it runs); lists the images its
/// manifests run.
pub(super) async fn kind_node_files(
    k: &KindNode<'_>,
    platform: &Platform,
    jobs: usize,
    limits: crate::primitives::unpack::Limits,
) -> anyhow::Result<KindNodeFiles> {
    let work = crate::primitives::owned::work_dir("kiln-kind-node-")?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs)?;
    let mut owners = crate::primitives::unpack::Owners::new(kind_manifests_path);
    let mut budget = crate::primitives::unpack::Budget::new(limits, kind_manifests_path);
    let label = format!("--kind-node {}", k.image);
    crate::ops::unpack::unpack_image(
        &k.source,
        &k.image,
        platform,
        jobs,
        work.path(),
        &label,
        |layer| {
            crate::primitives::unpack::apply_layer_part(
                &rootfs,
                layer,
                &mut owners,
                kind_manifests_path,
                &mut budget,
                None,
            )
        },
    )
    .await?;
    let root = crate::primitives::inroot::Root::open(&rootfs)?;
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir)?;
    let mut texts = Vec::new();
    for rel in [
        crate::domain::kind::CNI_MANIFEST,
        crate::domain::kind::STORAGE_MANIFEST,
    ] {
        let bytes = root.read(std::path::Path::new(rel))?.ok_or_else(|| {
            crate::primitives::error::BadInput(format!(
                "--kind-node {}: it has no /{rel}; name a kindest/node image of your kind release",
                k.image
            ))
        })?;
        let name = std::path::Path::new(rel).file_name().expect("has a name");
        std::fs::write(dir.join(name), &bytes)?;
        texts.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    let names = crate::domain::kind::contract::addon_images(&texts[0], &texts[1])
        .map_err(|e| crate::primitives::error::BadInput(format!("--kind-node {}: {e}", k.image)))?;
    let images = names
        .iter()
        .map(|n| {
            ImageRef::parse(n).map_err(|e| {
                crate::primitives::error::BadInput(format!(
                    "--kind-node {}: its manifests run {n:?}: {e}",
                    k.image
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(KindNodeFiles {
        _work: work,
        dir,
        label: format!("--kind-node {}", k.image),
        images,
    })
}
