//! With `KILN_BASELINE=/path/to/kiln` (e.g. the previous main, built
//! release), the rows a change to kiln's node path and cache is judged by,
//! run by that kiln right after this one's in each run, against the same
//! registry, disk and page cache: (e), (f), (g), and (a) into a fresh
//! rootfs with the cache warm, the first rootfs kept and deleted.

use std::path::Path;

use crate::median;

/// One run's arguments, each naming the cache directory it uses.
pub struct Args<'a> {
    /// (e), then (f): the node image, from a cold then a warm cache.
    pub node: Vec<String>,
    /// (g): the next version, the cache warm from (e).
    pub next: Vec<String>,
    /// (a): the set into `rootfs`.
    pub rootfs_build: Vec<String>,
    pub archive: &'a Path,
    pub rootfs: &'a Path,
    /// The caches the arguments name: emptied before and after.
    pub caches: Vec<&'a Path>,
    pub path: &'a str,
}

/// Seconds per run, row by row.
#[derive(Default)]
pub struct Times {
    pub e: Vec<f64>,
    pub f: Vec<f64>,
    pub g: Vec<f64>,
    pub warm_kept: Vec<f64>,
    pub warm: Vec<f64>,
}

impl Times {
    /// Runs the rows once with `bin`, in the order this kiln ran them.
    pub fn run(&mut self, bin: &Path, a: &Args) -> anyhow::Result<()> {
        let timed = |args: &[String]| crate::timed(bin, args, a.path).0;
        let clean = || {
            for c in &a.caches {
                let _ = std::fs::remove_dir_all(c);
            }
            let _ = std::fs::remove_file(a.archive);
            let _ = std::fs::remove_dir_all(a.rootfs);
        };
        clean();
        self.e.push(timed(&a.node));
        self.f.push(timed(&a.node));
        std::fs::remove_file(a.archive)?;
        self.g.push(timed(&a.next));
        timed(&a.rootfs_build);
        let kept = a.rootfs.with_extension("kept");
        std::fs::rename(a.rootfs, &kept)?;
        self.warm_kept.push(timed(&a.rootfs_build));
        std::fs::remove_dir_all(a.rootfs)?;
        std::fs::remove_dir_all(&kept)?;
        self.warm.push(timed(&a.rootfs_build));
        clean();
        Ok(())
    }

    /// The side-by-side table: `ours` are this kiln's medians of the same
    /// rows, in the order of [`Times`]' fields.
    pub fn table(self, ours: [f64; 5]) -> String {
        let theirs = [self.e, self.f, self.g, self.warm_kept, self.warm].map(median);
        let names = [
            "(e) node image, gzip, the cache cold",
            "(f) the same node image again, the cache warm",
            "(g) the next version, the cache warm",
            "(a) into a fresh rootfs, the cache warm, the first rootfs kept",
            "(a) into a fresh rootfs, the cache warm, the first rootfs deleted",
        ];
        let mut out = format!(
            "\nBeside the baseline kiln (KILN_BASELINE={}), each of its runs right after this kiln's:\n\n| row | this kiln | baseline | this / baseline |\n|---|---|---|---|\n",
            std::env::var("KILN_BASELINE").unwrap_or_default()
        );
        for ((name, o), t) in names.iter().zip(ours).zip(theirs) {
            out.push_str(&format!(
                "| {name} | {o:.2} s | {t:.2} s | {:.2} |\n",
                o / t
            ));
        }
        out
    }
}
