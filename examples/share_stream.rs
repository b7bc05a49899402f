//! Exactly-once share consumption in your own loop, without the runtime: a
//! [`ShareStream`] of Arrow batches, your own state file, and a crash half-way.
//!
//! `cargo run --example share_stream` (embedded broker in a temporary directory), or
//! `cargo run --features kafka --example share_stream -- --kafka 127.0.0.1:19092` (real Kafka 4.x).
//!
//! The loop counts words, sends one output record per input record into the open
//! transaction, and every 4 batches takes a checkpoint: it persists the handle with
//! its count (write and rename: the decision), then commits. Half-way the process
//! "dies" (the stream is dropped without a commit); the next start recovers from the
//! state file, and at the end the count and the output hold every record once.

use std::path::{Path, PathBuf};

use arrow::array::{Array, BinaryArray};
use futures::StreamExt;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::{IsolationLevel, ProducerRecord, TopicPartition};
use shareflow::connector::stream::{ShareStream, StreamCheckpoint, StreamOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const RECORDS: u64 = 5_000;

/// Your own state: a word count, stored with the handle that decides it.
#[derive(Default)]
struct State {
    handle: Option<StreamCheckpoint>,
    words: u64,
}

fn load(path: &Path) -> Result<State, BoxError> {
    let Ok(bytes) = std::fs::read(path) else { return Ok(State::default()) };
    let (words, handle) = bytes.split_at_checked(8).ok_or("the state file is shorter than 8 bytes")?;
    let words = u64::from_le_bytes(words.try_into()?);
    Ok(State { handle: Some(StreamCheckpoint::from_bytes(handle)?), words })
}

/// One atomic write of the count and the handle: this is the checkpoint's decision.
fn save(path: &Path, words: u64, handle: &StreamCheckpoint) -> Result<(), BoxError> {
    let tmp = path.with_extension("tmp");
    let mut bytes = words.to_le_bytes().to_vec();
    bytes.extend(handle.to_bytes());
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Runs the loop from the persisted state; stops after `crash_after` batches without
/// committing (a crash), or when the input is drained. Returns whether it drained.
async fn run(
    mut stream: ShareStream,
    state_file: &Path,
    out: &str,
    crash_after: Option<u32>,
) -> Result<bool, BoxError> {
    let mut words = load(state_file)?.words;
    let mut batches = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let values = batch.column(batch.schema().index_of("value")?).as_any().downcast_ref::<BinaryArray>().cloned();
        let values = values.ok_or("value is not binary")?;
        let mut output = Vec::with_capacity(values.len());
        for i in 0..values.len() {
            let text = String::from_utf8_lossy(values.value(i));
            words += text.split_whitespace().count() as u64;
            output.push(ProducerRecord::new(out, 0, text.to_uppercase()));
        }
        stream.send(output).await?;
        batches += 1;
        if crash_after == Some(batches) {
            println!("crash after {batches} batches: {} was never committed", stream.transaction());
            return Ok(false); // dropped without commit or close, as a killed process would
        }
        if batches % 4 == 0 {
            let handle = stream.checkpoint().await?;
            save(state_file, words, &handle)?;
            stream.commit(&handle).await?;
        }
    }
    let handle = stream.checkpoint().await?;
    save(state_file, words, &handle)?;
    stream.commit(&handle).await?;
    stream.close().await?;
    Ok(true)
}

fn options(group: &str, input: &str) -> StreamOptions {
    let mut options = StreamOptions::new(group, "word-counter", &[input]);
    options.source.max_poll_records = 200;
    options.source.stop_when_drained = true; // a bounded run for the example
    options
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let kafka = args.iter().position(|a| a == "--kafka").map(|i| args.get(i + 1).cloned());
    let dir = tempfile::tempdir()?;
    let state_file: PathBuf = dir.path().join("state");
    let input: Vec<String> = (0..RECORDS).map(|i| format!("order {i} shipped")).collect();
    match kafka {
        None => {
            let broker_dir = dir.path().join("broker");
            let mut broker = EmbeddedBroker::open(BrokerOptions::local_dir(&broker_dir)?).await?;
            broker.create_topic("orders", 2).await?;
            broker.create_topic("shouted", 1).await?;
            let records = input.iter().enumerate().map(|(i, v)| ProducerRecord::new("orders", i as i32 % 2, v.clone()));
            broker.produce(records.collect()).await?;
            for crash_after in [Some(7), None] {
                let last = load(&state_file)?.handle;
                let stream = ShareStream::embedded(&broker, options("shipping", "orders"), last.as_ref()).await?;
                if !run(stream, &state_file, "shouted", crash_after).await? {
                    broker.close(); // the broker dies with the process and reopens from its directory
                    broker = EmbeddedBroker::open(BrokerOptions::local_dir(&broker_dir)?).await?;
                }
            }
            let out = broker.fetch_all(&TopicPartition::new("shouted", 0), IsolationLevel::ReadCommitted).await?;
            report(load(&state_file)?.words, out.len() as u64);
        }
        #[cfg(feature = "kafka")]
        Some(bootstrap) => {
            use shareflow::connector::kafka::KafkaCluster;
            let bootstrap = bootstrap.ok_or("--kafka needs HOST:PORT")?;
            let cluster = KafkaCluster::connect(&bootstrap).await?;
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() % 1_000_000_000;
            let (group, input_topic, out) =
                (format!("shipping-{nanos}"), format!("orders-{nanos}"), format!("shouted-{nanos}"));
            cluster.ensure_topic(&input_topic, 2, &[]).await?;
            cluster.ensure_topic(&out, 1, &[]).await?;
            cluster.produce(&input_topic, input.iter().map(|v| (None, bytes::Bytes::from(v.clone())))).await?;
            for crash_after in [Some(7), None] {
                let last = load(&state_file)?.handle;
                let stream = ShareStream::kafka(&cluster, options(&group, &input_topic), last.as_ref()).await?;
                run(stream, &state_file, &out, crash_after).await?;
            }
            cluster.wait_stable(&out, std::time::Duration::from_secs(30)).await?;
            report(load(&state_file)?.words, cluster.read_committed(&out).await?.len() as u64);
        }
        #[cfg(not(feature = "kafka"))]
        Some(_) => return Err("this build has no Kafka backend: build with the `kafka` feature".into()),
    }
    Ok(())
}

fn report(words: u64, output: u64) {
    println!(
        "words counted: {words} (expected {}), output records committed: {output} (expected {RECORDS})",
        RECORDS * 3
    );
    let ok = words == RECORDS * 3 && output == RECORDS;
    println!("{}", if ok { "exactly once: yes" } else { "exactly once: NO" });
    if !ok {
        std::process::exit(1);
    }
}
