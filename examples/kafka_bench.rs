//! Throughput on a real Kafka 4.x broker, printed as figures:
//!
//! 1. shareflow's share consumer (at-least-once, acknowledgements batched on the next
//!    fetch) against Kafka's own `kafka-share-consumer-perf-test`
//!    (`org.apache.kafka.tools.ShareConsumerPerformance`), same broker, same topic,
//!    1 and 4 partitions, 1 KiB records;
//! 2. the exactly-once pipeline against the at-least-once pipeline, 1 s checkpoints.
//!
//! ```text
//! ./scripts/kafka start && eval "$(./scripts/kafka env)"
//! cargo run --release --example kafka_bench [-- RECORDS]
//! ```

use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::kafka::{
    KafkaCluster, KafkaShareConsumer, KafkaShareConsumerConfig, KafkaShareSource, KafkaSink, KafkaTransactions,
    KafkaTransactionsConfig,
};
use shareflow::connector::share::{AcknowledgeType, ShareConsumer};
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow::runtime::{JobBuilder, JobConfig};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn unique(base: &str) -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{base}-{ms}")
}

async fn group(c: &KafkaCluster) -> Result<String, Error> {
    let g = unique("bench-group");
    c.set_group_configs(&g, &[("share.auto.offset.reset", "earliest")]).await?;
    Ok(g)
}

/// Records per second of our consumer, from creating it to the last record accepted.
async fn ours(c: &KafkaCluster, topic: &str, records: u64) -> Result<f64, Error> {
    let g = group(c).await?;
    let started = Instant::now();
    let mut m = KafkaShareConsumer::new(c, KafkaShareConsumerConfig::new(&g)).await?;
    m.subscribe(&[topic]).await?;
    let mut seen = 0u64;
    while seen < records {
        let batch = m.poll(500, Duration::from_millis(500)).await?;
        for r in &batch {
            m.acknowledge(r, AcknowledgeType::Accept).await?;
        }
        seen += batch.len() as u64;
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!("only {seen} of {records} records in 300 s").into());
        }
    }
    m.commit().await?;
    let rate = records as f64 / started.elapsed().as_secs_f64();
    m.close().await?;
    Ok(rate)
}

/// Records per second the Java tool reports (its nMsg.sec column).
async fn java(c: &KafkaCluster, bootstrap: &str, topic: &str, records: u64) -> Result<f64, Error> {
    let lib =
        std::env::var("SHAREFLOW_KAFKA_LIB").map_err(|_| "set SHAREFLOW_KAFKA_LIB: eval \"$(./scripts/kafka env)\"")?;
    let g = group(c).await?;
    let out = Command::new("java")
        .args(["-cp", &format!("{lib}/*"), "org.apache.kafka.tools.ShareConsumerPerformance"])
        .args(["--bootstrap-server", bootstrap, "--topic", topic, "--group", &g])
        .args(["--num-records", &records.to_string(), "--timeout", "60000"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.contains(','));
    let header: Vec<&str> =
        lines.next().ok_or("no header from ShareConsumerPerformance")?.split(',').map(str::trim).collect();
    let values: Vec<&str> =
        lines.next().ok_or("no figures from ShareConsumerPerformance")?.split(',').map(str::trim).collect();
    let col = header.iter().position(|h| *h == "nMsg.sec").ok_or("no nMsg.sec column")?;
    Ok(values.get(col).ok_or("short line")?.parse()?)
}

/// Records per second through share source -> SQL -> Kafka sink over `records` records
/// of `value` in 4 partitions, parallelism 2, 1 s checkpoints: from the job's start to
/// its end (produce excluded), as `shareflow demo --kafka` measures it.
async fn pipeline(c: &KafkaCluster, records: u64, value: &Bytes, exactly_once: bool) -> Result<f64, Error> {
    let name = unique(if exactly_once { "bench-eos" } else { "bench-alo" });
    let (input, output) = (format!("{name}-input"), format!("{name}-output"));
    c.ensure_topic(&input, 4, &[]).await?;
    c.ensure_topic(&output, 4, &[]).await?;
    c.produce(&input, (0..records).map(|_| (None, value.clone()))).await?;

    let txns = KafkaTransactions::new(c.clone(), KafkaTransactionsConfig::default().exactly_once(exactly_once));
    let metrics = Arc::new(SourceMetrics::default());
    let mut source = SourceSettings::new(&name, &[&input]);
    source.stop_when_drained = true;
    source.max_poll_records = 2_000;
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        KafkaShareSource::factory(c.clone(), txns.clone(), source, metrics.clone()),
    )
    .parallelism(2)
    .sql("transform", "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input")
    .parallelism(2)
    .sink("kafka-sink", KafkaSink::factory(txns.clone(), &output))
    .parallelism(2);
    job.participant(txns);
    let storage = CheckpointStore::from_url(&format!("memory://{name}"), &[], &name)?;
    let mut config = JobConfig::new(storage, &name, "bench").checkpoint_interval(Duration::from_secs(1));
    config.channel_capacity = 8;
    let job = job.build(config)?;
    let started = Instant::now();
    job.run().await?;
    let rate = metrics.records_emitted.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    // 2 x records of value per run: give the disk back.
    c.delete_topics(&[&input, &output, &format!("{name}-bench-ledger"), &format!("{name}-intents")]).await?;
    Ok(rate)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let bootstrap = std::env::var("SHAREFLOW_KAFKA_BOOTSTRAP")
        .map_err(|_| "set SHAREFLOW_KAFKA_BOOTSTRAP: ./scripts/kafka start && eval \"$(./scripts/kafka env)\"")?;
    let records: u64 = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(200_000);
    let c = KafkaCluster::connect(&bootstrap).await?;
    let value = Bytes::from(vec![b'x'; 1024]);

    println!("== share consumer, {records} records of 1 KiB, at-least-once (accept every record)");
    for partitions in [1, 4] {
        let topic = unique(&format!("bench-{partitions}p"));
        c.ensure_topic(&topic, partitions, &[]).await?;
        c.produce(&topic, (0..records).map(|_| (None, value.clone()))).await?;
        let (mut best_ours, mut best_java) = (0f64, 0f64);
        for _ in 0..2 {
            best_java = best_java.max(java(&c, &bootstrap, &topic, records).await?);
            best_ours = best_ours.max(ours(&c, &topic, records).await?);
        }
        c.delete_topics(&[&topic]).await?;
        println!(
            "{partitions} partition(s): shareflow {best_ours:>9.0} rec/s ({:.1} MiB/s) | kafka-share-consumer-perf-test {best_java:>9.0} rec/s | ratio {:.2}x",
            best_ours / 1024.0,
            best_ours / best_java
        );
    }

    println!("== pipeline share source -> SQL -> Kafka sink, 4 partitions, parallelism 2, 1 s checkpoints, {records} records of 1 KiB");
    let (mut alo, mut eos) = (0f64, 0f64);
    for _ in 0..2 {
        for exactly_once in [false, true] {
            let rate = pipeline(&c, records, &value, exactly_once).await?;
            let best = if exactly_once { &mut eos } else { &mut alo };
            *best = best.max(rate);
        }
    }
    println!(
        "at-least-once {alo:>9.0} rec/s | exactly-once {eos:>9.0} rec/s | exactly-once / at-least-once {:.2}",
        eos / alo
    );
    Ok(())
}
