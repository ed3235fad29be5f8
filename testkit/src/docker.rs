//! A private Docker daemon for the tests: Debian forky's `docker.io` 28
//! (`make deps`, unpacked under `.deps/docker`), on its own data-root,
//! exec-root, pidfile and socket, with no iptables and no bridge, started
//! and stopped by the test. It runs the containerd it manages itself
//! (forky's, found first on its PATH) and Debian 12's runc: forky's runc
//! needs a newer glibc than this host has, and a clean environment keeps
//! any other runc off its PATH (`shared/notes/docker-facts.md`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Which image store dockerd keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The classic layer store (overlay2): layers registered by ChainID.
    Classic,
    /// The containerd image store (`"features": {"containerd-snapshotter":
    /// true}`), the default of new installs since Docker 29.
    Containerd,
}

pub struct Dockerd {
    child: Option<Child>,
    pub socket: PathBuf,
    pub store: Store,
    dir: tempfile::TempDir,
}

/// `.deps/docker` (`make deps`).
fn root() -> PathBuf {
    let p = crate::tools::workspace().join(".deps/docker");
    assert!(
        p.join("usr/sbin/dockerd").exists(),
        "{} is missing: run `make deps`",
        p.display()
    );
    p
}

/// The `docker` client of `.deps/docker`.
pub fn docker_cli() -> PathBuf {
    root().join("usr/bin/docker")
}

impl Dockerd {
    /// Starts dockerd with `store`, trusting the plain-HTTP registries
    /// `insecure` (`host:port`); ready when it answers `docker version`.
    pub fn start(store: Store, insecure: &[&str]) -> anyhow::Result<Dockerd> {
        Dockerd::start_with(store, insecure, false)
    }

    /// [`Dockerd::start`] with Docker's networking as users have it:
    /// iptables on (Debian 12's, `.deps/iptables`, its nft backend), so
    /// user networks get Docker's embedded DNS, which kind's nodes find
    /// each other by. It writes rules into this host's nftables (its
    /// DOCKER chains stay behind when it stops, as with any dockerd).
    pub fn start_networked(store: Store, insecure: &[&str]) -> anyhow::Result<Dockerd> {
        Dockerd::start_with(store, insecure, true)
    }

    fn start_with(store: Store, insecure: &[&str], networked: bool) -> anyhow::Result<Dockerd> {
        let dir = tempfile::Builder::new().prefix("kiln-dockerd-").tempdir()?;
        let d = dir.path();
        let features = match store {
            Store::Classic => serde_json::json!({}),
            Store::Containerd => serde_json::json!({"containerd-snapshotter": true}),
        };
        std::fs::write(
            d.join("daemon.json"),
            serde_json::json!({"features": features, "insecure-registries": insecure}).to_string(),
        )?;
        let forky = crate::tools::workspace().join(".deps/forky/usr/bin");
        let iptables = crate::tools::workspace().join(".deps/iptables");
        // `iptables` and friends are alternatives Debian's postinst would
        // set; here, links in a bin directory of this daemon's own.
        let bin = d.join("bin");
        std::fs::create_dir(&bin)?;
        for name in [
            "iptables",
            "iptables-save",
            "iptables-restore",
            "ip6tables",
            "ip6tables-save",
            "ip6tables-restore",
        ] {
            let nft = name.replacen("tables", "tables-nft", 1);
            std::os::unix::fs::symlink(iptables.join("usr/sbin").join(nft), bin.join(name))?;
        }
        let path = format!(
            "{}{}:{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
            if networked {
                format!("{}:", bin.display())
            } else {
                String::new()
            },
            forky.display(),
            root().join("usr/sbin").display(),
            root().join("usr/bin").display()
        );
        let log = std::fs::File::create(d.join("dockerd.log"))?;
        let mut cmd = Command::new(root().join("usr/sbin/dockerd"));
        cmd.env_clear().env("PATH", path);
        if networked {
            let libs = iptables
                .join("usr/lib")
                .join(format!("{}-linux-gnu", std::env::consts::ARCH));
            cmd.env("XTABLES_LIBDIR", libs.join("xtables"))
                .env("LD_LIBRARY_PATH", libs);
        }
        cmd.arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", d.join("docker.sock").display()))
            .args(if networked {
                &["--bridge=none"][..]
            } else {
                &["--iptables=false", "--ip-masq=false", "--bridge=none"][..]
            })
            .arg("--config-file")
            .arg(d.join("daemon.json"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // It dies with the test process, even when that is killed.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().context("starting dockerd")?;
        let mut me = Dockerd {
            child: Some(child),
            socket: d.join("docker.sock"),
            store,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = me.child.as_mut().unwrap().try_wait()? {
                me.child = None;
                bail!("dockerd exited ({st}): {}", me.log());
            }
            if me.socket.exists() {
                let v = me.docker().arg("version").output()?;
                if v.status.success() {
                    return Ok(me);
                }
            }
            if Instant::now() > deadline {
                bail!("dockerd did not answer within 60s: {}", me.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The `docker` client, talking to this daemon only.
    pub fn docker(&self) -> Command {
        let mut c = Command::new(docker_cli());
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("DOCKER_CONFIG", self.dir.path().join("client"))
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()));
        c
    }

    /// `docker ARGS`, bounded, asserted to succeed; its stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let o = crate::tools::run_bounded(self.docker().args(args), 300);
        assert!(
            o.status.success(),
            "docker {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr),
            self.log_tail()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "\ndockerd's last lines:\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }

    /// Stops dockerd (SIGTERM: it stops its containerd and unmounts), then
    /// SIGKILL if it has not ended within 30 s.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.stop();
    }
}
