//! The commands of the `shareflow` binary, one module each (`main.rs` only dispatches
//! on the command), and what they share: the command line ([`line`]), the exit of one
//! that makes no sense ([`args`]), how an outcome becomes the exit code ([`exit`]) and
//! the demo's checkpoint root.

pub(crate) mod args;
pub(crate) mod checkpoints;
pub(crate) mod consume;
pub(crate) mod crash_at;
pub(crate) mod demo;
pub(crate) mod dlq;
pub(crate) mod exit;
pub(crate) mod instances;
pub(crate) mod line;
pub(crate) mod produce;
pub(crate) mod run;
pub(crate) mod savepoint;
pub(crate) mod txn;

/// What a command that needs Kafka says in a build without the `kafka` feature.
#[cfg(not(feature = "kafka"))]
pub(crate) const WITHOUT_KAFKA: &str = "this shareflow was built without the kafka feature (--no-default-features); \
     build it with `cargo build --release` (the feature is on by default), or `cargo build --release --features kafka`";

/// The demo's checkpoint root, the default of the admin commands' `--checkpoints`.
pub(crate) fn demo_checkpoints() -> String {
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
    format!("file://{cwd}/target/shareflow-demo/checkpoints")
}
