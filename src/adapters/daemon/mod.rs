//! A private, short-lived containerd whose root is a rootfs's store.
//! containerd writes every record, so the store is exactly what the rootfs's
//! own containerd expects; kiln only re-lays the finished file out when a
//! build is reproducible ([`crate::adapters::bolt`]). The rooms: `config`
//! (the daemon's config), `namespaces` (its confinement as root),
//! `processes` (liveness, stale state, the emulator); start and stop here.

mod config;
mod namespaces;
mod processes;

pub use processes::{find_qemu, orphaned_daemon, process_gone, Emulator};

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use containerd_client::services::v1::version_client::VersionClient;
use containerd_client::tonic::transport::Channel;

use crate::adapters::version::Version;
use config::daemon_config;
use namespaces::{loopback_up, store_nodev};
use processes::sweep_stale_dirs;

#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    /// Turn on the CRI plugin (for checking the kubelet's view), with the
    /// `native` snapshotter and private CNI paths.
    pub cri: bool,
    /// With CRI: the sandbox image it is told to use (the node's own setting).
    pub sandbox_image: Option<String>,
    /// With CRI: run containers with this runc, in a network namespace of
    /// its own that has only loopback (root only).
    pub runc: Option<PathBuf>,
    /// Run the binary under user-mode emulation (a node's containerd for
    /// another platform than the host's).
    pub emulator: Option<Emulator>,
}

pub struct Daemon {
    child: Option<Child>,
    emulated: bool,
    pub socket: PathBuf,
    pub version: Version,
    dir: tempfile::TempDir,
}

/// Plugins no private daemon loads: they touch the host (`/opt`, tracing
/// exporters, NRI) or are snapshotters kiln never uses (`native` stays:
/// 1.7 refuses to start without one).
const ALWAYS_DISABLED: &[&str] = &[
    "io.containerd.internal.v1.opt",
    "io.containerd.internal.v1.tracing",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.nri.v1.nri",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.overlayfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.snapshotter.v1.erofs",
];

/// Also off in a store-only daemon: CRI and runtimes, which need privileges
/// and are not needed to write content and images.
const RUNTIME_PLUGINS: &[&str] = &[
    "io.containerd.grpc.v1.cri",
    "io.containerd.cri.v1.images",
    "io.containerd.cri.v1.runtime",
    "io.containerd.podsandbox.controller.v1.podsandbox",
    "io.containerd.sandbox.controller.v1.shim",
    "io.containerd.runtime.v1.linux",
    "io.containerd.runtime.v2.task",
    "io.containerd.runtime.v2.shim",
    "io.containerd.monitor.v1.cgroups",
];

impl Daemon {
    /// Starts `binary` with `root` as its store and waits until it answers.
    pub async fn start(binary: &Path, root: &Path, opts: &DaemonOptions) -> anyhow::Result<Daemon> {
        let version = Version::of_binary(binary).with_context(|| {
            format!(
                "cannot run containerd at {}; pass --containerd PATH",
                binary.display()
            )
        })?;
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let root = root.canonicalize()?;
        // Short path: unix socket paths are limited to 108 bytes.
        sweep_stale_dirs();
        let dir = crate::primitives::owned::work_dir_in(Path::new("/tmp"), DIR_PREFIX)?;
        std::fs::write(dir.path().join("kiln.pid"), std::process::id().to_string())?;
        let socket = dir.path().join("c.sock");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            daemon_config(&root, dir.path(), &socket, opts, &version),
        )?;
        let log = std::fs::File::create(dir.path().join("containerd.log"))?;
        let own_netns = opts.runc.is_some();
        let store = std::ffi::CString::new(root.as_os_str().as_encoded_bytes())?;
        let command = |nodev: bool| -> anyhow::Result<Command> {
            let mut cmd = match &opts.emulator {
                Some(e) => {
                    let mut c = Command::new(&e.qemu);
                    c.arg("-L").arg(&e.sysroot).arg(binary);
                    c
                }
                None => Command::new(binary),
            };
            cmd.arg("--config")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log.try_clone()?);
            // Its own process group: a Ctrl-C reaches kiln, which stops the
            // daemon in order; and the daemon dies with kiln, even on kill -9.
            cmd.process_group(0);
            if let Some(dir) = binary.parent() {
                // Its shim (containerd-shim-runc-v2) sits beside it.
                let path = std::env::var("PATH").unwrap_or_default();
                cmd.env("PATH", format!("{}:{path}", dir.display()));
            }
            let store = store.clone();
            unsafe {
                cmd.pre_exec(move || {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                        .map_err(std::io::Error::from)?;
                    if nodev {
                        store_nodev(&store)?;
                    }
                    if own_netns {
                        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                            .map_err(std::io::Error::from)?;
                        loopback_up()?;
                    }
                    Ok(())
                });
            }
            Ok(cmd)
        };
        // As root, the store is seen through a nodev mount (see
        // [`store_nodev`]); where even root may not mount (a container
        // without CAP_SYS_ADMIN) the tree check before every start stands alone.
        let nodev = rustix::process::geteuid().is_root();
        let child = match command(nodev)?.spawn() {
            Err(e) if nodev && e.raw_os_error() == Some(nix::libc::EPERM) => {
                tracing::warn!(
                    "cannot give containerd a nodev view of {} ({e}); relying on the store check",
                    root.display()
                );
                command(false)?.spawn()
            }
            spawned => spawned,
        }
        .with_context(|| format!("starting {}", binary.display()))?;
        tracing::debug!(binary = %binary.display(), %version, root = %root.display(), "started containerd");
        let mut daemon = Daemon {
            child: Some(child),
            emulated: opts.emulator.is_some(),
            socket,
            version,
            dir,
        };
        daemon.wait_ready().await?;
        Ok(daemon)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        // Emulated, a Go binary starts several times slower.
        let within = if self.emulated { 180 } else { 30 };
        let deadline = Instant::now() + Duration::from_secs(within);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "containerd exited ({status}) before it was ready: {}",
                    self.log_tail()
                );
            }
            if self.socket.exists() {
                if let Ok(ch) = containerd_client::connect(&self.socket).await {
                    if VersionClient::new(ch.clone()).version(()).await.is_ok() {
                        return self.check_store(ch).await;
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd did not answer within {within}s: {}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// containerd skips a plugin that fails to load and serves the rest: a
    /// daemon whose metadata store could not be opened answers, but without
    /// leases, images or content. Asking for its leases tells, and the log
    /// says why.
    async fn check_store(&self, ch: Channel) -> anyhow::Result<()> {
        use containerd_client::services::v1::leases_client::LeasesClient;
        let req = containerd_client::services::v1::ListRequest { filters: vec![] };
        let mut req = containerd_client::tonic::Request::new(req);
        req.metadata_mut()
            .insert("containerd-namespace", "default".parse().expect("ASCII"));
        match LeasesClient::new(ch).list(req).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == containerd_client::tonic::Code::Unimplemented => {
                bail!("containerd could not open the store: {}", self.log_tail())
            }
            Err(s) => bail!("containerd's store does not answer: {}", s.message()),
        }
    }

    pub async fn channel(&self) -> anyhow::Result<Channel> {
        containerd_client::connect(&self.socket)
            .await
            .map_err(|e| anyhow!("connecting to containerd at {}: {e}", self.socket.display()))
    }

    /// The last lines containerd logged, for error messages.
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.path().join("containerd.log")) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| {
                l.contains("level=error")
                    || l.contains("level=fatal")
                    || l.contains("failed to load plugin")
            })
            .collect();
        let pick = if lines.is_empty() {
            s.lines().rev().take(3).collect::<Vec<_>>()
        } else {
            lines.into_iter().rev().take(3).collect()
        };
        pick.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Whether it runs under user-mode emulation.
    pub fn emulated(&self) -> bool {
        self.emulated
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the daemon: SIGTERM, then SIGKILL after 15 s.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("containerd did not stop within 15s and was killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

const DIR_PREFIX: &str = "kiln-ctd-";

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("{e:#}");
        }
    }
}

/// The GC scheduler of kiln's writer daemon: no startup run, no run after N
/// mutations or deletions; explicit synchronous collections still run.
const GC_ON_REQUEST: &str = "\n[plugins.\"io.containerd.gc.v1.scheduler\"]\n  pause_threshold = 0.02\n  deletion_threshold = 0\n  mutation_threshold = 2147483647\n  schedule_delay = \"0s\"\n  startup_delay = \"876000h\"\n";
