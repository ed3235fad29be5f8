//! Files kiln hands to users (archives, the SBOM, provenance, the lock, a
//! rewritten manifest, containerd's `meta.db`): written whole or not at
//! all, and never through a name someone else could have prepared. Every
//! such write goes through here, so each has the same guarantees:
//!
//! - the bytes go to a fresh temporary file beside the target, created
//!   with `O_EXCL` under a random name (`tempfile`), so a symlink or file
//!   planted at a predictable name (`OUT.kiln-tmp`) is never followed or
//!   truncated;
//! - the file is synced before it is renamed over the target, and the
//!   directory after, so a crash leaves the old file or the new one;
//! - a new file gets `0666` less the caller's umask (kiln itself works
//!   under `022`: `primitives::umask`), as any program's new file does; a replaced file's mode is kept only if it is a regular file of
//!   the user kiln runs as, and then without its setuid, setgid and sticky
//!   bits (`& 0777`): a file another user made, or a symlink to a setuid
//!   binary, decides nothing about what root writes.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use tempfile::NamedTempFile;

/// A temporary file beside `target`, to fill and then [`persist`]. It is
/// removed if dropped unpersisted.
pub fn temp_beside(target: &Path) -> io::Result<NamedTempFile> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Private while it is written; its mode is set at `persist`.
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".kiln-tmp")
        .tempfile_in(dir_of(target))
}

/// The directory `target` is in (`.` for a bare name).
fn dir_of(target: &Path) -> &Path {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Makes a filled [`temp_beside`] file `target`: synced, given the mode of
/// the file it replaces if that is the user's own regular file (module
/// doc), renamed into place, the directory synced.
pub fn persist(tmp: NamedTempFile, target: &Path) -> io::Result<()> {
    persist_mode(tmp, target, None)
}

/// [`persist`] with `mode` when given (a file whose mode is part of a
/// reproducible image), else the replaced file's.
pub fn persist_mode(tmp: NamedTempFile, target: &Path, mode: Option<u32>) -> io::Result<()> {
    let mode = mode
        .or_else(|| {
            std::fs::symlink_metadata(target)
                .ok()
                .filter(|m| m.is_file() && m.uid() == rustix::process::geteuid().as_raw())
                .map(|m| m.permissions().mode() & 0o777)
        })
        .unwrap_or(0o666 & !crate::primitives::umask::caller());
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(target).map_err(|e| e.error)?;
    File::open(dir_of(target))?.sync_all()
}

/// Replaces `target` with `bytes` ([`temp_beside`], then [`persist`]).
pub fn write(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = temp_beside(target)?;
    tmp.write_all(bytes)?;
    persist(tmp, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39.4: a symlink planted at the old predictable temporary name
    /// (`OUT.kiln-tmp`) is neither followed nor truncated; the target is
    /// replaced whole and keeps its mode.
    #[test]
    fn a_planted_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let out = dir.path().join("sbom.json");
        std::os::unix::fs::symlink(&victim, dir.path().join("sbom.kiln-tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("sbom.json.kiln-tmp")).unwrap();
        write(&out, b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&out).unwrap(), b"{}");
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o644
        );
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).unwrap();
        write(&out, b"{\"a\":1}").unwrap();
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Nothing else was left beside it.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["sbom.json", "sbom.json.kiln-tmp", "sbom.kiln-tmp", "victim"]
        );
    }
}
