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
    .sql_with("agg", query, SqlOptions { allowed_lateness: lateness, ..SqlOptions::default() })
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
        // A run with no restarts stopped by a crash mid-way, its state in parts of at
        // most 256 bytes, each an object of its own...
        let store = storage("rescale").with_shared_state_limit(0).with_state_part_limit(256);
        let sink = CollectSink::new();
        let mut config = JobConfig::new(store.clone(), "agg", "half").checkpoint_interval(Duration::from_millis(3));
        config.inline_state_limit = 0;
        let job = pipeline(&sink, HOP, before, Duration::from_secs(3600)).build(config).unwrap();
        job.failpoints().arm(points::COMMIT_BEFORE, 4);
        assert!(matches!(job.run().await.unwrap_err(), RuntimeError::InjectedCrash(_)));
        let partial = sink.committed_rows();
        let newest = store.list_checkpoints().await.unwrap().into_iter().filter_map(|c| c.manifest).last().unwrap();
        let parts = newest.state_files.iter().filter(|f| f.part > 0).count();
        assert!(parts > 0 && newest.state_files.iter().all(|f| f.size <= 256 + 64), "{before}->{after}: {parts}");
        // ...then restored at another parallelism from the same checkpoints.
        let config = JobConfig::new(store, "agg", "half").checkpoint_interval(Duration::from_millis(3));
        pipeline(&sink, HOP, after, Duration::from_secs(3600)).build(config).unwrap().run().await.unwrap();
        assert!(partial < hop_oracle().len(), "{before}->{after}: the first run stopped mid-way ({partial} rows)");
        assert_eq!(sink.committed_sorted(), hop_oracle(), "{before} -> {after}");
    }
}

/// Session windows over event times that arrive out of order: per key, times are a
/// permutation of 0..1000 spread into 10 blocks of 100 dense milliseconds, 1 s apart,
/// so rows bridge and merge sessions, and each key ends with 10 sessions of 100 rows.
const SESSION: &str = r#"SELECT split AS k, CAST(session(("offset" * 37) % 1000 + (("offset" * 37) % 1000 / 100) * 1000,
    INTERVAL '0.5 seconds') AS BIGINT) AS w, count(*) AS c, sum("offset") AS s
    FROM input GROUP BY split, session(("offset" * 37) % 1000 + (("offset" * 37) % 1000 / 100) * 1000, INTERVAL '0.5 seconds')"#;

fn session_oracle() -> Vec<String> {
    oracle(|o| {
        let p = (o * 37) % 1000;
        vec![(p / 100) * 1100]
    })
}

#[tokio::test(start_paused = true)]
async fn session_windows_merge_rows_that_arrive_out_of_order() {
    for (p, crashes) in [(1, Vec::new()), (3, vec![(points::COMMIT_BEFORE.to_string(), 3)])] {
        let sink = CollectSink::new();
        run(&sink, SESSION, storage("session"), p, crashes).await.unwrap();
        assert_eq!(sink.committed_sorted(), session_oracle(), "parallelism {p}");
    }
}

/// Rows of every committed batch, in commit order, as (key, rest).
fn committed_in_order(sink: &CollectSink) -> Vec<(String, Vec<String>)> {
    let mut rows = Vec::new();
    for batch in sink.committed() {
        let options = arrow::util::display::FormatOptions::default();
        let f: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for r in 0..batch.num_rows() {
            rows.push((f[0].value(r).to_string(), f[1..].iter().map(|f| f.value(r).to_string()).collect()));
        }
    }
    rows
}

#[tokio::test(start_paused = true)]
async fn an_unwindowed_aggregate_emits_each_changed_key_once_per_checkpoint() {
    let query = r#"SELECT split AS k, count(*) AS c, count(DISTINCT "offset" % 7) AS d, avg("offset") AS a,
        min("offset") AS lo, max("offset") AS hi FROM input GROUP BY split"#;
    for crashes in
        [Vec::new(), vec![(points::AFTER_MANIFEST.to_string(), 2)], vec![(points::COMMIT_MID.to_string(), 3)]]
    {
        let sink = CollectSink::new();
        run(&sink, query, storage("upsert"), 2, crashes.clone()).await.unwrap();
        let rows = committed_in_order(&sink);
        let mut last: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (k, rest) in rows {
            counts.entry(k.clone()).or_default().push(rest[0].parse().unwrap());
            last.insert(k, rest);
        }
        assert!(counts.len() == SPLITS as usize && counts.values().all(|c| c.len() > 1), "{crashes:?}: {counts:?}");
        for (k, c) in &counts {
            // An upsert row only for a key that changed: each committed count is new.
            assert!(c.windows(2).all(|w| w[0] < w[1]), "{crashes:?}: key {k} counts {c:?}");
        }
        for (k, rest) in &last {
            assert_eq!(
                rest,
                &vec!["1000".to_string(), "7".into(), "499.5".into(), "0".into(), "999".into()],
                "{crashes:?}: key {k}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn late_rows_are_counted_and_dropped_never_merged_into_an_emitted_window() {
    // Event time jumps forward by 10 s at offset 500 of every split, then falls back:
    // with 1 s of lateness, the rows after it whose window closed are late.
    let query = r#"SELECT split AS k, CAST(tumble(CASE WHEN "offset" BETWEEN 500 AND 509 THEN "offset" + 10000 ELSE "offset" END,
        INTERVAL '0.1 seconds') AS BIGINT) AS w, count(*) AS c FROM input
        GROUP BY split, tumble(CASE WHEN "offset" BETWEEN 500 AND 509 THEN "offset" + 10000 ELSE "offset" END, INTERVAL '0.1 seconds')"#;
    let sink = CollectSink::new();
    let config = JobConfig::new(storage("late"), "agg", "job").checkpoint_interval(Duration::from_millis(3));
    let job = pipeline(&sink, query, 1, Duration::from_secs(1)).build(config).unwrap();
    job.run().await.unwrap();
    let late = job.late_rows();
    let rows = sink.committed_sorted();
    // Each (key, window) at most once: nothing merged into an emitted window.
    let mut windows: Vec<(String, String)> =
        committed_in_order(&sink).into_iter().map(|(k, r)| (k, r[0].clone())).collect();
    let before = windows.len();
    windows.sort();
    windows.dedup();
    assert_eq!(windows.len(), before, "a window was emitted twice: {rows:?}");
    let counted: u64 = committed_in_order(&sink).iter().map(|(_, r)| r[1].parse::<u64>().unwrap()).sum();
    assert!(late > 0, "rows after the jump are late");
    assert_eq!(counted + late, u64::from(SPLITS) * ROWS, "every row is counted once or dropped as late");
}

#[tokio::test(start_paused = true)]
async fn a_restore_refuses_state_of_another_query() {
    let store = storage("changed");
    let sink = CollectSink::new();
    let config = JobConfig::new(store.clone(), "agg", "job").checkpoint_interval(Duration::from_millis(3));
    let job = pipeline(&sink, TUMBLE, 2, Duration::from_secs(3600)).build(config).unwrap();
    job.failpoints().arm(points::COMMIT_BEFORE, 3);
    assert!(matches!(job.run().await.unwrap_err(), RuntimeError::InjectedCrash(_)));
    // The same operator name, another aggregate: the state does not fit.
    let changed = TUMBLE.replace("sum(\"offset\")", "max(\"offset\")");
    let config = JobConfig::new(store, "agg", "job").checkpoint_interval(Duration::from_millis(3));
    let err = pipeline(&sink, &changed, 2, Duration::from_secs(3600)).build(config).unwrap().run().await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("operator agg") && msg.contains("does not match its query") && msg.contains("max"), "{msg}");
}

/// Counts per (split, 50 ms window) of event times that part ways: split 1 runs a
/// second of event time per record, split 0 a millisecond.
const SKEWED: &str = r#"SELECT split AS k, CAST(tumble(CASE WHEN split = 1 THEN "offset" * 1000 ELSE "offset" END,
    INTERVAL '0.05 seconds') AS BIGINT) AS w, count(*) AS c FROM input
    GROUP BY split, tumble(CASE WHEN split = 1 THEN "offset" * 1000 ELSE "offset" END, INTERVAL '0.05 seconds')"#;

/// The batch answer of [`SKEWED`] over 2 splits of 300 rows: rows "k|w|c".
fn skewed_oracle() -> Vec<String> {
    let mut windows: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for split in 0..2i64 {
        for offset in 0..300i64 {
            let t = if split == 1 { offset * 1000 } else { offset };
            *windows.entry((split, t - t % 50)).or_default() += 1;
        }
    }
    let mut want: Vec<String> = windows.into_iter().map(|((k, w), c)| format!("{k}|{w}|{c}")).collect();
    want.sort();
    want
}

/// One source subtask reads two splits (as a share source reads several partitions),
/// split 1's event time far ahead of split 0's (a second per record against a
/// millisecond). The watermark follows the slower split: none of split 0's rows is late,
/// and the counts are the batch answer. (Held at the subtask's newest row, as before
/// streams, split 1 made most of split 0 late.)
#[tokio::test(start_paused = true)]
async fn a_partition_behind_another_on_one_subtask_holds_the_watermark_back() {
    let sink = CollectSink::new();
    let job = JobBuilder::new();
    let options =
        SqlOptions { allowed_lateness: Duration::from_millis(100), stream_column: "split", ..SqlOptions::default() };
    job.source(
        "numbers",
        SequenceSource::schema(),
        SequenceSource::factory_throttled(2, 300, 10, Duration::from_millis(1)),
    )
    .parallelism(1)
    .sql_with("agg", SKEWED, options)
    .sink("collect", sink.factory())
    .participant(sink.participant());
    let config = JobConfig::new(storage("streams"), "agg", "job").checkpoint_interval(Duration::from_millis(3));
    let job = job.build(config).unwrap();
    job.run().await.unwrap();
    assert_eq!(job.late_rows(), 0, "rows dropped as late");
    assert_eq!(sink.committed_sorted(), skewed_oracle());
}

/// Two sources whose event times part ways: split 1 runs a second of event time per
/// record, split 0 a millisecond. Split 0's source pauses 20 ms between batches, longer
/// than the 3 ms checkpoint interval, so it often has no rows in a checkpoint's period
/// while split 1's runs on. A pause shorter than the idle timeout must not let split
/// 1's watermark close split 0's windows: nothing is late, and the counts are the batch
/// answer. (With an idle timeout of zero, most of split 0 is dropped as late.)
#[tokio::test(start_paused = true)]
async fn a_source_that_pauses_holds_the_watermark_back() {
    let slow = SequenceSource::factory_throttled(2, 300, 10, Duration::from_millis(20));
    let fast = SequenceSource::factory_throttled(2, 300, 10, Duration::from_millis(1));
    // Subtask s owns split s.
    skewed_over_two_subtasks("pause", move |ctx| if ctx.subtask == 0 { slow(ctx) } else { fast(ctx) }).await;
}

/// Runs [`SKEWED`] (100 ms of allowed lateness) over `source` at parallelism 2 to the
/// end: nothing is late, and the counts are the batch answer.
async fn skewed_over_two_subtasks<S, F>(name: &str, source: F)
where
    S: shareflow::runtime::Source,
    F: Fn(&shareflow::runtime::SubtaskContext) -> S + Send + Sync + 'static,
{
    let sink = CollectSink::new();
    let job = JobBuilder::new();
    job.source("numbers", SequenceSource::schema(), source)
        .parallelism(2)
        .sql_with("agg", SKEWED, SqlOptions { allowed_lateness: Duration::from_millis(100), ..SqlOptions::default() })
        .sink("collect", sink.factory())
        .participant(sink.participant());
    let config = JobConfig::new(storage(name), "agg", "job").checkpoint_interval(Duration::from_millis(3));
    let job = job.build(config).unwrap();
    job.run().await.unwrap();
    assert_eq!(job.late_rows(), 0, "rows dropped as late");
    assert_eq!(sink.committed_sorted(), skewed_oracle());
}

/// A source that has nothing for its first `wait` (it polls idle, as a share source
/// whose first fetch is slow), then reads its [`SequenceSource`].
struct LateStart {
    inner: SequenceSource,
    until: Option<tokio::time::Instant>,
    wait: Duration,
}

#[shareflow::runtime::async_trait]
impl shareflow::runtime::Source for LateStart {
    async fn open(
        &mut self,
        ctx: &shareflow::runtime::SubtaskContext,
        restored: shareflow::runtime::StateItems,
    ) -> shareflow::runtime::Result<()> {
        self.until = Some(tokio::time::Instant::now() + self.wait);
        self.inner.open(ctx, restored).await
    }
    async fn poll_next(
        &mut self,
        checkpoint_id: shareflow::runtime::CheckpointId,
    ) -> shareflow::runtime::Result<shareflow::runtime::SourceEvent> {
        if self.until.is_some_and(|u| tokio::time::Instant::now() < u) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            return Ok(shareflow::runtime::SourceEvent::Idle);
        }
        self.inner.poll_next(checkpoint_id).await
    }
    async fn snapshot_state(
        &mut self,
        checkpoint_id: shareflow::runtime::CheckpointId,
    ) -> shareflow::runtime::Result<shareflow::runtime::StateItems> {
        self.inner.snapshot_state(checkpoint_id).await
    }
}

/// One source subtask gets its first rows 50 ms after the other, whose event time runs
/// far ahead (the first fetch of a restarted share source can come late on a loaded
/// machine). Until its first rows, the late subtask holds the watermark back: none of
/// its rows is late, and the counts are the batch answer. (A subtask without rows held
/// nothing back before: the other's watermark closed the late one's windows first.)
#[tokio::test(start_paused = true)]
async fn a_subtask_without_rows_yet_holds_the_watermark_back() {
    let numbers = SequenceSource::factory_throttled(2, 300, 10, Duration::from_millis(1));
    // Subtask s owns split s; split 0's subtask starts late.
    skewed_over_two_subtasks("late-start", move |ctx| {
        let wait = Duration::from_millis(if ctx.subtask == 0 { 50 } else { 0 });
        LateStart { inner: numbers(ctx), until: None, wait }
    })
    .await;
}
