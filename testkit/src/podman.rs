//! A private podman for the tests: Debian 12's podman 4.3.1 with conmon and
//! containers-common (`make deps`, unpacked under `.deps/podman`), rootful,
//! with its own storage (vfs), run root, containers.conf, registries.conf
//! and signature policy, none of the system's (`shared/notes/podman-facts.md`):
//! Debian 12's runc as its runtime (its crun refuses this host's hybrid
//! cgroups), cgroupfs, events to a file. Daemonless: every command is the
//! CLI, which is also what kiln runs (`--provider podman`), given
//! [`Podman::env`].

use std::path::{Path, PathBuf};
use std::process::Command;

/// `.deps/podman` (`make deps`).
fn root() -> PathBuf {
    let p = crate::tools::workspace().join(".deps/podman");
    assert!(
        p.join("usr/bin/podman").exists(),
        "{} is missing: run `make deps`",
        p.display()
    );
    p
}

pub struct Podman {
    dir: tempfile::TempDir,
}

impl Podman {
    /// A podman of its own, trusting the plain-HTTP registries `insecure`
    /// (`host:port`).
    pub fn new(insecure: &[&str]) -> anyhow::Result<Podman> {
        let dir = tempfile::Builder::new().prefix("kiln-podman-").tempdir()?;
        let d = dir.path();
        let r = root();
        std::fs::create_dir_all(d.join("home/.config/containers"))?;
        std::fs::write(
            d.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                d.join("store").display(),
                d.join("run").display()
            ),
        )?;
        std::fs::write(
            d.join("containers.conf"),
            format!(
                "[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nevents_logfile_path = \"{}\"\nruntime = \"runc\"\nconmon_path = [\"{}\"]\nvolume_path = \"{}\"\nstatic_dir = \"{}\"\ntmp_dir = \"{}\"\n[engine.runtimes]\nrunc = [\"/usr/sbin/runc\"]\n[network]\nnetwork_backend = \"cni\"\n",
                d.join("events.log").display(),
                r.join("usr/bin/conmon").display(),
                d.join("volumes").display(),
                d.join("static").display(),
                d.join("tmp").display(),
            ),
        )?;
        let mut registries = String::from("unqualified-search-registries = []\n");
        for host in insecure {
            registries.push_str(&format!(
                "[[registry]]\nlocation = \"{host}\"\ninsecure = true\n"
            ));
        }
        std::fs::write(d.join("registries.conf"), registries)?;
        std::fs::write(
            d.join("home/.config/containers/policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )?;
        Ok(Podman { dir })
    }

    /// The environment podman (and kiln, driving it) runs with: this
    /// podman first on PATH, its libraries, its configuration.
    pub fn env(&self) -> Vec<(String, String)> {
        let (r, d) = (root(), self.dir.path());
        let arch = std::process::Command::new("gcc")
            .arg("-print-multiarch")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let at = |p: &Path| p.display().to_string();
        vec![
            (
                "PATH".into(),
                format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", at(&r.join("usr/bin"))),
            ),
            (
                "LD_LIBRARY_PATH".into(),
                format!(
                    "{}:{}",
                    at(&r.join("usr/lib").join(&arch)),
                    at(&r.join("lib").join(&arch))
                ),
            ),
            ("CONTAINERS_CONF".into(), at(&d.join("containers.conf"))),
            (
                "CONTAINERS_STORAGE_CONF".into(),
                at(&d.join("storage.conf")),
            ),
            (
                "CONTAINERS_REGISTRIES_CONF".into(),
                at(&d.join("registries.conf")),
            ),
            ("HOME".into(), at(&d.join("home"))),
        ]
    }

    /// The `podman` CLI of this podman, in a clean environment.
    pub fn podman(&self) -> Command {
        let mut c = Command::new(root().join("usr/bin/podman"));
        c.env_clear();
        for (k, v) in self.env() {
            c.env(k, v);
        }
        c
    }

    /// `podman ARGS`, bounded, asserted to succeed; its stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let o = crate::tools::run_bounded(self.podman().args(args), 300);
        assert!(
            o.status.success(),
            "podman {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Its storage and configuration directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = crate::tools::run_bounded(
            self.podman()
                .args(["rm", "--all", "--force", "--time", "0"]),
            120,
        );
        let _ = crate::tools::run_bounded(self.podman().args(["volume", "prune", "--force"]), 60);
    }
}
