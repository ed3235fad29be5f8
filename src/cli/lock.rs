//! `kiln lock`: pin every manifest entry to the digest its tag resolves to now.

use std::path::PathBuf;

use super::BadInput;
use crate::manifest::NodeManifest;
use crate::reference::ImageRef;

#[derive(clap::Args)]
pub struct Args {
    /// The node manifest (YAML, kind: NodeImageManifest).
    #[arg(long)]
    manifest: PathBuf,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Rewrite the manifest in place instead of printing it.
    #[arg(long)]
    write: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let manifest = NodeManifest::load(&args.manifest).map_err(|e| BadInput(e.to_string()))?;
    let source = args.registry.source()?;
    let mut pins = Vec::new();
    let mut errors = Vec::new();
    for image in &manifest.images {
        // Entries with only a digest stay as they are; tags are resolved afresh.
        if image.tag.is_none() {
            pins.push(None);
            continue;
        }
        let by_tag = ImageRef {
            digest: None,
            ..image.clone()
        };
        match source.resolve(&by_tag).await {
            Ok(r) => {
                if image
                    .digest
                    .as_ref()
                    .is_some_and(|d| *d != r.descriptor.digest)
                {
                    eprintln!(
                        "kiln: {by_tag} moved: {} -> {}",
                        image.digest.as_ref().unwrap(),
                        r.descriptor.digest
                    );
                }
                pins.push(Some(r.descriptor.digest));
            }
            Err(e) => {
                errors.push(format!(
                    "{by_tag}: {}",
                    crate::text::one_line(&format!("{e:#}"))
                ));
                pins.push(None);
            }
        }
    }
    if !errors.is_empty() {
        anyhow::bail!("cannot resolve {}", errors.join("; "));
    }
    let text = manifest.with_digests(&pins);
    if args.write {
        let tmp = args.manifest.with_extension("kiln-tmp");
        std::fs::write(&tmp, &text)?;
        std::fs::rename(&tmp, &args.manifest)?;
        eprintln!(
            "kiln: pinned {} images in {}",
            pins.iter().flatten().count(),
            args.manifest.display()
        );
    } else {
        print!("{text}");
    }
    Ok(())
}
