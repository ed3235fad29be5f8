//! Transfer progress. On a terminal: an overall byte bar and one bar per
//! image in flight. Otherwise quiet and line-oriented: one line per finished
//! image, which is what CI logs want.

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
        }
    }

    pub fn hidden() -> Self {
        Progress {
            multi: None,
            overall: None,
            image: None,
            lines: false,
            shown: std::sync::Arc::new(std::sync::Once::new()),
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
    }

    pub fn advance(&self, bytes: u64) {
        for b in self.overall.iter().chain(&self.image) {
            b.inc(bytes);
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
    }

    pub fn finish(&self) {
        if let Some(b) = &self.overall {
            b.finish_and_clear();
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
