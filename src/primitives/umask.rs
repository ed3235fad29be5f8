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

/// The mode of a directory kiln makes for the caller: as their umask
/// gives it, but never writable by others, whatever the umask (under
/// `umask 000` a rootfs root then runs containerd on would be anyone's to
/// change); group write stays as the umask gives it.
pub fn as_caller_dir_mode() -> u32 {
    0o777 & !caller() & !0o002
}

/// Creates `dir` and its missing parents as `mkdir -p` would under the
/// caller's umask (not [`WORKING`]): what kiln hands back to the caller
/// (`kiln build --rootfs DIR`) gets the caller's modes, as its outputs do.
/// Directories that exist are left as they are. Each missing directory is
/// made and opened relative to its parent's descriptor, never through a
/// link, and its mode set through its own descriptor: a name another user
/// swaps meanwhile leads kiln to chmod nothing of theirs.
pub fn create_dir_all_as_caller(dir: &std::path::Path) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    use std::path::Component;
    let dir = std::path::absolute(dir)?;
    // O_PATH to pass through (search permission is all a parent needs);
    // a directory kiln made is opened to be read, so it can be fchmod'ed.
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let made_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(as_caller_dir_mode());
    let mut fd = rustix::fs::open("/", flags, Mode::empty())?;
    for c in dir.components() {
        let name = match c {
            Component::Normal(n) => n,
            Component::ParentDir => std::ffi::OsStr::new(".."),
            _ => continue,
        };
        // What exists is the caller's path, links and all.
        fd = match rustix::fs::openat(&fd, name, flags, Mode::empty()) {
            Ok(next) => next,
            Err(rustix::io::Errno::NOENT) => {
                match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let made = rustix::fs::openat(&fd, name, made_flags, Mode::empty())?;
                let st = rustix::fs::fstat(&made)?;
                if st.st_uid == rustix::process::geteuid().as_raw()
                    && st.st_mode & 0o777 != mode.as_raw_mode()
                {
                    rustix::fs::fchmod(&made, mode)?;
                }
                made
            }
            Err(e) => return Err(e.into()),
        };
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

    #[test]
    fn an_existing_link_of_the_callers_path_is_followed_and_nothing_else_is_changed() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::os::unix::fs::symlink(&real, t.path().join("link")).unwrap();
        super::create_dir_all_as_caller(&t.path().join("link/new/deep")).unwrap();
        assert!(real.join("new/deep").is_dir());
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&real), 0o711, "an existing directory kept its mode");
        assert_eq!(mode(&real.join("new")), super::as_caller_dir_mode());
        assert_eq!(
            super::as_caller_dir_mode() & 0o002,
            0,
            "never writable by others"
        );
    }
}
