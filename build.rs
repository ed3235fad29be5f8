//! Names the libraries that make kiln's layer bytes, from Cargo.lock, so a
//! layer is keyed by what made it (`domain::node_image::layer`: the tar
//! writer's `LAYER_FORMAT`, `Compression::identity`): another zlib-rs may
//! deflate the same tar to other bytes, another `tar` write other headers.

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    for (krate, var) in [
        ("zlib-rs", "KILN_ZLIB_RS"),
        ("flate2", "KILN_FLATE2"),
        ("tar", "KILN_TAR"),
    ] {
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
