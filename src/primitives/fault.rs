//! Named fault points for kiln's own tests. `KILN_FAULT=POINT:VICTIM` makes
//! the first arrival at `POINT` SIGKILL `kiln` itself or its private
//! `containerd`, or send kiln SIGTERM/SIGINT (`sigterm`, `sigint`), so a
//! test acts at an exact step instead of after a guessed delay. Unset
//! (always, outside the tests), every point is a no-op.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;

/// The steps a build can be cut at, in the order a build reaches them.
pub const POINTS: &[&str] = &[
    // Some bytes of a blob sent, not committed.
    "mid-blob",
    // A blob renamed into the store's directory; its record not yet written.
    "blob-renamed",
    // A layer committed; its manifest (which labels it) not yet written.
    "blob-committed",
    // An image's documents, labels included, written; its records not yet.
    "before-records",
    // Every record written; the lease not yet dropped.
    "before-gc",
    // The final GC asked for; its answer not yet read.
    "during-gc",
    // The final GC done; the completeness walk not yet run.
    "after-gc",
];

/// Steps of removing stale pins (reached only when there are some): one
/// stale pin removed, the others not yet.
pub const UNPIN_POINTS: &[&str] = &["mid-unpin"];

/// Steps of synchronous work where a test sends kiln a signal
/// (`KILN_FAULT=POINT:sigterm|sigint`), to check it exits 143/130 there too.
pub const SIGNAL_POINTS: &[&str] = &["gunzip", "unpack"];

/// The pid of kiln's private containerd, for the `containerd` victim.
static DAEMON_PID: AtomicI32 = AtomicI32::new(0);
static FIRED: AtomicBool = AtomicBool::new(false);

fn plan() -> Option<&'static (String, String)> {
    static PLAN: OnceLock<Option<(String, String)>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let v = std::env::var("KILN_FAULT").ok()?;
        let (point, victim) = v.split_once(':')?;
        Some((point.to_string(), victim.to_string()))
    })
    .as_ref()
}

/// Remembers which process is the private daemon (0: none).
pub fn set_daemon(pid: i32) {
    DAEMON_PID.store(pid, Ordering::SeqCst);
}

/// Fires the configured fault if kiln has reached `point`; at most once.
pub fn point(point: &str) {
    let Some((want, victim)) = plan() else { return };
    debug_assert!(
        POINTS.contains(&point) || SIGNAL_POINTS.contains(&point) || UNPIN_POINTS.contains(&point),
        "unknown fault point {point}"
    );
    if want != point || FIRED.swap(true, Ordering::SeqCst) {
        return;
    }
    if let Some(sig) = match victim.as_str() {
        "sigterm" => Some(nix::sys::signal::Signal::SIGTERM),
        "sigint" => Some(nix::sys::signal::Signal::SIGINT),
        _ => None,
    } {
        tracing::warn!(point, victim, "KILN_FAULT: signalling");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), sig);
        // Until the signal thread has recorded it, so the next check sees it.
        while crate::primitives::interrupt::check().is_ok() {
            std::thread::yield_now();
        }
        return;
    }
    let pid = match victim.as_str() {
        "kiln" => std::process::id() as i32,
        "containerd" => DAEMON_PID.load(Ordering::SeqCst),
        _ => 0,
    };
    if pid > 0 {
        tracing::warn!(point, victim, "KILN_FAULT: killing");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        if victim == "containerd" {
            // Wait until it is dead (a zombie: kiln reaps it later), so the
            // next call fails for certain instead of racing its death.
            while !dead(pid) {
                std::thread::yield_now();
            }
        }
    }
}

fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}
