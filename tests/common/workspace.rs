//! The workspace's crate directories, for the tests that read every crate's files
//! (`tests/infra.rs`, `tests/layout.rs`).

use std::path::PathBuf;

/// The workers, the bus crates and the engine binary (not the harness at the root), sorted.
pub fn crate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = ["functions", "crates"]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.push("engine-gateway".into());
    dirs.sort();
    dirs
}
