//! How kiln words things for people: one-line errors and byte counts.

/// Folds any text (a multi-line error chain) onto one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Human-readable size.
/// An error and its causes on one line, each said once (HTTP stacks repeat
/// their cause inside their own message).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !parts.iter().any(|p| p.contains(&m)) {
            parts.push(m);
        }
        src = s.source();
    }
    parts.join(": ")
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Writes one line to stdout or stderr. A reader that went away (`kiln ...
/// | head`) stops kiln as an interrupt does ([`crate::primitives::interrupt::reader_gone`]):
/// it unwinds, cleaning up, and exits quietly with the status a shell shows
/// for SIGPIPE (141), as other command-line tools end; never a panic, never
/// an exit from inside a write. (SIGPIPE itself stays ignored: kiln's
/// sockets must report a dead peer as an error.)
pub fn write_line(stdout: bool, args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let written = if stdout {
        writeln!(std::io::stdout().lock(), "{args}")
    } else {
        writeln!(std::io::stderr().lock(), "{args}")
    };
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            crate::primitives::interrupt::reader_gone();
        }
    }
}

/// stderr for `tracing`'s log lines, stopping kiln as [`write_line`] does
/// when the reader went away; the line is dropped (tracing would otherwise
/// report the failed write with `eprintln!`, which panics).
pub struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::io::stderr().write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                crate::primitives::interrupt::reader_gone();
                Ok(buf.len())
            }
            r => r,
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }
}
