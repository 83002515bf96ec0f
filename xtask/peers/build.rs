//! Reads the resolved versions of the peer crates from this crate's own
//! Cargo.lock so the benchmark output names exactly what was measured.

use std::fs;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = fs::read_to_string("Cargo.lock").unwrap_or_default();
    for (krate, var) in [
        ("graphile_worker", "PEER_VERSION_GRAPHILE_WORKER"),
        ("apalis", "PEER_VERSION_APALIS"),
        ("apalis-postgres", "PEER_VERSION_APALIS_POSTGRES"),
    ] {
        let version = locked_version(&lock, krate).unwrap_or_else(|| "unknown".to_owned());
        println!("cargo:rustc-env={var}={version}");
    }
}

/// Finds `version = "..."` of the `[[package]]` entry named `krate`.
fn locked_version(lock: &str, krate: &str) -> Option<String> {
    let wanted = format!("name = \"{krate}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let next = lines.next()?.trim();
            let version = next.strip_prefix("version = \"")?.strip_suffix('"')?;
            return Some(version.to_owned());
        }
    }
    None
}
