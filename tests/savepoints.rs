//! Savepoints on the runtime: a job stopped with a savepoint restarts from it at another
//! parallelism (1 -> 3, 3 -> 1), from a copy in another store too, with a changed query
//! whose state still fits, and every row of the
//! input counts once across the whole sequence, through a crash while the savepoint is
//! taken, at each of its steps. A changed query whose state does not fit, and a savepoint of an operator the
//! job lacks, are refused by name.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shareflow::checkpoint::CheckpointStore;
use shareflow::runtime::failpoint::points;
use shareflow::runtime::testing::{CollectSink, SequenceSource};
use shareflow::runtime::{
    JobBuilder, JobConfig, RestartStrategy, RuntimeError, SqlOptions, SAVEPOINT_MID, SAVEPOINT_STEPS,
};

const SPLITS: u32 = 4;
const ROWS: u64 = 1000;

const COUNTS: &str = r#"SELECT split AS k, CAST(tumble("offset", INTERVAL '0.05 seconds') AS BIGINT) AS w,
    count(*) AS c, sum("offset") AS s FROM input GROUP BY split, tumble("offset", INTERVAL '0.05 seconds')"#;

fn url(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("memory://savepoints-{name}-{n}/checkpoints")
}

fn pipeline(sink: &CollectSink, query: &str, agg: &str, parallelism: u32) -> JobBuilder {
    let job = JobBuilder::new();
    job.source(
        "numbers",
        SequenceSource::schema(),
        SequenceSource::factory_throttled(SPLITS, ROWS, 25, Duration::from_millis(1)),
    )
    .parallelism(parallelism)
    .sql_with(agg, query, SqlOptions { allowed_lateness: Duration::from_secs(3600), ..SqlOptions::default() })
    .parallelism(parallelism)
    .sink("collect", sink.factory())
    .participant(sink.participant());
    job
}

/// Checkpoints every 3 ms under `root`, their state in files (not inlined in the
/// manifest), so that a savepoint is a manifest and files.
fn config(root: &str) -> JobConfig {
    let mut c = JobConfig::new(CheckpointStore::from_url(root, &[], "job").unwrap(), "agg", "job")
        .checkpoint_interval(Duration::from_millis(3))
        .restart(RestartStrategy::FixedDelay { attempts: 2, delay: Duration::from_millis(1) });
    c.inline_state_limit = 0;
    c
}

/// The batch answer: rows "k|w|c|s" of every (split, 50 ms window).
fn oracle() -> Vec<String> {
    let mut groups = std::collections::BTreeMap::<(i32, i64), (i64, i64)>::new();
    for split in 0..SPLITS as i32 {
        for offset in 0..ROWS as i64 {
            let g = groups.entry((split, offset - offset % 50)).or_default();
            g.0 += 1;
            g.1 += offset;
        }
    }
    let mut rows: Vec<String> = groups.into_iter().map(|((k, w), (c, s))| format!("{k}|{w}|{c}|{s}")).collect();
    rows.sort();
    rows
}

/// Runs `job` and, `after` into it, stops it with savepoint `name`; returns the
/// savepoint's answer and the run's.
async fn stop_with_savepoint(
    job: shareflow::runtime::Job,
    name: &str,
    after: Duration,
) -> (Result<shareflow::runtime::Savepoint, RuntimeError>, Result<(), RuntimeError>) {
    let handle = job.savepoint_handle();
    let (ran, taken) = tokio::join!(job.run(), async {
        tokio::time::sleep(after).await;
        handle.stop_with(name).await
    });
    (taken, ran.map(|_| ()))
}

#[tokio::test(start_paused = true)]
async fn a_stop_with_savepoint_restarts_at_another_parallelism_exactly_once() {
    for (before, after) in [(1, 3), (3, 1)] {
        let sink = CollectSink::new();
        let first = url("first");
        // The first stop crashes between the savepoint's files and its manifest: no
        // savepoint, the job restarts and stops (it was asked to).
        let job = pipeline(&sink, COUNTS, "agg", before).build(config(&first)).unwrap();
        job.failpoints().arm(SAVEPOINT_MID, 0);
        let (taken, ran) = stop_with_savepoint(job, "sp", Duration::from_millis(15)).await;
        assert!(matches!(taken, Err(RuntimeError::InjectedCrash(_))), "{taken:?}");
        ran.unwrap();
        // Started again from its own checkpoints and stopped with a savepoint.
        let job = pipeline(&sink, COUNTS, "agg", before).build(config(&first)).unwrap();
        let (taken, ran) = stop_with_savepoint(job, "sp", Duration::from_millis(15)).await;
        ran.unwrap();
        let taken = taken.unwrap();
        let partial = sink.committed_rows();
        assert!(partial < oracle().len(), "{before}->{after}: stopped mid-way ({partial} rows)");
        // The savepoint copied to another store, then the copy restored at the other
        // parallelism, in a job of its own (a checkpoint root of its own).
        let from = shareflow::control::savepoint_url(&first, &taken.path);
        let copy = copy_savepoint(&from, &url("copy")).await;
        // The query changed where its state still fits (the same window, key types and
        // aggregates): other names, and a filter that keeps every row.
        let fits =
            COUNTS.replace("AS c,", "AS rows_in_window,").replace("FROM input", "FROM input WHERE \"offset\" >= 0");
        assert_ne!(fits, COUNTS);
        let job = pipeline(&sink, &fits, "agg", after).build(config(&url("second")).from_savepoint(copy)).unwrap();
        job.run().await.unwrap();
        assert_eq!(sink.committed_sorted(), oracle(), "{before} -> {after}: every row once");
    }
}

/// A crash at each step of a stop with a savepoint: while its final checkpoint is
/// written and committed (the restart's final checkpoint serves the request), and while
/// the savepoint is copied (the request fails, and a second stop takes it). Restored at
/// another parallelism, every row of the input counts once.
#[tokio::test(start_paused = true)]
async fn a_crash_at_each_step_of_a_savepoint_leaves_every_row_once() {
    let checkpoint_steps = [points::AFTER_STATE_BEFORE_MANIFEST, points::AFTER_MANIFEST, points::COMMIT_MID];
    let steps = checkpoint_steps.iter().chain(SAVEPOINT_STEPS).copied();
    for (i, step) in steps.enumerate() {
        let (before, after) = if i % 2 == 0 { (1, 3) } else { (3, 1) };
        let sink = CollectSink::new();
        let first = url("steps");
        // No periodic checkpoint: the first one is the stop's, where the crash fires.
        let config = || config(&first).checkpoint_interval(Duration::from_secs(3600));
        let job = pipeline(&sink, COUNTS, "agg", before).build(config()).unwrap();
        job.failpoints().arm(step, 0);
        let failpoints = job.failpoints().clone();
        let (taken, ran) = stop_with_savepoint(job, "sp", Duration::from_millis(15)).await;
        ran.unwrap();
        assert_eq!(failpoints.fired(), vec![step.to_string()], "the crash fired");
        let taken = if checkpoint_steps.contains(&step) {
            taken.unwrap_or_else(|e| panic!("{step}: the restart's final checkpoint serves it: {e}"))
        } else {
            assert!(matches!(taken, Err(RuntimeError::InjectedCrash(_))), "{step}: {taken:?}");
            if step == shareflow::runtime::SAVEPOINT_AFTER_MANIFEST {
                // That savepoint is complete: its name is not taken again.
                let job = pipeline(&sink, COUNTS, "agg", before).build(config()).unwrap();
                let (again, ran) = stop_with_savepoint(job, "sp", Duration::from_millis(15)).await;
                ran.unwrap();
                let msg = again.unwrap_err().to_string();
                assert!(msg.contains("savepoint \"sp\" already exists"), "{msg}");
            }
            let job = pipeline(&sink, COUNTS, "agg", before).build(config()).unwrap();
            let (taken, ran) = stop_with_savepoint(job, "sp-2", Duration::from_millis(15)).await;
            ran.unwrap();
            taken.unwrap()
        };
        assert!(sink.committed_rows() < oracle().len(), "{step}: stopped mid-way");
        let from = shareflow::control::savepoint_url(&first, &taken.path);
        let job = pipeline(&sink, COUNTS, "agg", after).build(config_from(&url("after"), &from)).unwrap();
        job.run().await.unwrap();
        assert_eq!(sink.committed_sorted(), oracle(), "{step}, {before} -> {after}: every row once");
    }
}

fn config_from(root: &str, savepoint: &str) -> JobConfig {
    config(root).from_savepoint(savepoint)
}

/// Copies every object of the savepoint at `from` under `to`; returns the copy's URL.
async fn copy_savepoint(from: &str, to: &str) -> String {
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    let (src, src_root) = shareflow::checkpoint::open_url(from, &[]).unwrap();
    let (dst, dst_root) = shareflow::checkpoint::open_url(to, &[]).unwrap();
    let objects: Vec<_> = src.list(Some(&src_root)).try_collect().await.unwrap();
    assert!(objects.len() >= 2, "a manifest and state: {objects:?}");
    for o in objects {
        let rel: Vec<_> = o.location.prefix_match(&src_root).unwrap().collect();
        let mut path = dst_root.clone();
        for part in rel {
            path = path.join(part.as_ref());
        }
        let bytes = src.get(&o.location).await.unwrap().bytes().await.unwrap();
        dst.put(&path, bytes.into()).await.unwrap();
    }
    to.to_string()
}

#[tokio::test(start_paused = true)]
async fn a_savepoint_that_does_not_fit_the_job_is_refused_by_name() {
    let sink = CollectSink::new();
    let root = url("misfit");
    let job = pipeline(&sink, COUNTS, "agg", 2).build(config(&root)).unwrap();
    let (taken, ran) = stop_with_savepoint(job, "sp", Duration::from_millis(15)).await;
    ran.unwrap();
    let from = shareflow::control::savepoint_url(&root, &taken.unwrap().path);
    // Another aggregate under the same operator name: its state does not fit.
    let changed = COUNTS.replace("sum(\"offset\")", "max(\"offset\")");
    let job = pipeline(&sink, &changed, "agg", 2).build(config(&url("changed")).from_savepoint(&from)).unwrap();
    let msg = job.run().await.unwrap_err().to_string();
    assert!(msg.contains("operator agg") && msg.contains("does not match its query"), "{msg}");
    // The operator renamed: the savepoint's state has nowhere to go.
    let job = pipeline(&sink, COUNTS, "renamed", 2).build(config(&url("renamed")).from_savepoint(&from)).unwrap();
    let msg = job.run().await.unwrap_err().to_string();
    assert!(msg.contains("operator \"agg\", which this job does not have"), "{msg}");
    // A URL with no savepoint.
    let job = pipeline(&sink, COUNTS, "agg", 2).build(config(&url("none")).from_savepoint(url("nothing"))).unwrap();
    let msg = job.run().await.unwrap_err().to_string();
    assert!(msg.contains("cannot read it as a savepoint"), "{msg}");
}
