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
//!   A page's blocks run in order and share the directory.
//! - `<!-- file: PATH -->` before any block writes the block to PATH first.
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

/// Runs one command the way a user's shell would; Err says how it differed.
fn run_command(world: &World, work: &Path, c: &Command) -> Result<(), String> {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c")
        .arg(format!("exec 2>&1\n{}", c.script))
        .current_dir(work)
        .env_clear()
        .env("PATH", &world.path)
        .env("HOME", work.join("home"))
        .env("KILN_REGISTRY", &world.registry)
        .env("NO_COLOR", "1")
        .env("TERM", "dumb")
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
    let kiln = PathBuf::from(env!("CARGO_BIN_EXE_kiln"));
    let path = format!(
        "{}:{}:{}",
        kiln.parent().unwrap().display(),
        root().join(".deps/root/usr/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let world = World {
        registry: registry.addr.clone(),
        release: release.to_path_buf(),
        path,
    };
    (registry, world)
}

#[test]
fn every_example_in_the_docs_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let (_registry, world) = world(&dir.path().join("release"));
    let pages = pages();
    assert!(pages.len() > 10, "docs/ pages: {pages:?}");
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
        path: format!(
            "{}:{}",
            Path::new(env!("CARGO_BIN_EXE_kiln"))
                .parent()
                .unwrap()
                .display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    };
    let good = "# p\n\n```console\n$ kiln --version\nkiln [..]\n$ kiln build --bogus\n? 2\n...\n```\n";
    assert_eq!(run_page(&world, "good.md", good), Vec::<String>::new());
    let wrong_output = "```console\n$ kiln --version\nkiln 0.0.0-not-this\n```\n";
    let e = run_page(&world, "out.md", wrong_output);
    assert!(e.len() == 1 && e[0].starts_with("out.md:2: $ kiln --version"), "{e:?}");
    let wrong_status = "```console\n$ kiln build --bogus\n```\n";
    let e = run_page(&world, "st.md", wrong_status);
    assert!(e.len() == 1 && e[0].contains("exit status 2, the doc says 0"), "{e:?}");
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
