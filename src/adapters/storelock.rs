//! One kiln per store: an exclusive `flock` on the store's directory, taken
//! before kiln's private containerd starts and held until the store closes
//! (the kernel drops it on every exit, a crash included, so it is never
//! stale). No file is created: the store's bytes, and a node image's layer,
//! stay as they are. A second kiln waits, saying who holds it, or fails at
//! once with `--no-wait`. A store whose `meta.db` another process holds (a
//! running containerd: bbolt locks it the same way) is refused naming that
//! process, instead of a daemon that times out.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{anyhow, bail};
use rustix::fs::{flock, FlockOperation, Mode, OFlags};

/// Held for as long as kiln writes the store.
pub struct StoreLock {
    _fd: OwnedFd,
}

/// Who holds a `flock` on the file with this device and inode, from
/// `/proc/locks` (`N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...`).
fn holder(path: &Path) -> Option<u32> {
    let m = std::fs::metadata(path).ok()?;
    let (dev, ino) = (m.dev(), m.ino());
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    std::fs::read_to_string("/proc/locks")
        .ok()?
        .lines()
        .filter(|l| l.contains("FLOCK"))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let at = f.iter().position(|x| *x == "FLOCK")?;
            let (pid, id) = (f.get(at + 3)?, f.get(at + 4)?);
            (*id == want).then(|| pid.parse().ok()).flatten()
        })
}

fn who(pid: Option<u32>) -> String {
    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
}

impl StoreLock {
    /// Locks `store_dir` (`ROOTFS/var/lib/containerd`) for `rootfs`.
    pub fn take(store_dir: &Path, rootfs: &Path, no_wait: bool) -> anyhow::Result<StoreLock> {
        let fd = rustix::fs::open(
            store_dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| anyhow!("opening {}: {e}", store_dir.display()))?;
        let mut said = false;
        loop {
            match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    let pid = holder(store_dir);
                    if no_wait {
                        bail!(
                            "another kiln{} is writing {}'s store; wait for it, or drop --no-wait to wait",
                            who(pid),
                            rootfs.display()
                        );
                    }
                    if !said {
                        say!(
                            "kiln: waiting for another kiln{} holding {}",
                            who(pid),
                            rootfs.display()
                        );
                        said = true;
                    }
                    crate::primitives::interrupt::check()?;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => bail!("locking {}: {e}", store_dir.display()),
            }
        }
        // bbolt's own lock: a containerd running on this store.
        let db = store_dir.join(crate::adapters::rootfs::META_DB);
        if let Ok(f) = std::fs::File::open(&db) {
            meta_db_free(&f, &db, rootfs)?;
        }
        Ok(StoreLock { _fd: fd })
    }
}

/// How long a dead kiln's daemon is given to stop before it is killed: as
/// long as kiln gives its own ([`crate::adapters::daemon::Daemon::stop`]).
const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// Checks that no process holds bbolt's lock on `meta.db`. The private
/// daemon of a kiln that was killed is still stopping for a moment after
/// (it got SIGTERM as its kiln died): that one is waited for, and killed
/// after [`ORPHAN_GRACE`] (bbolt survives a kill), so rerunning a killed
/// build just works. Any other holder is a containerd someone runs on the
/// store: refused at once, named.
fn meta_db_free(f: &std::fs::File, db: &Path, rootfs: &Path) -> anyhow::Result<()> {
    let mut waiting: Option<(u32, std::time::Instant)> = None;
    let mut killed = false;
    loop {
        match flock(f, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                let _ = flock(f, FlockOperation::Unlock);
                return Ok(());
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => bail!("checking {}: {e}", db.display()),
        }
        let pid = holder(db);
        match (pid, waiting) {
            (Some(p), Some((q, since))) if p == q => {
                let waited = since.elapsed();
                if waited > 2 * ORPHAN_GRACE {
                    bail!(
                        "the daemon (pid {p}) of a killed kiln still holds {} after SIGKILL; stop it first",
                        db.display()
                    );
                }
                if waited > ORPHAN_GRACE && !killed {
                    tracing::warn!("the daemon (pid {p}) of a killed kiln did not stop; killing it");
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    killed = true;
                }
            }
            (Some(p), _) if crate::adapters::daemon::orphaned_daemon(p) => {
                say!(
                    "kiln: waiting for the daemon (pid {p}) of a killed kiln to stop using {}",
                    rootfs.display()
                );
                waiting = Some((p, std::time::Instant::now()));
                killed = false;
            }
            // Between two reads of /proc/locks the holder may have let go.
            (None, _) if waiting.is_some() => {}
            _ => bail!(
                "{} is held by another process{} (a containerd running on {}'s store?): stop it first",
                db.display(),
                who(pid),
                rootfs.display()
            ),
        }
        crate::primitives::interrupt::check()?;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
