//! Processes around the daemon: whether a pid still lives, the state a
//! killed kiln left in /tmp, and the user-mode emulator a foreign node's
//! containerd runs under.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::DIR_PREFIX;

/// `qemu-ARCH -L SYSROOT BINARY ...`: QEMU's user-mode emulator, run
/// directly (no binfmt registration, nothing system-wide), finding the
/// binary's dynamic loader and libraries under the node's own root.
#[derive(Debug, Clone)]
pub struct Emulator {
    pub qemu: PathBuf,
    pub sysroot: PathBuf,
}

/// The user-mode emulator for `platform`: `given` (`--qemu`), else
/// `qemu-ARCH` or `qemu-ARCH-static` on PATH; else why not and what to do.
pub fn find_qemu(
    platform: &crate::primitives::platform::Platform,
    given: Option<&Path>,
) -> Result<PathBuf, String> {
    if let Some(q) = given {
        return if q.is_file() {
            Ok(q.to_path_buf())
        } else {
            Err(format!("--qemu {}: no such file", q.display()))
        };
    }
    let Some(name) = platform.qemu_name() else {
        return Err(format!("QEMU has no user-mode emulator for {platform}"));
    };
    [format!("qemu-{name}"), format!("qemu-{name}-static")]
        .iter()
        .find_map(|n| crate::adapters::rootfs::which(n))
        .ok_or_else(|| {
            format!(
                "no qemu-{name} on PATH for user-mode emulation (Debian: apt-get install qemu-user); pass --qemu PATH"
            )
        })
}

fn pid_alive(pid: i32) -> bool {
    // EPERM means it exists but is someone else's: alive.
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removes the state directories of private daemons whose kiln died (kill -9
/// leaves them behind; the daemon itself died with kiln).
pub(super) fn sweep_stale_dirs() {
    let Ok(rd) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in rd.flatten() {
        if !e.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let pid = std::fs::read_to_string(e.path().join("kiln.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        // Only a directory of the user kiln runs as: another user's, in a
        // shared /tmp, is theirs to keep.
        let mine = std::fs::symlink_metadata(e.path())
            .is_ok_and(|m| m.is_dir() && crate::primitives::owned::is_mine(&m));
        if mine && pid.is_some_and(|p| !pid_alive(p)) {
            tracing::debug!(dir = %e.path().display(), "removing a dead kiln's daemon directory");
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether process `pid` (on this host) is gone.
pub fn process_gone(pid: i32) -> bool {
    !pid_alive(pid)
}

/// Whether `pid` is the private daemon of a kiln that died: its `--config`
/// lies in one of kiln's state directories (`/tmp/kiln-ctd-*`) and the kiln
/// that wrote that directory's `kiln.pid` is gone (or the directory was
/// swept, which happens only once its kiln is gone). Such a daemon was sent
/// SIGTERM when its kiln died (`PR_SET_PDEATHSIG`) and is stopping; until it
/// has, it still holds the store's `meta.db`.
pub fn orphaned_daemon(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let Some(config) = args
        .iter()
        .position(|a| *a == b"--config")
        .and_then(|at| args.get(at + 1))
    else {
        return false;
    };
    let Some(dir) = Path::new(std::ffi::OsStr::from_bytes(config)).parent() else {
        return false;
    };
    let ours = dir.parent() == Some(Path::new("/tmp"))
        && dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(DIR_PREFIX));
    ours && std::fs::read_to_string(dir.join("kiln.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .is_none_or(|k| !pid_alive(k))
}
