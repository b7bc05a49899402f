//! The Parquet table sink against writing the same batches with the `parquet` crate
//! directly (release build, 2 cores, local disk), side by side:
//!
//! - **parquet**: two writers, each writing its half of the rows as batches of 2,000 into
//!   Parquet files of at most 128 MiB, put on the store as they close;
//! - **sink**: a job writing the same rows through `TableSink` (plain Parquet) at
//!   parallelism 2, staged per checkpoint and published at commit, 1 s checkpoints
//!   (target >= 0.9x parquet).
//!
//! Rounds take turns after one unmeasured round; medians are compared.
//! `cargo bench --features tables --bench table_sink [-- ROUNDS]`; results in `docs/results/table_sink.jsonl`.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::table::{TableCommitter, TableFormat, TableSettings, TableSink};
use shareflow::runtime::testing::SequenceSource;
use shareflow::runtime::{JobBuilder, JobConfig, RestartStrategy};

#[path = "support/results.rs"]
mod results;
#[path = "support/rounds.rs"]
mod rounds;

const ROWS: u64 = 2_000_000;
const BATCH: usize = 2_000;
const QUERY: &str = "SELECT split, \"offset\" AS id, CAST(value AS VARCHAR) AS body FROM input";

fn rows() -> u64 {
    std::env::var("SHAREFLOW_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ROWS)
}

fn props() -> parquet::file::properties::WriterProperties {
    parquet::file::properties::WriterProperties::builder().set_compression(parquet::basic::Compression::SNAPPY).build()
}

/// The rows of split `split` as the job's query gives them, a batch at a time.
fn batches(split: u32, n: u64) -> impl Iterator<Item = arrow::record_batch::RecordBatch> {
    let plan = shareflow::runtime::sql::SqlPlan::plan(QUERY, SequenceSource::schema()).unwrap();
    (0..n).step_by(BATCH).map(move |from| {
        let k = BATCH.min((n - from) as usize);
        let offsets: Vec<i64> = (from..from + k as u64).map(|o| o as i64).collect();
        let values: Vec<Vec<u8>> = offsets
            .iter()
            .map(|o| {
                let mut v = format!("{split}:{o}:").into_bytes();
                v.resize(16.max(v.len()), b'x');
                v
            })
            .collect();
        let input = arrow::record_batch::RecordBatch::try_new(
            SequenceSource::schema(),
            vec![
                Arc::new(arrow::array::Int32Array::from(vec![split as i32; k])),
                Arc::new(arrow::array::Int64Array::from(offsets)),
                Arc::new(arrow::array::BinaryArray::from_iter_values(values.iter())),
            ],
        )
        .unwrap();
        plan.execute(input, "bench").unwrap()
    })
}

/// The `parquet` crate alone: two writers, files put on the store as they close.
async fn parquet_direct(store: Arc<dyn ObjectStore>, n: u64) -> f64 {
    let started = Instant::now();
    let writers = (0..2u32).map(|split| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut file = 0;
            let mut writer: Option<ArrowWriter<Vec<u8>>> = None;
            for batch in batches(split, n / 2) {
                let w = writer
                    .get_or_insert_with(|| ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props())).unwrap());
                w.write(&batch).unwrap();
                if w.in_progress_size() + w.bytes_written() >= 128 << 20 {
                    let bytes = writer.take().unwrap().into_inner().unwrap();
                    store
                        .put(&Path::from(format!("direct/part-{split}-{file}.parquet")), PutPayload::from(bytes))
                        .await
                        .unwrap();
                    file += 1;
                }
            }
            if let Some(w) = writer {
                let bytes = w.into_inner().unwrap();
                store
                    .put(&Path::from(format!("direct/part-{split}-{file}.parquet")), PutPayload::from(bytes))
                    .await
                    .unwrap();
            }
        })
    });
    for w in writers.collect::<Vec<_>>() {
        w.await.unwrap();
    }
    started.elapsed().as_secs_f64()
}

/// The sink: the job, to the end of its bounded source.
async fn sink(dir: &std::path::Path, n: u64) -> f64 {
    let committer =
        TableCommitter::new(TableSettings::new(&format!("file://{}/table", dir.display()), TableFormat::Parquet))
            .unwrap();
    let job = JobBuilder::new();
    job.source("sequence", SequenceSource::schema(), SequenceSource::factory(2, n / 2, BATCH))
        .parallelism(2)
        .sql("row", QUERY)
        .parallelism(2)
        .sink("table-sink", TableSink::factory(committer.clone()))
        .parallelism(2)
        .participant(committer);
    let storage = CheckpointStore::from_url(&format!("file://{}/chk", dir.display()), &[], "tbl").unwrap();
    let mut config = JobConfig::new(storage, "tblbench", "tblbench")
        .checkpoint_interval(Duration::from_secs(1))
        .checkpoint_timeout(Duration::from_secs(30))
        .restart(RestartStrategy::None);
    config.channel_capacity = 8;
    let job = job.build(config).unwrap();
    let started = Instant::now();
    job.run().await.unwrap();
    started.elapsed().as_secs_f64()
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(3);
    let n = rows();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut results = results::Results::create("table_sink", serde_json::json!({"rounds": rounds, "rows": n}));
    let names = ["parquet", "sink"];
    let m = runtime.block_on(rounds::side_by_side(
        rounds,
        &names,
        |i| async move {
            let dir = tempfile::tempdir().unwrap();
            let seconds = if i == 0 {
                let (store, _) =
                    shareflow::checkpoint::open_url(&format!("file://{}", dir.path().display()), &[]).unwrap();
                parquet_direct(store, n).await
            } else {
                sink(dir.path(), n).await
            };
            n as f64 / seconds
        },
        |i, round, rate| {
            results
                .record(serde_json::json!({"kind": "rate", "variant": names[i], "round": round, "rows_per_s": rate}));
        },
    ));
    if rounds == 0 {
        return;
    }
    eprintln!("median: parquet {:.0} rows/s, sink {:.0} rows/s ({:.3}x)", m[0], m[1], m[1] / m[0]);
    results.record(
        serde_json::json!({"kind": "rate_summary", "parquet_per_s": m[0], "sink_per_s": m[1], "ratio": m[1] / m[0]}),
    );
}
