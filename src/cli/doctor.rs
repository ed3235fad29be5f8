//! `kiln doctor`: [`crate::ops::doctor`] called, its report out; exit 1
//! when something kiln cannot work without is missing.

use super::JsonArg;

#[derive(clap::Args)]
pub struct Args {
    /// The containerd to check instead of PATH's.
    #[arg(long, value_name = "PATH")]
    containerd: Option<std::path::PathBuf>,
    #[command(flatten)]
    json: JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let report = crate::ops::doctor::doctor(args.containerd.as_deref());
    if !args.json.print(&report)? {
        for c in &report.checks {
            say!(
                "kiln: {} {}: {} ({}{})",
                if c.ok {
                    "ok     "
                } else if c.required {
                    "MISSING"
                } else {
                    "missing"
                },
                c.name,
                c.found,
                c.for_what,
                c.fix
                    .as_ref()
                    .map(|f| format!("; to get it: {f}"))
                    .unwrap_or_default()
            );
        }
    }
    if report.ready {
        Ok(())
    } else {
        anyhow::bail!("kiln cannot build on this machine yet: see the MISSING lines")
    }
}
