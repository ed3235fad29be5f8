//! The umask, decided once per process. kiln works under `022` whatever
//! the caller's umask, so the directories and files it makes in a store,
//! a rootfs and a node-image layer (and the modes those layers carry, and
//! the cache keys made of them) are the same on every builder: a laptop
//! under `umask 077` and CI under `022` build the same digests (issue
//! 44.2). The caller's own umask is kept for what kiln hands back to them
//! (`primitives::atomic`: an output's mode is `0666` less it).

use std::sync::OnceLock;

/// The umask kiln works under.
pub const WORKING: u32 = 0o022;

static CALLER: OnceLock<u32> = OnceLock::new();

/// Sets the process's umask to [`WORKING`] and remembers the caller's.
/// Called first thing in `main`, before any thread starts (the umask is
/// the process's, not a thread's).
pub fn settle() {
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(WORKING));
    let _ = CALLER.set(old.as_raw_mode() & 0o777);
}

/// The caller's umask: as [`settle`] found it, else (kiln used as a
/// library) the process's own, read from `/proc/self/status` without
/// changing it; `022` if neither can be had.
pub fn caller() -> u32 {
    *CALLER.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(WORKING)
    })
}

/// Creates `dir` and its missing parents as `mkdir -p` would under the
/// caller's umask (not [`WORKING`]): what kiln hands back to the caller
/// (`kiln build --rootfs DIR`) gets the caller's modes, as its outputs do.
/// Directories that exist are left as they are.
pub fn create_dir_all_as_caller(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::absolute(dir)?;
    let missing: Vec<&std::path::Path> = dir.ancestors().take_while(|a| !a.exists()).collect();
    std::fs::create_dir_all(&dir)?;
    let mode = 0o777 & !caller();
    for d in missing.into_iter().rev() {
        let m = std::fs::symlink_metadata(d)?;
        if m.is_dir() && m.permissions().mode() & 0o777 != mode {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_relative_directory_is_made_whole() {
        let t = tempfile::tempdir().unwrap();
        let here = std::env::current_dir().unwrap();
        std::env::set_current_dir(t.path()).unwrap();
        let made = super::create_dir_all_as_caller(std::path::Path::new("a/b"));
        std::env::set_current_dir(here).unwrap();
        made.unwrap();
        assert!(t.path().join("a/b").is_dir());
    }
}
