//! How many transactional ids a long-running exactly-once job leaves on a real Kafka 4.x
//! broker, and what they cost its heap (decision 0008, "Fencing on stock Kafka").
//!
//! 1. **Slot pool (shareflow now):** the Kafka pipeline of the demo, on an empty input,
//!    checkpointing every 10 ms until CHECKPOINTS checkpoints have committed. Every
//!    checkpoint is a Kafka transaction (its commit entry rides in it), on
//!    `{group}-{prefix}-g{generation}-s{n mod 4}`.
//! 2. **One id per checkpoint (the scheme 0008 replaced):** CHECKPOINTS transactions, each
//!    on a transactional id of its own (`{group}-{prefix}-{n}`), by Kafka's own Java
//!    producer: init, begin, one record, commit.
//!
//! After each, the broker's ids under the prefix are counted (ListTransactions), and its
//! live heap is read with `jcmd PID GC.run` then `GC.heap_info`.
//!
//! ```text
//! ./scripts/kafka start && eval "$(./scripts/kafka env)"
//! cargo run --release --features kafka --example kafka_txn_ids [-- CHECKPOINTS]
//! ```

use std::process::Command;
use std::time::{Duration, Instant};

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::kafka::{
    KafkaCluster, KafkaShareSource, KafkaSink, KafkaTransactions, KafkaTransactionsConfig,
};
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow::runtime::{JobBuilder, JobConfig};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The scheme 0008 replaced: one transactional id per checkpoint, `PREFIX{n}`.
const PER_CHECKPOINT_IDS: &str = r#"
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class PerCheckpointIds {
    public static void main(String[] a) throws Exception {
        String bootstrap = a[0], prefix = a[1], topic = a[2];
        int n = Integer.parseInt(a[3]), threads = 4;
        Thread[] ts = new Thread[threads];
        for (int t = 0; t < threads; t++) {
            final int first = t;
            ts[t] = new Thread(() -> {
                for (int i = first; i < n; i += threads) {
                    Properties p = new Properties();
                    p.put("bootstrap.servers", bootstrap);
                    p.put("transactional.id", prefix + i);
                    p.put("key.serializer", ByteArraySerializer.class.getName());
                    p.put("value.serializer", ByteArraySerializer.class.getName());
                    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
                        producer.initTransactions();
                        producer.beginTransaction();
                        producer.send(new ProducerRecord<>(topic, new byte[8]));
                        producer.commitTransaction();
                    }
                }
            });
            ts[t].start();
        }
        for (Thread t : ts) t.join();
    }
}
"#;

/// The broker's live heap in KiB after a full GC.
fn live_heap_kib(pid: &str) -> Result<u64, Error> {
    let run = |args: &[&str]| -> Result<String, Error> {
        let out = Command::new("jcmd").arg(pid).args(args).output()?;
        if !out.status.success() {
            return Err(format!("jcmd {pid} {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    run(&["GC.run"])?;
    let info = run(&["GC.heap_info"])?;
    // " garbage-first heap   total 1048576K, used 123456K [...]"
    let used = info
        .split("used ")
        .nth(1)
        .and_then(|rest| rest.split('K').next())
        .ok_or_else(|| format!("no 'used' figure in jcmd GC.heap_info output:\n{info}"))?;
    Ok(used.trim().parse()?)
}

fn unique(base: &str) -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{base}-{ms}")
}

/// The demo's Kafka pipeline on an empty input until `checkpoints` checkpoints committed.
async fn slot_pool(c: &KafkaCluster, checkpoints: u64) -> Result<(String, f64), Error> {
    let name = unique("txn-ids");
    let (input, output) = (format!("{name}-input"), format!("{name}-output"));
    c.ensure_topic(&input, 2, &[]).await?;
    c.ensure_topic(&output, 2, &[]).await?;
    let txns = KafkaTransactions::new(c.clone(), KafkaTransactionsConfig::default());
    let metrics = std::sync::Arc::new(SourceMetrics::default());
    let source = SourceSettings::new(&name, &[&input]);
    let job = JobBuilder::new();
    job.source("share-source", record_schema(), KafkaShareSource::factory(c.clone(), txns.clone(), source, metrics))
        .parallelism(1)
        .sink("kafka-sink", KafkaSink::factory(txns.clone(), &output))
        .parallelism(1);
    job.participant(txns);
    let storage = CheckpointStore::from_url(&format!("memory://{name}"), &[], &name)?;
    let config = JobConfig::new(storage, &name, "job").checkpoint_interval(Duration::from_millis(10));
    let job = job.build(config)?;
    let stop = job.stop_handle();
    let started = Instant::now();
    // Progress every 1,000 checkpoints; give up (and say so) after an hour.
    let deadline = started + Duration::from_secs(3600);
    let (report, ()) = tokio::join!(job.run(), async {
        let mut reported = 0;
        loop {
            let done = job.metrics().checkpoints.completed;
            if done >= checkpoints || Instant::now() > deadline {
                break;
            }
            if done / 1000 > reported {
                reported = done / 1000;
                let s = started.elapsed().as_secs_f64();
                println!("slot pool: {done} checkpoints after {s:.0} s ({:.1} ms each)", 1000.0 * s / done as f64);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.stop();
    });
    let report = report?;
    let seconds = started.elapsed().as_secs_f64();
    if report.metrics.checkpoints.completed < checkpoints {
        return Err(format!(
            "only {} of {checkpoints} checkpoints committed within an hour",
            report.metrics.checkpoints.completed
        )
        .into());
    }
    println!(
        "slot pool: {} checkpoints committed in {seconds:.1} s ({:.1} ms each)",
        report.metrics.checkpoints.completed,
        1000.0 * seconds / report.metrics.checkpoints.completed.max(1) as f64
    );
    Ok((format!("{name}-job-"), seconds))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let bootstrap = std::env::var("SHAREFLOW_KAFKA_BOOTSTRAP")
        .map_err(|_| "set SHAREFLOW_KAFKA_BOOTSTRAP: ./scripts/kafka start && eval \"$(./scripts/kafka env)\"")?;
    let lib =
        std::env::var("SHAREFLOW_KAFKA_LIB").map_err(|_| "set SHAREFLOW_KAFKA_LIB: eval \"$(./scripts/kafka env)\"")?;
    let pidfile = std::env::var("SHAREFLOW_KAFKA_PIDFILE")
        .map_err(|_| "set SHAREFLOW_KAFKA_PIDFILE: eval \"$(./scripts/kafka env)\"")?;
    let pid = std::fs::read_to_string(&pidfile).map_err(|e| format!("read the broker's pid from {pidfile}: {e}"))?;
    let pid = pid.trim();
    let checkpoints: u64 = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(10_000);
    let c = KafkaCluster::connect(&bootstrap).await?;

    let heap0 = live_heap_kib(pid)?;
    let all0 = c.transactional_ids("").await?.len();
    println!("broker before: {all0} transactional ids, live heap {heap0} KiB");

    let (prefix, _) = slot_pool(&c, checkpoints).await?;
    let ids = c.transactional_ids(&prefix).await?.len();
    let heap1 = live_heap_kib(pid)?;
    println!(
        "slot pool: {ids} transactional ids under {prefix}; live heap {heap1} KiB ({:+} KiB)",
        heap1 as i64 - heap0 as i64
    );

    let name = unique("txn-ids-old");
    let topic = format!("{name}-output");
    c.ensure_topic(&topic, 2, &[]).await?;
    let dir = std::env::temp_dir().join(unique("per-checkpoint-ids"));
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("PerCheckpointIds.java");
    std::fs::write(&source, PER_CHECKPOINT_IDS)?;
    let started = Instant::now();
    let old_prefix = format!("{name}-job-");
    let out = Command::new("java")
        .args(["-cp", &format!("{lib}/*")])
        .arg(&source)
        .args([&bootstrap, &old_prefix, &topic, &checkpoints.to_string()])
        .output()?;
    if !out.status.success() {
        return Err(format!("the Java producer failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    println!("one id per checkpoint: {checkpoints} transactions in {:.1} s", started.elapsed().as_secs_f64());
    let ids = c.transactional_ids(&old_prefix).await?.len();
    let heap2 = live_heap_kib(pid)?;
    println!(
        "one id per checkpoint: {ids} transactional ids under {old_prefix}; live heap {heap2} KiB ({:+} KiB over the slot pool)",
        heap2 as i64 - heap1 as i64
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
