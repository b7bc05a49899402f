//! How the outcome of a command that ran becomes its output and its exit code: a
//! demo's or a run's summary ([`report`]), an admin command's result ([`admin_exit`]).

use std::process::ExitCode;

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
        Err(e) => {
            eprintln!("shareflow {what} failed: {e}");
            ExitCode::from(1)
        }
    }
}
