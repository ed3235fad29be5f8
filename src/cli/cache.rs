//! `kiln cache ls|prune`: flags in, [`crate::ops::cache`] called, the report out.

use std::path::PathBuf;

use super::{BadInput, JsonArg};
use crate::primitives::text::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

/// The cache a `kiln cache` command looks at.
#[derive(clap::Args)]
struct DirArg {
    /// The cache (default: $XDG_CACHE_HOME/kiln, else ~/.cache/kiln).
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
}

impl DirArg {
    fn get(&self) -> anyhow::Result<PathBuf> {
        self.cache_dir
            .clone()
            .or_else(crate::sink::cache::default_dir)
            .ok_or_else(|| {
                BadInput("no cache directory: neither XDG_CACHE_HOME nor HOME is set; pass --cache-dir DIR".into())
                    .into()
            })
    }
}

#[derive(clap::Subcommand)]
enum Action {
    /// List the cached blobs (least recently used first) and their total size.
    Ls {
        /// Re-hash every entry (else the cheap check: size, read-only, kiln's mtime mark).
        #[arg(long)]
        check: bool,
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Remove damaged entries, then the least recently used until at most SIZE stay.
    Prune {
        /// The size to keep, e.g. 20G, 500M, 0 (default: the cap kept after builds, 20G).
        #[arg(long, value_name = "SIZE", value_parser = crate::primitives::text::parse_size)]
        max_size: Option<u64>,
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        json: JsonArg,
    },
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.action {
        Action::Ls { check, dir, json } => {
            let listing = crate::ops::cache::list(&dir.get()?, check)?;
            let damaged = listing.entries.iter().filter(|e| !e.intact).count();
            if !json.print(&listing)? {
                for e in &listing.entries {
                    let when = chrono::DateTime::from_timestamp(e.last_used, 0)
                        .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                        .unwrap_or_default();
                    out!(
                        "{}  {:>10}  used {when}{}",
                        e.digest,
                        human_bytes(e.size),
                        if e.intact { "" } else { "  DAMAGED" }
                    );
                }
                out!(
                    "kiln: cache {}: {} entries, {}",
                    listing.dir.display(),
                    listing.entries.len(),
                    human_bytes(listing.total_bytes)
                );
            }
            if damaged > 0 {
                anyhow::bail!(
                    "{damaged} cache entries are damaged (never used by a build); `kiln cache prune` removes them"
                );
            }
            Ok(())
        }
        Action::Prune {
            max_size,
            dir,
            json,
        } => {
            let max = max_size.unwrap_or(crate::sink::cache::DEFAULT_MAX_BYTES);
            let p = crate::ops::cache::prune(&dir.get()?, max)?;
            if !json.print(&p)? {
                say!(
                    "kiln: cache {}: removed {} entries ({}), kept {} ({}, at most {})",
                    p.dir.display(),
                    p.removed,
                    human_bytes(p.removed_bytes),
                    p.kept,
                    human_bytes(p.kept_bytes),
                    human_bytes(p.max_bytes)
                );
            }
            Ok(())
        }
    }
}
