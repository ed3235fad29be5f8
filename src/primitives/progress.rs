//! Transfer progress. On a terminal: an overall byte bar and one bar per
//! image in flight. Otherwise line-oriented, which is what CI logs want: one
//! line per finished image, and while bytes move a line every few seconds
//! (`KILN_PROGRESS_SECS`, default 5) with the bytes and images so far, so a
//! slow run is never silent.
//!
//! Nor is a run whose bytes stopped: every request to a registry is
//! registered while it is in flight ([`waiting`]), and one that has brought
//! less than a KiB for the progress interval (at most 10 s) is said, with
//! what it waits on, the bytes so far and the tries left, again at each
//! interval until bytes come or it ends: a line off a terminal, a line
//! above the bars (and the bar's message) on one.

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone)]
pub struct Progress {
    multi: Option<MultiProgress>,
    overall: Option<ProgressBar>,
    image: Option<ProgressBar>,
    /// Print a line per finished image (not a terminal, not --json).
    lines: bool,
    /// Bars appear with the first bytes, after set-up warnings are printed.
    shown: std::sync::Arc<std::sync::Once>,
    /// Off a terminal: the counts the periodic line reports.
    ticker: Option<std::sync::Arc<Ticker>>,
    /// Stops the thread that says what waits ([`waiting`]) when dropped.
    watcher: Option<std::sync::Arc<std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>>>,
}

/// Requests asked again and downloads resumed in this run (the registry
/// client counts them; the periodic line says how many).
static RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One more request asked again, or download resumed.
pub fn retried() {
    RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The progress interval: `KILN_PROGRESS_SECS`, default 5 s.
fn interval() -> std::time::Duration {
    let secs = std::env::var("KILN_PROGRESS_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(5.0);
    std::time::Duration::from_secs_f64(secs)
}

/// A request in flight, as [`waiting`] registered it.
struct WaitState {
    what: String,
    started: std::time::Instant,
    /// Since when it has brought less than [`LIVE_BYTES`].
    quiet_since: std::time::Instant,
    quiet_bytes: u64,
    total: u64,
    said: Option<std::time::Instant>,
}

/// The least a live transfer brings per interval: less is waiting here,
/// and stalled for the registry client's stall guard.
pub const LIVE_BYTES: u64 = 1024;

static WAITS: std::sync::Mutex<std::collections::BTreeMap<u64, WaitState>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
static NEXT_WAIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A registered request; gone from the list when dropped.
pub struct Waiting(u64);

/// Registers a request in flight; `what` says what it waits on (the URL,
/// and the tries left).
pub fn waiting(what: impl Into<String>) -> Waiting {
    let id = NEXT_WAIT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::Instant::now();
    WAITS.lock().unwrap().insert(
        id,
        WaitState {
            what: crate::primitives::text::redact_urls(&what.into()),
            started: now,
            quiet_since: now,
            quiet_bytes: 0,
            total: 0,
            said: None,
        },
    );
    Waiting(id)
}

impl Waiting {
    /// `n` more bytes came.
    pub fn got(&self, n: u64) {
        if let Some(s) = WAITS.lock().unwrap().get_mut(&self.0) {
            s.total += n;
            s.quiet_bytes += n;
            if s.quiet_bytes >= LIVE_BYTES {
                s.quiet_since = std::time::Instant::now();
                s.quiet_bytes = 0;
                s.said = None;
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITS.lock().unwrap().remove(&self.0);
    }
}

/// The lines due at `now`: requests quiet for `after`, each said at most
/// once per `every`.
fn waiting_lines(
    now: std::time::Instant,
    after: std::time::Duration,
    every: std::time::Duration,
) -> Vec<String> {
    let mut lines = Vec::new();
    for s in WAITS.lock().unwrap().values_mut() {
        let quiet = now.saturating_duration_since(s.quiet_since);
        let due = s
            .said
            .is_none_or(|t| now.saturating_duration_since(t) >= every);
        if quiet >= after && due {
            s.said = Some(now);
            lines.push(format!(
                "kiln: waiting {}s on {}: {} so far in {}s",
                quiet.as_secs(),
                s.what,
                crate::primitives::text::human_bytes(s.total),
                now.saturating_duration_since(s.started).as_secs()
            ));
        }
    }
    lines
}

/// Says what is waiting, until the sender is dropped: lines (`bar` none),
/// or above the bars and in the overall bar's message.
fn watch_waits(stop: std::sync::mpsc::Receiver<()>, bar: Option<(MultiProgress, ProgressBar)>) {
    let every = interval();
    let after = every.min(std::time::Duration::from_secs(10));
    let tick = every.min(std::time::Duration::from_secs(1));
    std::thread::spawn(move || {
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(tick) {
            for line in waiting_lines(std::time::Instant::now(), after, every) {
                match &bar {
                    None => say!("{line}"),
                    Some((multi, overall)) => {
                        let _ = multi.println(&line);
                        overall.set_message(line.trim_start_matches("kiln: ").to_string());
                    }
                }
            }
        }
    });
}

/// Counts for the periodic progress line, and the thread that prints it
/// (started with the first bytes; ends when the sender is dropped).
struct Ticker {
    done: std::sync::atomic::AtomicU64,
    total: std::sync::atomic::AtomicU64,
    images_done: std::sync::atomic::AtomicUsize,
    images: usize,
    stop: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    started: std::sync::Once,
}

impl Ticker {
    fn start(self: &std::sync::Arc<Self>) {
        self.started.call_once(|| {
            let every = interval().as_secs_f64();
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            *self.stop.lock().unwrap() = Some(tx);
            let t = self.clone();
            let started = std::time::Instant::now();
            std::thread::spawn(move || {
                use std::sync::atomic::Ordering::Relaxed;
                // A tick is a timeout; finishing drops the sender and wakes it.
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(std::time::Duration::from_secs_f64(every))
                {
                    let done = t.done.load(Relaxed);
                    let secs = started.elapsed().as_secs_f64();
                    let retries = match RETRIES.load(Relaxed) {
                        0 => String::new(),
                        n => format!(", {n} retries so far"),
                    };
                    say!(
                        "kiln: progress {} of {} ({}/s), {}/{} images done{retries}",
                        crate::primitives::text::human_bytes(done),
                        crate::primitives::text::human_bytes(t.total.load(Relaxed)),
                        crate::primitives::text::human_bytes(
                            (done as f64 / secs.max(0.001)) as u64
                        ),
                        t.images_done.load(Relaxed),
                        t.images
                    );
                }
            });
        });
    }
}

impl Progress {
    /// Bars on stderr when it is a terminal and `enabled`; lines otherwise
    /// (when `enabled`); nothing when not `enabled` (e.g. --json).
    pub fn new(enabled: bool, images: usize) -> Self {
        if !enabled {
            return Progress::hidden();
        }
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let watcher = Some(std::sync::Arc::new(std::sync::Mutex::new(Some(stop))));
        if !std::io::stderr().is_terminal() {
            watch_waits(rx, None);
            return Progress {
                watcher,
                lines: true,
                ticker: Some(std::sync::Arc::new(Ticker {
                    done: Default::default(),
                    total: Default::default(),
                    images_done: Default::default(),
                    images,
                    stop: Default::default(),
                    started: std::sync::Once::new(),
                })),
                ..Progress::hidden()
            };
        }
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::hidden());
        let overall = multi.add(ProgressBar::new(0));
        overall.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}",
            )
            .expect("static template"),
        );
        overall.set_message(format!("0/{images} images"));
        watch_waits(rx, Some((multi.clone(), overall.clone())));
        Progress {
            multi: Some(multi),
            overall: Some(overall),
            image: None,
            lines: false,
            shown: std::sync::Arc::new(std::sync::Once::new()),
            ticker: None,
            watcher,
        }
    }

    pub fn hidden() -> Self {
        Progress {
            multi: None,
            overall: None,
            image: None,
            lines: false,
            shown: std::sync::Arc::new(std::sync::Once::new()),
            ticker: None,
            watcher: None,
        }
    }

    /// A handle that moves both this image's bar and the overall one.
    pub fn for_image(&self, name: &str) -> Progress {
        let image = self.multi.as_ref().map(|m| {
            let b = m.add(ProgressBar::new(0));
            b.set_style(
                ProgressStyle::with_template("  {bytes:>10}/{total_bytes:<10} {wide_msg}")
                    .expect("static template"),
            );
            b.set_message(name.to_string());
            b
        });
        Progress {
            image,
            ..self.clone()
        }
    }

    pub fn add_total(&self, bytes: u64) {
        if let (Some(m), Some(o)) = (&self.multi, &self.overall) {
            self.shown.call_once(|| {
                m.set_draw_target(ProgressDrawTarget::stderr());
                o.enable_steady_tick(std::time::Duration::from_millis(120));
            });
        }
        for b in self.overall.iter().chain(&self.image) {
            b.inc_length(bytes);
        }
        if let Some(t) = &self.ticker {
            t.total
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
            t.start();
        }
    }

    pub fn advance(&self, bytes: u64) {
        for b in self.overall.iter().chain(&self.image) {
            b.inc(bytes);
        }
        if let Some(t) = &self.ticker {
            t.done
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn set_message(&self, msg: String) {
        if let Some(b) = &self.overall {
            b.set_message(msg);
        }
    }

    /// Done with this image: its bar goes; off a terminal, a line says so.
    pub fn image_done(&self, line: &str) {
        if let Some(b) = &self.image {
            b.finish_and_clear();
        }
        if self.lines {
            say!("kiln: {line}");
        }
        if let Some(t) = &self.ticker {
            t.images_done
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.overall {
            b.finish_and_clear();
        }
        if let Some(t) = &self.ticker {
            t.stop.lock().unwrap().take();
        }
        if let Some(w) = &self.watcher {
            w.lock().unwrap().take();
        }
    }
}

/// This process's peak resident memory (VmHWM), in KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 45.4: a stalled request's line names the URL after redirects
    /// without its query: a pre-signed URL's signature is never printed.
    #[test]
    fn a_waiting_line_shows_no_signature() {
        let w = waiting(
            "the body of https://bucket.example/blob?X-Amz-Signature=s3cr3t&X-Amz-Security-Token=t0k3n (blob; 2 more tries)",
        );
        let later = std::time::Instant::now() + std::time::Duration::from_secs(3600);
        let lines = waiting_lines(later, std::time::Duration::ZERO, std::time::Duration::ZERO);
        let line = lines
            .iter()
            .find(|l| l.contains("bucket.example"))
            .expect("the request is said");
        assert!(
            !line.contains("s3cr3t") && !line.contains("t0k3n"),
            "{line}"
        );
        assert!(
            line.contains("https://bucket.example/blob?<redacted>"),
            "{line}"
        );
        drop(w);
    }
}
