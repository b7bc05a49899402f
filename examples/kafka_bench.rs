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
use std::time::{Duration, Instant};

use bytes::Bytes;
use shareflow::connector::kafka::{KafkaCluster, KafkaShareConsumer, KafkaShareConsumerConfig};
use shareflow::connector::share::{AcknowledgeType, ShareConsumer};
use shareflow::kafka_demo::{self, KafkaDemoOptions};

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
            let mut o = KafkaDemoOptions::new(&bootstrap);
            o.name = unique(if exactly_once { "bench-eos" } else { "bench-alo" });
            o.records = records;
            o.value_len = 1024;
            o.interval = Duration::from_secs(1);
            o.exactly_once = exactly_once;
            o.verify = false;
            o.progress = false;
            o.checkpoints = Some(format!("memory://{}", o.name));
            let s = kafka_demo::run(&o).await?;
            // 2 x records KiB per run: give the disk back.
            let ledger = format!("{}-demo-ledger", o.name);
            c.delete_topics(&[&kafka_demo::input_topic(&o.name), &kafka_demo::output_topic(&o.name), &ledger]).await?;
            let best = if exactly_once { &mut eos } else { &mut alo };
            *best = best.max(s.records_per_second);
        }
    }
    println!(
        "at-least-once {alo:>9.0} rec/s | exactly-once {eos:>9.0} rec/s | exactly-once / at-least-once {:.2}",
        eos / alo
    );
    Ok(())
}
