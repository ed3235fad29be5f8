//! Untrusted input stays contained. Hostile base images, archives and
//! registries: each case asserts that a watched directory outside the
//! rootfs is unchanged byte for byte, mode for mode and owner for owner, and
//! that nothing from the image ran.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;
use kiln_testkit::base::{image_of, layer_of, Entry};
use kiln_testkit::image::{host_platform, sha256, Layer};
use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as S};

/// A directory outside every rootfs, owned by someone else, that no case may touch.
struct Watched {
    dir: tempfile::TempDir,
    before: BTreeMap<PathBuf, String>,
}

fn state(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let p = root.join(rel);
        let m = std::fs::symlink_metadata(&p).unwrap();
        let what = if m.file_type().is_symlink() {
            format!("-> {}", std::fs::read_link(&p).unwrap().display())
        } else if m.is_file() {
            sha256(&std::fs::read(&p).unwrap())
        } else {
            String::new()
        };
        out.insert(
            rel.to_path_buf(),
            format!(
                "{:o} {}:{} {}.{} n{} {what}",
                m.mode(),
                m.uid(),
                m.gid(),
                m.mtime(),
                m.mtime_nsec(),
                m.nlink()
            ),
        );
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                walk(root, &rel.join(e.file_name()), out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

impl Watched {
    fn new() -> Watched {
        let dir = tempfile::Builder::new()
            .prefix("kiln-watched-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        std::fs::write(d.join("secret"), "host secret\n").unwrap();
        std::fs::set_permissions(d.join("secret"), PermissionsExt::from_mode(0o600)).unwrap();
        std::fs::write(d.join("config.toml"), "# the host's own\n").unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/file"), "x").unwrap();
        std::fs::set_permissions(d.join("sub"), PermissionsExt::from_mode(0o700)).unwrap();
        for p in ["secret", "config.toml", "sub", "sub/file", ""] {
            std::os::unix::fs::lchown(d.join(p), Some(4321), Some(4321)).unwrap();
        }
        let before = state(d);
        Watched { dir, before }
    }

    fn path(&self, rel: &str) -> String {
        let p = self.dir.path().join(rel);
        p.display().to_string()
    }

    #[track_caller]
    fn assert_unchanged(&self, case: &str) {
        let now = state(self.dir.path());
        assert_eq!(
            now, self.before,
            "{case}: the directory outside the rootfs changed"
        );
    }
}

/// Builds a node image from a base of `layers`, pushed to the loopback registry.
fn node_from(env: &Env, name: &str, layers: Vec<Layer>, extra: &[&str]) -> Output {
    let base = image_of(&format!("hostile/{name}"), "1", &[&host_platform()], layers);
    env.registry.push(&base).unwrap();
    let base_ref = format!("{}/hostile/{name}:1", env.registry.addr);
    build_node(env, name, &["--base", &base_ref], extra)
}

/// Builds a node image named `name` from the base `base` flags say.
fn build_node(env: &Env, name: &str, base: &[&str], extra: &[&str]) -> Output {
    let m = env.manifest(
        "node.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let output = format!("oci-archive:{}", env.path(&format!("{name}.tar")).display());
    let mirror = env.mirror();
    let mut args = vec!["build", "--manifest", m.to_str().unwrap()];
    args.extend(base);
    args.extend(["--output", &output, "--mirror", &mirror]);
    args.extend(extra);
    kiln(&args)
}

#[track_caller]
fn assert_refused(o: &Output, case: &str, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{case}: want a refusal:\n{err}");
    assert!(!err.contains("panicked"), "{case}:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("kiln: error: "))
        .unwrap_or_else(|| panic!("{case}: no error line:\n{err}"));
    assert!(line.contains(needle), "{case}: {line}");
}

#[test]
fn a_directory_replaced_by_a_symlink_is_never_chmodded_or_chowned_through() {
    let env = Env::new();
    let w = Watched::new();
    let (secret, sub) = (w.path("secret"), w.path("sub"));
    let layers = vec![
        layer_of(&[
            ("x/", D, b"", "", 0o777),
            ("x/inner", F, b"i", "", 0o644),
            ("x", S, b"", &secret, 0o777),
            ("y/", D, b"", "", 0o777),
            ("y", S, b"", &sub, 0o777),
        ]),
        // A later layer replaces a directory of the first one, too.
        layer_of(&[("z/", D, b"", "", 0o777)]),
        layer_of(&[("z", S, b"", &secret, 0o777), ("z/", D, b"", "", 0o777)]),
    ];
    let o = node_from(&env, "chmod", layers, &[]);
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    w.assert_unchanged("dir replaced by a symlink");
}

#[test]
fn the_same_attacks_inside_a_base_archive_change_nothing() {
    let env = Env::new();
    let w = Watched::new();
    let (secret, sub) = (w.path("secret"), w.path("sub"));
    let cases: Vec<(&str, Vec<Entry>, &str)> = vec![
        // A chmod through a replaced directory, then a hard link to a host
        // file: the link resolves inside the root, where there is no such
        // file. (At paths a node-image build extracts from its base.)
        (
            "chmod-link",
            vec![
                ("kind/", D, b"", "", 0o777),
                ("kind", S, b"", &secret, 0o777),
                ("etc/", D, b"", "", 0o755),
                ("etc/containerd/", D, b"", "", 0o755),
                ("etc/containerd/stolen", H, b"", &secret, 0o644),
            ],
            "layer entry etc/containerd/stolen",
        ),
        (
            "planted",
            vec![
                ("var/", D, b"", "", 0o755),
                ("var/lib", S, b"", &sub, 0o777),
            ],
            "/var/lib is a symlink",
        ),
    ];
    for (name, entries, needle) in cases {
        let base = image_of(
            "hostile/archived",
            name,
            &[&host_platform()],
            vec![layer_of(&entries)],
        );
        let archive = env.path(&format!("{name}-base.tar"));
        std::fs::write(
            &archive,
            kiln_testkit::archive::oci_layout(&base, &format!("hostile/archived:{name}"), None),
        )
        .unwrap();
        let o = build_node(
            &env,
            name,
            &["--base-archive", archive.to_str().unwrap()],
            &[],
        );
        assert_refused(&o, name, needle);
        w.assert_unchanged(name);
    }
}

#[test]
fn symlinks_planted_at_kilns_own_paths_are_refused() {
    let env = Env::new();
    let w = Watched::new();
    let dir = w.path("sub");
    let secret = w.path("secret");
    let cases: &[(&str, Vec<Entry>, &str)] = &[
        (
            "store",
            vec![
                ("var/lib/", D, b"", "", 0o755),
                ("var/lib/containerd", S, b"", &dir, 0o777),
            ],
            "/var/lib/containerd is a symlink",
        ),
        (
            "varlib",
            vec![
                ("var/", D, b"", "", 0o755),
                ("var/lib", S, b"", &dir, 0o777),
            ],
            "/var/lib is a symlink",
        ),
        (
            "etc",
            vec![("etc/containerd", S, b"", &dir, 0o777)],
            "/etc/containerd is a symlink",
        ),
        (
            "kind",
            vec![("kind", S, b"", &dir, 0o777)],
            "/kind is a symlink",
        ),
        (
            "content",
            vec![
                ("var/lib/containerd/", D, b"", "", 0o755),
                (
                    "var/lib/containerd/io.containerd.content.v1.content",
                    S,
                    b"",
                    &dir,
                    0o777,
                ),
            ],
            "io.containerd.content.v1.content is a symlink",
        ),
        (
            "metadb",
            vec![
                (
                    "var/lib/containerd/io.containerd.metadata.v1.bolt/",
                    D,
                    b"",
                    "",
                    0o755,
                ),
                (
                    "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db",
                    S,
                    b"",
                    &secret,
                    0o777,
                ),
            ],
            "meta.db is a symlink",
        ),
    ];
    for (name, entries, needle) in cases {
        let o = node_from(&env, name, vec![layer_of(entries)], &[]);
        assert_refused(&o, name, needle);
        w.assert_unchanged(name);
    }
}

#[test]
fn a_symlinked_config_is_replaced_not_written_through() {
    let env = Env::new();
    let w = Watched::new();
    let target = w.path("config.toml");
    let o = node_from(
        &env,
        "config",
        vec![layer_of(&[
            ("etc/", D, b"", "", 0o755),
            ("etc/containerd/", D, b"", "", 0o755),
            ("etc/containerd/config.toml", S, b"", &target, 0o777),
        ])],
        &[],
    );
    assert_ok(&o);
    w.assert_unchanged("config.toml symlink");
    // In the node image, the config is a regular file of kiln's.
    let files = kiln_testkit::base::read_tar(&env.path("config.tar"));
    let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let top = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let root = env.path("config-unpacked");
    std::fs::create_dir(&root).unwrap();
    let m: serde_json::Value =
        serde_json::from_slice(kiln_testkit::base::blob(&files, &top)).unwrap();
    let layers = kiln_testkit::base::layer_digests(&m);
    kiln_testkit::base::unpack_layers(&files, &layers, &root);
    let cfg = root.join("etc/containerd/config.toml");
    assert!(std::fs::symlink_metadata(&cfg).unwrap().is_file());
    assert!(std::fs::read_to_string(&cfg)
        .unwrap()
        .contains("registry.k8s.io/pause:3.10"));
}

#[test]
fn hard_links_to_host_files_stay_inside() {
    let env = Env::new();
    let w = Watched::new();
    let abs = w.path("secret");
    let up = format!("../../../../../../../..{abs}");
    for (name, target) in [("hl-abs", abs.as_str()), ("hl-up", up.as_str())] {
        let o = node_from(
            &env,
            name,
            vec![layer_of(&[
                ("etc/", D, b"", "", 0o755),
                ("etc/stolen", H, b"", target, 0o644),
            ])],
            &[],
        );
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
        w.assert_unchanged(name);
    }
}

/// A base whose containerd is a script that leaves a mark when run.
fn fake_containerd(mark: &Path) -> Vec<Layer> {
    let script = format!(
        "#!/bin/sh\necho ran >> {}\necho 'containerd github.com/containerd/containerd v1.7.24 x'\n",
        mark.display()
    );
    vec![layer_of(&[
        ("usr/", D, b"", "", 0o755),
        ("usr/local/", D, b"", "", 0o755),
        ("usr/local/bin/", D, b"", "", 0o755),
        ("usr/local/bin/containerd", F, script.as_bytes(), "", 0o755),
        ("usr/bin/", D, b"", "", 0o755),
        ("usr/bin/containerd", F, script.as_bytes(), "", 0o755),
    ])]
}

#[test]
fn nothing_from_the_image_is_executed() {
    let env = Env::new();
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("ran");
    let ctd = kiln_testkit::tools::containerd();
    let ctd = ctd.to_str().unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("default", &[]),
        ("explicit", &["--containerd", ctd]),
        // Opting in runs only a binary built for this machine; a script is not one.
        ("trusted", &["--trust-node-binaries"]),
    ];
    for (name, extra) in cases {
        let o = node_from(&env, &format!("fake-{name}"), fake_containerd(&mark), extra);
        assert_ok(&o);
        assert!(!mark.exists(), "{name}: the image's containerd ran");
    }
    // A rootfs build reads the same binaries, and runs none of them.
    let rootfs = env.path("rootfs");
    let script = format!("#!/bin/sh\necho ran >> {}\n", mark.display());
    for p in ["usr/local/bin/containerd", "usr/bin/containerd"] {
        std::fs::create_dir_all(rootfs.join(p).parent().unwrap()).unwrap();
        std::fs::write(rootfs.join(p), &script).unwrap();
        std::fs::set_permissions(rootfs.join(p), PermissionsExt::from_mode(0o755)).unwrap();
    }
    let m = env.path("node.yaml");
    assert_ok(&env.build(&m, &rootfs, &[]));
    assert!(!mark.exists(), "rootfs build: the image's containerd ran");
}

#[test]
fn without_a_usable_containerd_kiln_says_what_to_do() {
    let env = Env::new();
    let rootfs = env.path("rootfs");
    std::fs::create_dir_all(rootfs.join("usr/local/bin")).unwrap();
    kiln_testkit::tools::containerd_claiming("1.7.24", &rootfs.join("usr/local/bin/containerd"));
    let m = env.manifest(
        "m.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    // No containerd on PATH at all.
    let o = kiln_testkit::tools::run_bounded(
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["build", "--manifest", m.to_str().unwrap(), "--rootfs"])
            .arg(&rootfs)
            .args(["--mirror", &env.mirror()])
            .env("PATH", "/nonexistent")
            .env("KILN_NO_CACHE", "1"),
        60,
    );
    assert_fails(
        &o,
        1,
        &[
            "no containerd",
            "--trust-node-binaries",
            "--containerd PATH",
            "1.x",
        ],
    );
    // With the opt-in, the node's own (a real binary for this machine) writes the store.
    let o = kiln_testkit::tools::run_bounded(
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["build", "--manifest", m.to_str().unwrap(), "--rootfs"])
            .arg(&rootfs)
            .args(["--mirror", &env.mirror(), "--trust-node-binaries"])
            .env("PATH", "/nonexistent")
            .env("KILN_NO_CACHE", "1"),
        120,
    );
    assert_ok(&o);
}

/// Applies layers as uid/gid 65534 (a child re-running this test binary),
/// so the unprivileged unpacker is what runs.
#[test]
fn unprivileged_unpack_drops_devices_and_setuid() {
    if let Ok(spec) = std::env::var("KILN_TEST_UNPACK") {
        let (root, layer) = spec.split_once('\n').unwrap();
        kiln::primitives::unpack::apply_layer(Path::new(root), Path::new(layer)).unwrap();
        return;
    }
    if !rustix::process::geteuid().is_root() {
        return; // needs root to switch to another user
    }
    let w = Watched::new();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    let root = dir.path().join("rootfs");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
    let secret = w.path("secret");
    let layer = layer_of(&[
        ("bin/", D, b"", "", 0o755),
        ("bin/su", F, b"#!/bin/sh\n", "", 0o4755),
        ("bin/sg", F, b"#!/bin/sh\n", "", 0o2755),
        ("dev/", D, b"", "", 0o755),
        ("dev/null", tar::EntryType::Char, b"", "", 0o666),
        ("dev/sda", tar::EntryType::Block, b"", "", 0o660),
        ("x/", D, b"", "", 0o777),
        ("x", S, b"", &secret, 0o777),
    ]);
    let blob = dir.path().join("layer.tar.gz");
    std::fs::write(&blob, &layer.blob.bytes).unwrap();
    let o = kiln_testkit::tools::run_bounded(
        std::os::unix::process::CommandExt::gid(
            std::os::unix::process::CommandExt::uid(
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--exact",
                        "hostile::unprivileged_unpack_drops_devices_and_setuid",
                        "--nocapture",
                    ])
                    .env(
                        "KILN_TEST_UNPACK",
                        format!("{}\n{}", root.display(), blob.display()),
                    ),
                65534,
            ),
            65534,
        ),
        60,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in ["bin/su", "bin/sg"] {
        let m = std::fs::metadata(root.join(f)).unwrap();
        assert_eq!(
            m.mode() & 0o6000,
            0,
            "{f} kept setuid/setgid: {:o}",
            m.mode()
        );
        assert_eq!(m.uid(), 65534);
    }
    assert!(!root.join("dev/null").exists() && !root.join("dev/sda").exists());
    w.assert_unchanged("unprivileged unpack");
}

#[test]
fn hostile_archives_and_bundles_are_refused_and_change_nothing() {
    let env = Env::new();
    let w = Watched::new();
    let pause = env.image("pause");
    let pi = &pause.platforms[0];
    // An OCI layout whose manifest blob is a symlink to a host file.
    let mut entries: Vec<(String, Vec<u8>)> = vec![(
        "oci-layout".into(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    )];
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": pi.manifest.digest, "size": pi.manifest.bytes.len(),
        "annotations": {"io.containerd.image.name": "registry.k8s.io/pause:3.10"}}]});
    entries.push(("index.json".into(), serde_json::to_vec(&index).unwrap()));
    let tar_path = env.path("evil.tar");
    {
        let mut b = tar::Builder::new(std::fs::File::create(&tar_path).unwrap());
        for (n, d) in &entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(d.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, n, d.as_slice()).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(S);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(
            &mut h,
            format!("blobs/sha256/{}", &pi.manifest.digest[7..]),
            w.path("secret"),
        )
        .unwrap();
        b.finish().unwrap();
    }
    let rootfs = env.path("rootfs");
    let o = kiln(&[
        "load",
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--archive",
        tar_path.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    w.assert_unchanged("load --archive");
    let m = env.manifest(
        "b.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let o = env.build(&m, &rootfs, &["--from", tar_path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    w.assert_unchanged("build --from");
    // A gzip bomb: small on disk, far larger unpacked.
    let bomb = env.path("bomb.tar.gz");
    {
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&bomb).unwrap(),
            flate2::Compression::best(),
        );
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..200 {
            std::io::Write::write_all(&mut gz, &zeros).unwrap();
        }
        gz.finish().unwrap();
    }
    let (pid, o) = kiln_testkit::tools::run_bounded_pid(
        &mut kiln_cmd(
            &[
                "load",
                "--rootfs",
                rootfs.to_str().unwrap(),
                "--archive",
                bomb.to_str().unwrap(),
            ],
            &[],
        ),
        120,
    );
    assert_fails(&o, 2, &["decompresses to more than", "64x its size"]);
    // Its temp file went with it.
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("kiln-gunzip-{pid}-"))
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn push_credentials_never_reach_an_upload_location_on_another_host() {
    let mut env = Env::new();
    let (user, pass) = ("kiln", "s3cret-pass");
    let base = image_of(
        "hostile/push-base",
        "1",
        &[&host_platform()],
        vec![layer_of(&[("etc/", D, b"", "", 0o755)])],
    );
    env.registry.push(&base).unwrap();
    env.registry
        .restart_with(&kiln_testkit::registry::RegistryOptions {
            htpasswd: Some((user.into(), pass.into())),
            ..Default::default()
        })
        .unwrap();
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{user}:{pass}")
        )
    );
    let proxy = kiln_testkit::proxy::upload_proxy(env.registry.url(), basic.clone());
    let front = proxy.front.addr.to_string();
    let cfg_dir = env.path("docker");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    std::fs::write(
        cfg_dir.join("config.json"),
        serde_json::json!({"auths": {front.clone(): {"auth": &basic[6..]}}}).to_string(),
    )
    .unwrap();

    let m = env.manifest(
        "node.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let target = format!("{front}/pushed/node:1");
    let base_ref = format!("{front}/hostile/push-base:1");
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--base",
            &base_ref,
            "--push",
            &target,
            "--mirror",
            &format!("registry.k8s.io=http://{front}"),
        ],
        &[("DOCKER_CONFIG", cfg_dir.to_str().unwrap())],
    );
    assert_ok(&o);
    let seen = proxy.store_auth.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no upload went to the other host");
    assert!(
        seen.iter().all(Option::is_none),
        "the upload host was sent credentials: {seen:?}"
    );
}

/// A loop device over a scratch file (root only), detached when dropped:
/// a device node with its numbers is a stand-in for the build machine's disk.
struct Loop {
    dev: String,
    file: PathBuf,
    major: u32,
    minor: u32,
}

impl Loop {
    fn new(dir: &Path) -> Result<Loop, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root".into());
        }
        let file = dir.join("disk.img");
        let pattern: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, pattern).unwrap();
        let o = kiln_testkit::tools::run_bounded(
            std::process::Command::new("losetup")
                .args(["-f", "--show"])
                .arg(&file),
            30,
        );
        if !o.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let rdev = std::fs::metadata(&dev).unwrap().rdev();
        Ok(Loop {
            dev,
            file,
            major: rustix::fs::major(rdev),
            minor: rustix::fs::minor(rdev),
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        kiln_testkit::tools::run_bounded(
            std::process::Command::new("losetup").args(["-d", &self.dev]),
            30,
        );
    }
}

/// A layer with `dirs`, then `path` as a device or FIFO with these numbers.
fn special_layer(dirs: &[&str], path: &str, kind: tar::EntryType, major: u32, minor: u32) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    for d in dirs {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(D);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_cksum();
        b.append_data(&mut h, d, std::io::empty()).unwrap();
    }
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(0o600);
    h.set_size(0);
    h.set_device_major(major).unwrap();
    h.set_device_minor(minor).unwrap();
    h.set_cksum();
    b.append_data(&mut h, path, std::io::empty()).unwrap();
    let tar = b.into_inner().unwrap();
    Layer {
        diff_id: sha256(&tar),
        blob: kiln_testkit::image::Blob::new(
            kiln_testkit::image::OCI_LAYER_GZIP,
            kiln_testkit::image::gzip(&tar),
        ),
        tar,
    }
}

const META_DB: &str = "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db";
const STORE_DIRS: &[&str] = &[
    "var/",
    "var/lib/",
    "var/lib/containerd/",
    "var/lib/containerd/io.containerd.metadata.v1.bolt/",
];

/// Issue 26, case 1: a base (or a rootfs, or an image to verify) whose store
/// holds a device node or a FIFO where containerd's meta.db goes. kiln
/// refuses it (exit 2) naming the path and its type before any containerd
/// starts; the disk behind the device is unchanged byte for byte.
#[test]
fn a_device_node_or_fifo_in_a_store_is_refused_and_the_disk_is_untouched() {
    let env = Env::new();
    let w = Watched::new();
    let scratch = tempfile::tempdir().unwrap();
    let disk = match Loop::new(scratch.path()) {
        Ok(l) => Some(l),
        Err(why) => {
            eprintln!("no loop device ({why}): the device case uses numbers 7:0 and checks only the refusal");
            None
        }
    };
    let (major, minor) = disk.as_ref().map(|l| (l.major, l.minor)).unwrap_or((7, 0));
    let before = disk.as_ref().map(|l| std::fs::read(&l.file).unwrap());
    let c = kiln_testkit::tools::containerd();
    let base = kiln_testkit::base::kind_base_with(&c, &[&host_platform()]);
    let base_layers = base.platforms[0].layers.clone();
    for (case, kind, what) in [
        (
            "block",
            tar::EntryType::Block,
            format!("a block device ({major}:{minor})"),
        ),
        ("fifo", tar::EntryType::Fifo, "a FIFO".to_string()),
    ] {
        // A node image from such a base.
        let mut layers = base_layers.clone();
        layers.push(special_layer(STORE_DIRS, META_DB, kind, major, minor));
        let o = node_from(&env, &format!("dev-{case}"), layers.clone(), &[]);
        assert_fails(
            &o,
            2,
            &[
                &format!("/{META_DB} is {what}"),
                "remove it from the base image",
            ],
        );
        // The same store handed over as an image to verify: refused before
        // containerd starts.
        let img = image_of(
            &format!("hostile/verify-{case}"),
            "1",
            &[&host_platform()],
            layers,
        );
        env.registry.push(&img).unwrap();
        let o = kiln(&[
            "verify",
            "--image",
            &format!("{}/hostile/verify-{case}:1", env.registry.addr),
        ]);
        assert_fails(
            &o,
            2,
            &[
                &format!("/{META_DB} is {what}"),
                "remove it from the base image",
            ],
        );
    }
    // A --rootfs whose store already holds one (made here by hand).
    let m = env.manifest(
        "node.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let r = env.path("dev-rootfs");
    let db = r.join(META_DB);
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let mut made = vec![("fifo", "a FIFO".to_string())];
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &db,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let o = env.build(&m, &r, &[]);
    assert_fails(&o, 2, &[&format!("/{META_DB} is a FIFO")]);
    std::fs::remove_file(&db).unwrap();
    if disk.is_some() {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &db,
            rustix::fs::FileType::BlockDevice,
            rustix::fs::Mode::from_raw_mode(0o600),
            rustix::fs::makedev(major, minor),
        )
        .unwrap();
        let o = env.build(&m, &r, &[]);
        assert_fails(
            &o,
            2,
            &[&format!("/{META_DB} is a block device ({major}:{minor})")],
        );
        made.push(("block", format!("{major}:{minor}")));
    }
    if let (Some(l), Some(before)) = (&disk, &before) {
        assert!(
            std::fs::read(&l.file).unwrap() == *before,
            "the disk behind {} changed",
            l.dev
        );
        eprintln!(
            "{} ({}:{}) over {}: unchanged",
            l.dev,
            l.major,
            l.minor,
            l.file.display()
        );
    }
    eprintln!("rootfs cases: {made:?}");
    w.assert_unchanged("device nodes and FIFOs");
}

/// Issue 26, defence in depth: should a device node slip past the store
/// check (here planted after it, by calling the daemon directly), kiln's
/// private containerd still cannot open it: as root it sees the store
/// through a `nodev` bind mount in a mount namespace of its own. The disk
/// behind the device is unchanged and the daemon fails to start.
#[test]
fn the_private_containerd_cannot_open_a_device_in_its_store() {
    let scratch = tempfile::tempdir().unwrap();
    let disk = match Loop::new(scratch.path()) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: needs root and a loop device ({why})");
            return;
        }
    };
    let before = std::fs::read(&disk.file).unwrap();
    let store = scratch.path().join("rootfs/var/lib/containerd");
    let db = store.join("io.containerd.metadata.v1.bolt/meta.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &db,
        rustix::fs::FileType::BlockDevice,
        rustix::fs::Mode::from_raw_mode(0o600),
        rustix::fs::makedev(disk.major, disk.minor),
    )
    .unwrap();
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let started = rt.block_on(kiln::adapters::daemon::Daemon::start(
        &kiln_testkit::tools::containerd(),
        &store,
        &kiln::adapters::daemon::DaemonOptions::default(),
    ));
    let err = match started {
        Ok(d) => {
            d.stop().unwrap();
            panic!("containerd started over a block device as its meta.db");
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("could not open the store") && err.contains("permission denied"),
        "containerd should fail opening meta.db: {err}"
    );
    assert!(
        std::fs::read(&disk.file).unwrap() == before,
        "the disk behind {} changed",
        disk.dev
    );
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        mounts_before,
        "the host's mounts changed"
    );
    eprintln!(
        "{} ({}:{}) as meta.db: containerd refused it ({}), disk unchanged",
        disk.dev,
        disk.major,
        disk.minor,
        err.lines().last().unwrap_or_default()
    );
}

/// Issue 26, case 4: a base that holds more than the limits allow under
/// what kiln unpacks ends the build (and a verify of such an image) with
/// one line naming the limit and the flag that raises it; a raised limit
/// lets the same base through.
#[test]
fn a_base_over_the_limits_is_refused_naming_the_limit() {
    let env = Env::new();
    let w = Watched::new();
    let names: Vec<String> = (0..40)
        .map(|i| format!("var/lib/containerd/crowd/f{i:02}"))
        .chain(["var/lib/containerd/a/b/c/d/e/f/g/deep".to_string()])
        .collect();
    let mut entries: Vec<Entry> = vec![
        ("var/", D, b"", "", 0o755),
        ("var/lib/", D, b"", "", 0o755),
        ("var/lib/containerd/", D, b"", "", 0o755),
    ];
    entries.extend(names.iter().map(|n| (n.as_str(), F, &b"x"[..], "", 0o644)));
    let c = kiln_testkit::tools::containerd();
    let mut layers = kiln_testkit::base::kind_base_with(&c, &[&host_platform()]).platforms[0]
        .layers
        .clone();
    layers.push(layer_of(&entries));
    let o = node_from(&env, "crowded", layers.clone(), &["--max-entries", "30"]);
    assert_fails(&o, 2, &["more than 30 entries", "--max-entries"]);
    assert_eq!(
        stderr(&o).lines().filter(|l| l.contains("error")).count(),
        1
    );
    let o = node_from(&env, "crowded", layers.clone(), &["--max-bytes", "20"]);
    assert_fails(&o, 2, &["more than 20 bytes", "--max-bytes"]);
    let o = node_from(&env, "crowded", layers.clone(), &["--max-depth", "8"]);
    assert_fails(
        &o,
        2,
        &["deep: the image holds more than 8 levels", "--max-depth"],
    );
    // An image given to verify meets the same limits.
    let img = image_of(
        "hostile/crowded-verify",
        "1",
        &[&host_platform()],
        layers.clone(),
    );
    env.registry.push(&img).unwrap();
    let o = kiln(&[
        "verify",
        "--image",
        &format!("{}/hostile/crowded-verify:1", env.registry.addr),
        "--max-entries",
        "30",
    ]);
    assert_fails(&o, 2, &["more than 30 entries", "--max-entries"]);
    // The defaults let it through, and the limits flags need a base.
    let o = node_from(&env, "crowded", layers, &[]);
    assert_ok(&o);
    let m = env.manifest(
        "node.yaml",
        "registry.k8s.io/pause:3.10",
        &["registry.k8s.io/pause:3.10"],
    );
    let o = env.build(&m, &env.path("limits-rootfs"), &["--max-entries", "5"]);
    assert_fails(&o, 2, &["--max-entries"]);
    w.assert_unchanged("limits");
}

/// Issue 39, item 1: the byte limit counts what an entry writes. A PAX
/// `size` record (the ustar field says 0) and a GNU sparse file (written
/// at its logical size) were charged their header's size; and `verify
/// --image`, which unpacks the whole image, counted only the store.
#[test]
fn pax_and_sparse_sizes_count_against_the_byte_limit() {
    use kiln_testkit::base::{layer_from_tar, pax_sized_tar, sparse_tar};
    let env = Env::new();
    let c = kiln_testkit::tools::containerd();
    let base = kiln_testkit::base::kind_base_with(&c, &[&host_platform()]).platforms[0]
        .layers
        .clone();
    let with = |tar: Vec<u8>| {
        let mut layers = base.clone();
        layers.push(layer_from_tar(tar));
        layers
    };
    // 64 MiB in the store, which no header field admits to.
    let pax = with(pax_sized_tar(
        "var/lib/containerd/pax",
        &vec![7u8; 64 << 20],
    ));
    let limit = (32u64 << 20).to_string();
    let o = node_from(&env, "pax-size", pax, &["--max-bytes", &limit]);
    assert_fails(
        &o,
        2,
        &[
            "var/lib/containerd/pax",
            "more than 33554432 bytes",
            "--max-bytes",
        ],
    );
    let sparse = with(sparse_tar(
        "var/lib/containerd/sparse",
        1 << 30,
        &[1u8; 512],
    ));
    let o = node_from(&env, "sparse", sparse, &["--max-bytes", &limit]);
    assert_fails(
        &o,
        2,
        &[
            "var/lib/containerd/sparse",
            "more than 33554432 bytes",
            "--max-bytes",
        ],
    );
    // verify --image writes every path of the image: one outside the store
    // counts too (1 GiB of hole, refused before a byte of it is written).
    let img = image_of(
        "hostile/sparse-verify",
        "1",
        &[&host_platform()],
        with(sparse_tar("opt/hole", 1 << 30, &[1u8; 512])),
    );
    env.registry.push(&img).unwrap();
    let image = format!("{}/hostile/sparse-verify:1", env.registry.addr);
    let limit = (512u64 << 20).to_string();
    let o = kiln(&["verify", "--image", &image, "--max-bytes", &limit]);
    assert_fails(
        &o,
        2,
        &["opt/hole", "more than 536870912 bytes", "--max-bytes"],
    );
}

/// Issue 39.7: `verify --image` of an image whose /var/lib is a symlink
/// out of the root refuses it by name before anything walks the store, and
/// reads nothing through it (the store's path was joined as a host path,
/// and walked and re-hashed there).
#[test]
fn verify_refuses_a_symlinked_var_before_walking_the_store() {
    let env = Env::new();
    // What the link points at holds a "store" with a symlink in it:
    // walked through the link, kiln would name that one.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("containerd")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", outside.path().join("containerd/x")).unwrap();
    let target = outside.path().display().to_string();
    let layer = layer_of(&[
        ("var/", D, b"", "", 0o755),
        ("var/lib", S, b"", &target, 0o777),
    ]);
    let img = image_of("hostile/var-link", "1", &[&host_platform()], vec![layer]);
    env.registry.push(&img).unwrap();
    let image = format!("{}/hostile/var-link:1", env.registry.addr);
    let o = kiln(&["verify", "--image", &image]);
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("the rootfs's /var/lib is a symlink"), "{err}");
}

/// Issue 26, case 3: `build --base ... --verify` and `kiln verify` of an
/// image read its store with kiln's containerd; a runnable containerd in
/// the image (here a static binary that marks a file when run) is not run
/// without --trust-node-binaries.
#[test]
fn verify_runs_no_binary_from_the_image_without_consent() {
    let env = Env::new();
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("ran");
    let standin = std::fs::read(kiln_testkit::tools::standin()).unwrap();
    let c = kiln_testkit::tools::containerd();
    let mut layers = kiln_testkit::base::kind_base_with(&c, &[&host_platform()]).platforms[0]
        .layers
        .clone();
    layers.push(layer_of(&[
        ("usr/", D, b"", "", 0o755),
        ("usr/local/", D, b"", "", 0o755),
        ("usr/local/bin/", D, b"", "", 0o755),
        ("usr/local/bin/containerd", F, &standin, "", 0o755),
    ]));
    let base = image_of("hostile/runnable", "1", &[&host_platform()], layers);
    env.registry.push(&base).unwrap();
    // Images that run (build --verify starts the sandbox and the control
    // plane when root).
    let runnable = [
        ("pause", "3.10", "/pause"),
        ("etcd", "3.5.16-0", "/usr/local/bin/etcd"),
        ("kube-apiserver", "v1.31.2", "/usr/local/bin/kube-apiserver"),
        (
            "kube-controller-manager",
            "v1.31.2",
            "/usr/local/bin/kube-controller-manager",
        ),
        ("kube-scheduler", "v1.31.2", "/usr/local/bin/kube-scheduler"),
    ];
    for (repo, tag, path) in runnable {
        env.registry
            .push(&kiln_testkit::base::runnable(repo, tag, path, &[]))
            .unwrap();
    }
    let names: Vec<String> = runnable
        .iter()
        .map(|(r, t, _)| format!("registry.k8s.io/{r}:{t}"))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", &names);
    let out = env.path("runnable.tar");
    let mirror = env.mirror();
    let envs = [("KILN_STANDIN_MARK", mark.to_str().unwrap())];
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--base",
            &format!("{}/hostile/runnable:1", env.registry.addr),
            "--output",
            &format!("oci-archive:{}", out.display()),
            "--mirror",
            &mirror,
            "--verify",
        ],
        &envs,
    );
    assert_ok(&o);
    assert!(!mark.exists(), "build --verify ran the image's containerd");
    let o = kiln_env(
        &[
            "verify",
            "--image",
            &format!("oci-archive:{}", out.display()),
        ],
        &envs,
    );
    assert_ok(&o);
    assert!(!mark.exists(), "verify ran the image's containerd");
    assert!(
        !stderr(&o).contains("/rootfs/usr/local/bin/containerd"),
        "{}",
        stderr(&o)
    );
}

/// Every file of `rootfs`'s content store whose bytes do not hash to its name.
fn bad_blobs(rootfs: &Path) -> Vec<String> {
    let dir = rootfs.join("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256");
    let mut bad = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if sha256(&std::fs::read(e.path()).unwrap()) != format!("sha256:{name}") {
            bad.push(name);
        }
    }
    bad
}

/// Overwrites the biggest layer blob of `rootfs`'s store with other bytes of
/// the same size, its record untouched; returns its name.
fn plant_wrong_bytes(rootfs: &Path) -> String {
    let dir = rootfs.join("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256");
    let biggest = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap();
    let p = biggest.path();
    let size = biggest.metadata().unwrap().len() as usize;
    std::fs::set_permissions(&p, PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&p, vec![0x5a; size]).unwrap();
    std::fs::set_permissions(&p, PermissionsExt::from_mode(0o444)).unwrap();
    biggest.file_name().to_string_lossy().into_owned()
}

/// Issue 26, case 2: a store whose records name a blob at the right digest
/// and size while its file holds other bytes. `verify` fails naming it; a
/// rebuild proves bytes, not records, and fetches it again; a node image
/// from a base carrying such a store ships the right bytes.
#[test]
fn planted_records_are_trusted_by_bytes_not_records() {
    let env = Env::new();
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let r = env.path("rootfs");
    assert_ok(&env.build(&m, &r, &[]));
    assert!(r.join("var/lib/.kiln-proven-blobs.json").is_file());
    let planted = plant_wrong_bytes(&r);
    assert_eq!(bad_blobs(&r), vec![planted.clone()]);
    let o = kiln(&["verify", "--rootfs", r.to_str().unwrap()]);
    assert_fails(&o, 1, &["every bundled image is present"]);
    assert!(
        stderr(&o).contains(&format!("blob sha256:{planted} (")),
        "{}",
        stderr(&o)
    );
    let o = env.build(&m, &r, &[]);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("its file's bytes do not hash to its name; fetching it again"),
        "{}",
        stderr(&o)
    );
    assert!(
        bad_blobs(&r).is_empty(),
        "still planted: {:?}",
        bad_blobs(&r)
    );
    assert_ok(&kiln(&["verify", "--rootfs", r.to_str().unwrap()]));
    // The same store carried by a base image.
    let planted = plant_wrong_bytes(&r);
    let c = kiln_testkit::tools::containerd();
    let mut layers = kiln_testkit::base::kind_base_with(&c, &[&host_platform()]).platforms[0]
        .layers
        .clone();
    layers.push(kiln_testkit::base::store_layer(&r));
    let base = image_of("hostile/planted-store", "1", &[&host_platform()], layers);
    env.registry.push(&base).unwrap();
    let out = env.path("planted-store.tar");
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--base",
        &format!("{}/hostile/planted-store:1", env.registry.addr),
        "--output",
        &format!("oci-archive:{}", out.display()),
        "--mirror",
        &env.mirror(),
    ]);
    assert_ok(&o);
    assert!(stderr(&o).contains("fetching it again"), "{}", stderr(&o));
    let v = kiln(&[
        "verify",
        "--image",
        &format!("oci-archive:{}", out.display()),
    ]);
    assert_ok(&v);
    assert!(
        stderr(&v).contains("blob files (") && !stderr(&v).contains(&planted[..12]),
        "{}",
        stderr(&v)
    );
}
