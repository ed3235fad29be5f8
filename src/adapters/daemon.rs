//! A private, short-lived containerd whose root is a rootfs's store.
//! containerd writes every record, so the store is exactly what the rootfs's
//! own containerd expects; kiln only re-lays the finished file out when a
//! build is reproducible ([`crate::adapters::bolt`]).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use containerd_client::services::v1::version_client::VersionClient;
use containerd_client::tonic::transport::Channel;

use crate::adapters::version::Version;

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

/// `qemu-ARCH -L SYSROOT BINARY ...`: QEMU's user-mode emulator, run
/// directly (no binfmt registration, nothing system-wide), finding the
/// binary's dynamic loader and libraries under the node's own root.
#[derive(Debug, Clone)]
pub struct Emulator {
    pub qemu: PathBuf,
    pub sysroot: PathBuf,
}

/// The user-mode emulator for `platform`: `given` (`--qemu`), else
/// `qemu-ARCH` or `qemu-ARCH-static` on PATH; else why not and what to do.
pub fn find_qemu(
    platform: &crate::primitives::platform::Platform,
    given: Option<&Path>,
) -> Result<PathBuf, String> {
    if let Some(q) = given {
        return if q.is_file() {
            Ok(q.to_path_buf())
        } else {
            Err(format!("--qemu {}: no such file", q.display()))
        };
    }
    let Some(name) = platform.qemu_name() else {
        return Err(format!("QEMU has no user-mode emulator for {platform}"));
    };
    [format!("qemu-{name}"), format!("qemu-{name}-static")]
        .iter()
        .find_map(|n| crate::adapters::rootfs::which(n))
        .ok_or_else(|| {
            format!(
                "no qemu-{name} on PATH for user-mode emulation (Debian: apt-get install qemu-user); pass --qemu PATH"
            )
        })
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
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir_in("/tmp")?;
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

fn pid_alive(pid: i32) -> bool {
    // EPERM means it exists but is someone else's: alive.
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removes the state directories of private daemons whose kiln died (kill -9
/// leaves them behind; the daemon itself died with kiln).
fn sweep_stale_dirs() {
    let Ok(rd) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in rd.flatten() {
        if !e.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let pid = std::fs::read_to_string(e.path().join("kiln.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if pid.is_some_and(|p| !pid_alive(p)) {
            tracing::debug!(dir = %e.path().display(), "removing a dead kiln's daemon directory");
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Brings `lo` up in the (new, empty) network namespace: `SIOCSIFFLAGS`.
/// Defence in depth for a store kiln did not write: in a mount namespace
/// of the daemon's own, the store is bind-mounted over itself `nodev` (and
/// `nosuid`), so even a device node that slipped past
/// [`crate::adapters::rootfs::check_store_tree`] cannot be opened as a device (the
/// kernel refuses with EACCES). Nothing changes for the host's mounts
/// (everything is made private first) and the mounts end with the daemon.
/// Runs between fork and exec: only system calls on a path made before.
fn store_nodev(store: &std::ffi::CStr) -> std::io::Result<()> {
    use nix::libc;
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            store.as_ptr(),
            store.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            std::ptr::null(),
            store.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NODEV | libc::MS_NOSUID,
            std::ptr::null(),
        ))
    }
}

fn loopback_up() -> std::io::Result<()> {
    use nix::libc;
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if rc == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// Whether process `pid` (on this host) is gone.
pub fn process_gone(pid: i32) -> bool {
    !pid_alive(pid)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("{e:#}");
        }
    }
}

fn daemon_config(
    root: &Path,
    dir: &Path,
    socket: &Path,
    opts: &DaemonOptions,
    version: &Version,
) -> String {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    let runtime: &[&str] = if opts.cri { &[] } else { RUNTIME_PLUGINS };
    let disabled = ALWAYS_DISABLED
        .iter()
        .chain(runtime)
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let q = |p: &Path| format!("{:?}", p.display().to_string());
    let mut c = format!(
        "version = 2\nroot = {}\nstate = {}\ndisabled_plugins = [{disabled}]\n\n[grpc]\n  address = {}\n  uid = {uid}\n  gid = {gid}\n\n[ttrpc]\n  address = {}\n  uid = {uid}\n  gid = {gid}\n\n[debug]\n  level = \"info\"\n",
        q(root),
        q(&dir.join("state")),
        q(socket),
        q(&dir.join("t.sock")),
    );
    if opts.cri {
        c.push_str(&cri_config(dir, opts, version));
    } else {
        // kiln's writer: GC runs only when kiln asks for it (a synchronous
        // lease or record deletion), never on its own timer or mutation
        // count. A verified blob renamed into the store is then safe until
        // its record is written, even before any record protects it.
        c.push_str(GC_ON_REQUEST);
    }
    c
}

/// The GC scheduler of kiln's writer daemon: no startup run, no run after N
/// mutations or deletions; explicit synchronous collections still run.
const GC_ON_REQUEST: &str = "\n[plugins.\"io.containerd.gc.v1.scheduler\"]\n  pause_threshold = 0.02\n  deletion_threshold = 0\n  mutation_threshold = 2147483647\n  schedule_delay = \"0s\"\n  startup_delay = \"876000h\"\n";

/// The CRI part of a private daemon's config, for 1.7 (one plugin) or 2.x
/// (images and runtime plugins apart).
fn cri_config(dir: &Path, opts: &DaemonOptions, version: &Version) -> String {
    let q = |p: &Path| format!("{:?}", p.display().to_string());
    let v2 = version.major >= 2;
    let (images, runtime) = if v2 {
        (
            "io.containerd.cri.v1.images",
            "io.containerd.cri.v1.runtime",
        )
    } else {
        ("io.containerd.grpc.v1.cri", "io.containerd.grpc.v1.cri")
    };
    std::fs::create_dir_all(dir.join("cni/bin")).ok();
    std::fs::create_dir_all(dir.join("cni/conf")).ok();
    let mut c = String::new();
    // The runtime plugin's own keys (in 1.7 that one plugin holds them all).
    let mut keys = Vec::new();
    if opts.runc.is_some() {
        // This kernel refuses the sandbox's default oom_score_adj (-998).
        keys.push("restrict_oom_score_adj = true".to_string());
    }
    if let (false, Some(s)) = (v2, &opts.sandbox_image) {
        keys.push(format!("sandbox_image = {s:?}"));
    }
    if !keys.is_empty() {
        c.push_str(&format!(
            "\n[plugins.{runtime:?}]\n  {}\n",
            keys.join("\n  ")
        ));
    }
    if v2 {
        c.push_str(&format!(
            "\n[plugins.{images:?}]\n  snapshotter = \"native\"\n"
        ));
        if let Some(s) = &opts.sandbox_image {
            c.push_str(&format!(
                "\n[plugins.{images:?}.pinned_images]\n  sandbox = {s:?}\n"
            ));
        }
        // 2.x's transfer service (which CRI needs) unpacks with overlayfs
        // by default, and the private daemon has only `native`.
        c.push_str(&format!(
            "\n[[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]\n  platform = {:?}\n  snapshotter = \"native\"\n",
            crate::primitives::platform::Platform::host().to_string()
        ));
    } else {
        c.push_str(&format!(
            "\n[plugins.{images:?}.containerd]\n  snapshotter = \"native\"\n"
        ));
    }
    c.push_str(&format!(
        "\n[plugins.{runtime:?}.cni]\n  bin_dir = {}\n  conf_dir = {}\n",
        q(&dir.join("cni/bin")),
        q(&dir.join("cni/conf"))
    ));
    if let Some(runc) = &opts.runc {
        let table = format!("plugins.{runtime:?}.containerd.runtimes.runc");
        c.push_str(&format!(
            "\n[{table}]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[{table}.options]\n  BinaryName = {}\n",
            q(runc)
        ));
    }
    c
}
