//! Shared set-up for kiln's end-to-end tests: a seeded loopback registry, a
//! scratch directory, and the kiln binary with `make deps`'s containerd on PATH.
#![allow(dead_code)]

pub mod kind;
pub mod releases;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln_testkit::image::{host_platform, BuiltImage, ImageSet};
use kiln_testkit::registry::Registry;
use kiln_testkit::tools;

pub struct Env {
    pub registry: Registry,
    pub images: Vec<BuiltImage>,
    pub dir: tempfile::TempDir,
}

/// The fixture image set, with linux/amd64 swapped for the host's platform.
pub fn fixture_set() -> ImageSet {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images.yaml"),
    )
    .unwrap();
    let text = text.replace("linux/amd64", &host_platform());
    let text = if host_platform() == "linux/arm64" {
        text.replacen("linux/arm64]", "linux/amd64]", 99)
    } else {
        text
    };
    serde_yaml_ng::from_str(&text).unwrap()
}

impl Env {
    pub fn new() -> Env {
        let registry = Registry::start().expect("registry");
        let images = registry.seed(&fixture_set()).expect("seed");
        Env {
            registry,
            images,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn image(&self, repo: &str) -> &BuiltImage {
        self.images.iter().find(|i| i.repo == repo).unwrap()
    }

    /// Writes a manifest of `registry.k8s.io/<repo:tag>` entries; returns its path.
    pub fn manifest(&self, name: &str, sandbox: &str, images: &[&str]) -> PathBuf {
        let mut text = format!("apiVersion: kiln/v1\nkind: NodeImageManifest\nkubernetesVersion: v1.31.2\nsandboxImage: {sandbox}\nimages:\n");
        for i in images {
            text.push_str(&format!("  - {i}\n"));
        }
        self.write(name, &text)
    }

    /// `m.yaml` naming pause alone, and `rootfs` built from it.
    pub fn pause_rootfs(&self) -> (PathBuf, PathBuf) {
        let pause = "registry.k8s.io/pause:3.10";
        let m = self.manifest("m.yaml", pause, &[pause]);
        let r = self.path("rootfs");
        assert_ok(&self.build(&m, &r, &[]));
        (m, r)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn mirror(&self) -> String {
        format!("registry.k8s.io={}", self.registry.url())
    }

    /// `kiln build --manifest M --rootfs R --mirror ...` plus `extra`.
    pub fn build(&self, manifest: &Path, rootfs: &Path, extra: &[&str]) -> Output {
        let mut args: Vec<String> = vec![
            "build".into(),
            "--manifest".into(),
            manifest.display().to_string(),
            "--rootfs".into(),
            rootfs.display().to_string(),
            "--mirror".into(),
            self.mirror(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        kiln(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }
}

pub const ALL: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/etcd:3.5.16-0",
    "registry.k8s.io/coredns/coredns:v1.11.3",
    "registry.k8s.io/kube-apiserver:v1.31.2",
    "registry.k8s.io/kube-proxy:v1.31.2",
];

/// Runs the kiln binary (bounded to 3 minutes) with `.deps` containerd on PATH.
pub fn kiln(args: &[&str]) -> Output {
    kiln_env(args, &[])
}

/// As [`kiln`], with extra environment (`DOCKER_CONFIG`, `RUST_LOG`, a `PATH` prefix as `PATH+`).
pub fn kiln_env(args: &[&str], envs: &[(&str, &str)]) -> Output {
    tools::run_bounded(&mut kiln_cmd(args, envs), 180)
}

/// The kiln command [`kiln_env`] runs, not yet started.
pub fn kiln_cmd(args: &[&str], envs: &[(&str, &str)]) -> Command {
    let deps = tools::containerd().parent().unwrap().to_path_buf();
    let prefix = envs
        .iter()
        .find(|(k, _)| *k == "PATH+")
        .map(|(_, v)| format!("{v}:"))
        .unwrap_or_default();
    let path = format!(
        "{prefix}{}:{}",
        deps.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // KILN_TEST_BIN: another kiln to hold to the same tests (an older
    // build, to show a test fails without the change it comes with).
    let bin =
        std::env::var_os("KILN_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_kiln").into());
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .env_remove("KILN_FAULT")
        .env("DOCKER_CONFIG", "/nonexistent-kiln-test")
        .env_remove("KILN_CACHE_DIR");
    // Each run starts cold, as before the cache, unless a test names a
    // cache to share between its runs.
    if !args.contains(&"--cache-dir") && !envs.iter().any(|(k, _)| *k == "KILN_CACHE_DIR") {
        cmd.env("KILN_NO_CACHE", "1");
    }
    for (k, v) in envs.iter().filter(|(k, _)| *k != "PATH+") {
        cmd.env(k, v);
    }
    cmd
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "kiln failed ({}):\n{}\n{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

/// A failed run: exit `code`, no panic, and an error line containing every `needles`.
#[track_caller]
pub fn assert_fails(o: &Output, code: i32, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "want exit {code}:\n{err}");
    assert!(!err.contains("panicked"), "kiln panicked:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("kiln: error: "))
        .unwrap_or_else(|| panic!("no error line:\n{err}"));
    for n in needles {
        assert!(line.contains(n), "error line lacks {n:?}:\n{line}");
    }
}

/// `kiln inspect --json` as JSON.
pub fn inspect(rootfs: &Path) -> serde_json::Value {
    let o = kiln(&["inspect", "--rootfs", rootfs.to_str().unwrap(), "--json"]);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

pub fn report<'a>(inspect: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    inspect
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
}

/// Every image in the rootfs is pinned and complete (and there are `count`, if given).
#[track_caller]
pub fn assert_all_pinned_complete(rootfs: &Path, count: Option<usize>) -> serde_json::Value {
    let view = inspect(rootfs);
    let images = view.as_array().unwrap();
    if let Some(n) = count {
        assert_eq!(images.len(), n, "{view:#}");
    }
    assert!(
        images
            .iter()
            .all(|r| r["complete"] == true && r["pinned"] == true),
        "{view:#}"
    );
    view
}

/// The first per-image failure line (`kiln: failed: ...`).
#[track_caller]
pub fn failed_line(o: &Output) -> String {
    let err = stderr(o);
    err.lines()
        .find(|l| l.starts_with("kiln: failed:"))
        .unwrap_or_else(|| panic!("no failure line:\n{err}"))
        .to_string()
}

/// containerd's own `ctr content fetch --plain-http` of `reference` into the
/// daemon at `socket` (plus `extra` flags), asserted to succeed: an
/// independent client pulling what kiln pushed.
pub fn ctr_fetch(socket: &Path, reference: &str, extra: &[&str]) {
    let o = Command::new(tools::ctr())
        .arg("--address")
        .arg(socket)
        .args(["content", "fetch", "--plain-http"])
        .args(extra)
        .arg(reference)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ctr content fetch {reference}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A system tool by its Debian path (PATH may lack /usr/sbin).
pub fn sbin(name: &str) -> String {
    let p = format!("/usr/sbin/{name}");
    if Path::new(&p).exists() {
        p
    } else {
        name.to_string()
    }
}

/// An unprivileged user for the test's life (`useradd`; removed on drop):
/// the other user of a shared machine, or a builder without root.
pub struct LocalUser {
    pub name: String,
    pub uid: u32,
}

impl LocalUser {
    /// A new user named `PREFIX-PID-N`.
    pub fn create(prefix: &str) -> LocalUser {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        // A name left by a killed run of the same pid is ours to reuse.
        let _ = Command::new(sbin("userdel")).arg(&name).output();
        let o = Command::new(sbin("useradd"))
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                &name,
            ])
            .output()
            .expect("useradd (run the tests as root, as CI does)");
        assert!(
            o.status.success(),
            "useradd: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let id = Command::new("id").args(["-u", &name]).output().unwrap();
        let uid = String::from_utf8_lossy(&id.stdout).trim().parse().unwrap();
        LocalUser { name, uid }
    }

    /// A directory this user owns.
    pub fn dir(&self, path: &Path) -> PathBuf {
        std::fs::create_dir_all(path).unwrap();
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.uid)).unwrap();
        path.to_path_buf()
    }

    /// `PROGRAM ARGS` as this user, not yet started: no capabilities, no
    /// supplementary groups.
    pub fn command(&self, inner: &Command) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid",
            &self.uid.to_string(),
            "--regid",
            &self.uid.to_string(),
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ])
        .arg(inner.get_program())
        .args(inner.get_args());
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd
    }

    /// `kiln ARGS` as this user.
    pub fn kiln(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        tools::run_bounded(&mut self.command(&kiln_cmd(args, envs)), 180)
    }
}

impl Drop for LocalUser {
    fn drop(&mut self) {
        let _ = Command::new(sbin("userdel")).arg(&self.name).output();
    }
}

/// `cmd`, run by a shell that first sets `umask` and then becomes it.
pub fn with_umask(cmd: &Command, umask: &str) -> Command {
    let mut sh = Command::new("sh");
    sh.args(["-c", &format!("umask {umask} && exec \"$0\" \"$@\"")])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh
}

/// `kiln build --json` of the node image `manifest` on `base`, pushed to
/// `target`, following `previous` when given (a full reference), plus
/// `extra` flags and `envs`.
pub fn push_build(
    (manifest, base): (&Path, &str),
    (target, previous): (&str, Option<&str>),
    mirror: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Output {
    let mut args = vec![
        "build",
        "--manifest",
        manifest.to_str().unwrap(),
        "--base",
        base,
        "--mirror",
        mirror,
        "--push",
        target,
        "--json",
    ];
    if let Some(p) = previous {
        args.extend(["--previous", p]);
    }
    args.extend(extra);
    kiln_env(&args, envs)
}
