//! Asking a Kubernetes release's own kubeadm which images `kubeadm init`
//! pulls, as kind's node-image build asks it (`kubeadm config images list
//! --kubernetes-version V`), in JSON: kubeadm's output API
//! `output.kubeadm.k8s.io/v1alpha3`, kind `Images`
//! (kubernetes `cmd/kubeadm/app/apis/output/v1alpha3/types.go`:
//! `{"kind":"Images","apiVersion":"…","images":["registry.k8s.io/…",…]}`).
//! It is code from a release: the caller asks only with the user's consent
//! (`--trust-node-binaries`) and a checked SHA-512. It runs as the user,
//! from a private copy, with an empty environment and no stdin, under
//! `qemu-ARCH` for another architecture, bounded in time and output.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

/// A kubeadm that answers slower than this (emulated, it takes seconds) is
/// given up on.
const WITHIN: Duration = Duration::from_secs(120);
/// Its answer is a few hundred bytes.
const MAX_OUTPUT: u64 = 1 << 20;

/// The image names kubeadm lists for `version`; `emulator` runs a foreign
/// binary. Err says why there is no answer.
pub fn images_list(
    kubeadm: &Path,
    emulator: Option<&Path>,
    version: &str,
) -> Result<Vec<String>, String> {
    // A private, executable copy: the release's file may lack +x, and no
    // one else can swap it between the check and the run.
    let dir = crate::primitives::owned::work_dir("kiln-kubeadm-")
        .map_err(|e| format!("a private copy of kubeadm: {e:#}"))?;
    let copy = dir.path().join("kubeadm");
    std::fs::copy(kubeadm, &copy).map_err(|e| format!("copying {}: {e}", kubeadm.display()))?;
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", copy.display()))?;
    let mut cmd = match emulator {
        Some(q) => {
            let mut c = std::process::Command::new(q);
            c.arg(&copy);
            c
        }
        None => std::process::Command::new(&copy),
    };
    cmd.args([
        "config",
        "images",
        "list",
        "--kubernetes-version",
        version,
        "-o",
        "json",
    ])
    .env_clear()
    .env("HOME", dir.path())
    .current_dir(dir.path())
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    // Its own process group: on a timeout or an interrupt the whole group
    // is killed, grandchildren included.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd
        .spawn()
        .map_err(|e| format!("running {}: {e}", kubeadm.display()))?;
    let got = bounded(child, WITHIN).map_err(|why| format!("{}: {why}", kubeadm.display()))?;
    let (status, stdout, stderr) = got;
    if !status.success() {
        let why = String::from_utf8_lossy(&stderr);
        return Err(format!(
            "{} config images list exited {status}: {}",
            kubeadm.display(),
            why.lines().last().unwrap_or("").trim()
        ));
    }
    parse(&stdout)
}

/// Runs `child` (in a process group of its own) to its end within
/// `within`, its stdout and stderr read whole (each up to [`MAX_OUTPUT`]).
/// The deadline covers the whole run, not only the reading (a child that
/// closes its pipes and sleeps is ended too), and an interrupt (Ctrl-C)
/// ends it at once; either way the whole group is killed.
fn bounded(
    mut child: std::process::Child,
    within: Duration,
) -> Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>), String> {
    let group = rustix::process::Pid::from_child(&child);
    let kill = || {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    };
    let (mut out, mut err) = (
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    // Each pipe drained by a thread of its own, so neither fills up; a
    // third waits for the child. Each reports once, on the one channel.
    let (t1, t2, t3) = (tx.clone(), tx.clone(), tx);
    std::thread::spawn(move || {
        let mut o = Vec::new();
        let r = (&mut out).take(MAX_OUTPUT).read_to_end(&mut o);
        let _ = t1.send(Done::Out(r.map(|_| o)));
    });
    std::thread::spawn(move || {
        let mut e = Vec::new();
        let _ = (&mut err).take(MAX_OUTPUT).read_to_end(&mut e);
        let _ = t2.send(Done::Err(e));
    });
    std::thread::spawn(move || {
        let _ = t3.send(Done::Exit(child.wait()));
    });
    let deadline = std::time::Instant::now() + within;
    let (mut status, mut stdout, mut stderr) = (None, None, None);
    while status.is_none() || stdout.is_none() || stderr.is_none() {
        // Woken by the child's end, its output, or every tick to look at
        // the interrupt flag.
        let tick = deadline
            .saturating_duration_since(std::time::Instant::now())
            .min(Duration::from_millis(200));
        match rx.recv_timeout(tick) {
            Ok(Done::Exit(s)) => status = Some(s.map_err(|e| e.to_string())?),
            Ok(Done::Out(o)) => stdout = Some(o.map_err(|e| format!("reading its answer: {e}"))?),
            Ok(Done::Err(e)) => stderr = Some(e),
            Err(_) => {
                if crate::primitives::interrupt::check().is_err() {
                    kill();
                    return Err("interrupted; its process group was killed".into());
                }
                if std::time::Instant::now() >= deadline {
                    kill();
                    return Err(format!(
                        "gave no answer within {}s; its process group was killed",
                        within.as_secs()
                    ));
                }
            }
        }
    }
    // Exited and answered: anything it left running in its group goes too.
    kill();
    Ok((
        status.expect("looped until set"),
        stdout.expect("looped until set"),
        stderr.expect("looped until set"),
    ))
}

enum Done {
    Exit(std::io::Result<std::process::ExitStatus>),
    Out(std::io::Result<Vec<u8>>),
    Err(Vec<u8>),
}

/// The `images` of kubeadm's `Images` output.
fn parse(stdout: &[u8]) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct Images {
        kind: String,
        images: Vec<String>,
    }
    let i: Images = serde_json::from_slice(stdout)
        .map_err(|e| format!("kubeadm's answer is not its Images JSON: {e}"))?;
    if i.kind != "Images" || i.images.is_empty() || i.images.len() > 64 {
        return Err(format!(
            "kubeadm's answer is a {:?} with {} images, not its image list",
            i.kind,
            i.images.len()
        ));
    }
    Ok(i.images)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh -c SCRIPT` in a group of its own, as `images_list` runs kubeadm,
    /// and a pipe whose write end it and everything it starts hold as fd 3
    /// (a background job's stdin is /dev/null): the read end sees its end
    /// once every one of them is gone.
    fn sh(script: &str) -> (std::process::Child, std::io::PipeReader) {
        let (r, w) = std::io::pipe().unwrap();
        let mut c = std::process::Command::new("sh");
        c.args(["-c", &format!("exec 3<&0; {script}")])
            .stdin(w)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        (c.spawn().unwrap(), r)
    }

    /// Whether everything holding the pipe's write end is gone (within a
    /// minute, the test's bound).
    fn all_gone(mut r: std::io::PipeReader) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = tx.send(r.read_to_end(&mut buf).is_ok());
        });
        rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false)
    }

    /// Issue 45.6: a child that closes its pipes and sleeps is ended by
    /// the deadline (it bounded only the reading before), and a grandchild
    /// it started goes with it.
    #[test]
    fn the_deadline_covers_the_whole_run_and_kills_the_group() {
        let (child, held) = sh("sleep 300 & exec >&- 2>&-; sleep 300");
        let e = bounded(child, Duration::from_secs(2)).unwrap_err();
        assert!(e.contains("no answer within 2s"), "{e}");
        assert!(all_gone(held), "a process of the group survived");
        // An answer is read whole, and a leftover grandchild is ended.
        let (child, held) = sh("sleep 300 >/dev/null 2>&1 & echo answer");
        let (status, out, _) = bounded(child, Duration::from_secs(60)).unwrap();
        assert!(status.success());
        assert_eq!(out, b"answer\n");
        assert!(all_gone(held), "the grandchild survived");
    }

    #[test]
    fn kubeadm_output_is_read_as_its_api_says() {
        let ok = br#"{"kind":"Images","apiVersion":"output.kubeadm.k8s.io/v1alpha3","images":["registry.k8s.io/kube-apiserver:v1.37.0","registry.k8s.io/pause:3.10.1"]}"#;
        assert_eq!(parse(ok).unwrap().len(), 2);
        for bad in [
            &br#"{"kind":"BootstrapToken","images":["a"]}"#[..],
            br#"{"kind":"Images","images":[]}"#,
            b"registry.k8s.io/kube-apiserver:v1.37.0\n",
        ] {
            assert!(parse(bad).is_err());
        }
    }
}
