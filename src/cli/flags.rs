//! The flags several commands share, each defined once (as ripgrep
//! defines its flags): the manifest, platforms, jobs, signatures, the
//! cache, `--json`, the daemon, QEMU, the unpack limits, and the registry
//! flags. Each command's file flattens the ones it takes.

use super::BadInput;

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
    /// Platforms to use, repeatable or comma-separated as docker buildx and
    /// skopeo take them (default: linux/<host arch>).
    #[arg(long = "platform", value_name = "OS/ARCH", value_delimiter = ',')]
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
