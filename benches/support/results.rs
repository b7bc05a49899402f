//! Benchmark results as JSON lines, one file per benchmark, for `scripts/plots`.
//! Include with `#[path = "support/results.rs"] mod results;`.
//!
//! A run replaces `docs/results/<bench>.jsonl` (or `$SHAREFLOW_RESULTS_DIR/<bench>.jsonl`).
//! Its first line says what ran and when, so a chart names the run it came from; every
//! later line is one measurement with a `"kind"` field.

use std::io::Write;
use std::path::PathBuf;

/// Where a benchmark writes its measurements.
pub(crate) struct Results {
    path: PathBuf,
    file: std::fs::File,
}

impl Results {
    /// Starts (truncates) the results file of `bench`, with `args` recorded in its header.
    pub(crate) fn create(bench: &str, args: serde_json::Value) -> Self {
        let dir = std::env::var_os("SHAREFLOW_RESULTS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs").join("results"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("results directory {}: {e}", dir.display()));
        let path = dir.join(format!("{bench}.jsonl"));
        let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("results file {}: {e}", path.display()));
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let mut results = Self { path, file };
        results.record(serde_json::json!({
            "kind": "run",
            "bench": bench,
            "args": args,
            "started_unix_s": started,
            "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        }));
        results
    }

    /// Appends one measurement (a JSON object with a `"kind"`), flushed at once so a long
    /// run that is stopped keeps what it measured.
    pub(crate) fn record(&mut self, line: serde_json::Value) {
        let mut text = line.to_string();
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .unwrap_or_else(|e| panic!("results file {}: {e}", self.path.display()));
    }
}
