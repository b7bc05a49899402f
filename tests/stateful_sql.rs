//! Stateful SQL on the runtime: keyed aggregates and windows whose results are exactly
//! the batch answer across checkpoints, crashes at every runtime fault point, restores
//! at another parallelism, and a changed query. The source is the replayable
//! `SequenceSource` (split, offset, value); event time is the offset in ms.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use shareflow::checkpoint::CheckpointStore;
use shareflow::runtime::failpoint::points;
use shareflow::runtime::testing::{CollectSink, SequenceSource};
use shareflow::runtime::{JobBuilder, JobConfig, RestartStrategy, RuntimeError, SqlOptions};

const SPLITS: u32 = 4;
const ROWS: u64 = 1000;

fn storage(name: &str) -> CheckpointStore {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CheckpointStore::from_url(&format!("memory://stateful-{name}-{n}/checkpoints"), &[], "agg").unwrap()
}

fn pipeline(sink: &CollectSink, query: &str, parallelism: u32, lateness: Duration) -> JobBuilder {
    let job = JobBuilder::new();
    job.source(
        "numbers",
        SequenceSource::schema(),
        SequenceSource::factory_throttled(SPLITS, ROWS, 25, Duration::from_millis(1)),
    )
    .parallelism(parallelism)
    .sql_with("agg", query, SqlOptions { allowed_lateness: lateness })
    .parallelism(parallelism)
    .sink("collect", sink.factory())
    .participant(sink.participant());
    job
}

/// The batch answer, computed by hand over every (split, offset): rows "k|w|c|s".
fn oracle(window: impl Fn(i64) -> Vec<i64>) -> Vec<String> {
    let mut groups: BTreeMap<(i32, i64), (i64, i64)> = BTreeMap::new();
    for split in 0..SPLITS as i32 {
        for offset in 0..ROWS as i64 {
            for w in window(offset) {
                let g = groups.entry((split, w)).or_default();
                g.0 += 1;
                g.1 += offset;
            }
        }
    }
    let mut rows: Vec<String> = groups.into_iter().map(|((k, w), (c, s))| format!("{k}|{w}|{c}|{s}")).collect();
    rows.sort();
    rows
}

const TUMBLE: &str = r#"SELECT split AS k, CAST(tumble("offset", INTERVAL '0.05 seconds') AS BIGINT) AS w,
    count(*) AS c, sum("offset") AS s FROM input GROUP BY split, tumble("offset", INTERVAL '0.05 seconds')"#;
const HOP: &str = r#"SELECT split AS k, CAST(hop("offset", INTERVAL '0.02 seconds', INTERVAL '0.06 seconds') AS BIGINT) AS w,
    count(*) AS c, sum("offset") AS s FROM input GROUP BY 1, hop("offset", INTERVAL '0.02 seconds', INTERVAL '0.06 seconds')"#;

fn tumble_oracle() -> Vec<String> {
    oracle(|t| vec![t - t % 50])
}

fn hop_oracle() -> Vec<String> {
    oracle(|t| (0..3).map(|i| t - t % 20 - 20 * i).filter(|s| *s > t - 60).collect())
}

/// Runs to the end with up to 3 restarts; returns the fault points that fired.
async fn run(
    sink: &CollectSink,
    query: &str,
    store: CheckpointStore,
    parallelism: u32,
    crashes: Vec<(String, u32)>,
) -> Result<Vec<String>, RuntimeError> {
    let config = JobConfig::new(store, "agg", "job")
        .checkpoint_interval(Duration::from_millis(3))
        .restart(RestartStrategy::FixedDelay { attempts: 3, delay: Duration::from_millis(1) });
    let job = pipeline(sink, query, parallelism, Duration::from_secs(3600)).build(config).unwrap();
    job.failpoints().schedule(crashes);
    job.run().await?;
    Ok(job.failpoints().fired())
}

#[tokio::test(start_paused = true)]
async fn tumbling_and_hopping_counts_equal_the_batch_answer() {
    for (query, expected, p) in [(TUMBLE, tumble_oracle(), 1), (TUMBLE, tumble_oracle(), 3), (HOP, hop_oracle(), 2)] {
        let sink = CollectSink::new();
        run(&sink, query, storage("plain"), p, Vec::new()).await.unwrap();
        assert_eq!(sink.committed_sorted(), expected, "{query} at parallelism {p}");
    }
}

#[tokio::test(start_paused = true)]
async fn windows_are_exact_across_a_crash_at_every_runtime_fault_point() {
    for point in [
        points::AFTER_STATE_BEFORE_MANIFEST,
        points::AFTER_MANIFEST,
        points::COMMIT_BEFORE,
        points::COMMIT_MID,
        points::COMMIT_AFTER_BROKER_BEFORE_NOTIFY,
        points::RECOVERY_MID,
        points::AFTER_RECOVERY,
    ] {
        for skip in [1, 4] {
            let sink = CollectSink::new();
            // A recovery decides something only after a crash that left work undecided.
            let mut crashes = Vec::new();
            if point.starts_with("recovery.") {
                crashes.push((points::COMMIT_BEFORE.to_string(), skip));
            }
            crashes.push((point.to_string(), if point.starts_with("recovery.") { 0 } else { skip }));
            let mut expected: Vec<String> = crashes.iter().map(|c| c.0.clone()).collect();
            expected.sort();
            let mut fired = run(&sink, TUMBLE, storage("crash"), 2, crashes).await.unwrap();
            fired.sort();
            assert_eq!(fired, expected, "the crashes at {point} (skip {skip}) fired");
            assert_eq!(sink.committed_sorted(), tumble_oracle(), "crash at {point} (skip {skip})");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn state_moves_by_key_group_when_the_parallelism_changes() {
    for (before, after) in [(1, 3), (3, 1), (2, 5)] {
        // A run with no restarts stopped by a crash mid-way...
        let store = storage("rescale");
        let sink = CollectSink::new();
        let config = JobConfig::new(store.clone(), "agg", "half").checkpoint_interval(Duration::from_millis(3));
        let job = pipeline(&sink, HOP, before, Duration::from_secs(3600)).build(config).unwrap();
        job.failpoints().arm(points::COMMIT_BEFORE, 4);
        assert!(matches!(job.run().await.unwrap_err(), RuntimeError::InjectedCrash(_)));
        let partial = sink.committed_rows();
        // ...then restored at another parallelism from the same checkpoints.
        let config = JobConfig::new(store, "agg", "half").checkpoint_interval(Duration::from_millis(3));
        pipeline(&sink, HOP, after, Duration::from_secs(3600)).build(config).unwrap().run().await.unwrap();
        assert!(partial < hop_oracle().len(), "{before}->{after}: the first run stopped mid-way ({partial} rows)");
        assert_eq!(sink.committed_sorted(), hop_oracle(), "{before} -> {after}");
    }
}
