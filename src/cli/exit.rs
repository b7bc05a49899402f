//! How the outcome of a command that ran becomes its output and its exit code: a
//! demo's or a run's summary ([`report`]), an admin command's result ([`admin_exit`]).

use std::process::ExitCode;

use shareflow_runtime::ErrorKind;

/// The exit of an admin command that ran: 0, or 1 with `shareflow {what} failed: ...`
/// (no usage text: the options were fine).
pub(crate) fn admin_exit(what: &str, outcome: Result<(), Box<dyn std::error::Error + Send + Sync>>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shareflow {what} failed: {e}");
            ExitCode::from(1)
        }
    }
}

/// Prints a demo's summary and turns its outcome into the exit code.
pub(crate) fn report<S>(
    what: &str,
    outcome: Result<S, Box<dyn std::error::Error + Send + Sync>>,
    json: bool,
    to_json: impl Fn(&S) -> String,
    to_text: impl Fn(&S) -> String,
    clean: impl Fn(&S) -> bool,
) -> ExitCode {
    match outcome {
        Ok(summary) => {
            println!("{}", if json { to_json(&summary) } else { to_text(&summary) });
            if clean(&summary) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) if fenced(e.as_ref()) => {
            eprintln!(
                "shareflow {what} stopped, fenced: {e}\n\
                 Another process took this instance's prefix over: a newer start under the same instance name, or \
                 an adopter after this one was silent past the adoption timeout. This process stopped without a \
                 restart; what it committed stays committed, and the other process goes on from there. If the other \
                 process is the one meant to run, nothing needs doing; if not, stop it, then start this one again."
            );
            ExitCode::from(EXIT_FENCED)
        }
        Err(e) => {
            eprintln!("shareflow {what} failed: {e}");
            ExitCode::from(1)
        }
    }
}

/// The exit code of a run or demo that stopped because another process fenced it
/// (docs/operations.md): not a failure of this process, and not to be restarted blindly.
pub(crate) const EXIT_FENCED: u8 = 3;

/// Whether an error, or one of its sources, says this process was fenced.
fn fenced(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        e.downcast_ref::<shareflow_runtime::RuntimeError>().is_some_and(|r| r.kind() == ErrorKind::Fenced)
            || e.downcast_ref::<shareflow_checkpoint::CheckpointError>().is_some_and(|c| c.kind() == ErrorKind::Fenced)
    })
}
