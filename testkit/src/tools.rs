//! The binaries `make deps` unpacked under `.deps/`, or overrides from the environment.

use std::path::PathBuf;

/// The workspace root (where `.deps/` lives).
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit sits in the workspace")
        .to_path_buf()
}

/// A file `make deps` put under `.deps/` (REL from there), which must be there.
fn installed(rel: &str) -> PathBuf {
    let p = workspace().join(".deps").join(rel);
    assert!(p.exists(), "{} is missing: run `make deps`", p.display());
    p
}

fn dep(env: &str, rel: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let p = workspace().join(".deps/root").join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `make deps` (or set {env})",
        p.display()
    );
    p
}

pub fn containerd() -> PathBuf {
    dep("KILN_TEST_CONTAINERD", "usr/bin/containerd")
}

/// containerd 2.x (Debian forky), for testing nodes that run 2.x.
pub fn containerd2() -> PathBuf {
    let p = std::env::var_os("KILN_TEST_CONTAINERD2")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".deps/forky/usr/bin/containerd"));
    assert!(
        p.exists(),
        "{} is missing: run `make deps` (or set KILN_TEST_CONTAINERD2)",
        p.display()
    );
    p
}

/// Writes a copy of the 1.7 containerd binary to `dest` whose built-in
/// version string says `version` (same length as the real one, e.g.
/// "1.6.20"): a stand-in for an older node containerd, read but never run.
pub fn containerd_claiming(version: &str, dest: &std::path::Path) {
    let mut bin = std::fs::read(containerd()).unwrap();
    let needle = b"+unknown";
    let at = bin
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("containerd carries X.Y.Z+unknown");
    let start = bin[..at]
        .iter()
        .rposition(|c| !(c.is_ascii_digit() || *c == b'.'))
        .map_or(0, |p| p + 1);
    assert_eq!(at - start, version.len(), "same length as the real version");
    bin[start..at].copy_from_slice(version.as_bytes());
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(dest, bin).unwrap();
    std::fs::set_permissions(dest, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// The platform that is not this machine's (arm64 on amd64, else amd64)
/// and its architecture: the emulated-verify tests build a node for it.
pub fn other_platform() -> (String, &'static str) {
    let arch = if std::env::consts::ARCH == "aarch64" {
        "amd64"
    } else {
        "arm64"
    };
    (format!("linux/{arch}"), arch)
}

/// The root `make deps` unpacked Debian's containerd and libc for
/// [`other_platform`] into.
pub fn foreign_root() -> PathBuf {
    let p = workspace().join(".deps/foreign").join(other_platform().1);
    assert!(
        p.join("usr/bin/containerd").exists(),
        "{} is missing: run `make deps`",
        p.display()
    );
    p
}

/// The directory holding QEMU's user-mode emulators (`make deps`).
pub fn qemu_dir() -> PathBuf {
    let p = workspace().join(".deps/qemu/usr/bin");
    assert!(p.is_dir(), "{} is missing: run `make deps`", p.display());
    p
}

/// QEMU's user-mode emulator for `platform` (`make deps`): its file name
/// (as kiln looks for it on PATH) and its path. The name is kiln's own rule
/// (`Platform::qemu_name`), not a second copy of it.
pub fn qemu(platform: &str) -> (String, PathBuf) {
    let p = kiln::primitives::platform::Platform::parse(platform).expect("a platform");
    let name = format!(
        "qemu-{}",
        p.qemu_name().expect("an architecture QEMU emulates")
    );
    let path = qemu_dir().join(&name);
    (name, path)
}

/// The SPDX project's validator (`pyspdxtools` from PyPI's spdx-tools,
/// installed by `make deps` in its own virtualenv).
pub fn pyspdxtools() -> std::process::Command {
    std::process::Command::new(installed("spdx/bin/pyspdxtools"))
}

/// Debian 12's skopeo (`make deps`), ready to run: its libraries beside it.
pub fn skopeo() -> std::process::Command {
    let bin = installed("skopeo/usr/bin/skopeo");
    let root = workspace().join(".deps/skopeo");
    let libs: Vec<PathBuf> = std::fs::read_dir(root.join("usr/lib"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    let mut cmd = std::process::Command::new(bin);
    cmd.env(
        "LD_LIBRARY_PATH",
        std::env::join_paths(libs).expect("plain paths"),
    );
    cmd
}

pub fn ctr() -> PathBuf {
    dep("KILN_TEST_CTR", "usr/bin/ctr")
}

pub fn registry() -> PathBuf {
    dep("KILN_TEST_REGISTRY", "usr/bin/docker-registry")
}

/// The system's runc (Debian 12's; `make deps` installs it), as `kiln
/// verify --start` uses: trixie's in `.deps` needs glibc 2.38.
pub fn runc() -> PathBuf {
    std::env::var_os("KILN_TEST_RUNC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/runc"))
}

/// Runs a command to completion or kills it after `secs`: tests never hang.
pub fn run_bounded(cmd: &mut std::process::Command, secs: u64) -> std::process::Output {
    run_bounded_pid(cmd, secs).1
}

/// Waits for a child started elsewhere, killing it after `secs`.
pub fn wait_bounded(child: &mut std::process::Child, secs: u64) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let s = child.wait().expect("wait");
            panic!("a child did not finish within {secs}s (killed: {s})");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// As [`run_bounded`], also returning the process id it ran as.
pub fn run_bounded_pid(cmd: &mut std::process::Command, secs: u64) -> (u32, std::process::Output) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let s = child.wait().expect("wait");
            panic!("command {cmd:?} did not finish within {secs}s (killed: {s})");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let pid = child.id();
    (
        pid,
        std::process::Output {
            status,
            stdout: t_out.join().unwrap(),
            stderr: t_err.join().unwrap(),
        },
    )
}

/// The static stand-in daemon (`testkit/csrc/standin.c`), built once with
/// `gcc -static` under `target/` (written to a temp name, then renamed, so
/// concurrent test processes never see half a file).
pub fn standin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| static_c("standin")).clone()
}

/// A release's kubeadm stand-in (`testkit/csrc/kubeadm.c`), static, for
/// this machine: it answers `config images list -o json`.
pub fn kubeadm_standin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| static_c("kubeadm")).clone()
}

/// `testkit/csrc/NAME.c` built static into `target/kiln-NAME`.
fn static_c(name: &str) -> PathBuf {
    let src = workspace().join(format!("testkit/csrc/{name}.c"));
    // target/ may not exist (CARGO_TARGET_DIR elsewhere).
    std::fs::create_dir_all(workspace().join("target")).unwrap();
    let out = workspace().join(format!("target/kiln-{name}"));
    let tmp = workspace().join(format!("target/kiln-{name}.{}", std::process::id()));
    let st = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&tmp)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc -static {} failed", src.display());
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// Sigstore's cosign (Debian's, `make deps`), offline: its TUF cache and
/// config under `home`, no key password.
pub fn cosign(home: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(installed("cosign/usr/bin/cosign"));
    cmd.env("HOME", home)
        .env("TUF_ROOT", home.join("tuf"))
        .env("COSIGN_PASSWORD", "")
        .env("COSIGN_YES", "true")
        .current_dir(home);
    cmd
}

/// oras, the OCI registry client (Debian's, `make deps`).
pub fn oras(home: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(installed("oras/usr/bin/oras"));
    cmd.env("HOME", home)
        .env("DOCKER_CONFIG", home)
        .current_dir(home);
    cmd
}

/// crictl from cri-tools, built by `make deps` from its Go module
/// (testkit/go/peers): the kubelet's CLI view of a CRI runtime.
pub fn crictl() -> PathBuf {
    installed("go/bin/crictl")
}

/// kind itself, built by `make deps` from its Go module (testkit/go/peers).
pub fn kind() -> PathBuf {
    installed("go/bin/kind")
}

/// The kubelet of Kubernetes v1.35.4, built by `make deps` from
/// k8s.io/kubernetes (testkit/go/kubernetes).
pub fn kubelet() -> PathBuf {
    installed("go/bin/kubelet")
}

/// kubeadm of the same release, built beside the kubelet
/// (testkit/go/kubernetes).
pub fn kubeadm() -> PathBuf {
    installed("go/bin/kubeadm")
}
