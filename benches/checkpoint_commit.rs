//! Checkpoint commit latency (the state the manifest does not inline in the shared state
//! object, then the manifest with `PutMode::Create`) divided by the latency of one raw PUT
//! of the same manifest bytes, on the same store with the same durability; with a shared
//! state object, also against a raw PUT of its bytes followed by the raw manifest PUT
//! (the floor of a commit that writes the two in order). 64 KiB states run both ways:
//! inlined by the default limit (one object), and with none inlined. All are measured interleaved:
//! local disk with fsync, and the S3 server when `SHAREFLOW_S3_ENDPOINT` is set
//! (`eval "$(scripts/s3 env)"` after `scripts/s3 start`). Each configuration runs
//! `RUNS` times; the summary gives the median and min-max of the runs' ratios.
//!
//! `cargo bench --bench checkpoint_commit`

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use shareflow::checkpoint::{open_url, CheckpointPaths, CheckpointStore, DurableLocalStore, DEFAULT_INLINE_LIMIT};

#[path = "support/results.rs"]
mod results;

const ROUNDS: usize = 200;
const RUNS: usize = 5;
const SUBTASKS: usize = 4;

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// One run of one configuration; returns its (p50, p99) commit/raw ratios and its
/// layout.
async fn measure(
    results: &mut results::Results,
    name: &str,
    store: Arc<dyn ObjectStore>,
    root: &str,
    state_bytes: usize,
    inline_limit: usize,
    run: usize,
) -> (f64, f64, &'static str) {
    let job = format!("bench-{}-{state_bytes}-{inline_limit}-{run}", std::process::id());
    let checkpoints = CheckpointStore::new(store.clone(), CheckpointPaths::new(root, &job).unwrap());
    let state = bytes::Bytes::from(vec![7u8; state_bytes]);
    let (mut raw, mut commit) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    let mut manifest_bytes = 0;
    // With state files: one raw PUT of the shared state object's bytes too, and that plus
    // the raw manifest PUT, the floor of a commit that writes the two one after the other.
    let mut two_puts = Vec::with_capacity(ROUNDS);
    // Whether the manifest carried every state, as the store decided.
    let mut inlined = false;
    for round in 0..ROUNDS as u64 + 5 {
        let id = round + 1;
        // A checkpoint: what does not fit the inline limit into the shared state object,
        // then the manifest with PutMode::Create.
        let states: Vec<(String, u32, bytes::Bytes)> =
            (0..SUBTASKS).map(|i| ("op".to_string(), i as u32, state.clone())).collect();
        let started = Instant::now();
        let manifest = checkpoints.commit_checkpoint(id, &states, vec![], inline_limit).await.unwrap();
        let commit_time = started.elapsed();
        inlined = manifest.state_files.iter().all(|f| f.inline.is_some());
        // One raw PUT of the same manifest bytes, to another key.
        let bytes = manifest.encode().unwrap();
        manifest_bytes = bytes.len();
        let path = Path::from(format!("{root}/{job}/raw/{id:020}"));
        let started = Instant::now();
        store.put(&path, PutPayload::from(bytes)).await.unwrap();
        let raw_time = started.elapsed();
        let state_time = if inlined {
            None
        } else {
            let shared = store.get(&checkpoints.paths().shared_state(id)).await.unwrap().bytes().await.unwrap();
            let path = Path::from(format!("{root}/{job}/raw-state/{id:020}"));
            let started = Instant::now();
            store.put(&path, PutPayload::from(shared)).await.unwrap();
            Some(started.elapsed())
        };
        if round >= 5 {
            commit.push(commit_time);
            raw.push(raw_time);
            if let Some(t) = state_time {
                two_puts.push(t + raw_time);
            }
        }
    }
    raw.sort();
    commit.sort();
    two_puts.sort();
    let (r50, r99, c50, c99) =
        (quantile(&raw, 0.5), quantile(&raw, 0.99), quantile(&commit, 0.5), quantile(&commit, 0.99));
    let ms = |sorted: &[Duration]| -> Vec<f64> {
        [0.5, 0.9, 0.99].iter().map(|&q| quantile(sorted, q).as_secs_f64() * 1e3).collect()
    };
    results.record(serde_json::json!({"kind": "latency", "store": name, "subtasks": SUBTASKS,
        "state_bytes": state_bytes, "inline_limit": inline_limit, "layout": layout(inlined),
        "manifest_bytes": manifest_bytes, "rounds": ROUNDS, "run": run, "quantiles": [0.5, 0.9, 0.99],
        "raw_put_ms": ms(&raw), "commit_ms": ms(&commit),
        "state_and_manifest_puts_ms": if inlined { serde_json::Value::Null } else { ms(&two_puts).into() }}));
    let ratios = (c50.as_secs_f64() / r50.as_secs_f64(), c99.as_secs_f64() / r99.as_secs_f64());
    if !inlined {
        let (t50, t99) = (quantile(&two_puts, 0.5), quantile(&two_puts, 0.99));
        println!(
            "  raw state object PUT + raw manifest PUT p50 {t50:>10.2?}  p99 {t99:>10.2?}: commit / that p50 {:.2}x, p99 {:.2}x",
            c50.as_secs_f64() / t50.as_secs_f64(),
            c99.as_secs_f64() / t99.as_secs_f64()
        );
    }
    println!(
        "{name}: {SUBTASKS} subtasks x {} KiB state ({}, manifest {manifest_bytes} bytes), {ROUNDS} rounds interleaved, run {}/{RUNS}\n  raw manifest PUT  p50 {r50:>10.2?}  p99 {r99:>10.2?}\n  checkpoint commit p50 {c50:>10.2?}  p99 {c99:>10.2?}\n  ratio             p50 {:.2}x (target <= 2.5x)  p99 {:.2}x (target <= 4x)",
        state_bytes / 1024,
        layout(inlined),
        run + 1,
        ratios.0,
        ratios.1,
    );
    (ratios.0, ratios.1, layout(inlined))
}

/// How a configuration lays out a checkpoint.
fn layout(inlined: bool) -> &'static str {
    if inlined {
        "inlined in the manifest"
    } else {
        "one shared state object"
    }
}

/// Runs every configuration `RUNS` times on one store and prints the median and min-max
/// ratios: small state and 64 KiB states with the default inline limit (the manifest
/// carries them, one object), and 64 KiB states with none inlined (the shared state
/// object, then the manifest).
async fn measure_all(results: &mut results::Results, name: &str, store: Arc<dyn ObjectStore>) {
    for (size, limit) in [(2 * 1024, DEFAULT_INLINE_LIMIT), (64 * 1024, DEFAULT_INLINE_LIMIT), (64 * 1024, 0)] {
        let mut runs = Vec::new();
        for run in 0..RUNS {
            runs.push(measure(results, name, store.clone(), "bench", size, limit, run).await);
        }
        let summary = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            format!("{:.2}x ({:.2}-{:.2})", v[v.len() / 2], v[0], v[v.len() - 1])
        };
        println!(
            "SUMMARY {name}, {} KiB state, {}: ratio p50 {}, p99 {} (median and min-max of {RUNS} runs)",
            size / 1024,
            runs[0].2,
            summary(runs.iter().map(|r| r.0).collect()),
            summary(runs.iter().map(|r| r.1).collect()),
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut results = results::Results::create(
        "checkpoint_commit",
        serde_json::json!({"rounds": ROUNDS, "runs": RUNS, "subtasks": SUBTASKS, "s3": std::env::var("SHAREFLOW_S3_ENDPOINT").is_ok()}),
    );
    let results = &mut results;
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn ObjectStore> = Arc::new(DurableLocalStore::new(dir.path()).unwrap());
        measure_all(results, "file:// with fsync", local).await;
        match std::env::var("SHAREFLOW_S3_ENDPOINT") {
            Ok(endpoint) => {
                let get = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
                let (bucket, key, secret) = (
                    get("SHAREFLOW_S3_BUCKET", "shareflow"),
                    get("SHAREFLOW_S3_ACCESS_KEY", "shareflow"),
                    get("SHAREFLOW_S3_SECRET_KEY", "shareflow-secret"),
                );
                let (store, _) = open_url(
                    &format!("s3://{bucket}"),
                    &[("endpoint", &endpoint), ("access_key_id", &key), ("secret_access_key", &secret)],
                )
                .unwrap();
                measure_all(results, "s3 (MinIO)", store).await;
            }
            Err(_) => println!(
                "s3: skipped, SHAREFLOW_S3_ENDPOINT is not set (run scripts/s3 start; eval \"$(scripts/s3 env)\")"
            ),
        }
    });
}
