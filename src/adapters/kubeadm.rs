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
    .current_dir(dir.path());
    // Its own process group, killed on a timeout or an interrupt,
    // grandchildren included (`primitives::bounded`).
    let bounds = crate::primitives::bounded::Bounds {
        output: MAX_OUTPUT,
        within: WITHIN,
        idle: WITHIN,
    };
    let ran = crate::primitives::bounded::run(&mut cmd, None, bounds)
        .map_err(|why| format!("{}: {why}", kubeadm.display()))?;
    let (status, stdout, stderr) = (ran.status, ran.stdout, ran.stderr);
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
