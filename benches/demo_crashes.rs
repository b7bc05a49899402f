//! Throughput of the demo with crashes against without, in the same run: the
//! `shareflow demo` binary built with this bench's profile, 1,000,000 records, its
//! default settings (checkpoints every 100 ms, parallelism 2, 4 partitions), run
//! crash-free and with 3 crashes at the fault points of seeds 1, 2 and 3, in turn, for
//! `ROUNDS` rounds. Each run's `--json` summary also says where its crashes' time went:
//! records emitted again, restart delays, recovery.
//!
//! `cargo bench --bench demo_crashes [-- INTERVAL_MS]`

#![allow(clippy::unwrap_used, missing_docs)]

#[path = "support/demo.rs"]
mod demo;
#[path = "support/results.rs"]
mod results;

/// Rounds; each runs crash-free and every seed once.
const ROUNDS: usize = 5;
const RECORDS: u64 = 1_000_000;
/// Seed 0 stands for the crash-free run.
const SEEDS: [u64; 4] = [0, 1, 2, 3];

/// One demo run's `--json` summary.
fn demo_summary(seed: u64, interval: Option<&str>) -> serde_json::Value {
    let (records, seed_arg) = (RECORDS.to_string(), seed.to_string());
    let mut args = vec!["--records", &records];
    if let Some(ms) = interval {
        args.extend(["--interval", ms]);
    }
    if seed == 0 {
        args.extend(["--crashes", "0"]);
    } else {
        args.extend(["--crashes", "3", "--seed", &seed_arg]);
    }
    let run = demo::run(&args);
    assert!(run.success && run.summary["violations"] == 0, "seed {seed}: {}", run.summary);
    run.summary
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let interval = args.first().map(String::as_str);
    let mut results = results::Results::create(
        "demo_crashes",
        serde_json::json!({"rounds": ROUNDS, "records": RECORDS, "interval_ms": interval.map_or(serde_json::Value::Null, |i| i.into())}),
    );
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); SEEDS.len()];
    for round in 0..ROUNDS {
        let mut free = 0.0;
        for (i, seed) in SEEDS.into_iter().enumerate() {
            let s = demo_summary(seed, interval);
            let rate = s["records_per_second"].as_f64().unwrap();
            if seed == 0 {
                free = rate;
            }
            ratios[i].push(rate / free);
            println!(
                "round {round}, {}: {rate:.0} records/s ({:.2} of crash-free), {} s; crashes at {}; emitted again {}, restart delays {} s, recovery {} s",
                if seed == 0 { "crash-free".to_string() } else { format!("seed {seed}") },
                rate / free,
                s["seconds"],
                s["crash_points"],
                s["records_emitted_again"],
                s["restart_delay_seconds"],
                s["recovery_seconds"],
            );
            results.record(serde_json::json!({"kind": "demo", "round": round, "seed": seed,
                "records_per_second": rate, "seconds": s["seconds"], "crash_points": s["crash_points"],
                "records_emitted_again": s["records_emitted_again"], "restart_delay_seconds": s["restart_delay_seconds"],
                "recovery_seconds": s["recovery_seconds"], "interval_ms": interval}));
        }
    }
    for (seed, mut r) in SEEDS.into_iter().zip(ratios).skip(1) {
        r.sort_by(f64::total_cmp);
        println!(
            "SUMMARY seed {seed}: {:.2} of the crash-free rate of the same round (min {:.2}, max {:.2}, {ROUNDS} rounds)",
            r[r.len() / 2],
            r[0],
            r[r.len() - 1]
        );
    }
}
