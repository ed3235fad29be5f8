//! Transfer progress. On a terminal: an overall byte bar and one bar per
//! image in flight. Otherwise line-oriented, which is what CI logs want: one
//! line per finished image, and while bytes move a line every few seconds
//! (`KILN_PROGRESS_SECS`, default 5) with the bytes and images so far, so a
//! slow run is never silent.

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
}

/// Requests asked again and downloads resumed in this run (the registry
/// client counts them; the periodic line says how many).
static RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One more request asked again, or download resumed.
pub fn retried() {
    RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            let every = std::env::var("KILN_PROGRESS_SECS")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|s| *s > 0.0)
                .unwrap_or(5.0);
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
        if !std::io::stderr().is_terminal() {
            return Progress {
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
        Progress {
            multi: Some(multi),
            overall: Some(overall),
            image: None,
            lines: false,
            shown: std::sync::Arc::new(std::sync::Once::new()),
            ticker: None,
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
