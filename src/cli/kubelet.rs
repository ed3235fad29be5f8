//! `kiln generate kubelet-config`: the kubelet configuration that turns
//! image GC on beside a kiln node's pins, as a kind cluster config
//! (`domain::kubelet::config`).

use super::flags::{JsonArg, ManifestArg};
use super::BadInput;
use crate::domain::kubelet::config::{generate, Options};
use crate::domain::kubelet::policy::Policy;
use crate::domain::kubelet::Minor;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// A kind cluster config whose KubeletConfiguration patch turns image GC
    /// on by age and exempts the bundled images from credential re-checks.
    KubeletConfig(KubeletConfigArgs),
}

#[derive(clap::Args)]
struct KubeletConfigArgs {
    #[command(flatten)]
    manifest: ManifestArg,
    /// The kubelet's version (default: the manifest's kubernetesVersion).
    #[arg(long, value_name = "VERSION")]
    kubelet_version: Option<String>,
    /// imageMaximumGCAge: images unused this long are removed.
    #[arg(long, value_name = "DURATION", default_value = "168h")]
    max_age: String,
    /// imageMinimumGCAge: no image younger is removed.
    #[arg(long, value_name = "DURATION", default_value = "2m")]
    min_age: String,
    /// imageGCHighThresholdPercent (kind's 100: no GC by disk use, the
    /// host's disk is shared).
    #[arg(long, value_name = "PERCENT", default_value_t = 100)]
    disk_high: u8,
    /// imageGCLowThresholdPercent.
    #[arg(long, value_name = "PERCENT", default_value_t = 80)]
    disk_low: u8,
    /// imagePullCredentialsVerificationPolicy (kubelet v1.35 and later).
    #[arg(long, value_name = "POLICY", default_value = "NeverVerifyAllowlistedImages", value_parser = policy)]
    credential_policy: Policy,
    /// One more preloadedImagesVerificationAllowlist entry, e.g. for
    /// images you load later: PREFIX/* (example.com/team/*); an exact
    /// name matches only pods that name it with no tag or digest.
    #[arg(long, value_name = "ENTRY")]
    allow: Vec<String>,
    #[command(flatten)]
    json: JsonArg,
}

fn policy(s: &str) -> Result<Policy, String> {
    Policy::ALL
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("one of {}", Policy::ALL.map(|p| p.name()).join(", ")))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let What::KubeletConfig(a) = args.what;
    let manifest = a.manifest.load()?;
    let version = a
        .kubelet_version
        .clone()
        .or(manifest.kubernetes_version.clone())
        .ok_or_else(|| {
            BadInput(format!(
                "{} names no kubernetesVersion: pass --kubelet-version",
                manifest.path.display()
            ))
        })?;
    let kubelet =
        Minor::parse(&version).map_err(|e| BadInput(format!("--kubelet-version: {e}")))?;
    let g = generate(
        &manifest.images,
        &Options {
            kubelet,
            max_age: a.max_age,
            min_age: a.min_age,
            high: a.disk_high,
            low: a.disk_low,
            policy: a.credential_policy,
            allow: a.allow,
        },
    )
    .map_err(BadInput)?;
    if a.json.print(&g)? {
        return Ok(());
    }
    out!("{}", g.kind_config.trim_end());
    for n in &g.notes {
        say!("kiln: note: {n}");
    }
    Ok(())
}
