//! An archive's files opened once, when listed, and read only through
//! those descriptors: a file another user swaps afterwards for a FIFO or a
//! link (a layout directory's blob, issue 60.4) is never opened by name
//! again, so it cannot hang kiln or make it read another file.

use std::path::Path;

use anyhow::{anyhow, bail};

/// Opens `path` to read, without blocking (a FIFO would wait for a
/// writer forever) and, unless `follow`, without following a link; Err
/// unless what was opened is a regular file (`fstat` of that descriptor).
pub(crate) fn open_regular(path: &Path, follow: bool) -> anyhow::Result<std::fs::File> {
    use rustix::fs::OFlags;
    let mut flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rustix::fs::openat(rustix::fs::CWD, path, flags, rustix::fs::Mode::empty()).map_err(
        |e| {
            if e == rustix::io::Errno::LOOP {
                anyhow!("{} is a symbolic link; refusing it", path.display())
            } else {
                anyhow!("cannot open {}: {e}", path.display())
            }
        },
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        bail!(
            "{} is not a regular file (a FIFO, device, socket or directory); refusing it",
            path.display()
        );
    }
    Ok(std::fs::File::from(fd))
}

/// Another open file description of `file` (its own offset, for a reader
/// of its own), through `/proc/self/fd`: the same inode, whatever its name
/// now leads to.
pub(crate) fn reopen(file: &std::fs::File) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}
