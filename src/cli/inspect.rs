//! `kiln inspect`: what a rootfs's store holds.

use std::path::PathBuf;

use super::{BadInput, NodeStore};
use crate::adapters::rootfs;
use crate::domain::inspect::inspect;
use crate::primitives::text::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// The rootfs whose var/lib/containerd to list.
    #[arg(long)]
    rootfs: PathBuf,
    #[command(flatten)]
    daemon: super::DaemonArgs,
    #[command(flatten)]
    json: super::JsonArg,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    // Through the in-root resolver: a symlinked /var is refused, not followed.
    let holds_store = match crate::primitives::inroot::Root::open(&args.rootfs) {
        Ok(root) => {
            root.check_owned(std::path::Path::new(rootfs::STORE_DIR))?;
            let meta = std::path::Path::new(rootfs::STORE_DIR).join(crate::domain::store::META_DB);
            std::fs::symlink_metadata(args.rootfs.join(meta)).is_ok_and(|m| m.is_file())
        }
        Err(_) => false,
    };
    if !holds_store {
        return Err(BadInput(format!(
            "{} holds no containerd store (no {}/{}); run kiln build first",
            args.rootfs.display(),
            rootfs::STORE_DIR,
            crate::domain::store::META_DB
        ))
        .into());
    }
    let node = NodeStore::open(&args.rootfs, &args.daemon.choice()).await?;
    let reports = inspect(&node.store).await;
    node.close()?;
    let reports = reports?;
    if args.json.print(&reports)? {
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    let rows: Vec<[String; 7]> = reports
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.digest.get(7..19).unwrap_or(&r.digest).to_string(),
                if r.platforms.is_empty() {
                    "-".into()
                } else {
                    r.platforms.join(",")
                },
                human_bytes(r.size),
                yes(r.complete).into(),
                yes(r.pinned).into(),
                yes(r.managed).into(),
            ]
        })
        .collect();
    let header = [
        "IMAGE",
        "DIGEST",
        "PLATFORMS",
        "SIZE",
        "COMPLETE",
        "PINNED",
        "MANAGED",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out!("{}", line.join("  ").trim_end());
    }
    let pinned = reports.iter().filter(|r| r.pinned).count();
    out!(
        "{} images, {} pinned, {} incomplete",
        reports.len(),
        pinned,
        reports.iter().filter(|r| !r.complete).count()
    );
    Ok(())
}
