//! kiln run as root on a machine other users share (issue 45): its own
//! directories and outputs are no lever for them. Each test plays the
//! other user for real (a user the test creates, `setpriv`), against the
//! real binary and a loopback registry; they need root, as CI runs them.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `kiln bundle` of pause alone into `out`, with `envs`, under `umask`.
fn bundle(env: &Env, out: &Path, umask: &str, envs: &[(&str, &str)]) -> Output {
    let pause = "registry.k8s.io/pause:3.10";
    let m = env.manifest("pause.yaml", pause, &[pause]);
    let mirror = env.mirror();
    let inner = kiln_cmd(
        &[
            "bundle",
            "--manifest",
            m.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--mirror",
            &mirror,
        ],
        envs,
    );
    kiln_testkit::tools::run_bounded(&mut with_umask(&inner, umask), 180)
}

/// A root-owned, root-only file another user would like root to overwrite.
fn victim(dir: &Path) -> PathBuf {
    let v = dir.join("victim");
    std::fs::write(&v, b"precious").unwrap();
    std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o600)).unwrap();
    v
}

/// A directory everyone may create in, like /tmp or /shared: 1777, root's.
fn shared_dir(env: &Env) -> PathBuf {
    let shared = env.path("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    shared
}

/// Issue 45.1: another user renames a prepared directory (`oci-layout` a
/// symlink to a root-only file) in and out of `OUT.kiln-staging` while root
/// runs `kiln bundle --output OUT` again and again. Each run builds the
/// bundle or refuses the staging in one line; the target is never written,
/// and root makes nothing inside the other user's directory. (Against the
/// old code, which created the staging recursively and wrote `oci-layout`
/// through the name, this overwrote the target.)
#[test]
fn a_racing_user_cannot_make_root_write_through_the_bundle_staging() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let env = Env::new();
    let other = LocalUser::create("kiln-rival");
    std::fs::set_permissions(env.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = shared_dir(&env);
    let target = victim(&env.path(""));
    let out = shared.join("out.tar");
    let staging = shared.join("out.tar.kiln-staging");
    let prepared = shared.join("prepared");
    // The other user's directory, shaped as a staging with a trap in it,
    // renamed in and out of the staging name as fast as rename(2) goes.
    let setup = format!(
        "mkdir -p {p}/blobs/sha256 && ln -s {t} {p}/oci-layout && ln -s {t} {p}/index.json && chmod -R go-w {p}",
        p = prepared.display(),
        t = target.display(),
    );
    let o = kiln_testkit::tools::run_bounded(
        &mut other.command(Command::new("sh").args(["-c", &setup])),
        30,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let racer_py = "import os, sys\n\
        p, st, ready, stop = sys.argv[1:5]\n\
        open(ready, 'w').close()\n\
        while not os.path.exists(stop):\n\
        \x20   for a, b in ((p, st), (st, p)):\n\
        \x20       try:\n\
        \x20           os.rename(a, b)\n\
        \x20       except OSError:\n\
        \x20           pass\n";
    let mut inner = Command::new("timeout");
    inner
        .args(["300", "python3", "-c", racer_py])
        .arg(&prepared)
        .arg(&staging)
        .arg(shared.join(".ready"))
        .arg(shared.join(".stop"));
    let mut racer = other.command(&inner).spawn().unwrap();
    // Started: the racer says so in a file (no waiting on the clock).
    let ready = shared.join(".ready");
    let waited = std::time::Instant::now();
    while !ready.exists() {
        assert!(racer.try_wait().unwrap().is_none(), "the racer ended early");
        assert!(waited.elapsed() < std::time::Duration::from_secs(60));
        std::thread::yield_now();
    }
    let (mut built, mut refused) = (0, 0);
    for _ in 0..30 {
        let o = bundle(&env, &out, "022", &[]);
        if o.status.success() {
            built += 1;
        } else {
            let e = stderr(&o);
            assert!(
                (e.contains("belongs to uid") || e.contains("keeps appearing and vanishing"))
                    && e.lines().filter(|l| l.starts_with("kiln: error")).count() == 1,
                "an unclear refusal: {e}"
            );
            refused += 1;
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }
    std::fs::write(shared.join(".stop"), b"").unwrap();
    let _ = racer.wait();
    eprintln!("{built} built, {refused} refused");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o7777, 0o600);
    // Nothing of root's inside the other user's directory.
    let theirs = if prepared.exists() {
        &prepared
    } else {
        &staging
    };
    for e in walk(theirs) {
        let m = std::fs::symlink_metadata(&e).unwrap();
        assert_eq!(
            m.uid(),
            other.uid,
            "root made {} in their directory",
            e.display()
        );
    }
    assert!(built > 0 || refused > 0);
}

/// Every path under `dir`, `dir` included (symlinks not followed).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        for e in std::fs::read_dir(dir).unwrap() {
            out.extend(walk(&e.unwrap().path()));
        }
    }
    out
}

/// A snapshot of a tree: each path with its owner, mode and bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u32, u32, Vec<u8>)> {
    let mut v: Vec<_> = walk(dir)
        .into_iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let bytes = if m.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            (p, m.uid(), m.mode(), bytes)
        })
        .collect();
    v.sort();
    v
}

/// Issue 45.2: root with a user's HOME (`sudo -E`). The user's
/// `~/.cache/kiln` is a symlink to a root-owned directory shaped like a
/// content store: root's build refuses that cache (a warning, then no
/// cache) and touches nothing there; nor does it leave anything of root's
/// in the user's real cache when it is one. (The old code pruned the
/// directory's files and made root-owned `lock`, `lent/` and `layers/`.)
#[test]
fn root_with_a_users_home_touches_nothing_outside_their_cache() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let env = Env::new();
    let user = LocalUser::create("kiln-home");
    std::fs::set_permissions(env.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = user.dir(&env.path("home"));
    let cache_parent = user.dir(&home.join(".cache"));
    // Root's directory, shaped as a content store.
    let store = env.path("root-store");
    std::fs::create_dir_all(store.join("blobs/sha256")).unwrap();
    std::fs::create_dir_all(store.join("tmp")).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(store.join("blobs/sha256").join("ab".repeat(32)), b"blob").unwrap();
    std::fs::write(store.join("tmp/precious"), b"precious").unwrap();
    let link = cache_parent.join("kiln");
    std::os::unix::fs::symlink(&store, &link).unwrap();
    rustix::fs::chownat(
        rustix::fs::CWD,
        &link,
        Some(rustix::fs::Uid::from_raw(user.uid)),
        Some(rustix::fs::Gid::from_raw(user.uid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let before = snapshot(&store);
    let home_before = snapshot(&home);
    let pause = "registry.k8s.io/pause:3.10";
    let m = env.manifest("m.yaml", pause, &[pause]);
    let rootfs = env.path("rootfs");
    let home_s = home.to_str().unwrap();
    let mut args = vec![
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
    ];
    let mirror = env.mirror();
    args.extend(["--mirror", &mirror]);
    // The default cache (no KILN_NO_CACHE): HOME names it.
    let mut cmd = kiln_cmd(&args, &[("HOME", home_s)]);
    cmd.env_remove("KILN_NO_CACHE").env_remove("XDG_CACHE_HOME");
    let o = kiln_testkit::tools::run_bounded(&mut cmd, 180);
    assert_ok(&o);
    // Refused at the user's home, before the link (issue 56.3).
    assert!(stderr(&o).contains("belongs to uid"), "{}", stderr(&o));
    assert_eq!(snapshot(&store), before, "root's directory was changed");
    assert_eq!(snapshot(&home), home_before, "the user's home was changed");
    // The user's real cache, made by the user's own kiln, then root's run
    // with their HOME: refused again, and the user's kiln still uses it.
    std::fs::remove_file(&link).unwrap();
    let rootfs_u = user.dir(&env.path("rootfs-user"));
    let user_args = [
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        rootfs_u.to_str().unwrap(),
        "--mirror",
        &mirror,
    ];
    let mut ucmd = user.command(&kiln_cmd(&user_args, &[("HOME", home_s)]));
    ucmd.env_remove("KILN_NO_CACHE")
        .env_remove("XDG_CACHE_HOME");
    let mut ucmd2 = user.command(&kiln_cmd(&user_args, &[("HOME", home_s)]));
    ucmd2
        .env_remove("KILN_NO_CACHE")
        .env_remove("XDG_CACHE_HOME");
    assert_ok(&kiln_testkit::tools::run_bounded(&mut ucmd, 180));
    let users_cache = snapshot(&home);
    let o = kiln_testkit::tools::run_bounded(&mut cmd, 180);
    assert_ok(&o);
    assert!(stderr(&o).contains("belongs to uid"), "{}", stderr(&o));
    assert_eq!(
        snapshot(&home),
        users_cache,
        "root changed the user's cache"
    );
    for (p, uid, ..) in &users_cache {
        assert_eq!(*uid, user.uid, "{} is not the user's", p.display());
    }
    assert_ok(&kiln_testkit::tools::run_bounded(&mut ucmd2, 180));
}

/// Issue 45.3: an output's mode is `0666` less the umask, and a file it
/// replaces decides it only when that file is kiln's user's own regular
/// file (without setuid bits). (The old code wrote `0644` under `umask
/// 077`, `0666` over another user's `0666` file, and `4755` through a
/// symlink to a setuid file.)
#[test]
fn outputs_follow_the_umask_and_never_another_users_mode() {
    let env = Env::new();
    let out = env.path("b.tar");
    assert_ok(&bundle(&env, &out, "077", &[]));
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&out), 0o600);
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_ok(&bundle(&env, &out, "022", &[]));
    assert_eq!(mode(&out), 0o640, "the user's own file keeps its mode");
    // A setuid program, and a symlink to it where the output goes.
    let setuid = env.path("prog");
    std::fs::write(&setuid, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out2 = env.path("c.tar");
    std::os::unix::fs::symlink(&setuid, &out2).unwrap();
    assert_ok(&bundle(&env, &out2, "022", &[]));
    assert_eq!(mode(&out2), 0o644);
    assert_eq!(mode(&setuid), 0o4755);
    assert_eq!(std::fs::read(&setuid).unwrap(), b"#!/bin/sh\n");
    if is_root() {
        // Another user's 0666 file in a shared directory.
        let other = LocalUser::create("kiln-mode");
        let shared = shared_dir(&env);
        let out3 = shared.join("d.tar");
        std::fs::write(&out3, b"").unwrap();
        std::os::unix::fs::chown(&out3, Some(other.uid), Some(other.uid)).unwrap();
        std::fs::set_permissions(&out3, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_ok(&bundle(&env, &out3, "022", &[]));
        let m = std::fs::metadata(&out3).unwrap();
        assert_eq!((m.mode() & 0o7777, m.uid()), (0o644, 0));
    }
}

/// Issue 45.7: `kiln doctor` opens nothing for writing: as root with a
/// user's HOME, their cache is judged, not made or locked; and `make
/// install` builds nothing (under sudo it would leave a root-owned
/// target/): without a built binary it fails in one line.
#[test]
fn doctor_and_make_install_change_nothing() {
    let env = Env::new();
    let home = env.path("home");
    std::fs::create_dir_all(home.join(".cache/kiln")).unwrap();
    std::fs::set_permissions(
        home.join(".cache/kiln"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let before = snapshot(&home);
    let mut cmd = kiln_cmd(&["doctor", "--json"], &[("HOME", home.to_str().unwrap())]);
    cmd.env_remove("XDG_CACHE_HOME");
    let o = kiln_testkit::tools::run_bounded(&mut cmd, 60);
    assert!(stdout(&o).contains("\"cache\""), "{}", stdout(&o));
    assert_eq!(snapshot(&home), before, "doctor changed the cache");
    // make install from a tree with no target/release/kiln.
    let tree = env.path("tree");
    std::fs::create_dir(&tree).unwrap();
    let makefile = Path::new(env!("CARGO_MANIFEST_DIR")).join("Makefile");
    let o = kiln_testkit::tools::run_bounded(
        Command::new("make")
            .arg("-C")
            .arg(&tree)
            .arg("-f")
            .arg(&makefile)
            .arg("install")
            .arg(format!("DESTDIR={}", env.path("dest").display()))
            .env("CARGO", "false"),
        60,
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("target/release/kiln is missing: run make build first"),
        "{}",
        stderr(&o)
    );
    assert!(!tree.join("target").exists() && !env.path("dest").exists());
}

/// `kiln build` of pause alone into `rootfs`, with `envs`, not yet run.
fn build_pause(env: &Env, rootfs: &Path, envs: &[(&str, &str)]) -> Command {
    let pause = "registry.k8s.io/pause:3.10";
    let m = env.manifest("pause-build.yaml", pause, &[pause]);
    let mirror = env.mirror();
    kiln_cmd(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--mirror",
            &mirror,
        ],
        envs,
    )
}

/// A directory root owns, `0755`.
fn roots_dir(env: &Env, name: &str) -> PathBuf {
    let d = env.path(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// `link` -> `target`, owned by `uid`.
fn link_of(uid: u32, target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
    rustix::fs::chownat(
        rustix::fs::CWD,
        link,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(uid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

/// Issue 56.1: root's `TMPDIR` names a link another user made in a
/// shared directory (`/tmp/ci -> /var/tmp`). The landed main resolved the
/// link, checked where it led, and used the name again, so the user could
/// repoint it once the work directory existed; now a link another user
/// can repoint is refused before anything is made, and root's own link is
/// walked to the directory it names, which holds the work directory
/// while kiln runs and nothing after.
#[test]
fn a_tmpdir_another_user_can_repoint_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let env = Env::new();
    std::fs::set_permissions(env.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let user = LocalUser::create("kiln-tmpdir");
    let shared = shared_dir(&env);
    let target = roots_dir(&env, "tmp-target");
    let rootfs = env.path("rootfs");
    assert_ok(&kiln_testkit::tools::run_bounded(
        &mut build_pause(&env, &rootfs, &[]),
        180,
    ));
    let verify = |tmpdir: &Path| {
        kiln_env(
            &["verify", "--rootfs", rootfs.to_str().unwrap()],
            &[("TMPDIR", tmpdir.to_str().unwrap())],
        )
    };
    let theirs = shared.join("ci");
    link_of(user.uid, &target, &theirs);
    let o = verify(&theirs);
    assert_fails(
        &o,
        1,
        &[
            &format!(
                "{} is a symlink that belongs to uid {}",
                theirs.display(),
                user.uid
            ),
            "set TMPDIR to a directory only you (or root) can write",
        ],
    );
    assert!(is_empty(&target), "kiln made something where the link led");
    let own = shared.join("root-ci");
    std::os::unix::fs::symlink(&target, &own).unwrap();
    assert_ok(&verify(&own));
    assert!(is_empty(&target), "the work directory was left behind");
}

/// Issue 56.3: under `sudo -E`, the user's `~/.cache` (or
/// `XDG_CACHE_HOME`) is their link to a directory of root's. The landed
/// main opened the cache's parent by name, following the link, and made
/// and filled root's cache there; now every directory above the cache is
/// walked as the work directory's are: the build goes on without the
/// cache, says why, and nothing is made where the links lead.
#[test]
fn root_never_follows_a_users_link_above_its_cache() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let env = Env::new();
    std::fs::set_permissions(env.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let user = LocalUser::create("kiln-cachelink");
    let anywhere = roots_dir(&env, "anywhere");
    let home = user.dir(&env.path("home"));
    link_of(user.uid, &anywhere, &home.join(".cache"));
    let shared = shared_dir(&env);
    let xdg = shared.join("cache");
    link_of(user.uid, &anywhere, &xdg);
    for (n, (var, value, said)) in [
        ("HOME", &home, "belongs to uid"),
        ("XDG_CACHE_HOME", &xdg, "is a symlink that belongs to uid"),
    ]
    .into_iter()
    .enumerate()
    {
        let rootfs = env.path(&format!("rootfs-{n}"));
        let mut cmd = build_pause(&env, &rootfs, &[(var, value.to_str().unwrap())]);
        cmd.env_remove("KILN_NO_CACHE");
        if var == "HOME" {
            cmd.env_remove("XDG_CACHE_HOME");
        }
        let o = kiln_testkit::tools::run_bounded(&mut cmd, 180);
        assert_ok(&o);
        assert!(
            is_empty(&anywhere),
            "{var}: root's cache was made where the link led"
        );
        assert!(stderr(&o).contains(said), "{var}: {}", stderr(&o));
    }
}

/// Issue 56.5: `kiln build --rootfs DIR` makes DIR (and its missing
/// parents) under the caller's umask, as its other outputs: `0700` under
/// `umask 077` (the landed main made them `0755` whatever the umask).
/// Issue 60.5: but never writable by others: under `umask 000` root ran
/// containerd on a 0777 rootfs.
#[test]
fn a_new_rootfs_follows_the_umask() {
    let env = Env::new();
    for (umask, want) in [
        ("077", 0o700),
        ("022", 0o755),
        ("002", 0o775),
        ("000", 0o775),
    ] {
        let top = env.path(&format!("out-{umask}"));
        let rootfs = top.join("deep/rootfs");
        let cmd = build_pause(&env, &rootfs, &[]);
        assert_ok(&kiln_testkit::tools::run_bounded(
            &mut with_umask(&cmd, umask),
            180,
        ));
        for d in [&top, &top.join("deep"), &rootfs] {
            let mode = std::fs::metadata(d).unwrap().mode() & 0o7777;
            assert_eq!(mode, want, "umask {umask}: {} is {mode:o}", d.display());
        }
    }
}
