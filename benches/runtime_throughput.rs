//! Runtime throughput on one core (a current-thread tokio runtime), 8,192-row batches
//! with 100-byte values:
//! - operator efficiency: generator -> SQL filter/projection -> null sink, against the
//!   same batches moved through one bare bounded channel;
//! - checkpoint overhead: the same pipeline with checkpoints every second, against none.
//!
//! `cargo bench --bench runtime_throughput`

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{BinaryArray, Int32Array, Int64Array};
use arrow::record_batch::RecordBatch;
use shareflow::checkpoint::CheckpointStore;
use shareflow::runtime::testing::SequenceSource;
use shareflow::runtime::{
    async_trait, Collector, JobBuilder, JobConfig, Operator, Result, Source, SourceEvent, StateItems, SubtaskContext,
};

const ROWS_PER_BATCH: usize = 8192;

fn batch() -> RecordBatch {
    let n = ROWS_PER_BATCH;
    let values: Vec<Vec<u8>> = (0..n).map(|i| format!("{i:0>100}").into_bytes()).collect();
    RecordBatch::try_new(
        SequenceSource::schema(),
        vec![
            Arc::new(Int32Array::from(vec![0; n])),
            Arc::new(Int64Array::from_iter_values(0..n as i64)),
            Arc::new(BinaryArray::from_iter_values(values.iter())),
        ],
    )
    .unwrap()
}

/// Emits the same batch `batches` times; its state is how many it emitted.
struct Repeat {
    batch: RecordBatch,
    left: u64,
}

#[async_trait]
impl Source for Repeat {
    async fn open(&mut self, _ctx: &SubtaskContext, restored: StateItems) -> Result<()> {
        if let Some(b) = restored.first() {
            self.left = u64::from_le_bytes(b[..8].try_into().unwrap());
        }
        Ok(())
    }
    async fn poll_next(&mut self, _checkpoint_id: u64) -> Result<SourceEvent> {
        if self.left == 0 {
            return Ok(SourceEvent::Finished);
        }
        self.left -= 1;
        Ok(SourceEvent::Batch(self.batch.clone()))
    }
    async fn snapshot_state(&mut self, _n: u64) -> Result<StateItems> {
        Ok(vec![bytes::Bytes::copy_from_slice(&self.left.to_le_bytes())])
    }
}

struct Discard;

#[async_trait]
impl Operator for Discard {
    async fn process_batch(&mut self, _batch: RecordBatch, _input: usize, _out: &mut Collector) -> Result<()> {
        Ok(())
    }
}

async fn channel_baseline(batches: u64) -> f64 {
    let b = batch();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<RecordBatch>(4);
    let started = Instant::now();
    let producer = tokio::spawn(async move {
        for _ in 0..batches {
            tx.send(b.clone()).await.unwrap();
        }
    });
    let mut rows = 0;
    while let Some(b) = rx.recv().await {
        rows += b.num_rows();
    }
    producer.await.unwrap();
    rows as f64 / started.elapsed().as_secs_f64()
}

/// The same SQL plan applied to the same batches in a plain loop: the kernels' cost
/// without the runtime.
fn kernels_only(batches: u64) -> f64 {
    let plan = shareflow::runtime::sql::SqlPlan::plan(QUERY, SequenceSource::schema()).unwrap();
    let b = batch();
    let started = Instant::now();
    let mut rows = 0;
    for _ in 0..batches {
        std::hint::black_box(plan.execute(b.clone(), "bench").unwrap());
        rows += ROWS_PER_BATCH;
    }
    rows as f64 / started.elapsed().as_secs_f64()
}

const QUERY: &str = r#"SELECT "offset", value FROM input WHERE "offset" % 2 = 0"#;

async fn pipeline(batches: u64, interval: Option<Duration>, tag: &str) -> (f64, u64) {
    let b = batch();
    let job = JobBuilder::new();
    job.source("gen", SequenceSource::schema(), move |_| Repeat { batch: b.clone(), left: batches })
        .sql("filter", QUERY)
        .sink("discard", |_| Discard);
    let storage = CheckpointStore::from_url(&format!("memory://bench-{tag}/c"), &[], "bench").unwrap();
    let mut config = JobConfig::new(storage, "bench", tag);
    config.checkpoint_interval = interval;
    let job = job.build(config).unwrap();
    let started = Instant::now();
    let report = job.run().await.unwrap();
    let rows = batches * ROWS_PER_BATCH as u64;
    (rows as f64 / started.elapsed().as_secs_f64(), report.metrics.checkpoints.completed)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let batches = 20_000;
        let mut ratios = Vec::new();
        for round in 0..3 {
            let base = channel_baseline(batches).await;
            let kernels = kernels_only(batches);
            let (ops, _) = pipeline(batches, None, &format!("eff{round}")).await;
            println!(
                "operator efficiency, round {round}: bare channel {:.1} M rows/s, kernels alone {:.1} M rows/s, \
                 generator -> SQL filter/projection -> null sink {:.1} M rows/s; ratio to channel {:.3}, to kernels alone {:.2}",
                base / 1e6,
                kernels / 1e6,
                ops / 1e6,
                ops / base,
                ops / kernels
            );
            ratios.push((ops / base, ops / kernels));
        }
        ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
        println!(
            "operator efficiency median: {:.3} of a bare channel (target >= 0.5), {:.2} of the kernels alone; absolute target >= 5 M rows/s per core",
            ratios[1].0, ratios[1].1
        );

        let batches = 150_000;
        let mut overhead = Vec::new();
        for round in 0..3 {
            let (without, _) = pipeline(batches, None, &format!("nock{round}")).await;
            let (with, n) = pipeline(batches, Some(Duration::from_secs(1)), &format!("ck{round}")).await;
            println!(
                "checkpoint overhead, round {round}: no checkpoints {:.1} M rows/s, checkpoints every 1 s {:.1} M rows/s ({n} checkpoints), ratio {:.3}",
                without / 1e6,
                with / 1e6,
                with / without
            );
            overhead.push(with / without);
        }
        overhead.sort_by(f64::total_cmp);
        println!("checkpoint overhead median ratio {:.3} (target >= 0.97)", overhead[1]);
    });
}
