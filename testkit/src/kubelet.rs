//! A real kubelet (Kubernetes v1.35.4, built from k8s.io/kubernetes by
//! `make deps`) run standalone: no API server, pods from a static pod
//! directory. Its log is the judge, so it is kept whole and waited on.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A running kubelet; killed when dropped.
pub struct Kubelet {
    child: Child,
    /// Its log so far, and whether it has ended.
    log: Arc<(Mutex<(String, bool)>, Condvar)>,
    pods: PathBuf,
}

impl Kubelet {
    /// Starts the kubelet with `config`, its state in `root_dir` (for a
    /// node, the rootfs's `var/lib/kubelet`), its static pods read from
    /// the config's `staticPodPath`, which must be `pods`.
    pub fn start(config: &Path, root_dir: &Path, pods: &Path, cert_dir: &Path) -> Kubelet {
        let mut child = Command::new(crate::tools::kubelet())
            .arg(format!("--config={}", config.display()))
            .arg(format!("--root-dir={}", root_dir.display()))
            .arg(format!("--cert-dir={}", cert_dir.display()))
            .args(["--hostname-override=kiln-node", "--v=2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the kubelet");
        let err = child.stderr.take().expect("piped");
        let log = Arc::new((Mutex::new((String::new(), false)), Condvar::new()));
        let shared = log.clone();
        std::thread::spawn(move || {
            let (lock, cv) = &*shared;
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let mut l = lock.lock().unwrap();
                l.0.push_str(&line);
                l.0.push('\n');
                cv.notify_all();
            }
            lock.lock().unwrap().1 = true;
            cv.notify_all();
        });
        Kubelet {
            child,
            log,
            pods: pods.to_path_buf(),
        }
    }

    /// Waits until `done` holds for the log (woken by each new line), at
    /// most `secs`; the log either way, `Err` if it never held.
    pub fn wait_for(&self, secs: u64, done: impl Fn(&str) -> bool) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let (lock, cv) = &*self.log;
        let mut l = lock.lock().unwrap();
        loop {
            if done(&l.0) {
                return Ok(l.0.clone());
            }
            if l.1 {
                return Err(format!("the kubelet ended:\n{}", l.0));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("not within {secs} s:\n{}", l.0));
            }
            l = cv.wait_timeout(l, deadline - now).unwrap().0;
        }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.log.0.lock().unwrap().0.clone()
    }

    /// Writes a static pod `name` (host network, so no CNI is needed) whose
    /// one container runs `image` with pull policy `IfNotPresent`. Its
    /// sandbox is whatever the node's containerd is configured with.
    pub fn static_pod(&self, name: &str, container: &str, image: &str) {
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: kube-system\nspec:\n  hostNetwork: true\n  containers:\n  - name: {container}\n    image: {image}\n    imagePullPolicy: IfNotPresent\n"
        );
        // Written beside, then renamed: the kubelet never reads half a file.
        let tmp = self.pods.join(format!(".{name}.yaml"));
        std::fs::write(&tmp, pod).unwrap();
        std::fs::rename(&tmp, self.pods.join(format!("{name}.yaml"))).unwrap();
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
