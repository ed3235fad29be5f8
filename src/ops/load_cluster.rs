//! `kiln load --kind-cluster`: user images into every node of a running kind
//! cluster, managed and never pinned, through the provider's `exec` only.
//!
//! How: the images are copied once per node platform into an OCI archive
//! (that platform's content only, verified while it streams), and the archive
//! is streamed into each node, all nodes at once, through kind's own import
//! path: `ctr --namespace=k8s.io images import --platform P --snapshotter=S -`
//! (kind `pkg/cluster/nodeutils/util.go` `LoadImageArchive`, which passes
//! `--all-platforms --digests` instead), plus `--local` on containerd 2.x. `--platform` makes containerd walk
//! and unpack that platform only (`cmd/ctr/commands/images/import.go`:
//! `platforms.OnlyStrict`), so an index naming platforms whose content is
//! absent loads, where kind's `--all-platforms` fails with "content digest
//! not found" (kind #3795). No `--digests`: kiln's archives name every image.
//! An image already there keeps its labels (the importer updates only the
//! target: containerd 1.7 `import.go` and 2.x `client/import.go`,
//! `is.Update(ctx, img, "target")`, labels only when `--label` is given), so a bundled image never loses its pin; kiln then adds
//! `io.cri-containerd.image=managed` (ctr 1.7 has no `import --label`) and
//! reads the node's records back.
//!
//! A node already holding an image, complete for its platform, under the
//! same name and digest (`ctr images check`: kind #4236, its load never
//! asks) is sent nothing for it: a second identical load streams no byte
//! into the nodes. Every exec of a node is bounded (`Steps`, from
//! `--node-timeout`; `adapters::node_provider`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail};
use serde::Serialize;

use crate::adapters::node_provider::{probe, NodeFacts, Provider, Steps};
use crate::engine::copy::{CopyOptions, Engine};
use crate::engine::report::{CopiedImage, Failed, Stats};
use crate::primitives::digest::Digest;
use crate::primitives::platform::Platform;
use crate::primitives::progress::Progress;
use crate::primitives::reference::ImageRef;
use crate::sink::containerd::{
    K8S_NAMESPACE, LABEL_MANAGED as MANAGED_LABEL, LABEL_PINNED as PINNED_LABEL,
};
use crate::sink::layout::OciLayout;
use crate::source::Source;

/// Which cluster, through which engine, and which of its nodes (all when
/// empty).
pub struct Cluster {
    pub provider: Provider,
    pub name: String,
    pub nodes: Vec<String>,
    pub steps: Steps,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLoadReport {
    pub cluster: String,
    pub provider: Provider,
    /// The images copied into the archives (one per node platform).
    pub images: Vec<CopiedImage>,
    pub failed: Vec<Failed>,
    pub nodes: Vec<NodeReport>,
    pub stats: Stats,
    /// Bytes of the archives streamed into the nodes, each counted once.
    pub archive_bytes: u64,
}

/// One node's outcome: loaded, or why not (one line naming the node).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshotter: Option<String>,
    pub loaded: Vec<String>,
    /// The images it held already, complete, under the same digest: sent
    /// nothing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub already_there: Vec<String>,
    /// Bytes streamed into it.
    pub streamed: u64,
    pub seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One image record in a node, as `ctr images ls` shows it.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    digest: String,
    pinned: bool,
    managed: bool,
    /// Every blob of the node's platform is there (`ctr images check`).
    complete: bool,
}

/// The nodes to load into: the cluster's, narrowed to `wanted`.
pub async fn select_nodes(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let all = cluster.provider.nodes(&cluster.name, cluster.steps).await?;
    if all.is_empty() {
        return Err(crate::primitives::error::BadInput(format!(
            "kind cluster {:?}: no node containers labelled {}={} ({} ps -a); `kind get clusters` lists the clusters",
            cluster.name,
            crate::adapters::node_provider::CLUSTER_LABEL,
            cluster.name,
            cluster.provider.program()
        ))
        .into());
    }
    if cluster.nodes.is_empty() {
        return Ok(all);
    }
    for n in &cluster.nodes {
        if !all.contains(n) {
            return Err(crate::primitives::error::BadInput(format!(
                "--nodes {n}: not a node of kind cluster {:?} (its nodes: {})",
                cluster.name,
                all.join(", ")
            ))
            .into());
        }
    }
    Ok(cluster.nodes.clone())
}

/// Loads `refs` from `source` into every selected node of `cluster`.
/// `work` is a private directory for the archives.
pub async fn load_into_cluster<S: Source>(
    cluster: &Cluster,
    source: &S,
    refs: &[ImageRef],
    opts: &CopyOptions,
    force: bool,
    progress: Progress,
    work: &Path,
) -> anyhow::Result<ClusterLoadReport> {
    let names = select_nodes(cluster).await?;
    let provider = cluster.provider;
    let started = Instant::now();
    // Every node at once: its platform and snapshotter.
    let steps = cluster.steps;
    let facts: Vec<anyhow::Result<NodeFacts>> =
        futures_util::future::join_all(names.iter().map(|n| probe(provider, n, steps))).await;
    let platforms: Vec<Platform> = {
        let mut p: Vec<Platform> = facts
            .iter()
            .filter_map(|f| f.as_ref().ok().map(|f| f.platform.clone()))
            .collect();
        p.sort();
        p.dedup();
        p
    };
    // One archive per platform.
    let mut archives: BTreeMap<Platform, (PathBuf, Vec<CopiedImage>)> = BTreeMap::new();
    let mut failed: BTreeMap<String, Failed> = BTreeMap::new();
    let mut stats = Stats::default();
    let mut archive_bytes = 0;
    for (i, platform) in platforms.iter().enumerate() {
        let out = work.join(format!("images-{i}.tar"));
        let (copied, bad, st, size) = archive(
            source,
            refs,
            opts,
            platform,
            &work.join(format!("layout-{i}")),
            &out,
            progress.clone(),
        )
        .await?;
        stats.add(&st);
        archive_bytes += size;
        for f in bad {
            failed.entry(f.reference.clone()).or_insert(f);
        }
        archives.insert(platform.clone(), (out, copied));
    }
    // What each node lacks: a node holding every image sends nothing; one
    // lacking some gets an archive of those alone (made once per set).
    let held: Vec<anyhow::Result<BTreeMap<String, Record>>> =
        futures_util::future::join_all(names.iter().zip(&facts).map(|(name, f)| async move {
            match f {
                Ok(_) => records(provider, name, steps).await,
                Err(e) => Err(anyhow!("{e:#}")),
            }
        }))
        .await;
    let mut subsets: BTreeMap<(Platform, Vec<String>), PathBuf> = BTreeMap::new();
    let mut plans = Vec::new();
    for ((name, f), held) in names.iter().zip(facts).zip(held) {
        let plan = match (f, held) {
            (Ok(facts), Ok(held)) => {
                let (_, copied) = &archives[&facts.platform];
                let (there, lacking): (Vec<&CopiedImage>, Vec<&CopiedImage>) =
                    copied.iter().partition(|c| {
                        held.get(&c.reference).is_some_and(|r| {
                            r.complete && r.managed && r.digest == c.digest.to_string()
                        })
                    });
                let lacking: Vec<CopiedImage> = lacking.into_iter().cloned().collect();
                let there: Vec<String> = there.iter().map(|c| c.reference.clone()).collect();
                let path = if lacking.len() == copied.len() {
                    Some(archives[&facts.platform].0.clone())
                } else if lacking.is_empty() {
                    None
                } else {
                    let key = (
                        facts.platform.clone(),
                        lacking.iter().map(|c| c.reference.clone()).collect(),
                    );
                    if !subsets.contains_key(&key) {
                        let i = subsets.len();
                        let out = work.join(format!("lacking-{i}.tar"));
                        let refs: Vec<ImageRef> = lacking
                            .iter()
                            .map(|c| ImageRef::parse(&c.reference))
                            .collect::<Result<_, _>>()?;
                        let (_, _, st, _) = archive(
                            source,
                            &refs,
                            opts,
                            &facts.platform,
                            &work.join(format!("lacking-layout-{i}")),
                            &out,
                            progress.clone(),
                        )
                        .await?;
                        stats.add(&st);
                        subsets.insert(key.clone(), out);
                    }
                    Some(subsets[&key].clone())
                };
                Ok((facts, held, lacking, there, path))
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        plans.push((name.clone(), plan));
    }
    let reports =
        futures_util::future::join_all(plans.into_iter().map(|(name, plan)| async move {
            let t = Instant::now();
            let (facts, outcome) = match plan {
                Ok((facts, held, lacking, there, path)) => {
                    let r = load_node(
                        provider,
                        &name,
                        &facts,
                        (path.as_deref(), &lacking),
                        &held,
                        force,
                        steps,
                    )
                    .await
                    .map(|(loaded, streamed)| (loaded, there, streamed));
                    (Some(facts), r)
                }
                Err(e) => (None, Err(e)),
            };
            let (loaded, already_there, streamed) = match &outcome {
                Ok((l, t, s)) => (l.clone(), t.clone(), *s),
                Err(_) => Default::default(),
            };
            NodeReport {
                name: name.clone(),
                platform: facts.as_ref().map(|f| f.platform.to_string()),
                snapshotter: facts.map(|f| f.snapshotter),
                loaded,
                already_there,
                streamed,
                seconds: t.elapsed().as_secs_f64(),
                error: outcome
                    .err()
                    .map(|e| crate::primitives::text::one_line(&format!("node {name}: {e:#}"))),
            }
        }))
        .await;
    tracing::debug!(
        "loaded into {} nodes in {:?}",
        reports.len(),
        started.elapsed()
    );
    // What every platform's archive held, once per image.
    let mut images: BTreeMap<String, CopiedImage> = BTreeMap::new();
    for (_, (_, copied)) in archives {
        for c in copied {
            images.entry(c.reference.clone()).or_insert(c);
        }
    }
    Ok(ClusterLoadReport {
        cluster: cluster.name.clone(),
        provider,
        images: images.into_values().collect(),
        failed: failed.into_values().collect(),
        nodes: reports,
        stats,
        archive_bytes,
    })
}

/// Copies `refs` for `platform` into a layout under `staging` and packs it
/// into `out`: what was copied, what failed, the copy's stats, the size.
async fn archive<S: Source>(
    source: &S,
    refs: &[ImageRef],
    opts: &CopyOptions,
    platform: &Platform,
    staging: &Path,
    out: &Path,
    progress: Progress,
) -> anyhow::Result<(Vec<CopiedImage>, Vec<Failed>, Stats, u64)> {
    let layout = OciLayout::open(staging)?;
    // Blobs go straight into the archive as they are verified: written once.
    layout.archive_to(out)?;
    let opts = CopyOptions {
        platforms: vec![platform.clone()],
        jobs: opts.jobs,
        cache: opts.cache.clone(),
        gate: None,
        absent: None,
    };
    let engine = Engine::new(source, &layout, opts.jobs, progress);
    let results = engine.copy_all(refs, &opts).await;
    let stats = engine.stats();
    drop(engine);
    let (copied, failed) = crate::engine::report::split(refs, results);
    layout.write_index()?;
    let size = layout.pack(out, &[])?;
    Ok((copied, failed, stats, size))
}

/// The image records `node` holds (`ctr images ls`), each with whether it
/// is complete for the node's platform (`ctr images check`).
async fn records(
    provider: Provider,
    node: &str,
    steps: Steps,
) -> anyhow::Result<BTreeMap<String, Record>> {
    let ns = format!("--namespace={K8S_NAMESPACE}");
    let (ls, _) = provider
        .exec(node, &["ctr", &ns, "images", "ls"], None, steps)
        .await?;
    let (check, _) = provider
        .exec(node, &["ctr", &ns, "images", "check"], None, steps)
        .await?;
    let mut held = parse_records(&ls);
    for (name, complete) in parse_check(&check) {
        if let Some(r) = held.get_mut(&name) {
            r.complete = complete;
        }
    }
    Ok(held)
}

/// Imports the archive at `path` (the images `copied`, those the node
/// lacks; none: nothing to send) into `node`, which held `before`; the
/// names it loaded and the bytes streamed.
async fn load_node(
    provider: Provider,
    node: &str,
    facts: &NodeFacts,
    (path, copied): (Option<&Path>, &[CopiedImage]),
    before: &BTreeMap<String, Record>,
    force: bool,
    steps: Steps,
) -> anyhow::Result<(Vec<String>, u64)> {
    let Some(path) = path.filter(|_| !copied.is_empty()) else {
        return Ok((Vec::new(), 0));
    };
    let ctr = |args: &[&str]| -> Vec<String> {
        let mut v = vec!["ctr".to_string(), format!("--namespace={K8S_NAMESPACE}")];
        v.extend(args.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: Vec<String>, stdin: Option<std::fs::File>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        provider.exec(node, &args, stdin, steps).await
    };
    // load's rule: a bundled image is replaced only with --force (and then
    // stays pinned); nothing is imported into a node that refuses one.
    for c in copied {
        if let Some(r) = before.get(&c.reference) {
            if r.pinned && r.digest != c.digest.to_string() && !force {
                bail!(
                    "{} is bundled (pinned) there as {}; loading {} would replace it: give --force to replace it (it stays pinned)",
                    c.reference,
                    r.digest,
                    c.digest
                );
            }
        }
    }
    let platform = facts.platform.to_string();
    let snapshotter = format!("--snapshotter={}", facts.snapshotter);
    let mut import = vec!["images", "import", "--platform", &platform, &snapshotter];
    // ctr 2.x imports through the daemon's transfer service unless told
    // `--local` (1.7's default; 1.6's ctr has no such flag): locally, a
    // 270 MiB image imported and unpacked in 6.5 s rather than 9.0 s in a
    // node on this project's bench machine (make bench (p)).
    if facts.containerd.major >= 2 {
        import.push("--local");
    }
    import.push("-");
    let (_, streamed) = run(ctr(&import), Some(std::fs::File::open(path)?)).await?;
    for c in copied {
        run(
            ctr(&[
                "images",
                "label",
                &c.reference,
                &format!("{MANAGED_LABEL}=managed"),
            ]),
            None,
        )
        .await?;
    }
    // Read back what the node now holds.
    let after = parse_records(&run(ctr(&["images", "ls"]), None).await?.0);
    let mut loaded = Vec::new();
    for c in copied {
        let r = after.get(&c.reference).ok_or_else(|| {
            anyhow!(
                "{} is not in the node's store after the import",
                c.reference
            )
        })?;
        if r.digest != c.digest.to_string() {
            bail!(
                "{} is {} in the node after the import, not {}",
                c.reference,
                r.digest,
                c.digest
            );
        }
        if before.get(&c.reference).is_some_and(|b| b.pinned) && !r.pinned {
            bail!("{} lost its pin in the import", c.reference);
        }
        if !r.managed {
            bail!("{} is not labelled managed after the import", c.reference);
        }
        loaded.push(c.reference.clone());
    }
    Ok((loaded, streamed))
}

/// `ctr images check`: `REF TYPE DIGEST STATUS SIZE UNPACKED`, the status
/// `complete (n/n)` or `incomplete (k/n)` for ctr's (the node's) platform.
fn parse_check(out: &str) -> Vec<(String, bool)> {
    out.lines()
        .skip(1)
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() >= 4 && Digest::parse(t[2]).is_ok())
                .then(|| (t[0].to_string(), t[3] == "complete"))
        })
        .collect()
}

/// `ctr images ls`: `REF TYPE DIGEST SIZE PLATFORMS LABELS`, the size in two
/// words ("1.2 MiB"), labels `k=v` joined by `,` (or `-`).
fn parse_records(out: &str) -> BTreeMap<String, Record> {
    out.lines()
        .skip(1)
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            if t.len() < 4 || Digest::parse(t[2]).is_err() {
                return None;
            }
            let labels: Vec<&str> = t[4..].iter().flat_map(|w| w.split(',')).collect();
            Some((
                t[0].to_string(),
                Record {
                    digest: t[2].to_string(),
                    pinned: labels.contains(&format!("{PINNED_LABEL}=pinned").as_str()),
                    managed: labels.contains(&format!("{MANAGED_LABEL}=managed").as_str()),
                    complete: false,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_from_ctr_images_ls() {
        let out = "REF TYPE DIGEST SIZE PLATFORMS LABELS \n\
registry.k8s.io/pause:3.10 application/vnd.oci.image.index.v1+json sha256:1111111111111111111111111111111111111111111111111111111111111111 312.0 KiB linux/amd64,linux/arm64 io.cri-containerd.image=managed,io.cri-containerd.pinned=pinned \n\
docker.io/library/app:1 application/vnd.oci.image.manifest.v1+json sha256:2222222222222222222222222222222222222222222222222222222222222222 2.0 MiB linux/amd64 - \n";
        let r = parse_records(out);
        assert_eq!(r.len(), 2);
        let pause = &r["registry.k8s.io/pause:3.10"];
        assert!(pause.pinned && pause.managed);
        let app = &r["docker.io/library/app:1"];
        assert!(!app.pinned && !app.managed);
        assert!(app.digest.ends_with("2222"));
    }
}
