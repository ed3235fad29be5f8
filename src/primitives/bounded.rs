//! A child process run to its end within bounds: what it prints read up
//! to a cap, a deadline on the whole run, an idle deadline on what is fed
//! to its stdin, and Ctrl-C. When any of them ends it, its whole process
//! group is killed; and when it ends by itself, whatever it left running
//! in its group too. Always before the child is reaped: until then its
//! pid, and so its group's id, cannot be given to another process, so a
//! kill never reaches a group that is not the child's.
//!
//! For programs kiln runs on input it does not trust: a release's kubeadm
//! (`adapters::kubeadm`), a container engine's CLI talking to a kind node
//! (`adapters::node_provider`), whose output and time a node controls.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How much and how long.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Bytes of stdout (and of stderr) read at most; more ends the run.
    pub output: u64,
    /// The whole run.
    pub within: Duration,
    /// Fed stdin: the longest it may take the child to take the next
    /// chunk, and, once it has taken the last, to end.
    pub idle: Duration,
}

/// A run that ended by itself.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes fed to its stdin.
    pub fed: u64,
}

/// Why a run was ended (its process group killed), or could not start.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error("printed more than {0} bytes; stopped")]
    TooMuch(u64),
    #[error("gave no answer within {}s; stopped", .0.as_secs())]
    Late(Duration),
    #[error("took nothing of its input for {}s; stopped", .0.as_secs())]
    Idle(Duration),
    #[error("took its input, then gave no answer within {}s; stopped", .0.as_secs())]
    Quiet(Duration),
    #[error("interrupted; stopped")]
    Interrupted,
    #[error("{0}")]
    Io(String),
}

enum Done {
    Exit,
    Out(std::io::Result<Vec<u8>>),
    Err(Vec<u8>),
    /// Its input all taken, or not (it exited, or closed it): the
    /// child's own answer then says why.
    Fed,
    TooMuch,
}

/// Runs `cmd` (in a process group of its own) within `bounds`, `stdin`
/// fed to it when given ([module doc](self)).
pub fn run(
    cmd: &mut Command,
    stdin: Option<Box<dyn Read + Send>>,
    bounds: Bounds,
) -> Result<Ran, Stopped> {
    cmd.process_group(0)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| Stopped::Io(e.to_string()))?;
    let pid = rustix::process::Pid::from_child(&child);
    let kill = || {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    };
    let (tx, rx) = mpsc::channel();
    let cap = bounds.output;
    let read = |mut from: Box<dyn Read + Send>, tx: mpsc::Sender<Done>, out: bool| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let r = (&mut from).take(cap + 1).read_to_end(&mut buf);
            if buf.len() as u64 > cap {
                let _ = tx.send(Done::TooMuch);
                // Drained so the child is not blocked writing while it dies.
                let _ = std::io::copy(&mut from, &mut std::io::sink());
                return;
            }
            let _ = tx.send(if out {
                Done::Out(r.map(|_| buf))
            } else {
                Done::Err(buf)
            });
        })
    };
    read(
        Box::new(child.stdout.take().expect("piped")),
        tx.clone(),
        true,
    );
    read(
        Box::new(child.stderr.take().expect("piped")),
        tx.clone(),
        false,
    );
    let fed = Arc::new(AtomicU64::new(0));
    let last = Arc::new(Mutex::new(Instant::now()));
    let feeding = match (stdin, child.stdin.take()) {
        (Some(mut from), Some(mut to)) => {
            let (tx, fed, last) = (tx.clone(), fed.clone(), last.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 << 10];
                let _ = (|| -> std::io::Result<()> {
                    loop {
                        let n = from.read(&mut buf)?;
                        if n == 0 {
                            return Ok(());
                        }
                        to.write_all(&buf[..n])?;
                        fed.fetch_add(n as u64, Ordering::Relaxed);
                        *last.lock().unwrap() = Instant::now();
                    }
                })();
                drop(to);
                let _ = tx.send(Done::Fed);
            });
            true
        }
        _ => false,
    };
    // Told when the child has exited, without reaping it (`WNOWAIT`).
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = rustix::process::waitid(
                rustix::process::WaitId::Pid(pid),
                rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
            );
            let _ = tx.send(Done::Exit);
        });
    }
    drop(tx);
    let started = Instant::now();
    let (mut exited, mut stdout, mut stderr, mut fed_done) = (false, None, None, !feeding);
    let stop = |why: Stopped, child: &mut std::process::Child| {
        kill();
        let _ = child.wait();
        Err(why)
    };
    while !(exited && stdout.is_some() && stderr.is_some() && fed_done) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Done::Exit) => exited = true,
            Ok(Done::Out(o)) => match o {
                Ok(o) => stdout = Some(o),
                Err(e) => return stop(Stopped::Io(format!("reading its answer: {e}")), &mut child),
            },
            Ok(Done::Err(e)) => stderr = Some(e),
            // A child that stops reading its input and exits: its answer says why.
            Ok(Done::Fed) => {
                fed_done = true;
                *last.lock().unwrap() = Instant::now();
            }
            Ok(Done::TooMuch) => return stop(Stopped::TooMuch(cap), &mut child),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return stop(Stopped::Io("lost track of it".into()), &mut child)
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if crate::primitives::interrupt::check().is_err() {
            return stop(Stopped::Interrupted, &mut child);
        }
        if started.elapsed() >= bounds.within {
            return stop(Stopped::Late(bounds.within), &mut child);
        }
        if feeding && !exited && last.lock().unwrap().elapsed() >= bounds.idle {
            let why = if fed_done {
                Stopped::Quiet(bounds.idle)
            } else {
                Stopped::Idle(bounds.idle)
            };
            return stop(why, &mut child);
        }
    }
    // Exited and answered: anything it left running in its group goes too,
    // before the child is reaped.
    kill();
    let status = child.wait().map_err(|e| Stopped::Io(e.to_string()))?;
    Ok(Ran {
        status,
        stdout: stdout.expect("looped until set"),
        stderr: stderr.expect("looped until set"),
        fed: fed.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Bounds = Bounds {
        output: 1 << 10,
        within: Duration::from_secs(5),
        idle: Duration::from_secs(2),
    };

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_child_that_answers_is_read_whole() {
        let r = run(
            &mut sh("echo out; echo err >&2; cat"),
            Some(Box::new(&b"fed"[..])),
            QUICK,
        )
        .unwrap();
        assert!(r.status.success());
        assert_eq!(r.stdout, b"out\nfed");
        assert_eq!(r.stderr, b"err\n");
        assert_eq!(r.fed, 3);
    }

    #[test]
    fn one_that_floods_hangs_or_stops_reading_is_ended() {
        assert!(matches!(
            run(&mut sh("yes"), None, QUICK),
            Err(Stopped::TooMuch(_))
        ));
        let t = Instant::now();
        let within = Bounds {
            within: Duration::from_millis(600),
            ..QUICK
        };
        // Its pipes closed, asleep: the deadline still ends it.
        assert!(matches!(
            run(&mut sh("exec >/dev/null 2>&1; sleep 30"), None, within),
            Err(Stopped::Late(_))
        ));
        assert!(t.elapsed() < Duration::from_secs(5));
        // Never reads its input: the idle deadline.
        let idle = Bounds {
            idle: Duration::from_millis(400),
            ..QUICK
        };
        let endless: Box<dyn Read + Send> = Box::new(std::io::repeat(7));
        assert!(matches!(
            run(&mut sh("sleep 30"), Some(endless), idle),
            Err(Stopped::Idle(_))
        ));
    }

    /// Whether process `pid` is gone (or a zombie waiting for init),
    /// looked at until it is, within ten seconds.
    fn ends(pid: &str) -> bool {
        let state = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(')').next().map(|r| r.trim().chars().next()))
                .flatten()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !matches!(state(), None | Some('Z') | Some('X')) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Issue 45.6 and 56.4: the group is killed whether the child ends by
    /// itself or by the deadline, a grandchild it started with it.
    #[test]
    fn what_it_left_running_in_its_group_is_killed() {
        let r = run(&mut sh("sleep 300 >/dev/null 2>&1 & echo $!"), None, QUICK).unwrap();
        let pid = String::from_utf8(r.stdout).unwrap().trim().to_string();
        assert!(ends(&pid), "a process of its group outlived the run");
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("pid");
        let script = format!(
            "sleep 300 >/dev/null 2>&1 & echo $! > {}; exec >&- 2>&-; sleep 300",
            file.display()
        );
        let within = Bounds {
            within: Duration::from_millis(800),
            ..QUICK
        };
        assert!(matches!(
            run(&mut sh(&script), None, within),
            Err(Stopped::Late(_))
        ));
        let pid = std::fs::read_to_string(&file).unwrap().trim().to_string();
        assert!(ends(&pid), "a process of its group outlived the deadline");
    }
}
