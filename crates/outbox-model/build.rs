//! Fingerprints the migrations tree so that test templates and tools can tell
//! one schema from another without connecting to a database.

use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    // Read when the script runs, not when it is compiled: cargo reuses one
    // compiled build script for every checkout of this package that shares
    // a target directory, and a path fixed at compile time would fingerprint
    // the checkout that compiled it.
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("migrations");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files = Vec::new();
    collect(&dir, &mut files);
    files.sort();
    // FNV-1a over relative path and content: stable across machines.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        let rel = file
            .strip_prefix(&dir)
            .unwrap_or(file)
            .to_string_lossy()
            .into_owned();
        let content = std::fs::read(file).unwrap_or_default();
        for byte in rel
            .as_bytes()
            .iter()
            .chain([0u8].iter())
            .chain(content.iter())
        {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=OUTBOX_MIGRATIONS_FINGERPRINT={hash:016x}");
}
