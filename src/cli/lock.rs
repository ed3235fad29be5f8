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
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let manifest = args.manifest.load()?;
    let registry = args.registry.client()?;
    let report = crate::ops::lock::lock(&registry, &manifest).await?;
    for l in &report.images {
        if let (Some(old), Some(new)) = (&l.moved_from, &l.digest) {
            say!("kiln: {} moved: {old} -> {new}", l.reference);
        }
    }
    let path = &args.manifest.manifest;
    if args.write {
        let tmp = path.with_extension("kiln-tmp");
        std::fs::write(&tmp, &report.text)?;
        std::fs::rename(&tmp, path)?;
        if !args.json.print(&report)? {
            say!(
                "kiln: pinned {} images in {}",
                report.images.iter().filter(|l| l.digest.is_some()).count(),
                path.display()
            );
        }
    } else if !args.json.print(&report)? {
        out!("{}", report.text.strip_suffix('\n').unwrap_or(&report.text));
    }
    Ok(())
}
