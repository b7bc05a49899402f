//! The PostgreSQL sink against plain `COPY` (release build, 2 cores, the server of
//! `scripts/postgres` on the same machine), side by side on the same rows:
//!
//! - **copy**: at least once, each batch of 2,000 rows one `COPY ... FROM STDIN` in its
//!   own transaction, from 2 connections at once;
//! - **exactly-once**: a job writing the same rows through `PostgresSink` at parallelism
//!   2, each subtask's rows of a checkpoint in one transaction prepared at the barrier
//!   and committed with the checkpoint (`COMMIT PREPARED`), 100 ms checkpoints
//!   (target >= 0.8x copy).
//!
//! Rounds take turns after one unmeasured round; medians are compared.
//! `SHAREFLOW_POSTGRES=postgres://... cargo bench --features postgres --bench postgres_sink [-- ROUNDS]`;
//! results in `docs/results/postgres_sink.jsonl`.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::SinkExt;
use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::postgres::{PostgresCommitter, PostgresSettings, PostgresSink, WriteMode};
use shareflow::runtime::testing::SequenceSource;
use shareflow::runtime::{JobBuilder, JobConfig, RestartStrategy};
use tokio_postgres::NoTls;

#[path = "support/results.rs"]
mod results;
#[path = "support/rounds.rs"]
mod rounds;

const ROWS: u64 = 1_000_000;
const BATCH: usize = 2_000;
const TABLE: &str = "bench_sink";

fn rows() -> u64 {
    std::env::var("SHAREFLOW_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ROWS)
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn reset(url: &str) {
    let c = client(url).await;
    c.batch_execute(&format!("DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} (split int, id bigint, body text)"))
        .await
        .unwrap();
}

async fn count(url: &str) -> i64 {
    client(url).await.query_one(&format!("SELECT count(*) FROM {TABLE}"), &[]).await.unwrap().get(0)
}

/// The rows the job's source gives split `split`, `from..from + n`, as COPY text: the
/// same values (`{split}:{offset}:` padded to 16 bytes).
fn copy_batch(split: u32, from: u64, n: usize) -> Bytes {
    let mut out = Vec::with_capacity(n * 40);
    for o in from..from + n as u64 {
        let mut v = format!("{split}:{o}:");
        while v.len() < 16 {
            v.push('x');
        }
        out.extend_from_slice(format!("{split}\t{o}\t{v}\n").as_bytes());
    }
    Bytes::from(out)
}

/// At least once: every batch one COPY in its own transaction, two connections.
async fn copy(url: &str, n: u64) -> f64 {
    let started = Instant::now();
    let per_split = n / 2;
    let writers = (0..2u32).map(|split| {
        let url = url.to_string();
        tokio::spawn(async move {
            let c = client(&url).await;
            let mut from = 0;
            while from < per_split {
                let k = BATCH.min((per_split - from) as usize);
                let sink =
                    c.copy_in::<_, Bytes>(format!("COPY {TABLE} (split, id, body) FROM STDIN").as_str()).await.unwrap();
                futures::pin_mut!(sink);
                sink.send(copy_batch(split, from, k)).await.unwrap();
                sink.finish().await.unwrap();
                from += k as u64;
            }
        })
    });
    for w in writers.collect::<Vec<_>>() {
        w.await.unwrap();
    }
    started.elapsed().as_secs_f64()
}

/// Exactly once: the job, to the end of its bounded source.
async fn exactly_once(url: &str, dir: &std::path::Path, n: u64) -> f64 {
    let settings = PostgresSettings { url: url.to_string(), table: TABLE.into(), mode: WriteMode::Insert };
    let job = JobBuilder::new();
    job.source("sequence", SequenceSource::schema(), SequenceSource::factory(2, n / 2, BATCH))
        .parallelism(2)
        .sql("row", "SELECT split, \"offset\" AS id, CAST(value AS VARCHAR) AS body FROM input")
        .parallelism(2)
        .sink("postgres-sink", PostgresSink::factory(settings.clone()))
        .parallelism(2)
        .participant(PostgresCommitter::new(settings));
    let storage = CheckpointStore::from_url(&format!("file://{}/chk", dir.display()), &[], "pg").unwrap();
    let mut config = JobConfig::new(storage, "pgbench", "pgbench")
        .checkpoint_interval(Duration::from_millis(100))
        .checkpoint_timeout(Duration::from_secs(10))
        .restart(RestartStrategy::None);
    config.channel_capacity = 8;
    let job = job.build(config).unwrap();
    let started = Instant::now();
    job.run().await.unwrap();
    started.elapsed().as_secs_f64()
}

fn main() {
    let Ok(url) = std::env::var("SHAREFLOW_POSTGRES") else {
        eprintln!("SHAREFLOW_POSTGRES is not set: start PostgreSQL with scripts/postgres start, eval \"$(scripts/postgres env)\"");
        std::process::exit(2);
    };
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(3);
    let n = rows();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut results = results::Results::create("postgres_sink", serde_json::json!({"rounds": rounds, "rows": n}));
    let names = ["copy", "exactly-once"];
    let m = runtime.block_on(async {
        let m = rounds::side_by_side(
            rounds,
            &names,
            |i| {
                let url = url.clone();
                async move {
                    reset(&url).await;
                    let dir = tempfile::tempdir().unwrap();
                    let seconds = if i == 0 { copy(&url, n).await } else { exactly_once(&url, dir.path(), n).await };
                    assert_eq!(count(&url).await as u64, n, "every row once");
                    n as f64 / seconds
                }
            },
            |i, round, rate| {
                results.record(
                    serde_json::json!({"kind": "rate", "variant": names[i], "round": round, "rows_per_s": rate}),
                );
            },
        )
        .await;
        client(&url).await.batch_execute(&format!("DROP TABLE IF EXISTS {TABLE}")).await.unwrap();
        m
    });
    if rounds == 0 {
        return;
    }
    eprintln!("median: copy {:.0} rows/s, exactly-once {:.0} rows/s ({:.3}x)", m[0], m[1], m[1] / m[0]);
    results.record(serde_json::json!({"kind": "rate_summary", "copy_per_s": m[0], "exactly_once_per_s": m[1], "ratio": m[1] / m[0]}));
}
