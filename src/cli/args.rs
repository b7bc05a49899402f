//! The command line's arguments, which each command takes out option by option, and
//! [`fail`], the exit of a command line that does not parse.

use std::process::ExitCode;

use super::usage::USAGE;

/// Prints `shareflow: {message}` and the usage text to stderr; the exit code is 2.
pub(crate) fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("shareflow: {message}\n\n{USAGE}");
    ExitCode::from(2)
}

/// The arguments not taken yet, in order.
pub(crate) struct Args(pub(crate) Vec<String>);

impl Args {
    /// Takes the flag `name` out: whether it was given.
    pub(crate) fn flag(&mut self, name: &str) -> bool {
        match self.0.iter().position(|a| a == name) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }

    /// Takes the option `name` and the value after it out; an error if no value follows.
    pub(crate) fn value(&mut self, name: &str) -> Result<Option<String>, String> {
        match self.0.iter().position(|a| a == name) {
            Some(i) if i + 1 < self.0.len() => {
                let v = self.0.remove(i + 1);
                self.0.remove(i);
                Ok(Some(v))
            }
            Some(_) => Err(format!("{name} needs a value")),
            None => Ok(None),
        }
    }

    /// Takes the option `name` out, its value parsed as a number.
    pub(crate) fn number<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        self.value(name)?.map(|v| v.parse().map_err(|_| format!("{name} {v:?} is not a valid number"))).transpose()
    }

    /// An error naming the first argument left, if any: one no option took.
    pub(crate) fn finish(&self) -> Result<(), String> {
        match self.0.first() {
            Some(extra) => Err(format!("unknown argument {extra:?}")),
            None => Ok(()),
        }
    }
}
