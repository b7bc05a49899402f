//! The `shareflow` command line.
//!
//! - `shareflow demo`: runs the main exactly-once job on the embedded broker.
//! - `shareflow help`: prints usage.

use std::process::ExitCode;

const USAGE: &str = "usage: shareflow <command>

commands:
  demo     run the exactly-once demo job on the embedded broker
  help     print this message";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => {
            eprintln!(
                "shareflow demo: not yet available. The embedded broker and the share-group contract are \
                 in place; the runtime and the end-to-end job come next."
            );
            ExitCode::from(2)
        }
        Some("help") | Some("--help") | Some("-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("shareflow: unknown command {other:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
        None => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
