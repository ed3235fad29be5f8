//! The daemon's confinement as root, set up between fork and exec: its own
//! mount namespace with the store bind-mounted `nodev,nosuid`, and with
//! `--start` a network namespace that has only loopback.

/// Brings `lo` up in the (new, empty) network namespace: `SIOCSIFFLAGS`.
/// Defence in depth for a store kiln did not write: in a mount namespace
/// of the daemon's own, the store is bind-mounted over itself `nodev` (and
/// `nosuid`), so even a device node that slipped past
/// [`crate::adapters::rootfs::check_store_tree`] cannot be opened as a device (the
/// kernel refuses with EACCES). Nothing changes for the host's mounts
/// (everything is made private first) and the mounts end with the daemon.
/// Runs between fork and exec: only system calls on a path made before.
pub(super) fn store_nodev(store: &std::ffi::CStr) -> std::io::Result<()> {
    use nix::libc;
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            store.as_ptr(),
            store.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            std::ptr::null(),
            store.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NODEV | libc::MS_NOSUID,
            std::ptr::null(),
        ))
    }
}

pub(super) fn loopback_up() -> std::io::Result<()> {
    use nix::libc;
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if rc == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            return Err(err);
        }
    }
    Ok(())
}
