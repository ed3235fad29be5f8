//! `kiln build --base`: node images, daemonless. Base image in (registry or
//! archive), one new layer with the pinned store, node image out (OCI
//! archive, docker archive, or pushed).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Context};
use serde_json::json;

use super::{interruptible, BadInput};
use crate::copy::{CopyOptions, Engine};
use crate::layout::OciLayout;
use crate::manifest::NodeManifest;
use crate::node_image::{build_node_image, NodeImage};
use crate::oci::{Document, ImageManifest};
use crate::platform::Platform;
use crate::progress::Progress;
use crate::reference::ImageRef;
use crate::sink::registry::RegistryPush;
use crate::source::archive::ArchiveSource;
use crate::source::AnySource;
use crate::text::human_bytes;

pub struct NodeArgs {
    pub base: Option<String>,
    pub base_archive: Option<PathBuf>,
    pub output: Option<String>,
    pub push: Option<String>,
    pub tag: Option<String>,
    pub from: Option<PathBuf>,
    pub registry: super::RegistryArgs,
    pub daemon: super::DaemonArgs,
    pub jobs: usize,
    pub json: bool,
}

enum Output {
    Oci(PathBuf),
    Docker(PathBuf),
}

fn parse_output(s: &str) -> Result<Output, BadInput> {
    match s.split_once(':') {
        Some(("oci-archive", p)) if !p.is_empty() => Ok(Output::Oci(PathBuf::from(p))),
        Some(("docker-archive", p)) if !p.is_empty() => Ok(Output::Docker(PathBuf::from(p))),
        _ => Err(BadInput(format!(
            "--output {s:?}: want oci-archive:PATH or docker-archive:PATH"
        ))),
    }
}

fn parse_ref(flag: &str, s: &str) -> Result<ImageRef, BadInput> {
    ImageRef::parse(s).map_err(|e| BadInput(format!("{flag}: {e}")))
}

pub async fn run(
    args: &NodeArgs,
    manifest: &NodeManifest,
    platforms: Vec<Platform>,
    started: Instant,
) -> anyhow::Result<()> {
    let output = args.output.as_deref().map(parse_output).transpose()?;
    let push = args
        .push
        .as_deref()
        .map(|p| parse_ref("--push", p))
        .transpose()?;
    if output.is_none() && push.is_none() {
        return Err(BadInput("a node image needs somewhere to go: --output oci-archive:PATH, --output docker-archive:PATH or --push REF".into()).into());
    }
    if matches!(output, Some(Output::Docker(_))) && platforms.len() > 1 {
        return Err(BadInput(
            "docker-archive holds one platform; use oci-archive: or --push for several".into(),
        )
        .into());
    }
    let tag = match (&args.tag, &push) {
        (Some(t), _) => parse_ref("--tag", t)?,
        (None, Some(p)) => p.clone(),
        (None, None) => parse_ref(
            "--tag",
            &format!(
                "kiln.local/node:{}",
                manifest.kubernetes_version.as_deref().unwrap_or("latest")
            ),
        )?,
    };
    let registry = args.registry.source()?;
    let bundle = args
        .from
        .as_deref()
        .map(|b| super::open_bundle(b, &manifest.images, &platforms))
        .transpose()?;
    let images = match &bundle {
        Some(b) => AnySource::Archive(b),
        None => AnySource::Registry(&registry),
    };
    let base_archive = args
        .base_archive
        .as_deref()
        .map(|a| ArchiveSource::open(&[a.to_path_buf()]).map_err(super::bad_input))
        .transpose()?;
    let base_ref = match (&args.base, &base_archive) {
        (Some(b), _) => parse_ref("--base", b)?,
        (None, Some(src)) => src.images().into_iter().next().ok_or_else(|| {
            BadInput(format!(
                "{} names no image",
                args.base_archive
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            ))
        })?,
        (None, None) => unreachable!("clap: --base or --base-archive"),
    };
    let base_source = match &base_archive {
        Some(a) => AnySource::Archive(a),
        None => AnySource::Registry(&registry),
    };
    let staging = tempfile::Builder::new()
        .prefix("kiln-node-image-")
        .tempdir()?;
    let layout = OciLayout::open(staging.path())?;
    let progress = Progress::new(!args.json, manifest.images.len());
    let copy_opts = CopyOptions {
        platforms: platforms.clone(),
        jobs: args.jobs,
    };

    let work = async {
        // The base, into the staging layout.
        let base_top = Engine::new(&base_source, &layout, args.jobs, Progress::hidden())
            .copy(&base_ref, &copy_opts)
            .await?;
        let base_top = crate::oci::Descriptor::new(&base_top.media_type, base_top.digest, 0);
        let node = build_node_image(
            &layout,
            &base_ref,
            &base_top,
            &images,
            manifest,
            &platforms,
            &args.daemon.choice(),
            args.jobs,
            progress.clone(),
        )
        .await?;
        anyhow::Ok((base_ref, node))
    };
    let result = interruptible(work).await;
    progress.finish();
    let (base_ref, node) = result?;

    let mut said = Vec::new();
    if let Some(out) = &output {
        layout.name_only(&tag, &node.top);
        layout.write_index()?;
        let (path, extra) = match out {
            Output::Oci(p) => (p, vec![]),
            Output::Docker(p) => {
                write_docker_manifest(&layout, &node, &tag)?;
                (p, vec!["manifest.json"])
            }
        };
        let size = layout
            .pack(path, &extra)
            .with_context(|| format!("writing {}", path.display()))?;
        said.push(format!(
            "{} ({})",
            args.output.as_deref().unwrap_or_default(),
            human_bytes(size)
        ));
    }
    if let Some(target) = &push {
        layout.name_only(target, &node.top);
        let sink = RegistryPush::new(registry.clone(), target.clone());
        let engine = Engine::new(&layout, &sink, args.jobs, Progress::hidden());
        engine
            .copy(target, &copy_opts)
            .await
            .map_err(|e| anyhow!("pushing {target}: {e:#}"))?;
        let st = engine.stats();
        said.push(format!(
            "pushed {target} ({} blobs uploaded, {} already there)",
            st.blobs_fetched, st.blobs_present
        ));
    }
    let layer_sizes: Vec<String> = node
        .layers
        .iter()
        .map(|l| format!("{} {} entries", human_bytes(l.size), l.entries))
        .collect();
    if args.json {
        let platforms: Vec<serde_json::Value> = node
            .manifests
            .iter()
            .map(|(p, d)| json!({"platform": p.to_string(), "manifest": d.digest}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "digest": node.top.digest, "mediaType": node.top.media_type, "name": tag.to_string(), "base": base_ref.to_string(),
                "platforms": platforms, "kilnLayers": node.layers.iter().map(|l| json!({"digest": l.digest, "diffId": l.diff_id, "size": l.size})).collect::<Vec<_>>(),
                "seconds": started.elapsed().as_secs_f64(),
            }))?
        );
    }
    eprintln!(
        "kiln: node image {} {} from {base_ref} ({}; kiln layer {}) in {:.1}s: {}",
        tag,
        node.top.digest,
        node.manifests
            .iter()
            .map(|(p, _)| p.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        layer_sizes.join(", "),
        started.elapsed().as_secs_f64(),
        said.join("; ")
    );
    Ok(())
}

/// `manifest.json` as `docker load` reads it (Docker 25 paths into blobs/).
fn write_docker_manifest(
    layout: &OciLayout,
    node: &NodeImage,
    tag: &ImageRef,
) -> anyhow::Result<()> {
    let (_, m) = &node.manifests[0];
    let bytes = std::fs::read(layout.blob_path(&m.digest))?;
    let Ok((_, Document::Manifest(man))) = Document::parse(&bytes) else {
        anyhow::bail!("node manifest unreadable")
    };
    let man: ImageManifest = man;
    let blob = |d: &crate::digest::Digest| format!("blobs/sha256/{}", d.hex());
    let name = tag.tagged_name().unwrap_or_else(|| tag.to_string());
    let short = name
        .strip_prefix("docker.io/library/")
        .or_else(|| name.strip_prefix("docker.io/"))
        .unwrap_or(&name)
        .to_string();
    let doc = json!([{"Config": blob(&man.config.digest), "RepoTags": [short], "Layers": man.layers.iter().map(|l| blob(&l.digest)).collect::<Vec<_>>()}]);
    layout.add_file("manifest.json", &serde_json::to_vec(&doc)?)
}
