//! `kiln-testkit registry [--images FILE]... [--base R:T] [--kind-base R:T]
//! [--release DIR] -- CMD...`: runs CMD with the demo's loopback registry
//! (`kiln_testkit::demo`); `$KILN_REGISTRY` holds its
//! `127.0.0.1:PORT`. The registry stops when CMD ends: nothing outlives the call.

use std::path::Path;
use std::process::{Command, ExitCode};

use kiln_testkit::demo::Demo;
use kiln_testkit::registry::Registry;

const HELP: &str = "\
kiln-testkit: a loopback OCI registry seeded with images this repository builds,
for the demo, the tests and the docs' examples (no internet needed).

usage: kiln-testkit registry --demo -- CMD [ARG]...
       kiln-testkit registry [--images FILE]... [--base REPO:TAG] [--kind-base REPO:TAG]
                             [--release DIR] -- CMD [ARG]...

  --demo               what `make demo` and the docs' examples use (run from the
                       repository's root): images/demo.yaml, kiln/base:demo,
                       kindest/base:demo and the release in out/release

  --images FILE        push the image set FILE describes (e.g. images/demo.yaml)
  --base REPO:TAG      push a base image (containerd and its config) under that name
  --kind-base REPO:TAG push a kindest/base-style base (kind's entrypoint too)
  --release DIR        write a stand-in Kubernetes release (v1.31.2, amd64 and arm64)
                       into DIR: kubernetes-server-linux-ARCH.tar.gz and its .sha512

CMD runs with KILN_REGISTRY=127.0.0.1:PORT; the registry stops when CMD ends.
Keep one up for the docs' examples with `make demo-registry` (a shell):

  kiln build --manifest manifests/demo.yaml --rootfs out/rootfs \\
    --mirror registry.k8s.io=http://$KILN_REGISTRY
  kiln build --manifest manifests/demo.yaml --base $KILN_REGISTRY/kiln/base:demo \\
    --mirror registry.k8s.io=http://$KILN_REGISTRY --output oci-archive:out/node.tar
";

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // `registry --demo`: the demo's registry, as tests/docs.rs starts it.
    let standard = args.get(1).map(String::as_str) == Some("--demo");
    if standard {
        args.remove(1);
    }
    if args.iter().any(|a| a == "--help" || a == "-h")
        || args.first().map(String::as_str) == Some("help")
    {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let usage = "usage: kiln-testkit registry (--demo | [--images FILE]... [--base REPO:TAG] [--kind-base REPO:TAG] [--release DIR]) -- CMD [ARG]... (kiln-testkit --help)";
    let Some(sep) = args.iter().position(|a| a == "--") else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    if args.first().map(String::as_str) != Some("registry")
        || sep + 1 >= args.len()
        || (sep - 1) % 2 != 0
    {
        eprintln!("{usage}");
        return ExitCode::from(2);
    }
    let opts: Vec<(&str, &str)> = args[1..sep]
        .chunks(2)
        .map(|c| (c[0].as_str(), c[1].as_str()))
        .collect();
    if let Some((bad, _)) = opts
        .iter()
        .find(|(k, _)| !["--images", "--base", "--kind-base", "--release"].contains(k))
    {
        eprintln!("kiln-testkit: unknown option {bad}\n{usage}");
        return ExitCode::from(2);
    }
    if standard && !opts.is_empty() {
        eprintln!("kiln-testkit: --demo takes no other option\n{usage}");
        return ExitCode::from(2);
    }
    let pick = |k: &str| -> Vec<&str> {
        opts.iter()
            .filter(|(o, _)| *o == k)
            .map(|(_, v)| *v)
            .collect()
    };
    let demo = if standard {
        Demo::standard(Path::new("images/demo.yaml"), Path::new("out/release"))
    } else {
        Demo {
            images: pick("--images").into_iter().map(Path::new).collect(),
            base: pick("--base").last().copied(),
            kind_base: pick("--kind-base").last().copied(),
            release: pick("--release").last().map(|p| Path::new(*p)),
        }
    };
    let run = || -> anyhow::Result<i32> {
        let registry = Registry::start()?;
        let n = demo.seed(&registry)?;
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
