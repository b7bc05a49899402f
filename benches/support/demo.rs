//! One `shareflow demo` run (the binary built with the bench's profile) and its `--json`
//! summary. Include with `#[path = "support/demo.rs"] mod demo;`.

/// What one run printed and how it ended.
pub(crate) struct DemoRun {
    /// The process exited 0.
    pub(crate) success: bool,
    /// The summary: the JSON object on its last line.
    pub(crate) summary: serde_json::Value,
}

/// Runs `shareflow demo --dir <fresh temporary dir> --json ARGS`; panics, with what it
/// printed, when it printed no summary.
pub(crate) fn run(args: &[&str]) -> DemoRun {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .arg("demo")
        .arg("--dir")
        .arg(dir.path())
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| {
        panic!("no summary from shareflow demo {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr))
    });
    DemoRun { success: out.status.success(), summary }
}
