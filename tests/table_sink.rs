//! The table sink: Parquet files and Delta tables published exactly once, through
//! seeded crashes at every fault point (among them between the Delta log and notify),
//! with rolled files and Hive partitions, on `file://` and on the S3 server. The table
//! is read back from its log and its files with the `parquet` crate's reader.
//!
//! `SHAREFLOW_SEED=n` runs one seed; `SHAREFLOW_TABLE_SEEDS=k` runs k (default 12).

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;
#[path = "support/rng.rs"]
mod rng;
#[path = "support/s3.rs"]
mod s3;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use eos::storage_on;
use futures::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::ProducerRecord;
use shareflow::connector::table::{TableCommitter, TableFormat, TableSettings, TableSink};
use shareflow::runtime::{JobConfig, RestartStrategy};

const INPUT: &str = "tbl-in";
const QUERY: &str =
    "SELECT CAST(CAST(value AS VARCHAR) AS BIGINT) AS id, concat('row-', CAST(value AS VARCHAR)) AS body, \
                     CAST(CAST(value AS VARCHAR) AS BIGINT) % 3 AS bucket FROM input";

/// Every object under `root` of `store`, by path relative to `root`.
async fn objects(store: &Arc<dyn ObjectStore>, root: &Path) -> Vec<String> {
    let mut out: Vec<String> = store
        .list(Some(root))
        .map_ok(|m| {
            m.location
                .prefix_match(root)
                .map(|p| p.map(|s| s.as_ref().to_string()).collect::<Vec<_>>().join("/"))
                .unwrap()
        })
        .try_collect()
        .await
        .unwrap();
    out.sort();
    out
}

async fn read(store: &Arc<dyn ObjectStore>, path: &Path) -> bytes::Bytes {
    store.get(path).await.unwrap().bytes().await.unwrap()
}

/// The ids of every row of the table, with their partition value when partitioned:
/// for Delta, the files the log adds; for Parquet, every data file.
async fn table_ids(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    format: TableFormat,
    partitioned: bool,
) -> Vec<(i64, Option<String>)> {
    let all = objects(store, root).await;
    let files: Vec<(String, Option<String>)> = match format {
        TableFormat::Parquet => all
            .iter()
            .filter(|p| p.ends_with(".parquet") && !p.starts_with("_staging"))
            .map(|p| (p.clone(), p.split_once('/').and_then(|(d, _)| d.strip_prefix("bucket=")).map(str::to_string)))
            .collect(),
        TableFormat::Delta => {
            let mut files = Vec::new();
            for log in all.iter().filter(|p| p.starts_with("_delta_log/") && p.ends_with(".json")) {
                let text = read(store, &Path::from(format!("{root}/{log}"))).await;
                let mut txns = 0;
                for line in std::str::from_utf8(&text).unwrap().lines() {
                    let v: serde_json::Value = serde_json::from_str(line).unwrap();
                    txns += usize::from(v.get("txn").is_some());
                    if let Some(add) = v.get("add") {
                        let path = add["path"].as_str().unwrap().replace("%25", "%");
                        let bucket = add["partitionValues"].get("bucket").and_then(|b| b.as_str()).map(str::to_string);
                        files.push((path, bucket));
                    }
                }
                assert_eq!(txns, 1, "{log}: one txn action per commit");
            }
            files
        }
    };
    let mut ids = Vec::new();
    for (file, bucket) in files {
        let bytes = read(store, &Path::from(format!("{root}/{file}"))).await;
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap().build().unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let stored = batch.column_by_name("bucket").is_some();
            assert_eq!(
                stored, !partitioned,
                "{file}: the partition column is in the directory's name, not in the files"
            );
            let id = batch.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            ids.extend((0..id.len()).map(|i| (id.value(i), bucket.clone())));
        }
    }
    ids.sort();
    ids
}

async fn run_seed(seed: u64, store: Arc<dyn ObjectStore>, root: &str) -> Result<usize, String> {
    let mut rng = rng::Rng::new(seed);
    let n = 150 + rng.below(300);
    let (partitions, parallelism) = (1 + rng.below(3) as u32, 1 + rng.below(3) as u32);
    let format = if seed.is_multiple_of(2) { TableFormat::Delta } else { TableFormat::Parquet };
    let partitioned = seed % 4 < 2;
    let broker = EmbeddedBroker::open(BrokerOptions::in_memory().default_config(eos::share_config())).await.unwrap();
    broker.create_topic(INPUT, partitions).await.unwrap();
    let records = (0..n)
        .map(|i| ProducerRecord {
            partition: Some((i % u64::from(partitions)) as i32),
            ..ProducerRecord::new(INPUT, 0, i.to_string())
        })
        .collect();
    broker.produce(records).await.unwrap();
    let settings = TableSettings {
        partition_by: partitioned.then(|| "bucket".to_string()),
        // Small files, so that they roll inside a checkpoint.
        target_file_bytes: 1 + rng.below(4_000) as usize,
        ..TableSettings::new(&format!("memory:///{root}"), format)
    };
    let committer = TableCommitter::on_store(settings, store.clone(), root);
    let group = format!("tbl{seed}");
    let (job, stream, _) = eos::drained_source(&broker, &group, INPUT, eos::share_config(), parallelism);
    stream
        .sql("to-row", QUERY)
        .parallelism(parallelism)
        .sink("table-sink", TableSink::factory(committer.clone()))
        .parallelism(parallelism)
        .participant(committer);
    let mut config = JobConfig::new(storage_on(Arc::new(InMemory::new()), "c"), &group, "job")
        .checkpoint_interval(Duration::from_millis(5 + rng.below(30)))
        .checkpoint_timeout(Duration::from_secs(15))
        .restart(RestartStrategy::FixedDelay { attempts: 12, delay: Duration::from_millis(10) });
    config.tolerable_checkpoint_failures = 3;
    let job = job.build(config).unwrap();
    let points = eos::demo::fault_points();
    let mut crashes = Vec::new();
    for _ in 0..1 + rng.below(3) {
        crashes.push((points[rng.below(points.len() as u64) as usize].to_string(), rng.below(3) as u32));
    }
    let schedule = format!(
        "seed {seed}: {format:?}, partitioned {partitioned}, {n} records, parallelism {parallelism}, {crashes:?}"
    );
    job.failpoints().schedule(crashes);
    let result = job.run().await;
    let fired = job.failpoints().fired();
    result.map_err(|e| format!("{schedule}: the job failed: {e} (fired {fired:?})"))?;
    let got = table_ids(&store, &Path::from(root), format, partitioned).await;
    let want: Vec<(i64, Option<String>)> =
        (0..n as i64).map(|i| (i, partitioned.then(|| (i % 3).to_string()))).collect();
    if got != want {
        let mut count = BTreeMap::new();
        for (id, _) in &got {
            *count.entry(*id).or_insert(0) += 1;
        }
        let twice: Vec<i64> = count.iter().filter(|(_, c)| **c > 1).map(|(i, _)| *i).take(5).collect();
        return Err(format!("{schedule}: fired {fired:?}: {} rows of {n}, twice: {twice:?}", got.len()));
    }
    let staged: Vec<String> = objects(&store, &Path::from(root))
        .await
        .into_iter()
        .filter(|p| p.starts_with("_staging/") && !p.ends_with("_aborted"))
        .collect();
    if !staged.is_empty() {
        return Err(format!("{schedule}: staged files left after a clean stop: {:?}", &staged[..staged.len().min(3)]));
    }
    Ok(fired.len())
}

async fn campaign(store: Arc<dyn ObjectStore>, base: &str, default_seeds: u64) {
    let seeds = eos::campaign_seeds("SHAREFLOW_TABLE_SEEDS", default_seeds);
    let (mut fired, mut failures) = (0, Vec::new());
    for &seed in &seeds {
        match run_seed(seed, store.clone(), &format!("{base}/t{seed}")).await {
            Ok(k) => fired += k,
            Err(why) => {
                eprintln!("{why}\n  replay: SHAREFLOW_SEED={seed} cargo test --test table_sink");
                failures.push(seed);
            }
        }
    }
    eos::campaign_verdict(&format!("table campaign on {base}"), seeds.len(), &failures, fired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_lands_once_on_local_disk_through_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = shareflow::checkpoint::open_url(&format!("file://{}", dir.path().display()), &[]).unwrap();
    campaign(store, "tables", 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_lands_once_on_the_s3_server_through_crashes() {
    let Some((store, _)) = s3::s3_store() else { return };
    campaign(store, &format!("tables-{}", s3::run_tag()), 4).await;
}
