//! `kiln-testkit registry [--images FILE]... [--kind-base REPO:TAG] -- CMD...`:
//! runs CMD with a loopback registry seeded from FILEs (and, with
//! --kind-base, a kindest/base-style base image); `$KILN_REGISTRY` holds its
//! `127.0.0.1:PORT`. The registry stops when CMD ends: nothing outlives the call.

use std::process::{Command, ExitCode};

use kiln_testkit::image::ImageSet;
use kiln_testkit::registry::Registry;

const HELP: &str = "\
kiln-testkit: a loopback OCI registry seeded with images this repository builds,
for the demo, the tests and the README's examples (no internet needed).

usage: kiln-testkit registry [--images FILE]... [--kind-base REPO:TAG] -- CMD [ARG]...

  --images FILE        push the image set FILE describes (e.g. images/demo.yaml)
  --kind-base REPO:TAG push a kindest/base-style base image under that name

CMD runs with KILN_REGISTRY=127.0.0.1:PORT; the registry stops when CMD ends.
Keep one up for the README's examples with `make demo-registry` (a shell):

  kiln build --manifest manifests/demo.yaml --rootfs out/rootfs \\
    --mirror registry.k8s.io=http://$KILN_REGISTRY
  kiln build --manifest manifests/demo.yaml --base $KILN_REGISTRY/kindest/base:demo \\
    --mirror registry.k8s.io=http://$KILN_REGISTRY --output oci-archive:out/node.tar
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h")
        || args.first().map(String::as_str) == Some("help")
    {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let usage = "usage: kiln-testkit registry [--images FILE]... [--kind-base REPO:TAG] -- CMD [ARG]... (kiln-testkit --help)";
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
        .find(|(k, _)| *k != "--images" && *k != "--kind-base")
    {
        eprintln!("kiln-testkit: unknown option {bad}\n{usage}");
        return ExitCode::from(2);
    }
    let run = || -> anyhow::Result<i32> {
        let registry = Registry::start()?;
        let mut n = 0;
        for (k, v) in &opts {
            if *k == "--images" {
                n += registry
                    .seed(&ImageSet::load(std::path::Path::new(v))?)?
                    .len();
            } else {
                let (repo, tag) = v.rsplit_once(':').unwrap_or((v, "latest"));
                let mut base =
                    kiln_testkit::base::kind_base(&[&kiln_testkit::image::host_platform()]);
                base.repo = repo.to_string();
                base.tag = tag.to_string();
                registry.push(&base)?;
                n += 1;
            }
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
