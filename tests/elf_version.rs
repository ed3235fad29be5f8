//! The node's containerd version is read from its ELF file, never by running
//! it: checked against `--version` of the real 1.7 and 2.x binaries.

use kiln::adapters::version::Version;

fn both(bin: std::path::PathBuf) {
    let file = std::fs::File::open(&bin).unwrap();
    let read = Version::of_elf(&file).unwrap();
    let ran = Version::by_running(&bin).unwrap();
    assert_eq!(read, ran, "{}", bin.display());
}

#[test]
fn containerd_1_7_version_from_its_elf() {
    both(kiln_testkit::tools::containerd());
}

#[test]
fn containerd_2_version_from_its_elf() {
    both(kiln_testkit::tools::containerd2());
}

#[test]
fn other_files_are_not_containerd() {
    let sh = std::fs::File::open("/bin/sh").unwrap();
    assert!(Version::of_elf(&sh).is_err());
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), "#!/bin/sh\necho containerd 9.9.9\n").unwrap();
    let e = Version::of_elf(&std::fs::File::open(script.path()).unwrap()).unwrap_err();
    assert!(e.to_string().contains("not an ELF"), "{e}");
}
