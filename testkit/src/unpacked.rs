//! A node image's tree as containerd and Docker unpack it, for tests that
//! must judge kiln's output the way those programs read it: containerd's
//! native snapshotter (the top snapshot, viewed) and Docker's
//! `docker create` + `docker export`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::docker::Dockerd;
use crate::registry::Registry;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A tree as (path → what it is): type, mode, owner, and a file's bytes'
/// digest or a link's target; a directory's `trusted.overlay.opaque`.
pub type Tree = BTreeMap<String, String>;

/// The tree under `root`, walked without following links.
pub fn walk(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                let opaque = rustix::fs::lgetxattr(&p, "trusted.overlay.opaque", &mut [0u8; 8])
                    .map(|_| " opaque")
                    .unwrap_or("");
                format!(
                    "dir {:o} {}:{}{opaque}",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid()
                )
            } else {
                format!(
                    "file {:o} {}:{} {}",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid(),
                    crate::image::sha256(&std::fs::read(&p).unwrap())
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

/// The tree the containerd `d` unpacks `registry`'s `repo:tag` to (native
/// snapshotter): its top snapshot (by the config's chain of diff IDs),
/// viewed.
pub fn containerd_tree(
    d: &kiln::adapters::daemon::Daemon,
    registry: &Registry,
    repo: &str,
    tag: &str,
) -> Result<Tree, String> {
    let reference = format!("{}/{repo}:{tag}", registry.addr);
    let ctr = |args: &[&str]| {
        let o = crate::tools::run_bounded(
            std::process::Command::new(crate::tools::ctr())
                .arg("--address")
                .arg(&d.socket)
                .args(args),
            300,
        );
        if !o.status.success() {
            return Err(format!(
                "ctr {args:?}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    };
    ctr(&[
        "images",
        "pull",
        "--plain-http",
        "--snapshotter",
        "native",
        &reference,
    ])?;
    // The top layer's chain ID, from the config's diff IDs.
    let json = |path: String, accept: &str| -> Result<serde_json::Value, String> {
        registry
            .get(&path, accept)
            .and_then(|r| Ok(r.json()?))
            .map_err(|e| format!("{path}: {e:#}"))
    };
    let m = json(format!("/v2/{repo}/manifests/{tag}"), OCI_MANIFEST)?;
    let config = json(
        format!(
            "/v2/{repo}/blobs/{}",
            m["config"]["digest"].as_str().unwrap_or_default()
        ),
        "*/*",
    )?;
    let mut chain = String::new();
    for d in config["rootfs"]["diff_ids"].as_array().unwrap() {
        let d = d.as_str().unwrap();
        chain = if chain.is_empty() {
            d.to_string()
        } else {
            crate::image::sha256(format!("{chain} {d}").as_bytes())
        };
    }
    let key = format!("view-{tag}");
    ctr(&["snapshots", "--snapshotter", "native", "view", &key, &chain])?;
    let mounts = ctr(&[
        "snapshots",
        "--snapshotter",
        "native",
        "mounts",
        "/unused",
        &key,
    ])?;
    // "mount -t bind SOURCE TARGET -o ...": the view's directory.
    let source = mounts
        .split_whitespace()
        .skip_while(|w| *w != "bind")
        .nth(1)
        .unwrap_or_else(|| panic!("no bind mount in {mounts:?}"))
        .to_string();
    let tree = walk(Path::new(&source));
    ctr(&["snapshots", "--snapshotter", "native", "rm", &key])?;
    Ok(tree)
}

/// The tree Docker gives `image` (`docker create` + `docker export`).
pub fn docker_tree(docker: &Dockerd, image: &str) -> Result<Tree, String> {
    let run = |args: &[&str]| -> Result<String, String> {
        let o = crate::tools::run_bounded(docker.docker().args(args), 300);
        if !o.status.success() {
            return Err(format!(
                "docker {args:?}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    };
    run(&["pull", image])?;
    let id = run(&["create", "--entrypoint", "/kiln-none", image])?;
    let export = docker.dir().join(format!("export-{}.tar", id.trim()));
    run(&["export", "-o", export.to_str().unwrap(), id.trim()])?;
    let mut out = Tree::new();
    let mut tar = tar::Archive::new(std::fs::File::open(&export).unwrap());
    for e in tar.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().display().to_string();
        let h = e.header().clone();
        let what = match h.entry_type() {
            tar::EntryType::Symlink => {
                format!("link {}", h.link_name().unwrap().unwrap().display())
            }
            tar::EntryType::Directory => format!("dir {:o}", h.mode().unwrap() & 0o7777),
            t => {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut b).unwrap();
                format!(
                    "{t:?} {:o} {}",
                    h.mode().unwrap() & 0o7777,
                    crate::image::sha256(&b)
                )
            }
        };
        out.insert(path.trim_end_matches('/').to_string(), what);
    }
    run(&["rm", id.trim()])?;
    std::fs::remove_file(&export).unwrap();
    Ok(out)
}

/// Where `got` differs from `want`: `+ path: what` for what `got` has
/// otherwise or more, `- path` for what it lacks.
pub fn differences(want: &Tree, got: &Tree) -> Vec<String> {
    let mut out: Vec<String> = got
        .iter()
        .filter(|(p, w)| want.get(*p) != Some(*w))
        .map(|(p, w)| format!("+ {p}: {w}"))
        .collect();
    out.extend(
        want.keys()
            .filter(|p| !got.contains_key(*p))
            .map(|p| format!("- {p}")),
    );
    out
}
