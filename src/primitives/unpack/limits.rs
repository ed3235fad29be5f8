//! Limits on what one image may put under the paths kiln unpacks (entries,
//! bytes, depth), so a hostile base costs bounded work, and the flags that
//! raise them.

use std::path::Path;

/// The flags that raise each limit (entries, bytes, depth; `cli::LimitArgs`),
/// so the line that ends a build says what to pass.
pub const LIMIT_FLAGS: [&str; 3] = ["--max-entries", "--max-bytes", "--max-depth"];

/// Bounds on what an untrusted image may put under the paths kiln unpacks
/// and then works through (a node's store, its config, `/kind`): each later
/// phase is linear in what is there, and these keep that finite. A real
/// node's store (blobs, a few snapshots) is far below every default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Entries (files, directories, links), summed over all layers.
    pub entries: u64,
    /// Bytes of regular files, summed over all layers.
    pub bytes: u64,
    /// Path components below the root.
    pub depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            entries: 1_000_000,
            bytes: 64 << 30,
            depth: 128,
        }
    }
}

/// [`Limits`] being spent across the layers of one image, on the paths
/// `counted` says yes to.
#[derive(Debug, Clone)]
pub struct Budget {
    limits: Limits,
    counted: fn(&Path) -> bool,
    entries: u64,
    bytes: u64,
}

impl Budget {
    pub fn new(limits: Limits, counted: fn(&Path) -> bool) -> Self {
        Budget {
            limits,
            counted,
            entries: 0,
            bytes: 0,
        }
    }

    /// Counts one entry of `size` file bytes at `path`; errs naming the
    /// limit passed and the flag that raises it.
    pub fn spend(
        &mut self,
        path: &Path,
        size: u64,
    ) -> Result<(), crate::primitives::error::BadInput> {
        if !(self.counted)(path) {
            return Ok(());
        }
        let over = |what: &str, limit: String, flag: &str| {
            crate::primitives::error::BadInput(format!(
                "{}: the image holds more than {limit} under what kiln unpacks ({what}); \
                 raise {flag} if you trust it",
                path.display()
            ))
        };
        let depth = path.components().count();
        if depth > self.limits.depth {
            let limit = format!("{} levels", self.limits.depth);
            return Err(over("path depth", limit, LIMIT_FLAGS[2]));
        }
        self.entries += 1;
        if self.entries > self.limits.entries {
            let limit = format!("{} entries", self.limits.entries);
            return Err(over("entries", limit, LIMIT_FLAGS[0]));
        }
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > self.limits.bytes {
            let limit = format!("{} bytes", self.limits.bytes);
            return Err(over("file bytes", limit, LIMIT_FLAGS[1]));
        }
        Ok(())
    }
}
