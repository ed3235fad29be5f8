//! Names the compression libraries kiln is built with, from Cargo.lock, so a
//! cached compressed layer is keyed by the library that made its bytes
//! (`domain::node_image::layer::Compression::identity`): another zlib-rs
//! may deflate the same tar to other bytes.

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    for (krate, var) in [("zlib-rs", "KILN_ZLIB_RS"), ("flate2", "KILN_FLATE2")] {
        let version = version_of(&lock, krate).unwrap_or_else(|| "unknown".into());
        println!("cargo:rustc-env={var}={version}");
    }
}

/// The version Cargo.lock pins for `krate` (its first entry).
fn version_of(lock: &str, krate: &str) -> Option<String> {
    let at = lock.find(&format!("name = \"{krate}\"\n"))?;
    let rest = &lock[at..];
    let line = rest.lines().nth(1)?;
    Some(
        line.strip_prefix("version = \"")?
            .trim_end_matches('"')
            .to_string(),
    )
}
