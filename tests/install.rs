//! `make install` as packagers run it (PREFIX, DESTDIR): the binary, a man
//! page per command and completions for bash, zsh and fish, each naming
//! every subcommand and flag the CLI defines.

use std::path::Path;

/// Every (subcommand path, long flag) of the CLI, walked from its definition.
fn flags(cmd: &clap::Command, path: &[String], out: &mut Vec<(Vec<String>, String)>) {
    for a in cmd.get_arguments() {
        if let Some(l) = a.get_long() {
            out.push((path.to_vec(), l.to_string()));
        }
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let mut p = path.to_vec();
        p.push(sub.get_name().to_string());
        out.push((p.clone(), String::new()));
        flags(sub, &p, out);
    }
}

#[test]
fn make_install_puts_the_binary_man_pages_and_completions_in_place() {
    let dest = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("make")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["-s", "install-files", "PREFIX=/usr"])
        .arg(format!("KILN={}", env!("CARGO_BIN_EXE_kiln")))
        .arg(format!("DESTDIR={}", dest.path().display()))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "make install-files: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let usr = dest.path().join("usr");
    let bin = usr.join("bin/kiln");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&bin).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o755);
    let read =
        |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let bash = read(&usr.join("share/bash-completion/completions/kiln"));
    let zsh = read(&usr.join("share/zsh/site-functions/_kiln"));
    let fish = read(&usr.join("share/fish/vendor_completions.d/kiln.fish"));
    let mut all = Vec::new();
    flags(&kiln::cli::command(), &[], &mut all);
    assert!(all.len() > 100, "{} flags", all.len());
    for (path, flag) in &all {
        let page = if path.is_empty() {
            "kiln.1".to_string()
        } else {
            format!("kiln-{}.1", path.join("-"))
        };
        let man = read(&usr.join("share/man/man1").join(&page));
        if flag.is_empty() {
            let name = path.last().unwrap();
            for (shell, text) in [("bash", &bash), ("zsh", &zsh), ("fish", &fish)] {
                assert!(
                    text.contains(name.as_str()),
                    "{shell} completion lacks {name}"
                );
            }
            continue;
        }
        // roff escapes the dashes: \-\-flag.
        let roff = format!("\\-\\-{}", flag.replace('-', "\\-"));
        assert!(man.contains(&roff), "{page} lacks --{flag}");
        let long = format!("--{flag}");
        assert!(
            bash.contains(&long),
            "bash completion lacks {long} ({path:?})"
        );
        assert!(
            zsh.contains(&long),
            "zsh completion lacks {long} ({path:?})"
        );
        assert!(
            fish.contains(&format!("-l {flag}")),
            "fish completion lacks {long} ({path:?})"
        );
    }
    // The pages read as man pages: man's own formatter, where installed.
    if std::path::Path::new("/usr/bin/man").exists() {
        let o = std::process::Command::new("man")
            .arg("-l")
            .arg(usr.join("share/man/man1/kiln-build.1"))
            .env("MANPAGER", "cat")
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("--manifest"));
    }
}

/// `kiln doctor` says what is missing and how to get it, and passes once
/// the one thing kiln cannot work without is there.
#[test]
fn doctor_names_what_is_missing_and_how_to_get_it() {
    let home = tempfile::tempdir().unwrap();
    let run = |path: &str, extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("doctor")
            .args(extra)
            .env("PATH", path)
            .env("HOME", home.path())
            .env("XDG_CACHE_HOME", home.path().join("cache"))
            .output()
            .unwrap()
    };
    // No containerd anywhere on this PATH.
    let empty = home.path().join("empty-bin");
    std::fs::create_dir(&empty).unwrap();
    let o = run(empty.to_str().unwrap(), &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("MISSING containerd: not on PATH")
            && err.contains("apt-get install containerd")
            && err.contains("missing runc")
            && err.contains("made by the first build"),
        "{err}"
    );
    assert!(
        !home.path().join("cache").exists(),
        "doctor created the cache"
    );
    // With the containerd `make deps` installs: ready.
    let containerd = kiln_testkit::tools::containerd();
    let o = run(
        empty.to_str().unwrap(),
        &["--containerd", containerd.to_str().unwrap(), "--json"],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["ready"], true);
    assert_eq!(r["checks"][0]["name"], "containerd");
    assert!(
        r["checks"][0]["found"]
            .as_str()
            .unwrap()
            .starts_with("1.7."),
        "{r}"
    );
}
