//! The parts of a real Kubernetes cluster, made here for the cluster test
//! (tests/kind_cluster.rs): a Kubernetes server release in the real
//! layout from the binaries `make deps` builds from k8s.io/kubernetes, the
//! add-on images from their Go modules (testkit/go/cluster), and the node
//! base `make deps` builds from Debian's packages (scripts/kind-base.sh).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::image::{sha256, Blob, BuiltImage, Layer};

/// The release the cluster runs (testkit/go/kubernetes pins it).
pub const VERSION: &str = "v1.35.4";
/// kind's add-ons as built here (module doc of tests/kind_cluster.rs).
pub const KINDNETD: &str = "kiln.test/kindnetd-standin:v1";
pub const PROVISIONER: &str = "kiln.test/local-path-provisioner:v0.0.33";
pub const HELPER: &str = "kiln.test/local-path-helper:busybox";

/// The binaries a release ships in `kubernetes/server/bin/` and kiln installs.
const NODE_BINARIES: &[&str] = &["kubelet", "kubeadm", "kubectl"];

/// The programs a release ships as `docker save` archives.
const IMAGES: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
];

fn go_bin(name: &str) -> PathBuf {
    let p = crate::tools::workspace().join(".deps/go/bin").join(name);
    assert!(p.exists(), "{} is missing: run `make deps`", p.display());
    p
}

/// The node base's root filesystem tar (`.deps/kind-base/<key>.tar`).
pub fn base_tar() -> PathBuf {
    kind_base_file(".tar")
}

/// Debian's nft and its libraries (`.deps/kind-base/<key>.nft.tar`).
fn nft_tar() -> PathBuf {
    kind_base_file(".nft.tar")
}

fn kind_base_file(suffix: &str) -> PathBuf {
    let dir = crate::tools::workspace().join(".deps/kind-base");
    let mut tars: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}: run `make deps`", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(suffix) && name.matches('.').count() == suffix.matches('.').count()
        })
        .collect();
    assert_eq!(tars.len(), 1, "{}: one base expected", dir.display());
    tars.pop().unwrap()
}

/// A tar of (path, bytes, mode) files and (path, target) symlinks, in
/// order, root-owned, mtime 0; parent directories first.
fn tar_with(files: &[(&str, &[u8], u32)], links: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    let paths = files.iter().map(|f| f.0).chain(links.iter().map(|l| l.0));
    for p in paths {
        let mut d = String::new();
        let parts: Vec<&str> = p.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            d.push_str(part);
            d.push('/');
            if dirs.insert(d.clone()) {
                let mut h = tar::Header::new_ustar();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                h.set_path(&d).unwrap();
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
        }
    }
    for (path, data, mode) in files {
        let mut h = tar::Header::new_ustar();
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        h.set_path(path).unwrap();
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    for (path, target) in links {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_link(&mut h, path, target).unwrap();
    }
    b.into_inner().unwrap()
}

/// An uncompressed layer (`...layer.v1.tar`): these layers are large and
/// compressing them would cost the test more than moving them.
fn plain_layer(tar: Vec<u8>) -> Layer {
    Layer {
        diff_id: sha256(&tar),
        blob: Blob::new("application/vnd.oci.image.layer.v1.tar", tar.clone()),
        tar,
    }
}

/// An image of these layers for this machine's platform, with this config.
fn image(repo: &str, tag: &str, layers: Vec<Layer>, config: serde_json::Value) -> BuiltImage {
    let platform = crate::image::host_platform();
    let arch = platform.split('/').nth(1).unwrap().to_string();
    let mut cfg = json!({
        "architecture": arch, "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    });
    cfg["config"]["Env"] =
        json!(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]);
    crate::base::single_image(repo, tag, &platform, layers, cfg)
}

/// The node base (kindest/base-like): the Debian root filesystem as one
/// layer, run as kind runs its nodes (`entrypoint`, then systemd).
pub fn base_image(repo: &str, tag: &str) -> BuiltImage {
    let tar = std::fs::read(base_tar()).unwrap();
    let platform = crate::image::host_platform();
    let arch = platform.split('/').nth(1).unwrap().to_string();
    let layer = plain_layer(tar);
    let cfg = json!({
        "architecture": arch, "os": "linux",
        "config": {
            "Entrypoint": ["/usr/local/bin/entrypoint", "/sbin/init"],
            "Env": ["container=docker", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "StopSignal": "SIGRTMIN+3",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id.clone()]},
    });
    crate::base::single_image(repo, tag, &platform, vec![layer], cfg)
}

/// A one-program image: `program` at `path`, its entrypoint.
fn program_image(repo: &str, tag: &str, program: &Path, path: &str) -> BuiltImage {
    let bin = std::fs::read(program).unwrap();
    let layer = plain_layer(tar_with(
        &[(path.trim_start_matches('/'), &bin, 0o755)],
        &[],
    ));
    image(repo, tag, vec![layer], json!({"Entrypoint": [path]}))
}

/// One file of the base's root filesystem.
fn from_base(path: &str) -> Vec<u8> {
    let mut a = tar::Archive::new(std::fs::File::open(base_tar()).unwrap());
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let p = e
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if p == path {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut b).unwrap();
            return b;
        }
    }
    panic!("{path} is not in the node base");
}

/// The add-on images kubeadm and kind run, by the name each is pushed
/// under (`registry.k8s.io/...` ones as kubeadm v1.35.4 lists them; the
/// `kiln.test/` ones are kind's add-ons built here, see the module doc).
pub fn addon_images() -> Vec<(String, BuiltImage)> {
    let standin = crate::tools::standin();
    // The pause image runs the stand-in daemon (it waits for SIGTERM,
    // as pause does); the helper runs Debian's busybox as sh and rm.
    let busybox = from_base("usr/bin/busybox");
    let helper = plain_layer(tar_with(
        &[("bin/busybox", &busybox, 0o755)],
        &[
            ("bin/sh", "busybox"),
            ("bin/rm", "busybox"),
            ("bin/mkdir", "busybox"),
            ("bin/echo", "busybox"),
        ],
    ));
    vec![
        (
            "registry.k8s.io/pause:3.10.1".into(),
            program_image("pause", "3.10.1", &standin, "/pause"),
        ),
        (
            "registry.k8s.io/etcd:3.6.6-0".into(),
            program_image("etcd", "3.6.6-0", &go_bin("server"), "/usr/local/bin/etcd"),
        ),
        (
            "registry.k8s.io/coredns/coredns:v1.13.1".into(),
            program_image("coredns/coredns", "v1.13.1", &go_bin("coredns"), "/coredns"),
        ),
        (
            KINDNETD.into(),
            program_image(
                "kindnetd-standin",
                "v1",
                &go_bin("kindnetd"),
                "/bin/kindnetd",
            ),
        ),
        (
            PROVISIONER.into(),
            program_image(
                "local-path-provisioner",
                "v0.0.33",
                &go_bin("local-path-provisioner"),
                "/usr/local/bin/local-path-provisioner",
            ),
        ),
        (
            HELPER.into(),
            image(
                "local-path-helper",
                "busybox",
                vec![helper],
                json!({"Entrypoint": ["/bin/sh"]}),
            ),
        ),
    ]
}

/// A legacy `docker save` archive of `layers` (uncompressed tars) tagged
/// `name`, with `config` as its config's `config`.
fn docker_save(name: &str, layers: &[&[u8]], config: serde_json::Value) -> Vec<u8> {
    let arch = crate::image::host_platform()
        .split('/')
        .nth(1)
        .unwrap()
        .to_string();
    let hexes: Vec<String> = layers
        .iter()
        .map(|l| sha256(l).trim_start_matches("sha256:").to_string())
        .collect();
    let cfg = serde_json::to_vec(&json!({
        "architecture": arch, "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": hexes.iter().map(|h| format!("sha256:{h}")).collect::<Vec<_>>()},
    }))
    .unwrap();
    let cfg_hex = sha256(&cfg).trim_start_matches("sha256:").to_string();
    let manifest = serde_json::to_vec(&json!([{
        "Config": format!("{cfg_hex}.json"),
        "RepoTags": [name],
        "Layers": hexes.iter().map(|h| format!("{h}/layer.tar")).collect::<Vec<_>>(),
    }]))
    .unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_path(path).unwrap();
        h.set_cksum();
        b.append(&h, data).unwrap();
    };
    add(&format!("{cfg_hex}.json"), &cfg);
    for (h, l) in hexes.iter().zip(layers) {
        add(&format!("{h}/layer.tar"), l);
    }
    add("manifest.json", &manifest);
    b.into_inner().unwrap()
}

/// Writes the release in the layout of `kubernetes-server-linux-ARCH.tar.gz`
/// unpacked (kiln's `--kubernetes DIR`) under `dir`: `kubernetes/version`,
/// the node binaries, and each control-plane program as a `docker save`
/// archive tagged `registry.k8s.io/NAME-ARCH:TAG` with its `.docker_tag`.
/// kube-proxy's image carries Debian's nft under its program: the cluster
/// runs kube-proxy's nftables mode, which runs `nft` (the real image is
/// built on a Debian base with the same tools).
pub fn release_dir(dir: &Path) -> PathBuf {
    let arch = crate::image::host_platform()
        .split('/')
        .nth(1)
        .unwrap()
        .to_string();
    let bin = dir.join("kubernetes/server/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(dir.join("kubernetes/version"), format!("{VERSION}\n")).unwrap();
    for b in NODE_BINARIES {
        std::fs::copy(go_bin(b), bin.join(b)).unwrap();
    }
    let nft = std::fs::read(nft_tar()).unwrap();
    for name in IMAGES {
        let program = std::fs::read(go_bin(name)).unwrap();
        let path = format!("usr/local/bin/{name}");
        let layer = tar_with(&[(&path, &program, 0o755)], &[]);
        let mut layers: Vec<&[u8]> = Vec::new();
        if *name == "kube-proxy" {
            layers.push(&nft);
        }
        layers.push(&layer);
        let config = json!({
            "Entrypoint": [format!("/{path}")],
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        });
        let save = docker_save(
            &format!("registry.k8s.io/{name}-{arch}:{VERSION}"),
            &layers,
            config,
        );
        std::fs::write(bin.join(format!("{name}.tar")), save).unwrap();
        std::fs::write(
            bin.join(format!("{name}.docker_tag")),
            format!("{VERSION}\n"),
        )
        .unwrap();
    }
    dir.to_path_buf()
}

/// The release's image names as kind and kubeadm use them (arch suffix gone).
pub fn release_images() -> Vec<String> {
    IMAGES
        .iter()
        .map(|n| format!("registry.k8s.io/{n}:{VERSION}"))
        .collect()
}

/// A by-name map of files for a kind manifests directory (`--kind-manifests`):
/// the test's CNI manifest (its stand-in kindnetd) and kiln's own storage
/// template, with the images filled in.
pub fn kind_manifests(dir: &Path, kindnetd: &str, provisioner: &str, helper: &str) -> PathBuf {
    let here = crate::tools::workspace();
    let cni = std::fs::read_to_string(here.join("testkit/kind-base/default-cni.yaml"))
        .unwrap()
        .replace("@KINDNETD_IMAGE@", kindnetd);
    let storage = std::fs::read_to_string(here.join("manifests/kind-layout/default-storage.yaml"))
        .unwrap()
        .replace("@PROVISIONER_IMAGE@", provisioner)
        .replace("@HELPER_IMAGE@", helper);
    let files = BTreeMap::from([("default-cni.yaml", cni), ("default-storage.yaml", storage)]);
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir.to_path_buf()
}

/// Everything kiln's node build reads: the add-ons and the base pushed to
/// a registry, the release, the manifest and kind's manifests on disk.
pub struct NodeInputs {
    pub manifest: PathBuf,
    pub release: PathBuf,
    pub kind_manifests: PathBuf,
    /// The base's reference in the registry.
    pub base: String,
    /// `registry.k8s.io=URL` and `kiln.test=URL`.
    pub mirrors: Vec<String>,
    /// Where the node image goes (`--push`).
    pub node_image: String,
}

impl NodeInputs {
    /// Pushes the add-ons and the base to `registry`; writes the rest under `dir`.
    pub fn push(dir: &Path, registry: &crate::registry::Registry) -> NodeInputs {
        let url = registry.url();
        let mut manifest = format!(
            "apiVersion: kiln/v1\nkind: NodeImageManifest\nkubernetesVersion: {VERSION}\nsandboxImage: registry.k8s.io/pause:3.10.1\nimages:\n"
        );
        for (name, image) in addon_images() {
            registry.push(&image).unwrap();
            manifest.push_str(&format!("  - {name}\n"));
        }
        let base = base_image("kiln-test/kind-base", "bookworm");
        registry.push(&base).unwrap();
        drop(base);
        let manifest_path = dir.join("node.yaml");
        std::fs::write(&manifest_path, manifest).unwrap();
        NodeInputs {
            manifest: manifest_path,
            release: release_dir(&dir.join("release")),
            kind_manifests: kind_manifests(
                &dir.join("kind-manifests"),
                KINDNETD,
                PROVISIONER,
                HELPER,
            ),
            base: format!("{}/kiln-test/kind-base:bookworm", registry.addr),
            mirrors: vec![format!("registry.k8s.io={url}"), format!("kiln.test={url}")],
            node_image: format!("{}/kiln/node:{VERSION}", registry.addr),
        }
    }

    /// `kiln build` of the node image from these inputs, pushed.
    pub fn build_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "build",
            "--manifest",
            self.manifest.to_str().unwrap(),
            "--base",
            &self.base,
            "--kubernetes",
            self.release.to_str().unwrap(),
            "--kind-manifests",
            self.kind_manifests.to_str().unwrap(),
            "--push",
            &self.node_image,
        ]
        .map(String::from)
        .to_vec();
        for m in &self.mirrors {
            args.extend(["--mirror".to_string(), m.clone()]);
        }
        args
    }
}

/// `kiln generate kubelet-config` for the cluster: GC on by disk use at
/// 1 % and 0 % (one pass removes every unused image it may; kiln's default
/// is by age), no minimum age to speak of, and images loaded later under
/// `example.com/team/` allowlisted: kubelet 1.35 re-checks credentials for
/// images it did not pull unless allowlisted (kiln's policy,
/// NeverVerifyAllowlistedImages), and an exact name would match only a pod
/// naming it untagged.
pub fn generate_args(manifest: &Path) -> Vec<String> {
    [
        "generate",
        "kubelet-config",
        "--manifest",
        manifest.to_str().unwrap(),
        "--disk-high",
        "1",
        "--disk-low",
        "0",
        "--min-age",
        "1s",
        "--allow",
        "example.com/team/*",
    ]
    .map(String::from)
    .to_vec()
}

/// kind's cluster config, written to `dir/kind.yaml` from what `kiln
/// generate kubelet-config` printed: two nodes, kube-proxy's nftables mode
/// (its image carries nft, see [`release_dir`]) and, in kiln's patch,
/// `failCgroupV1: false`: these hosts mount cgroup v1, which kubelet 1.35
/// refuses unless told (KEP-5573).
pub fn kind_config(generated: &[u8], dir: &Path) -> PathBuf {
    let mut config: serde_yaml_ng::Mapping = serde_yaml_ng::from_slice(generated).unwrap();
    let patches = config
        .get_mut("kubeadmConfigPatches")
        .and_then(|p| p.as_sequence_mut())
        .expect("kiln's kubeadmConfigPatches");
    let patch = patches[0].as_str().unwrap().trim_end().to_string();
    patches[0] = serde_yaml_ng::Value::String(format!("{patch}\nfailCgroupV1: false\n"));
    config.insert(
        "networking".into(),
        serde_yaml_ng::from_str("kubeProxyMode: nftables").unwrap(),
    );
    config.insert(
        "nodes".into(),
        serde_yaml_ng::from_str("- role: control-plane\n- role: worker").unwrap(),
    );
    let path = dir.join("kind.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    path
}

/// kind itself (built from its Go module) with the test's docker CLI first
/// on PATH, talking to `d`, its HOME and TMPDIR `home`.
pub fn kind(d: &crate::docker::Dockerd, home: &Path) -> std::process::Command {
    let cli = crate::docker::docker_cli();
    let mut c = std::process::Command::new(crate::tools::kind());
    c.env_clear()
        .env(
            "PATH",
            format!(
                "{}:/usr/sbin:/usr/bin:/sbin:/bin",
                cli.parent().unwrap().display()
            ),
        )
        .env("HOME", home)
        .env("TMPDIR", home)
        .env("DOCKER_HOST", format!("unix://{}", d.socket.display()));
    c
}
