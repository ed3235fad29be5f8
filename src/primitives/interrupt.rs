//! SIGINT and SIGTERM, noticed everywhere: a dedicated thread waits for
//! them (they are blocked in every other thread), records which arrived and
//! wakes async waiters; synchronous loops (unpacking, gunzip, packing) call
//! [`check`] as they go. Either way the command unwinds normally, so temp
//! files and the private containerd are cleaned up, and exits 128 + signal
//! (130 for Ctrl-C, 143 for SIGTERM). A reader of kiln's output that went
//! away ([`reader_gone`]) stops it the same way, exiting 141 as a command
//! ended by SIGPIPE does.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use tokio::sync::Notify;

static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// How long a signalled kiln may take to unwind before it exits anyway.
const UNWIND_GRACE: std::time::Duration = std::time::Duration::from_secs(4);
static NOTIFY: Notify = Notify::const_new();

/// The user stopped kiln with `signal`: exit code 128 + signal.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {}", match Signal::try_from(*.0) {
    Ok(Signal::SIGINT) => "Ctrl-C (SIGINT)",
    Ok(Signal::SIGPIPE) => "the reader of its output going away (SIGPIPE)",
    _ => "SIGTERM",
})]
pub struct Interrupted(pub i32);

/// The reader of stdout or stderr went away (`kiln ... | head`): kiln
/// stops as if interrupted, unwinding (its containerd stopped, temp files
/// removed), and exits 141. Latched: only the first cause counts.
pub fn reader_gone() {
    let pipe = Signal::SIGPIPE as i32;
    if SIGNAL
        .compare_exchange(0, pipe, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        NOTIFY.notify_waiters();
    }
}

/// Whether [`reader_gone`] stopped this run.
pub fn is_reader_gone() -> bool {
    SIGNAL.load(Ordering::SeqCst) == Signal::SIGPIPE as i32
}

impl Interrupted {
    pub fn exit_code(&self) -> u8 {
        (128 + self.0).clamp(0, 255) as u8
    }
}

/// Blocks SIGINT/SIGTERM in this thread (and so in every thread it starts
/// afterwards) and starts the thread that waits for them. Call first.
pub fn install() {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    if nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None).is_err() {
        return;
    }
    std::thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            // A second signal while unwinding: stop at once.
            if SIGNAL.swap(sig as i32, Ordering::SeqCst) != 0 {
                std::process::exit(128 + sig as i32);
            }
            NOTIFY.notify_waiters();
            // Unwinding may wait on a worker blocked where no check runs
            // (a read from a stalled `docker save`, a FIFO): whatever it
            // is blocked on, kiln ends within UNWIND_GRACE. What it leaves
            // (a private containerd, temp files) the next run sweeps
            // (docs/crash-safety.md).
            std::thread::spawn(move || {
                std::thread::sleep(UNWIND_GRACE);
                eprintln!(
                    "kiln: {}: still unwinding after {} s; exiting now",
                    Interrupted(sig as i32),
                    UNWIND_GRACE.as_secs()
                );
                std::process::exit(128 + sig as i32);
            });
        }
    });
}

/// `Err` once a signal has arrived: for synchronous loops.
pub fn check() -> Result<(), Interrupted> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => Ok(()),
        s => Err(Interrupted(s)),
    }
}

/// Resolves when a signal has arrived.
pub async fn signalled() -> Interrupted {
    loop {
        let notified = NOTIFY.notified();
        if let Err(i) = check() {
            return i;
        }
        notified.await;
    }
}
