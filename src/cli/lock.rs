//! `kiln lock`: flags in, [`crate::ops::lock`] called, the manifest (or a
//! report) out.

use super::{JsonArg, ManifestArg};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    manifest: ManifestArg,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Rewrite the manifest in place instead of printing it.
    #[arg(long)]
    write: bool,
    /// Also write a lock of every input of the node image to FILE: the
    /// manifest's bytes, each image's digest, the base's and the
    /// kindest/node's, each platform's release and its SHA-512, and kiln's
    /// version; `kiln build --lock FILE` then builds exactly that.
    #[arg(long, value_name = "FILE")]
    lock_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    inputs: super::node::NodeInputs,
    #[command(flatten)]
    platforms: super::PlatformArgs,
    #[command(flatten)]
    cache: super::CacheArgs,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let manifest = args.manifest.load()?;
    if args.lock_file.is_none() {
        let given = [
            ("--base", args.inputs.base.is_some()),
            ("--kubernetes", args.inputs.kubernetes.is_some()),
            ("--kind-node", args.inputs.kind_node.is_some()),
            ("--previous", args.inputs.previous.is_some()),
            ("--platform", !args.platforms.platforms.is_empty()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            return Err(super::BadInput(format!(
                "{flag} is locked only into a lock file: add --lock-file FILE"
            ))
            .into());
        }
    }
    let platforms = args.platforms.get();
    if let Some(k) = args.inputs.release() {
        k.check_platforms(&platforms).map_err(super::BadInput)?;
    }
    let parse = |flag: &str, r: &Option<String>| {
        r.as_deref()
            .map(|r| {
                crate::primitives::reference::ImageRef::parse(r)
                    .map_err(|e| super::BadInput(format!("{flag} {r}: {e}")))
            })
            .transpose()
    };
    let kubernetes = args.inputs.release();
    let cache = match kubernetes {
        Some(_) => args.cache.open()?,
        None => None,
    };
    let inputs = crate::ops::lock::Inputs {
        base: parse("--base", &args.inputs.base)?,
        kind_node: parse("--kind-node", &args.inputs.kind_node)?,
        previous: parse("--previous", &args.inputs.previous)?,
        kubernetes,
        platforms: &platforms,
        cache: cache.as_ref(),
    };
    let registry = args.registry.client()?;
    let mut report = crate::ops::lock::lock(&registry, &manifest).await?;
    for l in &report.images {
        if let (Some(old), Some(new)) = (&l.moved_from, &l.digest) {
            say!("kiln: {} moved: {old} -> {new}", l.reference);
        }
    }
    let path = &args.manifest.manifest;
    if let Some(file) = &args.lock_file {
        // The manifest as it will be on disk: the lock holds its bytes.
        let locked = if args.write {
            crate::domain::manifest::NodeManifest::parse(path, &report.text)
                .map_err(|e| super::BadInput(e.to_string()))?
        } else {
            manifest.clone()
        };
        let lock = crate::ops::lock::lock_inputs(&registry, &locked, &report, &inputs).await?;
        crate::primitives::atomic::write(file, lock.to_yaml().as_bytes())
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", file.display()))?;
        say!(
            "kiln: locked {} images{}{}{} in {}",
            lock.images.len(),
            lock.base.as_ref().map(|_| ", the base").unwrap_or_default(),
            if lock.kubernetes.is_empty() {
                String::new()
            } else {
                format!(", {} release(s)", lock.kubernetes.len())
            },
            format!(
                "{}{}",
                lock.kind_node
                    .as_ref()
                    .map(|_| ", the kind node")
                    .unwrap_or_default(),
                lock.previous
                    .as_ref()
                    .map(|_| ", the previous node image")
                    .unwrap_or_default()
            ),
            file.display()
        );
        if let Some(p) = &lock.previous {
            say!(
                "kiln: the lock pins the previous node image's bytes ({}), not trust in them: a build uses its build record only when its signature verifies under --verify-signatures",
                p.digest
            );
        }
        report.lock = Some(lock);
    }
    if args.write {
        crate::primitives::atomic::write(path, report.text.as_bytes())
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        if !args.json.print(&report)? {
            say!(
                "kiln: pinned {} images in {}",
                report.images.iter().filter(|l| l.digest.is_some()).count(),
                path.display()
            );
        }
    } else if args.lock_file.is_some() {
        args.json.print(&report)?;
    } else if !args.json.print(&report)? {
        out!("{}", report.text.strip_suffix('\n').unwrap_or(&report.text));
    }
    Ok(())
}
