//! Walks through every fault point: crash there, restart, and print what recovery
//! decided and that the output is still exactly once.
//!
//! `cargo run --example crash_recovery`

use shareflow::demo::{self, DemoOptions, FAULT_POINTS};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for (i, point) in FAULT_POINTS.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("shareflow-crash-recovery-{i}"));
        // One crash; the demo's schedule is seeded, so find a seed whose first crash is
        // this point.
        let seed = (0..10_000)
            .find(|s| demo::crash_schedule(*s, 1).first().is_some_and(|c| c.0 == *point && c.1 < 8))
            .unwrap_or(0);
        let options = DemoOptions {
            dir,
            records: 50_000,
            crashes: 1,
            seed,
            progress: false,
            interval: std::time::Duration::from_millis(20),
            ..DemoOptions::default()
        };
        let s = demo::run(&options).await?;
        println!(
            "{point:<40} crashed: {:<5} attempts: {}  recovery committed {} and aborted {} transactions; \
             output {} records, {} duplicates, {} lost",
            !s.crash_points.is_empty(),
            s.attempts,
            s.transactions_recovered,
            s.transactions_aborted,
            s.records_committed,
            s.duplicates,
            s.lost
        );
    }
    Ok(())
}
