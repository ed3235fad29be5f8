//! The command line: one module per command, each a thin layer over the
//! library. Exit codes: 0 success, 1 failure, 2 bad input, 130 Ctrl-C
//! (SIGINT), 143 SIGTERM.

mod build;
mod bundle;
mod cache;
mod index;
mod inspect;
mod load;
mod lock;
mod node;
mod verify;

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
}

/// `--manifest`: shared by every command that reads a node manifest.
#[derive(clap::Args, Clone, Debug)]
pub struct ManifestArg {
    /// The node manifest (YAML, kind: NodeImageManifest).
    #[arg(long)]
    pub manifest: std::path::PathBuf,
}

impl ManifestArg {
    pub fn load(&self) -> anyhow::Result<crate::domain::manifest::NodeManifest> {
        crate::domain::manifest::NodeManifest::load(&self.manifest)
            .map_err(|e| BadInput(e.to_string()).into())
    }
}

/// `--platform`, repeatable: shared by every command that picks platforms.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PlatformArgs {
    /// Platforms to use, repeatable (default: linux/<host arch>).
    #[arg(long = "platform", value_name = "OS/ARCH")]
    pub platforms: Vec<crate::primitives::platform::Platform>,
}

impl PlatformArgs {
    pub fn get(&self) -> Vec<crate::primitives::platform::Platform> {
        if self.platforms.is_empty() {
            vec![crate::primitives::platform::Platform::host()]
        } else {
            self.platforms.clone()
        }
    }
}

/// `--jobs`: shared by every command that copies blobs.
#[derive(clap::Args, Clone, Debug)]
pub struct JobsArg {
    /// Blob transfers in flight at once.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
}

/// `--verify-signatures POLICY`: shared by the commands that fetch images
/// from registries to keep them.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SignatureArgs {
    /// Check each image's cosign signature against POLICY (YAML: per
    /// registry or repository, the public keys or keyless signers that
    /// must have signed it) before storing anything of it; an image that
    /// fails is not stored and the run fails naming it.
    #[arg(long, value_name = "POLICY")]
    pub verify_signatures: Option<std::path::PathBuf>,
}

impl SignatureArgs {
    pub fn gate(&self) -> anyhow::Result<Option<std::sync::Arc<dyn crate::engine::gate::Gate>>> {
        let Some(path) = &self.verify_signatures else {
            return Ok(None);
        };
        let policy = crate::domain::signatures::SignaturePolicy::load(path)?;
        Ok(Some(std::sync::Arc::new(policy)))
    }
}

/// `--cache-dir`, `--no-cache`: shared by every command that fetches blobs.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct CacheArgs {
    /// Keep verified blobs in DIR and take them from there first, shared by
    /// builds (default: $XDG_CACHE_HOME/kiln, else ~/.cache/kiln).
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Neither read nor write the cache (wins over --cache-dir).
    #[arg(long, env = "KILN_NO_CACHE", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_cache: bool,
}

impl CacheArgs {
    /// The cache this run uses, its run lock taken. A default directory
    /// that cannot be made costs a warning, not the build.
    pub fn open(&self) -> anyhow::Result<Option<crate::sink::cache::Cache>> {
        use crate::sink::cache::{default_dir, Cache};
        if self.no_cache {
            if let Some(dir) = &self.cache_dir {
                tracing::warn!(
                    "--no-cache (or KILN_NO_CACHE) wins: {} is neither read nor written",
                    dir.display()
                );
            }
            return Ok(None);
        }
        if let Some(dir) = &self.cache_dir {
            return Cache::open(dir)
                .map(Some)
                .map_err(|e| BadInput(format!("--cache-dir: {e:#}")).into());
        }
        let Some(dir) = default_dir() else {
            return Ok(None);
        };
        match Cache::open(&dir) {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                say!("kiln: warning: building without a cache: {e:#}; pass --cache-dir DIR, or --no-cache to say so");
                Ok(None)
            }
        }
    }
}

impl CacheArgs {
    /// Ends a run's use of the cache: kept under its default cap when no
    /// other kiln is using it.
    pub fn close(cache: Option<crate::sink::cache::Cache>) {
        if let Some(c) = cache {
            c.close();
        }
    }
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

/// `--json`: on every command.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct JsonArg {
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

impl JsonArg {
    /// Prints `report` as JSON when asked; says whether it did.
    pub fn print(&self, report: &impl serde::Serialize) -> anyhow::Result<bool> {
        if self.json {
            out!("{}", serde_json::to_string_pretty(report)?);
        }
        Ok(self.json)
    }

    /// As [`JsonArg::print`], with the seconds since `started` and kiln's
    /// own peak memory added to the report.
    pub fn print_timed(
        &self,
        report: &impl serde::Serialize,
        started: std::time::Instant,
    ) -> anyhow::Result<bool> {
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Timed<'a, R> {
            #[serde(flatten)]
            report: &'a R,
            seconds: f64,
            /// kiln's own peak resident memory (its containerd not included).
            peak_rss_kib: Option<u64>,
        }
        self.print(&Timed {
            report,
            seconds: started.elapsed().as_secs_f64(),
            peak_rss_kib: crate::primitives::progress::peak_rss_kib(),
        })
    }
}

/// Which containerd writes (or reads) a rootfs's store; shared by every
/// command that opens one.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DaemonArgs {
    /// containerd binary that writes the store (default: `containerd` on PATH).
    #[arg(long, value_name = "PATH")]
    containerd: Option<std::path::PathBuf>,
    /// Without --containerd, run the rootfs's own containerd (when built for
    /// this machine). It is code from the image, run as you: only for images
    /// you trust. Without this flag kiln executes nothing from an image.
    #[arg(long)]
    trust_node_binaries: bool,
    /// When another kiln is writing the same store, fail at once instead of
    /// waiting for it.
    #[arg(long)]
    no_wait: bool,
}

impl DaemonArgs {
    pub fn choice(&self) -> crate::adapters::rootfs::DaemonChoice {
        crate::adapters::rootfs::DaemonChoice {
            containerd: self.containerd.clone(),
            trust_node_binaries: self.trust_node_binaries,
            no_wait: self.no_wait,
        }
    }
}

/// How `verify` reads the kubelet's view of another platform's node:
/// shared by `verify` and `build --verify`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct QemuArg {
    /// QEMU's user-mode emulator for verifying another platform than this
    /// machine's (default: qemu-ARCH, then qemu-ARCH-static, on PATH); the
    /// node's own containerd runs under it only with --trust-node-binaries.
    #[arg(long, value_name = "PATH")]
    pub qemu: Option<std::path::PathBuf>,
}

/// What an untrusted image may put under the paths kiln unpacks from it
/// (its store, containerd config and `/kind`); shared by `build --base`
/// and `verify --image`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LimitArgs {
    /// At most this many entries under what kiln unpacks from an image
    /// [default: 1000000].
    #[arg(long, value_name = "N")]
    pub(super) max_entries: Option<u64>,
    /// At most this many bytes of files there, e.g. 64G [default: 64G].
    #[arg(long, value_name = "SIZE", value_parser = crate::primitives::text::parse_size)]
    pub(super) max_bytes: Option<u64>,
    /// At most this many path components deep [default: 128].
    #[arg(long, value_name = "N")]
    pub(super) max_depth: Option<usize>,
}

impl LimitArgs {
    pub fn limits(&self) -> crate::primitives::unpack::Limits {
        let d = crate::primitives::unpack::Limits::default();
        crate::primitives::unpack::Limits {
            entries: self.max_entries.unwrap_or(d.entries),
            bytes: self.max_bytes.unwrap_or(d.bytes),
            depth: self.max_depth.unwrap_or(d.depth),
        }
    }
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

/// Where registries are reached: shared by every command that fetches.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RegistryArgs {
    /// Fetch HOST's images from URL but record them as HOST's; repeatable,
    /// tried in order, then HOST itself.
    #[arg(long = "mirror", value_name = "HOST=URL")]
    pub mirrors: Vec<String>,
    /// Trust this CA certificate (PEM) for every registry; repeatable.
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_certs: Vec<std::path::PathBuf>,
    /// Mirrors and CAs per registry from a kiln registries file (YAML).
    #[arg(long = "registry-config", value_name = "FILE")]
    pub registry_config: Option<std::path::PathBuf>,
    /// Mirrors and CAs from a containerd certs.d directory (HOST/hosts.toml).
    #[arg(long = "hosts-dir", value_name = "DIR")]
    pub hosts_dir: Option<std::path::PathBuf>,
    /// A transfer that brings under 1 KiB in this many seconds is stalled:
    /// asked again, then failed naming the host (a server that trickles or
    /// says nothing cannot hold kiln).
    #[arg(long = "stall-timeout", value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub stall_timeout: u64,
}

impl RegistryArgs {
    pub fn client(&self) -> anyhow::Result<crate::adapters::registry::RegistryClient> {
        let mut hosts = crate::adapters::registry::hosts::Hosts::default();
        hosts.add_mirror_flags(&self.mirrors).map_err(BadInput)?;
        for ca in &self.ca_certs {
            crate::adapters::registry::hosts::check_ca_file(ca)
                .map_err(|e| BadInput(format!("--ca-cert: {e:#}")))?;
        }
        hosts.add_ca_certs(&self.ca_certs);
        if let Some(f) = &self.registry_config {
            hosts
                .add_registry_file(f)
                .map_err(|e| BadInput(format!("--registry-config: {e:#}")))?;
        }
        if let Some(d) = &self.hosts_dir {
            hosts
                .add_hosts_dir(d)
                .map_err(|e| BadInput(format!("--hosts-dir: {e:#}")))?;
        }
        let creds = crate::adapters::registry::credentials::Credentials::load()
            .map_err(|e| BadInput(format!("{e:#}")))?;
        Ok(crate::adapters::registry::RegistryClient::new(
            hosts,
            creds,
            crate::adapters::registry::Retry {
                stall: std::time::Duration::from_secs(self.stall_timeout),
                ..Default::default()
            },
        ))
    }
}

/// Opens a bundle (`--from`) and checks it holds everything `images` need
/// for `platforms`, before anything is written.
pub(crate) fn open_bundle(
    path: &std::path::Path,
    images: &[crate::primitives::reference::ImageRef],
    platforms: &[crate::primitives::platform::Platform],
) -> anyhow::Result<crate::source::archive::ArchiveSource> {
    let src =
        crate::source::archive::ArchiveSource::open(&[path.to_path_buf()]).map_err(bad_input)?;
    src.check(images, platforms)
        .map_err(|e| BadInput(format!("{}: {e}", path.display())))?;
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
