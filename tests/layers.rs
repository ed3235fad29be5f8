//! The house's shape, checked from the code's own imports (ARCHITECTURE.md):
//! each folder of `src/` is a layer that imports only the layers below it,
//! and no file imports itself round a circle. Reads `crate::` paths
//! (grouped `use crate::{...}` too) and `super::` paths as text, the way
//! rustc resolves them to files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top to bottom. A file may import its own layer's files and any layer
/// after its own.
const LAYERS: &[&str] = &[
    "cli",
    "ops",
    "domain",
    "engine",
    "sink",
    "source",
    "adapters",
    "primitives",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file (`src/sink/containerd/mod.rs` → sink::containerd).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The file a module path names, trying the longest prefix first.
fn file_of(path: &[String], modules: &BTreeMap<Vec<String>, PathBuf>) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains_key(p))
}

/// Every path a file names from this crate, as module paths: `crate::a::b`,
/// each item of `use crate::{a::b, c}`, and `super::x` from the file's
/// module. Comment lines and code after `#[cfg(test)]` are left out (tests
/// may reach anywhere).
fn imports(text: &str, me: &[String]) -> Vec<Vec<String>> {
    // Comments (doc links among them) are no imports.
    let text: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let text = text.as_str();
    let mut out = Vec::new();
    let ident = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|p| {
                p.trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|p| !p.is_empty())
            .collect()
    };
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with('$') {
            continue;
        }
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Items at the group's first level.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(ident(&item));
        } else {
            out.push(ident(rest));
        }
    }
    // `super::` is the parent module: `a` from `a/b.rs`, the folder above
    // from `a/mod.rs` (whose module path is already `a`).
    let parent: Vec<String> = me[..me.len().saturating_sub(1)].to_vec();
    for (i, _) in text.match_indices("super::") {
        if text[..i].ends_with("::") {
            continue;
        }
        let mut p = parent.clone();
        p.extend(ident(&text[i + "super::".len()..]));
        out.push(p);
    }
    out.retain(|p| !p.is_empty());
    out
}

struct House {
    /// file (as module path) → the files it imports.
    arrows: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn house() -> House {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let modules: BTreeMap<Vec<String>, PathBuf> = all
        .iter()
        .filter(|f| !f.ends_with("main.rs") && !f.ends_with("lib.rs"))
        .map(|f| (module_of(f), f.clone()))
        .collect();
    let mut arrows = BTreeMap::new();
    for (me, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let to: BTreeSet<Vec<String>> = imports(&text, me)
            .iter()
            .filter_map(|p| file_of(p, &modules))
            .filter(|t| t != me)
            .collect();
        arrows.insert(me.clone(), to);
    }
    House { arrows }
}

fn layer(module: &[String]) -> usize {
    LAYERS
        .iter()
        .position(|l| *l == module[0])
        .unwrap_or_else(|| {
            panic!(
                "src/{} is in no layer: add it to ARCHITECTURE.md and LAYERS",
                module[0]
            )
        })
}

#[test]
fn every_layer_imports_only_the_layers_below_it() {
    let house = house();
    let mut up = Vec::new();
    for (from, tos) in &house.arrows {
        for to in tos {
            if layer(to) < layer(from) {
                up.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports that run up a layer:\n{}",
        up.join("\n")
    );
    // The check reads what it should: the engine imports sinks and
    // sources, the command line the ops.
    let has = |a: &str, b: &str| {
        house.arrows.iter().any(|(f, t)| {
            f.join("::").starts_with(a) && t.iter().any(|t| t.join("::").starts_with(b))
        })
    };
    assert!(has("engine::copy", "sink"));
    assert!(has("engine::copy", "source"));
    assert!(has("cli", "ops"));
    // `super::` paths resolve too.
    assert!(has(
        "adapters::registry::pull",
        "adapters::registry::transport"
    ));
}

#[test]
fn no_file_imports_itself_round_a_circle() {
    let house = house();
    // Depth-first search; a grey node met again closes a circle.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        White,
        Grey,
        Black,
    }
    let names: Vec<&Vec<String>> = house.arrows.keys().collect();
    let mut mark: BTreeMap<&Vec<String>, Mark> = names.iter().map(|n| (*n, Mark::White)).collect();
    fn visit<'a>(
        n: &'a Vec<String>,
        house: &'a House,
        mark: &mut BTreeMap<&'a Vec<String>, Mark>,
        path: &mut Vec<&'a Vec<String>>,
    ) -> Option<String> {
        mark.insert(n, Mark::Grey);
        path.push(n);
        for t in &house.arrows[n] {
            match mark[t] {
                Mark::Grey => {
                    let at = path.iter().position(|p| *p == t).unwrap();
                    let mut c: Vec<String> = path[at..].iter().map(|p| p.join("::")).collect();
                    c.push(t.join("::"));
                    return Some(c.join(" -> "));
                }
                Mark::White => {
                    if let Some(c) = visit(t, house, mark, path) {
                        return Some(c);
                    }
                }
                Mark::Black => {}
            }
        }
        path.pop();
        mark.insert(n, Mark::Black);
        None
    }
    for n in names {
        if mark[n] == Mark::White {
            if let Some(c) = visit(n, &house, &mut mark, &mut Vec::new()) {
                panic!("an import circle: {c}");
            }
        }
    }
}

/// kiln's own directories outside a rootfs are made and opened only by
/// `primitives::owned` (issue 45): no other file makes a temporary
/// directory by itself (code after `#[cfg(test)]` left out).
#[test]
fn only_the_owned_module_makes_kilns_directories() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut offenders = Vec::new();
    for f in all {
        // A `tests.rs` is a unit-test module (`#[cfg(test)] mod tests;`).
        if f.to_string_lossy().contains("primitives/owned/") || f.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            let l = line.trim_start();
            if l.starts_with("//") {
                continue;
            }
            if [
                ".tempdir()",
                "tempdir_in(",
                "TempDir::new",
                "tempfile::tempdir(",
            ]
            .iter()
            .any(|p| l.contains(p))
            {
                offenders.push(format!("{}:{}: {l}", f.display(), n + 1));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "make kiln's directories through primitives::owned (work_dir, OwnedDir):\n{}",
        offenders.join("\n")
    );
}

/// Rooms stay small (issue 47): no file of kiln's or its testkit's over 600
/// lines; one that grows is split along the concerns it holds.
#[test]
fn no_room_is_over_600_lines() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("testkit/src"),
        &mut all,
    );
    let big: Vec<String> = all
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 600).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(
        big.is_empty(),
        "split these along their concerns:\n{}",
        big.join("\n")
    );
}
