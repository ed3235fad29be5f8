//! Transfer progress on a terminal; nothing at all when stderr is not one.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A byte counter on stderr when it is a terminal and `enabled`.
    pub fn new(enabled: bool, images: usize) -> Self {
        if !enabled || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}",
            )
            .expect("static template"),
        );
        bar.set_message(format!("0/{images} images"));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Progress { bar: Some(bar) }
    }

    pub fn hidden() -> Self {
        Progress { bar: None }
    }

    pub fn add_total(&self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.inc_length(bytes);
        }
    }

    pub fn advance(&self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.inc(bytes);
        }
    }

    pub fn set_message(&self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
