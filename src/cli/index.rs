//! `kiln index --push REF REF1 REF2...`: flags in, [`crate::ops::index`]
//! called, the report out.

use super::{parse_image, BadInput, JobsArg, JsonArg};

#[derive(clap::Args)]
pub struct Args {
    /// Where the multi-platform index goes (a tag).
    #[arg(long, value_name = "REF")]
    push: String,
    /// The single-platform node images to join (one per platform).
    #[arg(value_name = "REF", required = true, num_args = 1..)]
    members: Vec<String>,
    /// Sign the index with this PEM P-256 private key (as `cosign sign
    /// --key` does) before it is tagged: a build that follows it trusts
    /// its members' build records only when this signature verifies.
    #[arg(long, value_name = "FILE")]
    sign_key: Option<std::path::PathBuf>,
    #[command(flatten)]
    registry: super::RegistryArgs,
    #[command(flatten)]
    jobs: JobsArg,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let target = parse_image("--push", &args.push)?;
    let members = args
        .members
        .iter()
        .map(|m| parse_image("image", m))
        .collect::<Result<Vec<_>, BadInput>>()?;
    let key = args
        .sign_key
        .as_deref()
        .map(crate::domain::signatures::sign::SigningKey::load)
        .transpose()?;
    let registry = args.registry.client()?;
    let report = super::interruptible(crate::ops::index::index(
        &registry,
        &target,
        &members,
        args.jobs.jobs,
        key.as_ref(),
    ))
    .await?;
    if !args.json.print(&report)? {
        for m in &report.members {
            say!(
                "kiln: {} {} from {}{}",
                m.platform,
                m.manifest,
                m.from,
                if m.copied { " (copied)" } else { "" }
            );
        }
        say!(
            "kiln: pushed index {} {} ({})",
            report.name,
            report.digest,
            report.pushed.describe()
        );
        if let Some(at) = &report.signature {
            say!("kiln: signed before tagging: {at} (cosign's format)");
        }
    }
    Ok(())
}
