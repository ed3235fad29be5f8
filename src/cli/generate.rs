//! What packagers install beside the binary, generated from the one CLI
//! definition (so a flag added is a flag documented): shell completions
//! (`kiln completions bash|zsh|fish|elvish|powershell`, `clap_complete`) and
//! man pages (`kiln man --out-dir DIR`, hidden, `clap_mangen`: `kiln.1` and
//! one `kiln-SUBCOMMAND.1` per subcommand). `make install` runs both.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub struct ManArgs {
    /// Where the pages go (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
}

/// Writes `shell`'s completion script for kiln to stdout.
pub fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = super::command();
    clap_complete::generate(args.shell, &mut cmd, "kiln", &mut std::io::stdout());
    Ok(())
}

/// Writes kiln's man pages into `--out-dir`.
pub fn man(args: ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir)?;
    clap_mangen::generate_to(super::command(), &args.out_dir)
        .map_err(|e| anyhow::anyhow!("writing man pages into {}: {e}", args.out_dir.display()))
}
