//! The command line: one module per command, each a thin layer over the
//! library. Exit codes: 0 success, 1 failure, 2 bad input, 130 Ctrl-C
//! (SIGINT), 143 SIGTERM.

mod build;
mod bundle;
mod cache;
mod doctor;
mod index;
mod inspect;
mod load;
mod lock;
mod node;
mod verify;

mod flags;
mod generate;
mod kubelet;
pub use flags::*;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub(crate) use crate::domain::store::NodeStore;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Bake Kubernetes node images: component images pinned in a rootfs's containerd store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Bake a manifest's images, pinned, into a rootfs's containerd store, or into a node image from a base image.
    Build(Box<build::Args>),
    /// Write a manifest's images into one OCI-layout tarball, for air-gapped builds.
    Bundle(bundle::Args),
    /// Pin every manifest entry to the digest its tag resolves to.
    Lock(lock::Args),
    /// Load user images into a node: managed, never pinned.
    Load(load::Args),
    /// List the images in a rootfs's containerd store.
    Inspect(inspect::Args),
    /// Check that a node keeps its bundled images the way kubelet needs, offline
    /// (runs the node's own containerd, with CRI, on a private copy).
    Verify(verify::Args),
    /// Join single-platform node images (one per CI job) into one multi-platform index.
    Index(index::Args),
    /// The blob cache builds share: `ls` what it holds, `prune` it.
    Cache(cache::Args),
    /// Check this machine for what kiln needs (containerd, runc, qemu-user, the cache) and say how to get what is missing.
    Doctor(doctor::Args),
    /// Generate configuration for what runs kiln's nodes (`kubelet-config`).
    Generate(kubelet::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(generate::CompletionsArgs),
    /// Write kiln's man pages into a directory (for packagers: make install).
    #[command(hide = true)]
    Man(generate::ManArgs),
}

/// Why kiln removes a kubelet's image-manager state, in one phrase.
const KUBELET_STATE_WHY: &str = "with it, kubelet 1.35 and later would take the bundled images as pulled by itself and, under its default credential policy, check them again against registries an offline node cannot reach";

/// The CLI's definition, for the generated completions and man pages.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// `--lock FILE`, read: a lock that cannot be read is bad input.
pub(crate) fn load_lock(
    path: Option<&std::path::Path>,
) -> anyhow::Result<Option<crate::domain::lockfile::Lock>> {
    Ok(path
        .map(crate::domain::lockfile::Lock::load)
        .transpose()
        .map_err(BadInput)?)
}

/// Refuses a build whose inputs drifted from its lock, naming each.
pub(crate) fn refuse_drift(lock: &std::path::Path, drift: Vec<String>) -> anyhow::Result<()> {
    if drift.is_empty() {
        return Ok(());
    }
    Err(BadInput(format!(
        "{}: the build's inputs differ from the lock: {}; build what was locked, or lock again (kiln lock --lock-file)",
        lock.display(),
        drift.join("; ")
    ))
    .into())
}

/// Writes an SBOM (`--sbom FILE`), created at `SOURCE_DATE_EPOCH` (else
/// the epoch) so the same inputs give the same bytes.
pub(crate) fn write_sbom(
    path: &std::path::Path,
    sbom: &crate::domain::sbom::Sbom,
) -> anyhow::Result<()> {
    write_document("--sbom", path, sbom.render()?)
}

/// Writes a document a flag asked for, never half-written.
pub(crate) fn write_document(
    flag: &str,
    path: &std::path::Path,
    text: String,
) -> anyhow::Result<()> {
    crate::primitives::atomic::write(path, text.as_bytes())
        .map_err(|e| anyhow::anyhow!("{flag}: writing {}: {e}", path.display()))
}

/// Input the user must fix (manifest, flags): exit code 2.
/// (An interruption while reading the input stays an interruption.)
pub(crate) fn bad_input(e: anyhow::Error) -> anyhow::Error {
    if e.downcast_ref::<crate::primitives::interrupt::Interrupted>()
        .is_some()
    {
        e
    } else {
        BadInput(format!("{e:#}")).into()
    }
}

pub use crate::primitives::error::{BadInput, PartialFailure};
use verify::archive_path;

/// An image reference from the command line; `what` names the flag.
pub(crate) fn parse_image(
    what: &str,
    s: &str,
) -> Result<crate::primitives::reference::ImageRef, BadInput> {
    crate::primitives::reference::ImageRef::parse(s).map_err(|e| BadInput(format!("{what}: {e}")))
}

/// [`parse_image`] for a flag that also takes an archive: a file path given
/// as a reference would become a Docker Hub name (`out/node.tar` ->
/// `docker.io/out/node.tar:latest`, then DNS retries), so it is refused
/// saying how this flag takes a file (`archive`).
pub(crate) fn parse_image_or_file(
    what: &str,
    s: &str,
    archive: &str,
) -> Result<crate::primitives::reference::ImageRef, BadInput> {
    let looks_like_file = [".tar", ".tar.gz", ".tgz"].iter().any(|x| s.ends_with(x))
        || ((s.contains('/') || s.contains('.')) && std::path::Path::new(s).is_file());
    if looks_like_file && !s.contains('@') {
        return Err(BadInput(format!(
            "{what} {s}: that is a file, not an image reference (it would be pulled as docker.io/{s}); for an archive use {archive}"
        )));
    }
    crate::primitives::reference::ImageRef::parse(s).map_err(|e| BadInput(format!("{what}: {e}")))
}

/// The HTTP stack's crates: at `RUST_LOG=debug` they print every HTTP/2
/// frame, burying kiln's own events; they stay at `warn` unless `RUST_LOG`
/// names them (`RUST_LOG=debug,h2=debug`).
const HTTP_STACK: &[&str] = &["h2", "hyper", "hyper_util", "tower", "rustls", "tonic"];

/// `RUST_LOG` (default `warn`), with [`HTTP_STACK`] behind its own targets.
fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::EnvFilter {
    let given = rust_log.filter(|s| !s.trim().is_empty()).unwrap_or("warn");
    let mut directives = vec![given.to_string()];
    for t in HTTP_STACK {
        let named = given
            .split(',')
            .any(|d| d.trim().split(['=', '[']).next() == Some(*t));
        if !named {
            directives.push(format!("{t}=warn"));
        }
    }
    tracing_subscriber::EnvFilter::try_new(directives.join(","))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
}

/// Colour in log lines only on a terminal, and never with `NO_COLOR` set
/// to anything non-empty (no-color.org).
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

pub fn main() -> ExitCode {
    crate::primitives::interrupt::install();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("RUST_LOG").ok().as_deref()))
        .with_writer(|| crate::primitives::text::QuietStderr)
        .with_target(false)
        .with_ansi(colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say!("kiln: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Build(a) => build::run(*a).await,
            Command::Load(a) => load::run(a).await,
            Command::Bundle(a) => bundle::run(a).await,
            Command::Lock(a) => lock::run(a).await,
            Command::Inspect(a) => inspect::run(a).await,
            Command::Verify(a) => verify::run(a).await,
            Command::Index(a) => index::run(a).await,
            Command::Cache(a) => cache::run(a).await,
            Command::Doctor(a) => doctor::run(a).await,
            Command::Generate(a) => kubelet::run(a),
            Command::Completions(a) => generate::completions(a),
            Command::Man(a) => generate::man(a),
        }
    });
    // Nobody reads kiln's output any more: quiet, 141 (what a shell shows
    // for SIGPIPE), once everything has unwound.
    if crate::primitives::interrupt::is_reader_gone() {
        return ExitCode::from(141);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = if e.chain().any(|c| c.is::<BadInput>()) {
                2
            } else if e.is::<crate::primitives::error::NotVerified>() {
                3
            } else if let Some(i) = e.downcast_ref::<crate::primitives::interrupt::Interrupted>() {
                i.exit_code()
            } else {
                1
            };
            say!(
                "kiln: error: {}",
                crate::primitives::text::one_line(&format!("{e:#}"))
            );
            ExitCode::from(code)
        }
    }
}

/// Opens a bundle (`--from`) and checks it holds everything `images` need
/// for `platforms`, before anything is written.
pub(crate) fn open_bundle(
    paths: &[std::path::PathBuf],
    images: &[crate::primitives::reference::ImageRef],
    platforms: &[crate::primitives::platform::Platform],
) -> anyhow::Result<crate::source::archive::ArchiveSource> {
    let src = crate::source::archive::ArchiveSource::open(paths).map_err(bad_input)?;
    let named: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    src.check_since().map_err(BadInput)?;
    src.check(images, platforms).map_err(|e| {
        // A differential bundle without the one it builds on: say which.
        let hint: Vec<String> = src
            .differential()
            .iter()
            .filter(|(_, old)| {
                !paths
                    .iter()
                    .any(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == *old))
            })
            .map(|(new, old)| {
                format!(
                    "; {new} is a differential bundle (kiln bundle --since): pass --from {old} too"
                )
            })
            .collect();
        BadInput(format!("{}: {e}{}", named.join(" + "), hint.concat()))
    })?;
    Ok(src)
}

/// Runs `work`, or stops at Ctrl-C / SIGTERM with [`crate::primitives::interrupt::Interrupted`].
pub(crate) async fn interruptible<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        r = work => r,
        i = crate::primitives::interrupt::signalled() => Err(i.into()),
    }
}

/// The pins a build removed, kept or left, one line each (stderr).
pub(crate) fn render_pins(
    prefix: &str,
    unpinned: &[crate::ops::build::Unpinned],
    kept: &[crate::ops::build::Unpinned],
    others: &[String],
) {
    for u in unpinned {
        say!(
            "kiln: {prefix}unpinned {} ({}); it stays stored, and kubelet's GC may reclaim it",
            u.name,
            u.reason
        );
    }
    for u in kept {
        say!(
            "kiln: {prefix}--keep-pinned: kept the pin on {} ({})",
            u.name,
            u.reason
        );
    }
    for o in others {
        say!("kiln: {prefix}{o} is pinned by someone other than kiln; left as it is");
    }
}

/// An output file's directory must exist before any work is done.
pub(crate) fn check_output_dir(flag: &str, path: &std::path::Path) -> Result<(), BadInput> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        Err(BadInput(format!(
            "{flag} {}: the directory {} does not exist; create it first",
            path.display(),
            dir.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(super::colour(true, None));
        assert!(super::colour(true, Some(OsStr::new(""))));
        assert!(!super::colour(true, Some(OsStr::new("1"))));
        assert!(!super::colour(false, None));
    }

    #[test]
    fn the_http_stack_stays_quiet_unless_named() {
        let f = super::log_filter(Some("debug")).to_string();
        assert!(f.contains("h2=warn") && f.contains("hyper=warn"), "{f}");
        let f = super::log_filter(Some("debug,h2=trace")).to_string();
        assert!(f.contains("h2=trace") && !f.contains("h2=warn"), "{f}");
        assert!(super::log_filter(None).to_string().contains("warn"));
    }
}
