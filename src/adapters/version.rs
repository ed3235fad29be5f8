//! containerd versions, and what each can do with pinned images.

use std::fmt;
use std::path::Path;
use std::process::Command;

use anyhow::{anyhow, bail, Context};

/// Every `X.Y.Z[-pre]+unknown` in the file range, streamed in 1 MiB reads.
fn scan_unknown_versions(
    file: &std::fs::File,
    (start, len): (u64, u64),
) -> anyhow::Result<Vec<Version>> {
    use std::os::unix::fs::FileExt;
    const NEEDLE: &[u8] = b"+unknown";
    const CHUNK: usize = 1 << 20;
    const BACK: usize = 40;
    let mut out = Vec::new();
    let mut buf = vec![0u8; CHUNK + BACK];
    let mut pos = 0u64;
    let mut carried = 0usize;
    while pos < len {
        let want = CHUNK.min((len - pos) as usize);
        let n = file.read_at(&mut buf[carried..carried + want], start + pos)?;
        if n == 0 {
            break;
        }
        let have = carried + n;
        let hay = &buf[..have];
        let mut i = 0;
        while let Some(k) = hay[i..].windows(NEEDLE.len()).position(|w| w == NEEDLE) {
            let end = i + k;
            let from = end.saturating_sub(BACK);
            let word = &hay[from..end];
            let tail = word
                .iter()
                .rposition(|c| !(c.is_ascii_alphanumeric() || *c == b'.' || *c == b'-'))
                .map_or(word, |p| &word[p + 1..]);
            // The version starts at the first digit that makes X.Y.Z.
            if let Some(v) = (0..tail.len())
                .filter(|&s| tail[s].is_ascii_digit() && (s == 0 || !tail[s - 1].is_ascii_digit()))
                .find_map(|s| {
                    let t = std::str::from_utf8(&tail[s..]).ok()?;
                    let v = Version::parse_output(t)?;
                    t.starts_with(&format!("{}.{}.{}", v.major, v.minor, v.patch))
                        .then_some(v)
                })
            {
                out.push(v);
            }
            i = end + NEEDLE.len();
        }
        // Keep the tail: a match may straddle two reads.
        let keep = BACK.min(have);
        buf.copy_within(have - keep..have, 0);
        carried = keep;
        pos += n as u64;
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses the first `[v]X.Y.Z` in `containerd --version` output
    /// (`containerd github.com/containerd/containerd 1.7.24~ds1 ...`).
    pub fn parse_output(out: &str) -> Option<Version> {
        out.split_whitespace().find_map(|w| {
            let w = w.trim_start_matches('v');
            let mut it = w.split(|c: char| !c.is_ascii_digit());
            let major = it.next()?.parse().ok()?;
            let minor = it.next()?.parse().ok()?;
            let patch = it.next()?.parse().ok()?;
            w.contains('.').then_some(Version {
                major,
                minor,
                patch,
            })
        })
    }

    /// A containerd binary's version: read from its ELF file (no process
    /// to start: a build's no-op rerun is mostly daemon start-up), else
    /// from `--version`; looked up once per binary and run.
    pub fn of_binary(binary: &Path) -> anyhow::Result<Version> {
        static SEEN: std::sync::Mutex<Vec<(std::path::PathBuf, Version)>> =
            std::sync::Mutex::new(Vec::new());
        if let Some((_, v)) = SEEN.lock().unwrap().iter().find(|(p, _)| p == binary) {
            return Ok(*v);
        }
        let v = match std::fs::File::open(binary)
            .map_err(anyhow::Error::from)
            .and_then(|f| Version::of_elf(&f))
        {
            Ok(v) => v,
            Err(_) => Version::by_running(binary)?,
        };
        SEEN.lock().unwrap().push((binary.to_path_buf(), v));
        Ok(v)
    }

    /// What `binary --version` prints (runs it: only for a trusted binary).
    pub fn by_running(binary: &Path) -> anyhow::Result<Version> {
        let out = Command::new(binary)
            .arg("--version")
            .output()
            .with_context(|| format!("running {} --version", binary.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        Version::parse_output(&text).ok_or_else(|| {
            anyhow!(
                "{} --version printed no version: {text:?}",
                binary.display()
            )
        })
    }

    /// A containerd binary's version, read from the file without running
    /// it: the file may come from an untrusted image (and may be built for
    /// another architecture). Go records the main package in `.go.buildinfo`
    /// (`github.com/containerd/containerd[/v2]/cmd/containerd`, giving the
    /// major version, and a `mod` line with the version in module builds);
    /// containerd's `version.Version` default, `X.Y.Z+unknown`, sits in
    /// `.rodata` whether or not the build overrode it with `-X`.
    pub fn of_elf(file: &std::fs::File) -> anyhow::Result<Version> {
        use object::{Object, ObjectSection};
        let cache = object::ReadCache::new(file);
        let elf = object::File::parse(&cache).map_err(|e| anyhow!("not an ELF binary: {e}"))?;
        let info = elf
            .section_by_name(".go.buildinfo")
            .ok_or_else(|| anyhow!("not a Go binary (no .go.buildinfo)"))?;
        let info = info
            .data()
            .map_err(|e| anyhow!("reading .go.buildinfo: {e}"))?;
        let text = String::from_utf8_lossy(&info[..info.len().min(1 << 16)]);
        let main = text
            .split('\n')
            // The first line follows a binary sentinel, not a newline.
            .find_map(|l| l.split_once("path\t").map(|(_, p)| p))
            .ok_or_else(|| anyhow!("its Go build info names no main package"))?;
        let major = match main {
            "github.com/containerd/containerd/cmd/containerd" => 1,
            m => match m
                .strip_prefix("github.com/containerd/containerd/v")
                .and_then(|r| r.strip_suffix("/cmd/containerd"))
                .and_then(|n| n.parse::<u32>().ok())
            {
                Some(n) => n,
                None => bail!("it is {m}, not containerd"),
            },
        };
        let module = text.split('\n').find_map(|l| {
            let mut f = l.strip_prefix("mod\t")?.split('\t');
            f.next()?
                .starts_with("github.com/containerd/containerd")
                .then(|| f.next().and_then(Version::parse_output))?
        });
        if let Some(v) = module.filter(|v| v.major == major) {
            return Ok(v);
        }
        let rodata = elf
            .section_by_name(".rodata")
            .and_then(|s| s.file_range())
            .ok_or_else(|| anyhow!("no .rodata section"))?;
        let found = scan_unknown_versions(file, rodata)?;
        let mut ours: Vec<Version> = found.into_iter().filter(|v| v.major == major).collect();
        ours.sort();
        ours.dedup();
        match ours.as_slice() {
            [v] => Ok(*v),
            [] => bail!("no containerd {major}.x version string in it"),
            _ => bail!("several containerd version strings in it: {ours:?}"),
        }
    }

    /// Whether CRI reports `pinned` for images labelled pinned at all.
    pub fn honours_pinned_label(&self) -> bool {
        match (self.major, self.minor) {
            (1, 6) => *self >= Version::new(1, 6, 22),
            (1, 7) => *self >= Version::new(1, 7, 3),
            (1, m) => m > 7,
            (m, _) => m >= 2,
        }
    }

    /// Whether label-based pinning is reliable (containerd PRs #9381/#9382).
    pub fn pins_reliably(&self) -> bool {
        match (self.major, self.minor) {
            (1, 6) => *self >= Version::new(1, 6, 25),
            (1, 7) => *self >= Version::new(1, 7, 10),
            (1, m) => m > 7,
            (m, _) => m >= 2,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_judges() {
        let v = Version::parse_output(
            "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6",
        )
        .unwrap();
        assert_eq!(v, Version::new(1, 7, 24));
        assert_eq!(
            Version::parse_output("containerd containerd.io v2.0.2 c507a0257e").unwrap(),
            Version::new(2, 0, 2)
        );
        assert!(!Version::new(1, 6, 20).honours_pinned_label());
        assert!(
            Version::new(1, 6, 22).honours_pinned_label()
                && !Version::new(1, 6, 22).pins_reliably()
        );
        assert!(!Version::new(1, 7, 2).honours_pinned_label());
        assert!(Version::new(1, 7, 10).pins_reliably());
        assert!(Version::new(2, 0, 0).pins_reliably());
    }
}
