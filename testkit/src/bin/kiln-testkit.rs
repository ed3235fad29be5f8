//! `kiln-testkit registry --images FILE -- CMD...`: runs CMD with a loopback
//! registry seeded from FILE; `$KILN_REGISTRY` holds its `127.0.0.1:PORT`.
//! The registry stops when CMD ends, so nothing outlives the call.

use std::process::{Command, ExitCode};

use kiln_testkit::image::ImageSet;
use kiln_testkit::registry::Registry;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: kiln-testkit registry --images FILE [--images FILE]... -- CMD [ARG]...";
    let Some(sep) = args.iter().position(|a| a == "--") else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    if args.first().map(String::as_str) != Some("registry") || sep + 1 >= args.len() {
        eprintln!("{usage}");
        return ExitCode::from(2);
    }
    let files: Vec<&String> = args[1..sep]
        .chunks(2)
        .filter(|c| c[0] == "--images" && c.len() == 2)
        .map(|c| &c[1])
        .collect();
    let run = || -> anyhow::Result<i32> {
        let registry = Registry::start()?;
        let mut n = 0;
        for f in &files {
            let set = ImageSet::load(std::path::Path::new(f.as_str()))?;
            n += registry.seed(&set)?.len();
        }
        eprintln!(
            "kiln-testkit: registry at {} seeded with {n} images",
            registry.url()
        );
        let status = Command::new(&args[sep + 1])
            .args(&args[sep + 2..])
            .env("KILN_REGISTRY", &registry.addr)
            .status()?;
        Ok(status.code().unwrap_or(1))
    };
    match run() {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("kiln-testkit: {e:#}");
            ExitCode::FAILURE
        }
    }
}
