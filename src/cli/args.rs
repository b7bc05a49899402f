//! [`fail`]: the exit of a command line that parses but does not make sense (clap
//! refuses what does not parse, with the same exit code).

use std::process::ExitCode;

/// Prints `shareflow: {message}` and where the options are described to stderr; the exit
/// code is 2, as for a command line clap refuses.
pub(crate) fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("shareflow: {message}\n\nFor the options: shareflow help, or shareflow COMMAND --help");
    ExitCode::from(2)
}
