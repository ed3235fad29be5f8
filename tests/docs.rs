//! Every example in the README and docs/ runs (issue 37): a doc change
//! that breaks one fails `make test`.
//!
//! The rules a page follows (docs/README.md says them for writers):
//! - A ```` ```console ```` block is run. `$ ` starts a command (a line
//!   ending in `\` continues it); the lines after it are its expected
//!   output, stdout and stderr together, matched with snapbox's wildcards
//!   (`[..]` in a line, `...` for any lines). No lines shown: the output is
//!   not checked. A first line `? N` expects exit status N (else 0).
//! - Commands run in bash, in a fresh directory per page holding
//!   `manifests/`, `images/` and `out/release/` (the stand-in release), with
//!   `$KILN_REGISTRY` set: the environment `make demo-registry` gives a user
//!   (`kiln_testkit::demo`), so an example runs as written in that shell.
//!   A page's blocks run in order and share the directory; each command
//!   is a shell of its own.
//! - `<!-- file: PATH -->` before any block writes the block to PATH first;
//!   such a block is a file, not an example (docs/ci.md's scripts and
//!   workflows, which `the_release_pipeline_runs_as_written` runs).
//! - A shell block (`sh`, `bash`, `shell`) or any block with a line starting
//!   `kiln ` or `$ ` that is not `console` must say why it is not run:
//!   `<!-- not run: REASON -->` just before it. So no command hides.
//!
//! Why a runner of our own over trycmd: trycmd passes a command's words to
//! the binary as they are, with no shell, so `$KILN_REGISTRY`, `{arch}`
//! quoting, pipes and `VAR=x kiln ...` (what users type) could not appear
//! in an example. The parts that are real work are well-kept crates:
//! pulldown-cmark reads the Markdown as CommonMark does, snapbox matches
//! output with the same wildcards trycmd uses.

use std::path::{Path, PathBuf};

use kiln_testkit::demo::Demo;
use kiln_testkit::image::host_platform;
use kiln_testkit::registry::Registry;
use kiln_testkit::tools::run_bounded;
use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One fenced block of a page, with what the comment before it said.
#[derive(Debug)]
struct Block {
    line: usize,
    lang: String,
    text: String,
    directive: Option<String>,
}

/// The fenced code blocks of a Markdown text, each with the HTML comment
/// just before it (if any).
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut directive: Option<String> = None;
    let mut open: Option<Block> = None;
    for (event, range) in Parser::new(text).into_offset_iter() {
        match event {
            Event::Html(html) if open.is_none() => {
                let h = html.trim();
                if let Some(inner) = h.strip_prefix("<!--").and_then(|h| h.strip_suffix("-->")) {
                    directive = Some(inner.trim().to_string());
                }
            }
            Event::Start(Tag::CodeBlock(kind)) => {
                let lang = match kind {
                    CodeBlockKind::Fenced(info) => {
                        info.split_whitespace().next().unwrap_or("").to_string()
                    }
                    CodeBlockKind::Indented => String::new(),
                };
                open = Some(Block {
                    line: text[..range.start].lines().count() + 1,
                    lang,
                    text: String::new(),
                    directive: directive.take(),
                });
            }
            Event::Text(t) => {
                if let Some(b) = open.as_mut() {
                    b.text.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => out.extend(open.take()),
            Event::Start(_) if open.is_none() => directive = None,
            _ => {}
        }
    }
    out
}

/// One command of a console block and what it should print.
#[derive(Debug, PartialEq)]
struct Command {
    line: usize,
    script: String,
    status: i32,
    expected: Option<String>,
}

/// The commands of a console block starting at line `first` of its page.
fn commands(first: usize, text: &str) -> Vec<Command> {
    let mut out: Vec<Command> = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let Some(cmd) = line.strip_prefix("$ ") else {
            // Output of the command before (a block starts with a command).
            if let Some(c) = out.last_mut() {
                if c.expected.is_none() {
                    if let Some(n) = line.strip_prefix("? ").and_then(|n| n.parse().ok()) {
                        c.status = n;
                        continue;
                    }
                }
                let e = c.expected.get_or_insert_with(String::new);
                e.push_str(line);
                e.push('\n');
            }
            continue;
        };
        let mut script = cmd.to_string();
        while script.ends_with('\\') {
            let Some((_, more)) = lines.next() else { break };
            script.push('\n');
            script.push_str(more);
        }
        out.push(Command {
            line: first + 1 + i,
            script,
            status: 0,
            expected: None,
        });
    }
    out
}

/// What a page's examples run against.
struct World {
    registry: String,
    release: PathBuf,
    path: String,
}

/// The mistakes of one page (file:line: what).
fn run_page(world: &World, name: &str, text: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    for d in ["manifests", "images"] {
        std::os::unix::fs::symlink(root().join(d), work.join(d)).unwrap();
    }
    std::fs::create_dir_all(work.join("out")).unwrap();
    std::os::unix::fs::symlink(&world.release, work.join("out/release")).unwrap();
    std::fs::create_dir_all(work.join("home")).unwrap();
    for b in blocks(text) {
        let at = format!("{name}:{}", b.line);
        let commandish = b
            .text
            .lines()
            .any(|l| l.starts_with("kiln ") || l.starts_with("$ "));
        match b.directive.as_deref() {
            Some(d) if d.starts_with("not run:") => {
                if d["not run:".len()..].trim().is_empty() {
                    errors.push(format!("{at}: `not run:` needs its reason"));
                }
                continue;
            }
            Some(d) if d.starts_with("file:") => {
                let path = work.join(d["file:".len()..].trim());
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &b.text).unwrap();
                // A file, not an example (a script a test runs, a workflow).
                if b.lang != "console" {
                    continue;
                }
            }
            Some(d) => {
                errors.push(format!(
                    "{at}: unknown directive <!-- {d} --> (file: PATH or not run: REASON)"
                ));
                continue;
            }
            None => {}
        }
        if b.lang != "console" {
            if ["sh", "bash", "shell"].contains(&b.lang.as_str()) || commandish {
                errors.push(format!(
                    "{at}: a command example that is not run: make it a ```console block, \
                     or put <!-- not run: REASON --> before it"
                ));
            }
            continue;
        }
        for c in commands(b.line, &b.text) {
            if let Err(e) = run_command(world, work, &c) {
                errors.push(format!("{name}:{}: $ {}\n{e}", c.line, c.script));
            }
        }
    }
    errors
}

/// bash running `script` in `cwd` with none of the test's environment but
/// PATH and HOME: what a fresh shell or a CI runner gives.
fn bash(script: &str, cwd: &Path, path: &str, home: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-c", script])
        .current_dir(cwd)
        .env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .env("TERM", "dumb");
    cmd
}

/// kiln, then `make deps`'s tools, then the test's PATH.
fn kiln_path() -> String {
    format!(
        "{}:{}:{}",
        Path::new(env!("CARGO_BIN_EXE_kiln"))
            .parent()
            .unwrap()
            .display(),
        root().join(".deps/root/usr/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs one command the way a user's shell would; Err says how it differed.
fn run_command(world: &World, work: &Path, c: &Command) -> Result<(), String> {
    let script = format!("exec 2>&1\n{}", c.script);
    let mut cmd = bash(&script, work, &world.path, &work.join("home"));
    cmd.env("KILN_REGISTRY", &world.registry)
        // A CI log's progress lines come with time; the docs show none.
        .env("KILN_PROGRESS_SECS", "3600");
    let o = run_bounded(&mut cmd, 600);
    let actual = String::from_utf8_lossy(&o.stdout).into_owned();
    let status = o.status.code().unwrap_or(-1);
    if status != c.status {
        return Err(format!(
            "exit status {status}, the doc says {}; it printed:\n{actual}",
            c.status
        ));
    }
    let Some(expected) = &c.expected else {
        return Ok(());
    };
    snapbox::Assert::new()
        .action(snapbox::assert::Action::Verify)
        .palette(snapbox::report::Palette::plain())
        .try_eq(
            Some(&"kiln"),
            snapbox::Data::text(actual),
            snapbox::Data::text(expected.clone()),
        )
        .map_err(|e| e.to_string())
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    let mut stack = vec![root().join("docs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn world(release: &Path) -> (Registry, World) {
    let registry = Registry::start().expect("registry");
    let images = root().join("images/demo.yaml");
    Demo::standard(&images, release)
        .seed(&registry)
        .expect("seed the demo registry");
    let world = World {
        registry: registry.addr.clone(),
        release: release.to_path_buf(),
        path: kiln_path(),
    };
    (registry, world)
}

#[test]
fn every_example_in_the_docs_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let (_registry, world) = world(&dir.path().join("release"));
    let mut pages = pages();
    assert!(pages.len() > 10, "docs/ pages: {pages:?}");
    // KILN_DOCS=docs/air-gap.md runs that page alone (for writers).
    if let Ok(only) = std::env::var("KILN_DOCS") {
        pages.retain(|p| p.ends_with(&only));
    }
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = pages
            .iter()
            .map(|p| {
                let world = &world;
                s.spawn(move || {
                    let name = p.strip_prefix(root()).unwrap().display().to_string();
                    run_page(world, &name, &std::fs::read_to_string(p).unwrap())
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(errors.is_empty(), "\n{}", errors.join("\n\n"));
}

/// The runner catches drift: an output that kiln no longer prints, a
/// status it no longer exits with, and a command example nobody runs.
#[test]
fn a_page_that_drifted_from_kiln_fails() {
    let dir = tempfile::tempdir().unwrap();
    let world = World {
        registry: "127.0.0.1:9".into(),
        release: dir.path().join("release"),
        path: kiln_path(),
    };
    let good =
        "# p\n\n```console\n$ kiln --version\nkiln [..]\n$ kiln build --bogus\n? 2\n...\n```\n";
    assert_eq!(run_page(&world, "good.md", good), Vec::<String>::new());
    let wrong_output = "```console\n$ kiln --version\nkiln 0.0.0-not-this\n```\n";
    let e = run_page(&world, "out.md", wrong_output);
    assert!(
        e.len() == 1 && e[0].starts_with("out.md:2: $ kiln --version"),
        "{e:?}"
    );
    let wrong_status = "```console\n$ kiln build --bogus\n```\n";
    let e = run_page(&world, "st.md", wrong_status);
    assert!(
        e.len() == 1 && e[0].contains("exit status 2, the doc says 0"),
        "{e:?}"
    );
    let hidden = "```sh\nkiln build --manifest m.yaml --rootfs r\n```\n\n```\nkiln inspect --rootfs r\n```\n";
    let e = run_page(&world, "h.md", hidden);
    assert_eq!(e.len(), 2, "{e:?}");
    let marked = "<!-- not run: needs the internet -->\n```sh\nkiln build --manifest m.yaml --rootfs r\n```\n";
    assert_eq!(run_page(&world, "m.md", marked), Vec::<String>::new());
    let empty_reason = "<!-- not run: -->\n```sh\nkiln x\n```\n";
    assert_eq!(run_page(&world, "r.md", empty_reason).len(), 1);
}

#[test]
fn console_blocks_read_as_commands_and_their_output() {
    let c = commands(10, "$ a \\\n  b\nout 1\nout 2\n$ c\n? 2\n$ d\n");
    assert_eq!(
        c,
        vec![
            Command {
                line: 11,
                script: "a \\\n  b".into(),
                status: 0,
                expected: Some("out 1\nout 2\n".into()),
            },
            Command {
                line: 15,
                script: "c".into(),
                status: 2,
                expected: None,
            },
            Command {
                line: 17,
                script: "d".into(),
                status: 0,
                expected: None,
            },
        ]
    );
}

/// The blocks of docs/ci.md written to files, by name.
fn ci_files() -> std::collections::BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("docs/ci.md")).unwrap();
    blocks(&text)
        .into_iter()
        .filter_map(|b| {
            let d = b.directive?;
            Some((d.strip_prefix("file:")?.trim().to_string(), b.text))
        })
        .collect()
}

/// The pipeline's steps that the test does not run, and why.
const NOT_RUN: &[(&str, &str)] = &[
    ("install", "it fetches kiln and packages from the internet"),
    ("login", "it needs the CI's secrets"),
];

/// A GitHub job's `run:` steps, in order, without [`NOT_RUN`]'s.
fn github_runs(job: &serde_yaml_ng::Value) -> Vec<String> {
    let steps = job["steps"].as_sequence().expect("steps");
    for (id, _) in NOT_RUN {
        assert!(
            steps.iter().any(|s| s["id"].as_str() == Some(id)),
            "no step `{id}`: update NOT_RUN"
        );
    }
    steps
        .iter()
        .filter(|s| !NOT_RUN.iter().any(|(id, _)| s["id"].as_str() == Some(id)))
        .filter_map(|s| s["run"].as_str())
        .map(|r| r.trim().to_string())
        .collect()
}

/// docs/ci.md's pipeline, its shell steps run as written: the lock made by
/// lock.sh, the build job for linux/amd64 and linux/arm64 (the one that
/// is not this machine's under QEMU, as a native runner would run it), the
/// index job joining them; the GitLab jobs hold the same commands.
#[test]
fn the_release_pipeline_runs_as_written() {
    let files = ci_files();
    let gh: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&files[".github/workflows/node-image.yml"]).unwrap();
    let gl: serde_yaml_ng::Value = serde_yaml_ng::from_str(&files[".gitlab-ci.yml"]).unwrap();
    let build = github_runs(&gh["jobs"]["build"]);
    let index = github_runs(&gh["jobs"]["index"]);
    // GitLab runs the same commands.
    let script = |job: &str| -> Vec<String> {
        gl[job]["script"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().trim().to_string())
            .collect()
    };
    assert_eq!(
        script("build"),
        build,
        "GitLab's build job differs from GitHub's"
    );
    assert_eq!(
        script("index"),
        index,
        "GitLab's index job differs from GitHub's"
    );

    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let (registry, world) = world(&release);
    let reg = world.registry.clone();
    let work = dir.path().join("repo");
    std::fs::create_dir_all(&work).unwrap();
    // The repository's files: the manifest kind nodes start from, a policy
    // with a key of the test's own (the real one wants Sigstore's trust
    // root and registry.k8s.io's signatures), its images signed by cosign.
    std::fs::copy(
        root().join("manifests/kind-v1.31.yaml"),
        work.join("node.yaml"),
    )
    .unwrap();
    std::fs::write(work.join("lock.sh"), &files["lock.sh"]).unwrap();
    let home = dir.path().join("cosign");
    std::fs::create_dir_all(&home).unwrap();
    let cosign = |args: &[&str]| {
        let o = run_bounded(kiln_testkit::tools::cosign(&home).args(args), 120);
        assert!(
            o.status.success(),
            "cosign {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    cosign(&["generate-key-pair", "--output-key-prefix", "release"]);
    std::fs::copy(home.join("release.pub"), work.join("release.pub")).unwrap();
    // The pipeline's own signing key: its public half in the repository,
    // its private half the CI secret NODE_SIGNING_KEY.
    let signing = kiln_testkit::sigstore::node_signing(&dir.path().join("signing"), "unused");
    std::fs::copy(&signing.public, work.join("node-signing.pub")).unwrap();
    let signing_key = std::fs::read_to_string(&signing.key).unwrap();
    std::fs::write(
        work.join("policy.yaml"),
        format!("apiVersion: kiln/v1\nkind: SignaturePolicy\nimages:\n- match: registry.k8s.io\n  keys: [release.pub]\n- match: {reg}/kindest/node\n  keys: [node-signing.pub]\n- match: \"*\"\n  unsigned: true\n"),
    )
    .unwrap();
    for repo in ["pause:3.10", "etcd:3.5.15-0", "coredns/coredns:v1.11.3"] {
        cosign(&[
            "sign",
            "--key",
            "release.key",
            "--tlog-upload=false",
            "--allow-http-registry",
            "--allow-insecure-registry",
            "--yes",
            &format!("{reg}/{repo}"),
        ]);
    }
    // The workflow's variables, as the test sets them: every one the
    // workflow has, none it lacks.
    let vars: Vec<(&str, String)> = vec![
        ("NODE", format!("{reg}/kindest/node")),
        ("VERSION", "v1.31.2".into()),
        // The first release: it follows nothing.
        ("PREVIOUS", String::new()),
        ("BASE", format!("{reg}/kindest/base:demo")),
        (
            "KUBERNETES",
            format!(
                "{}/kubernetes-server-linux-{{arch}}.tar.gz",
                release.display()
            ),
        ),
        (
            "MIRRORS",
            format!("--mirror registry.k8s.io=http://{reg} --mirror docker.io=http://{reg}"),
        ),
    ];
    let names: Vec<&str> = gh["env"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(names, vars.iter().map(|(k, _)| *k).collect::<Vec<_>>());
    let path = format!(
        "{}:{}",
        kiln_testkit::tools::qemu_dir().display(),
        world.path
    );
    let run = |what: &str, script: &str, extra: &[(&str, &str)]| {
        let script = format!("set -euo pipefail\n{script}");
        let mut cmd = bash(&script, &work, &path, &dir.path().join("home"));
        for (k, v) in &vars {
            cmd.env(k, v);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.env("NODE_SIGNING_KEY", &signing_key);
        let o = run_bounded(&mut cmd, 900);
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        eprintln!("--- {what}\n{out}");
        assert!(o.status.success(), "{what}: {script}\n{out}");
        out
    };
    run("lock.sh", &files["lock.sh"], &[]);
    let matrix = gh["jobs"]["build"]["strategy"]["matrix"]["include"]
        .as_sequence()
        .unwrap();
    let job_env = gh["jobs"]["build"]["env"].as_mapping().unwrap();
    let mut platforms = Vec::new();
    for entry in matrix {
        // The job's env from the matrix: `${{ matrix.KEY }}` is the entry's KEY.
        let env: Vec<(String, String)> = job_env
            .iter()
            .map(|(k, v)| {
                let v = v.as_str().unwrap();
                let key = v
                    .strip_prefix("${{ matrix.")
                    .and_then(|v| v.strip_suffix(" }}"))
                    .unwrap_or_else(|| panic!("{v}: only matrix values are known here"));
                (
                    k.as_str().unwrap().to_string(),
                    entry[key].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        platforms.push(entry["platform"].as_str().unwrap().to_string());
        for step in &build {
            let out = run(&format!("build {env:?}"), step, &env);
            if step.contains("kiln build") {
                assert!(
                    out.contains("ok    every bundled image is present"),
                    "{out}"
                );
            }
        }
        let arch = entry["arch"].as_str().unwrap();
        for f in [
            format!("sbom-{arch}.spdx.json"),
            format!("provenance-{arch}.json"),
        ] {
            let doc: serde_json::Value =
                serde_json::from_slice(&std::fs::read(work.join(&f)).unwrap()).unwrap();
            assert!(doc.is_object(), "{f}");
        }
    }
    for step in &index {
        run("index", step, &[]);
    }
    // The next release on a fresh runner (a HOME and cache of its own), as
    // a CI runner is: lock.sh locks the release before it (PREVIOUS) by
    // digest, and the build takes the layers it shares by digest from that
    // image's record instead of fetching and compressing them.
    let next: &[(&str, &str)] = &[("PREVIOUS", "v1.31.2"), ("VERSION", "v1.31.2-r2")];
    run(
        "lock.sh, following the last release",
        &files["lock.sh"],
        next,
    );
    let host = matrix
        .iter()
        .find(|e| e["platform"].as_str() == Some(host_platform().as_str()))
        .unwrap();
    let fresh_home = dir.path().join("fresh-home");
    std::fs::create_dir_all(&fresh_home).unwrap();
    let fresh_cache = dir.path().join("fresh-cache");
    let mut env: Vec<(&str, &str)> = vec![
        ("PLATFORM", host["platform"].as_str().unwrap()),
        ("ARCH", host["arch"].as_str().unwrap()),
        ("HOME", fresh_home.to_str().unwrap()),
        ("KILN_CACHE_DIR", fresh_cache.to_str().unwrap()),
    ];
    env.extend(next);
    let step = build.iter().find(|s| s.contains("kiln build")).unwrap();
    let out = run("build, a fresh runner, the next release", step, &env);
    assert!(
        out.contains("taken by digest from the previous image"),
        "{out}"
    );
    assert!(
        out.contains("signed (cosign signature verified: key node-signing.pub)"),
        "{out}"
    );
    // The registry holds one index naming both platforms.
    let r = registry
        .get(
            "/v2/kindest/node/manifests/v1.31.2",
            "application/vnd.oci.image.index.v1+json",
        )
        .unwrap();
    let index: serde_json::Value = serde_json::from_slice(&r.bytes().unwrap()).unwrap();
    let mut got: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            Some(format!(
                "{}/{}",
                m["platform"]["os"].as_str()?,
                m["platform"]["architecture"].as_str()?
            ))
        })
        .collect();
    got.sort();
    platforms.sort();
    assert_eq!(got, platforms);
}

/// Every link from one page to another file of the repository resolves,
/// and every page under docs/ is on the README's map.
#[test]
fn every_link_between_pages_resolves() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut errors = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for event in Parser::new(&text) {
            let Event::Start(Tag::Link { dest_url, .. }) = event else {
                continue;
            };
            if dest_url.contains("://") || dest_url.starts_with('#') {
                continue;
            }
            let file = dest_url.split('#').next().unwrap();
            if !page.parent().unwrap().join(file).exists() {
                errors.push(format!("{}: {dest_url} does not exist", page.display()));
            }
        }
        let rel = page.strip_prefix(root()).unwrap().display().to_string();
        if rel != "README.md" && !readme.contains(&format!("]({rel})")) {
            errors.push(format!("{rel} is not on the README's map"));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// Every default the docs quote for a flag, `--FLAG …` followed closely by
/// "(default N" or "defaults to N", is a default the CLI states for that
/// flag: clap's own, or "default: N" / "default N" in its help (issue 63:
/// docs/node-images.md said 25 where kiln keeps 50).
#[test]
fn every_default_the_docs_quote_is_the_clis() {
    // flag -> every default stated for it, by any subcommand.
    let mut stated: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    fn walk(c: &clap::Command, stated: &mut std::collections::BTreeMap<String, Vec<String>>) {
        for a in c.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            let e = stated.entry(format!("--{long}")).or_default();
            e.extend(
                a.get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned()),
            );
            let help = [a.get_help(), a.get_long_help()]
                .into_iter()
                .flatten()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join(" ");
            for (i, _) in help.match_indices("default") {
                if let Some(v) = value_after(&help[i + "default".len()..]) {
                    e.push(v);
                }
            }
        }
        for s in c.get_subcommands() {
            walk(s, stated);
        }
    }
    walk(&kiln::cli::command(), &mut stated);
    let mut checked = 0;
    let mut wrong = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for pat in ["(default", "defaults to"] {
            for (i, _) in text.match_indices(pat) {
                let before = &text[i.saturating_sub(160)..i];
                let Some(at) = before.rfind("`--") else {
                    continue;
                };
                let flag: String = before[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                let Some(value) = value_after(&text[i + pat.len()..]) else {
                    continue;
                };
                checked += 1;
                let known = stated.get(&flag).cloned().unwrap_or_default();
                if !known.contains(&value) {
                    wrong.push(format!(
                        "{}: {flag} default {value:?}; the CLI says {known:?}",
                        page.display()
                    ));
                }
            }
        }
    }
    eprintln!("{checked} quoted defaults checked");
    assert!(checked > 0);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The value after "default": `: N`, ` N`, ` to N`, `**N**`, `` `N` ``;
/// `None` when no value follows (a sentence, not a quote).
fn value_after(s: &str) -> Option<String> {
    let s = s.trim_start_matches(':').trim_start();
    let s = s.strip_prefix("to ").unwrap_or(s).trim_start();
    let s = s.trim_start_matches(['*', '`']);
    let v: String = s
        .chars()
        .take_while(|c| !matches!(c, '*' | '`' | ',' | ';' | ')' | ']' | ' ' | '\n'))
        .collect();
    (!v.is_empty() && v.chars().next().is_some_and(|c| c.is_ascii_digit())).then_some(v)
}
