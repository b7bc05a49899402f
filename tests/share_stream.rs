//! `ShareStream`, the embedding API without the runtime: a caller's own loop that
//! crashes at every step of its checkpoint protocol loses nothing and repeats nothing,
//! on the embedded broker and on real Kafka. The loop uses only the stream's API and
//! its own store (a handle and a row count).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "support/rng.rs"]
mod rng;

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::array::{Array, BinaryArray};
use arrow::record_batch::RecordBatch;
use futures::StreamExt;
use rng::Rng;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::{IsolationLevel, ProducerRecord, ShareConfig, TopicPartition};
use shareflow::connector::stream::{ShareStream, StreamCheckpoint, StreamOptions};
use shareflow::runtime::ErrorKind;

const GROUP: &str = "stream-group";
const PREFIX: &str = "worker";
const IN: &str = "stream-in";
const OUT: &str = "stream-out";

/// Where the caller's process dies: right after this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    /// A batch was read and nothing done with it.
    Read,
    /// Its output was sent into T(n).
    Sent,
    /// T(n) was prepared; the handle was not persisted.
    Prepared,
    /// The handle was persisted with the state; T(n) was not committed.
    Persisted,
    /// T(n) was committed.
    Committed,
}

const CRASHES: [Crash; 5] = [Crash::Read, Crash::Sent, Crash::Prepared, Crash::Persisted, Crash::Committed];

/// The caller's own store: the last persisted handle and the state that goes with it,
/// written together.
#[derive(Debug, Default, Clone)]
struct Store {
    handle: Option<Vec<u8>>,
    rows: u64,
}

impl Store {
    fn last(&self) -> Option<StreamCheckpoint> {
        self.handle.as_ref().map(|b| StreamCheckpoint::from_bytes(b).expect("the handle we wrote decodes"))
    }
}

fn values(batch: &RecordBatch) -> Vec<Vec<u8>> {
    let col = batch.column(batch.schema().index_of("value").unwrap());
    let values = col.as_any().downcast_ref::<BinaryArray>().expect("binary values");
    (0..values.len()).map(|i| values.value(i).to_vec()).collect()
}

fn input_value(i: u64) -> String {
    format!("r-{i:06}")
}

/// How one run of the caller's loop ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// It crashed as its `crash` said.
    Crashed,
    /// The stream ended (drained).
    Drained,
    /// The stream asked for a restart (`Unavailable`: on Kafka, a ledger write slower
    /// than half the acquisition lock); a caller reopens from its last handle.
    Restart,
}

/// The caller's loop: one output record per input record, a checkpoint every `every`
/// batches, crashing as `crash` says (at its `at`-th batch).
async fn run(mut stream: ShareStream, store: &mut Store, out: &str, every: u32, crash: Option<(u32, Crash)>) -> End {
    let mut rows = store.rows;
    let mut batches = 0u32;
    let dies = |step: Crash, batches: u32| crash.is_some_and(|(at, c)| c == step && batches >= at);
    while let Some(batch) = stream.next().await {
        let batch = match batch {
            Ok(batch) => batch,
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                eprintln!("the stream asks for a restart: {e}");
                return End::Restart;
            }
            Err(e) => panic!("a batch: {e}"),
        };
        batches += 1;
        if dies(Crash::Read, batches) {
            return End::Crashed;
        }
        rows += batch.num_rows() as u64;
        let out =
            values(&batch).into_iter().map(|v| ProducerRecord::new(out, 0, [b"o-".as_slice(), &v].concat())).collect();
        stream.send(out).await.expect("send");
        if dies(Crash::Sent, batches) {
            return End::Crashed;
        }
        if !batches.is_multiple_of(every) {
            continue;
        }
        let handle = stream.checkpoint().await.expect("checkpoint");
        if dies(Crash::Prepared, batches) {
            return End::Crashed;
        }
        *store = Store { handle: Some(handle.to_bytes()), rows };
        if dies(Crash::Persisted, batches) {
            return End::Crashed;
        }
        stream.commit(&handle).await.expect("commit");
        if dies(Crash::Committed, batches) {
            return End::Crashed;
        }
    }
    // Drained: the last checkpoint covers everything read.
    let handle = stream.checkpoint().await.expect("final checkpoint");
    *store = Store { handle: Some(handle.to_bytes()), rows };
    stream.commit(&handle).await.expect("final commit");
    stream.close().await.expect("close");
    End::Drained
}

/// Counts each input value in `output`, and names what is missing or repeated.
fn exactly_once(output: &[Vec<u8>], records: u64) -> Result<(), String> {
    let mut seen: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
    for v in output {
        *seen.entry(v.clone()).or_default() += 1;
    }
    let mut missing = Vec::new();
    for i in 0..records {
        let v = format!("o-{}", input_value(i)).into_bytes();
        if seen.remove(&v).is_none() {
            missing.push(i);
        }
    }
    let repeated: Vec<String> = seen.iter().map(|(v, n)| format!("{} x{n}", String::from_utf8_lossy(v))).collect();
    let duplicates = output.len() as u64 - (records - missing.len() as u64);
    if missing.is_empty() && duplicates == 0 {
        return Ok(());
    }
    Err(format!(
        "{} missing (first {:?}), {duplicates} extra ({:?})",
        missing.len(),
        &missing[..missing.len().min(5)],
        &repeated[..repeated.len().min(5)]
    ))
}

/// Fisher-Yates with the tests' seeded generator.
fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

fn options() -> StreamOptions {
    let mut options = StreamOptions::new(GROUP, PREFIX, &[IN]);
    options.source.max_poll_records = 50;
    options.source.stop_when_drained = true;
    options
}

/// An embedded broker in `dir` whose input holds `records` records over 2 partitions,
/// with the highest delivery limit (10): five crashes raise a count by at most five.
async fn embedded_with_input(dir: &std::path::Path, records: u64) -> EmbeddedBroker {
    let broker = EmbeddedBroker::open(BrokerOptions::local_dir(dir).unwrap()).await.unwrap();
    broker.create_topic(IN, 2).await.unwrap();
    broker.create_topic(OUT, 1).await.unwrap();
    let config = ShareConfig::builder().delivery_count_limit(10).build().unwrap();
    broker.configure_group(GROUP, config).await.unwrap();
    let input: Vec<ProducerRecord> =
        (0..records).map(|i| ProducerRecord::new(IN, (i % 2) as i32, input_value(i))).collect();
    for chunk in input.chunks(500) {
        broker.produce(chunk.to_vec()).await.unwrap();
    }
    broker
}

async fn embedded_output(broker: &EmbeddedBroker) -> Vec<Vec<u8>> {
    let out = broker.fetch_all(&TopicPartition::new(OUT, 0), IsolationLevel::ReadCommitted).await.unwrap();
    out.into_iter().filter_map(|r| r.value.map(|v| v.to_vec())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_crashing_at_every_step_on_the_embedded_broker_loses_and_repeats_nothing() {
    const RECORDS: u64 = 3_000;
    let mut rng = Rng::new(0x5eed_5743);
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = embedded_with_input(dir.path(), RECORDS).await;
        let mut store = Store::default();
        // Every crash kind once per round, in a seeded order, at seeded batches.
        let mut crashes = CRASHES.to_vec();
        shuffle(&mut rng, &mut crashes);
        for &kind in &crashes {
            let at = 1 + rng.below(6) as u32;
            let stream = ShareStream::embedded(&broker, options(), store.last().as_ref()).await.expect("recover");
            let end = run(stream, &mut store, OUT, 2, Some((at, kind))).await;
            assert_eq!(end, End::Crashed, "round {round}: the crash {kind:?} at batch {at} happened");
            // The process dies: the broker goes with it and reopens from its directory.
            broker.close();
            broker = EmbeddedBroker::open(BrokerOptions::local_dir(dir.path()).unwrap()).await.unwrap();
        }
        let stream = ShareStream::embedded(&broker, options(), store.last().as_ref()).await.expect("recover");
        assert_eq!(run(stream, &mut store, OUT, 2, None).await, End::Drained, "the last run drains");
        let output = embedded_output(&broker).await;
        exactly_once(&output, RECORDS).unwrap_or_else(|e| panic!("round {round}, crashes {crashes:?}: {e}"));
        assert_eq!(store.rows, RECORDS, "round {round}: the caller's state counts every record once");
        assert!(broker.pending_transactions().await.unwrap().is_empty(), "nothing is left undecided");
        broker.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persisted_handle_commits_and_an_unpersisted_one_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let broker = embedded_with_input(dir.path(), 100).await;
    let mut options = options();
    options.source.max_poll_records = 10;
    // Checkpoint 1 persisted and committed by the recovery; checkpoint 2 never persisted.
    let mut stream = ShareStream::embedded(&broker, options.clone(), None).await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    stream.send(vec![ProducerRecord::new(OUT, 0, "from-1")]).await.unwrap();
    let h1 = stream.checkpoint().await.unwrap();
    assert_eq!(h1.checkpoint_id(), 1);
    let second = stream.next().await.unwrap().unwrap();
    stream.send(vec![ProducerRecord::new(OUT, 0, "from-2")]).await.unwrap();
    let h2 = stream.checkpoint().await.unwrap();
    assert_eq!((h2.checkpoint_id(), h2.fencing_epoch()), (2, h1.fencing_epoch()));
    assert!(embedded_output(&broker).await.is_empty(), "nothing is visible before a commit");
    drop(stream);

    let mut stream = ShareStream::embedded(&broker, options, Some(&h1)).await.unwrap();
    assert_eq!(embedded_output(&broker).await, vec![b"from-1".to_vec()], "T(1) committed, T(2) aborted");
    assert_eq!(stream.transaction().checkpoint_id(), 4, "T(3) was begun before the crash, and ids are never reused");
    // The records of T(2) come back; those of T(1) do not.
    let mut again = Vec::new();
    while let Some(b) = stream.next().await {
        again.extend(values(&b.unwrap()));
    }
    let second_values = values(&second);
    assert!(second_values.iter().all(|v| again.contains(v)), "T(2)'s records are delivered again");
    assert!(values(&first).iter().all(|v| !again.contains(v)), "T(1)'s records are done");
    let h3 = stream.checkpoint().await.unwrap();
    assert!(h3.fencing_epoch() > h1.fencing_epoch(), "a recovery takes a higher fencing epoch");
    // A handle of an earlier run is for the recovery, not for commit.
    let err = stream.commit(&h1).await.expect_err("a handle of an earlier run");
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("passed to the recovery"), "{err}");
    stream.commit(&h3).await.unwrap();
    stream.commit(&h3).await.expect("commit is idempotent");
    stream.close().await.unwrap();
    broker.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stream_fences_the_first_and_a_foreign_handle_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = embedded_with_input(dir.path(), 20).await;
    let mut old = ShareStream::embedded(&broker, options(), None).await.unwrap();
    old.next().await.unwrap().unwrap();
    let mut new = ShareStream::embedded(&broker, options(), None).await.unwrap();
    let err = old.checkpoint().await.expect_err("the first stream is fenced");
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    let again = old.checkpoint().await.expect_err("a failed stream stays failed");
    assert!(again.to_string().contains("open a new one with the last persisted handle"), "{again}");

    let foreign = StreamCheckpoint::from_bytes(&{
        let mut other = StreamOptions::new("another-group", PREFIX, &[IN]);
        other.source.stop_when_drained = true;
        broker.create_topic("another-in", 1).await.unwrap();
        other.source.topics = vec!["another-in".into()];
        let mut s = ShareStream::embedded(&broker, other, None).await.unwrap();
        let h = s.checkpoint().await.unwrap();
        s.commit(&h).await.unwrap();
        h.to_bytes()
    })
    .unwrap();
    let err = ShareStream::embedded(&broker, options(), Some(&foreign)).await.expect_err("foreign handle");
    assert!(err.to_string().contains("belongs to group another-group"), "{err}");
    // The live stream is untouched by the refused open.
    while let Some(b) = new.next().await {
        b.unwrap();
    }
    let h = new.checkpoint().await.unwrap();
    new.commit(&h).await.unwrap();
    new.close().await.unwrap();
    broker.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_with_an_unread_batch_in_flight_is_refused_until_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let broker = embedded_with_input(dir.path(), 0).await;
    let mut options = options();
    options.source.stop_when_drained = false;
    options.source.poll_timeout = Duration::from_secs(5);
    let mut stream = ShareStream::embedded(&broker, options, None).await.unwrap();
    // A `select!` whose other branch wins: the poll stays in flight, waiting for records.
    assert!(tokio::time::timeout(Duration::from_millis(200), stream.next()).await.is_err());
    broker.produce(vec![ProducerRecord::new(IN, 0, "late")]).await.unwrap();
    let err = stream.checkpoint().await.expect_err("the in-flight poll returned a batch nobody read");
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("read them with next()"), "{err}");
    let batch = stream.next().await.unwrap().unwrap();
    assert_eq!(values(&batch), vec![b"late".to_vec()]);
    stream.send(vec![ProducerRecord::new(OUT, 0, "o-late")]).await.unwrap();
    let h = stream.checkpoint().await.expect("read: the checkpoint goes on");
    stream.commit(&h).await.unwrap();
    assert_eq!(embedded_output(&broker).await, vec![b"o-late".to_vec()]);
    stream.close().await.unwrap();
    broker.close();
}

#[cfg(feature = "kafka")]
mod kafka {
    use super::*;
    use shareflow::connector::kafka::KafkaCluster;
    use support::kafka::{cluster, unique};

    struct Names {
        group: String,
        input: String,
        output: String,
    }

    fn options(n: &Names) -> StreamOptions {
        let mut options = StreamOptions::new(&n.group, PREFIX, &[&n.input]);
        options.source.max_poll_records = 50;
        options.source.stop_when_drained = true;
        options
    }

    async fn output(c: &KafkaCluster, topic: &str) -> Vec<Vec<u8>> {
        assert!(c.wait_stable(topic, Duration::from_secs(30)).await.expect("ends"), "{topic} stays open");
        c.read_committed(topic)
            .await
            .expect("read")
            .into_iter()
            .filter_map(|(_, _, _, v)| v.map(|v| v.to_vec()))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_crashing_at_every_step_on_kafka_loses_and_repeats_nothing() {
        const RECORDS: u64 = 1_000;
        let Some(c) = cluster().await else { return };
        let n = Names { group: unique("stream-group"), input: unique("stream-in"), output: unique("stream-out") };
        c.ensure_topic(&n.input, 2, &[]).await.unwrap();
        c.ensure_topic(&n.output, 1, &[]).await.unwrap();
        c.set_group_configs(&n.group, &[("share.record.lock.duration.ms", "2000")]).await.unwrap();
        c.produce(&n.input, (0..RECORDS).map(|i| (None, bytes::Bytes::from(input_value(i))))).await.unwrap();
        let mut store = Store::default();
        let mut rng = Rng::new(0x4b61_666b);
        let mut crashes = CRASHES.to_vec();
        shuffle(&mut rng, &mut crashes);
        for &kind in &crashes {
            let at = 1 + rng.below(4) as u32;
            let mut end = End::Restart;
            // A restart is a ledger write slower than half the lock: on a loaded machine
            // a few come in a row.
            for _ in 0..8 {
                let stream = ShareStream::kafka(&c, options(&n), store.last().as_ref()).await.expect("recover");
                end = run(stream, &mut store, &n.output, 1, Some((at, kind))).await;
                if end != End::Restart {
                    break;
                }
            }
            assert_eq!(end, End::Crashed, "the crash {kind:?} at batch {at} happened");
        }
        let mut end = End::Restart;
        for _ in 0..8 {
            let stream = ShareStream::kafka(&c, options(&n), store.last().as_ref()).await.expect("recover");
            end = run(stream, &mut store, &n.output, 1, None).await;
            if end != End::Restart {
                break;
            }
        }
        assert_eq!(end, End::Drained, "the last run drains");
        let out = output(&c, &n.output).await;
        exactly_once(&out, RECORDS).unwrap_or_else(|e| panic!("crashes {crashes:?}: {e}"));
        assert_eq!(store.rows, RECORDS, "the caller's state counts every record once");
    }
}
