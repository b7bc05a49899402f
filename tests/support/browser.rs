//! Headless Chromium for the dashboard's browser test, run so that it cannot hang a
//! test: a fresh profile per run, its output to files (not pipes, which a lingering
//! helper process of the browser could hold open forever), its own process group,
//! and a time limit after which the whole group is killed by its id. The test that
//! includes it includes `support/processes.rs` as `processes` too.
#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one browser run may take before it is killed.
pub const LIMIT: Duration = Duration::from_secs(90);

/// The flags of every run: headless, no sandbox (tests run as root in CI), no GPU, no
/// first-run work, no crash reporter (a helper process that may outlive the browser),
/// nothing from the network beyond the page.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--virtual-time-budget=4000",
];

/// A line to the test's stderr that the test harness does not capture, so that a run
/// stopped from outside still shows how far it got.
pub fn progress(line: &str) {
    let _ = writeln!(std::io::stderr(), "[browser test] {line}");
}

/// One run of `browser` on `url` with `extra` flags, in a scratch directory under
/// `scratch`: its stdout, or why it failed (exit status or time limit, with the tail of
/// its stderr).
pub fn run(browser: &str, scratch: &Path, extra: &[String], url: &str) -> Result<String, String> {
    let dir = tempfile::tempdir_in(scratch).map_err(|e| format!("scratch dir: {e}"))?;
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let profile = dir.path().join("profile");
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(browser)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(file(&out_path)?)
            .stderr(file(&err_path)?)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {browser}: {e}"))?
    };
    // Waiting is the tests' own bounded wait; `None` when the limit passed.
    let status = crate::processes::wait(&mut child, LIMIT);
    // The group goes in every case: the browser's helpers may outlive it.
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).stderr(Stdio::null()).status();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let tail: String =
        stderr.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    match status {
        Some(s) if s.success() => std::fs::read_to_string(&out_path).map_err(|e| format!("its output: {e}")),
        Some(s) => Err(format!("{browser} exited with {s}; its stderr ends:\n{tail}")),
        None => {
            Err(format!("{browser} did not finish in {} s and was killed; its stderr ends:\n{tail}", LIMIT.as_secs()))
        }
    }
}

/// [`run`], tried up to `attempts` times: a browser on a loaded machine sometimes fails
/// to start. Every failure is printed; the last one is returned.
pub fn run_retrying(
    browser: &str,
    scratch: &Path,
    extra: &[String],
    url: &str,
    attempts: u32,
) -> Result<String, String> {
    let mut last = String::new();
    for attempt in 1..=attempts {
        progress(&format!("{browser} {} {url} (attempt {attempt} of {attempts})", extra.join(" ")));
        let started = Instant::now();
        match run(browser, scratch, extra, url) {
            Ok(out) => {
                progress(&format!("done in {:.1} s", started.elapsed().as_secs_f64()));
                return Ok(out);
            }
            Err(e) => {
                progress(&format!("failed after {:.1} s: {e}", started.elapsed().as_secs_f64()));
                last = e;
            }
        }
    }
    Err(last)
}
