//! Throughput on a real Kafka 4.x broker, and where the pipeline's time goes.
//!
//! Each round measures, on the same broker and the same topics of 1 KiB records:
//! 1. shareflow's share consumer (at-least-once, acknowledgements batched on the next
//!    fetch) against Kafka's own `kafka-share-consumer-perf-test`
//!    (`org.apache.kafka.tools.ShareConsumerPerformance`), 1 and 4 partitions;
//! 2. two reference runs, PARALLELISM members of the same consumer polling as the
//!    pipeline's source does: reading only, and writing every record they read to another
//!    topic through one shared writer (no runtime, no ledger, no transactions): less work
//!    than the pipeline does for the same records, and the reference it is held to;
//! 3. shareflow's `TopicWriter` against Kafka's own `kafka-producer-perf-test`, each
//!    writing as many records to a topic of 4 partitions;
//! 4. the pipeline on 4 partitions, parallelism 2 (or PARALLELISM), 1 s checkpoints, as
//!    four variants that add one stage at a time: share source -> discard (exactly-once: the
//!    acknowledgements commit in a transaction per checkpoint), + SQL, + Kafka sink
//!    (the full exactly-once pipeline), and the full pipeline at-least-once.
//!
//! After each pipeline run it prints and records where the time went: each operator's
//! backpressure (a blocked operator has a slower one downstream), and how long the
//! source's subtasks waited in share consumer polls that returned records and for their
//! ledger intents.
//!
//! Every run of our clients that counts its records as it goes (the raw consumer, the
//! reference runs, the pipeline's sources) is also watched every millisecond: when the
//! first record came, when the count passed 10 % and 90 % of the records, and how long
//! the run went on after the last. The middle, 10 % to 90 %, gives the rate without a
//! job's fixed costs at either end (its start, its drain check and last checkpoint),
//! the rate a job that runs for weeks sees, with the CPU this process and the broker
//! spent there and the cores the two kept busy together.
//!
//! Every run reads in a share group of its own, made ready before its clock starts: a new
//! group assigns partitions only after one heartbeat interval (2 s on the test broker),
//! which would otherwise be half of a run of a few seconds. Runs of two members (the
//! reference runs and the pipeline's source) then wait at a [`JoinGate`] until the group
//! assigned each its share, as a job does: about 1 s, and counted in their rates.
//!
//! Beside each rate it records the CPU seconds this process and the Kafka broker spent,
//! per million records: on one machine the two share the cores, so a stage that makes
//! the broker work (the Kafka sink writes every record again) shows up there. Topics are
//! created and deleted outside the measured window, each run starts 2 s after the one
//! before (the broker's delayed deletions are done), and each round starts at another
//! variant. Before the first round, one unrecorded read and one unrecorded run of each
//! variant warm up a freshly started broker.
//!
//! ```text
//! ./scripts/kafka start && eval "$(./scripts/kafka env)"
//! cargo run --release --features kafka --example kafka_bench [-- RECORDS [ROUNDS [PARALLELISM [consumer]]]]
//! ```
//!
//! The figures go to `docs/results/kafka_bench.jsonl` (or `$SHAREFLOW_RESULTS_DIR`), for
//! `scripts/bench-summary`; the medians over the rounds are printed at the end.
//!
//! With `consumer`, it measures only our consumer against Kafka's tool, at each of the
//! settings in `CONSUMER_SETTINGS` (Kafka's default of 500 records a fetch and a poll,
//! whole fetches of 10,000 on both sides, and our polls of 500 from fetches of 10,000),
//! and writes `kafka_consumer_bench.jsonl`: runs long enough for the Java tool's JIT to
//! warm up (5,000,000 records) take minutes, not the hour the whole bench would.

#[path = "../benches/support/results.rs"]
mod results;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::kafka::{
    JoinGate, KafkaCluster, KafkaShareConsumer, KafkaShareConsumerConfig, KafkaShareSource, KafkaSink,
    KafkaTransactions, KafkaTransactionsConfig, WHOLE_FETCH_POLL_RECORDS,
};
use shareflow::connector::share::{AcknowledgeType, ShareConsumer};
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings, DEFAULT_POLL_TIMEOUT};
use shareflow::runtime::{async_trait, Collector, JobBuilder, JobConfig, Operator};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn unique(base: &str) -> String {
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{base}-{ns}")
}

/// A new share group reading `topic` from the start, ready before a measured run: a
/// member joins until the coordinator assigned it a partition, then leaves. A new group
/// assigns a partition only once its share state is initialised, which takes one
/// heartbeat interval (2 s on the test broker); a group that runs for weeks pays it once,
/// and a run of a few seconds should not count it.
async fn group_ready(c: &KafkaCluster, topic: &str) -> Result<String, Error> {
    let g = unique("bench-group");
    make_ready(c, &g, topic).await?;
    Ok(g)
}

/// [`group_ready`] for the group named `g`.
async fn make_ready(c: &KafkaCluster, g: &str, topic: &str) -> Result<(), Error> {
    c.set_group_configs(g, &[("share.auto.offset.reset", "earliest")]).await?;
    let mut m = KafkaShareConsumer::new(c, KafkaShareConsumerConfig::new(g)).await?;
    m.subscribe(&[topic]).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.assignment().is_empty() {
        if Instant::now() > deadline {
            return Err(format!("group {g}: no partition of {topic} assigned in 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    m.close().await?;
    Ok(())
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`; with
/// `children`, those of its waited-for children instead.
fn cpu_seconds(pid: &str, children: bool) -> Result<f64, Error> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // Fields after the command name, which is in parentheses and may hold spaces:
    // index 0 is field 3 (state), so utime (14) is 11, stime 12, cutime 13, cstime 14.
    let rest = stat.rsplit_once(')').ok_or_else(|| format!("{path}: no command name"))?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (u, s) = if children { (13, 14) } else { (11, 12) };
    let tick = |i: usize| -> Result<f64, Error> {
        Ok(fields.get(i).ok_or_else(|| format!("{path}: short line"))?.parse::<f64>()?)
    };
    Ok((tick(u)? + tick(s)?) / clock_ticks())
}

/// Clock ticks per second of `/proc` times (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The Kafka broker's pid, from the pid file `./scripts/kafka env` names.
fn broker_pid() -> Result<String, Error> {
    let file = std::env::var("SHAREFLOW_KAFKA_PIDFILE")
        .map_err(|_| "set SHAREFLOW_KAFKA_PIDFILE: eval \"$(./scripts/kafka env)\"")?;
    let pid = std::fs::read_to_string(&file).map_err(|e| format!("the broker's pid file {file}: {e}"))?;
    Ok(pid.trim().to_string())
}

/// What one measured run cost: records per second, and CPU seconds per million records
/// of this process (or of the Java tool), and of the broker.
#[derive(Debug, Clone, Copy)]
struct Cost {
    /// What the run reported.
    run: Rate,
    client_cpu_per_m: f64,
    broker_cpu_per_m: f64,
    /// When the run started and ended, in milliseconds since the Unix epoch: for tools
    /// that line other samples up with it (`scripts/kafka-requests`).
    started_unix_ms: u64,
    ended_unix_ms: u64,
}

impl Cost {
    /// Records per second over the whole run.
    fn rate(&self) -> f64 {
        self.run.whole
    }
}

/// What a run reports: records per second over the whole run, and when its count of
/// records passed its marks, for the runs that count as they go.
#[derive(Debug, Clone, Copy)]
struct Rate {
    whole: f64,
    marks: Option<Marks>,
    /// Records polled with a delivery count above 1: with no crash in a run, records
    /// of a partition the group moved to another member, back after their locks expired.
    redelivered: Option<u64>,
    /// Polls that returned records (for the pipeline: ledger intents written, one per
    /// such poll): the broker's work per record falls as a fetch carries more.
    polls: Option<u64>,
}

impl From<f64> for Rate {
    fn from(whole: f64) -> Self {
        Rate { whole, marks: None, redelivered: None, polls: None }
    }
}

/// Runs `f` (which handles `records` records) and measures its cost.
async fn measured<F: std::future::Future<Output = Result<Rate, Error>>>(
    broker: &str,
    records: u64,
    children: bool,
    f: F,
) -> Result<Cost, Error> {
    let (client0, broker0) = (cpu_seconds("self", children)?, cpu_seconds(broker, false)?);
    let started_unix_ms = unix_ms();
    let rate = f.await?;
    let ended_unix_ms = unix_ms();
    let (client1, broker1) = (cpu_seconds("self", children)?, cpu_seconds(broker, false)?);
    let per_m = 1e6 / records as f64;
    Ok(Cost {
        run: rate,
        client_cpu_per_m: (client1 - client0) * per_m,
        broker_cpu_per_m: (broker1 - broker0) * per_m,
        started_unix_ms,
        ended_unix_ms,
    })
}

/// Milliseconds since the Unix epoch, by the wall clock.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// When a run's count of records passed its marks, as times since the run started,
/// sampled every millisecond. A run has fixed costs at both ends (a job starts its
/// transactional producers and ends with a drain check and a last checkpoint; a member
/// joins and commits): the middle, between 10 % and 90 % of the records, is the rate a
/// job that runs for weeks sees, and the CPU it costs there.
#[derive(Debug, Clone, Copy)]
struct Marks {
    /// The first record counted.
    first: Duration,
    /// The count's passing 10 % and 90 % of the records.
    tenth: Mark,
    ninth: Mark,
    /// When the count reached every record.
    last: Duration,
    /// The run's end: a job ended, the last writes acknowledged.
    end: Duration,
}

/// One sample of a watched run.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Duration,
    count: u64,
    /// CPU seconds used so far by this process and by the broker, where readable.
    cpu: Option<(f64, f64)>,
}

impl Mark {
    fn take(at: Duration, count: u64) -> Mark {
        let cpu = broker_pid().and_then(|b| Ok((cpu_seconds("self", false)?, cpu_seconds(&b, false)?))).ok();
        Mark { at, count, cpu }
    }
}

impl Marks {
    /// Records per second between the 10 % and 90 % marks; none when one sample saw both.
    fn middle_rate(&self) -> Option<f64> {
        Some((self.ninth.count - self.tenth.count) as f64 / self.middle()?.as_secs_f64())
    }

    fn middle(&self) -> Option<Duration> {
        self.ninth.at.checked_sub(self.tenth.at).filter(|d| !d.is_zero())
    }

    /// CPU seconds per million records between the 10 % and 90 % marks, of this process
    /// and of the broker, and the cores both kept busy together (of the machine's).
    fn middle_cpu(&self) -> Option<(f64, f64, f64)> {
        let ((job0, broker0), (job1, broker1)) = (self.tenth.cpu?, self.ninth.cpu?);
        let per_m = 1e6 / (self.ninth.count - self.tenth.count).max(1) as f64;
        let busy = (job1 - job0 + broker1 - broker0) / self.middle()?.as_secs_f64();
        Some(((job1 - job0) * per_m, (broker1 - broker0) * per_m, busy))
    }

    /// The figures a results row carries.
    fn json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let cpu = self.middle_cpu();
        serde_json::json!({
            "middle_rate": self.middle_rate(), "to_first_record_ms": ms(self.first),
            "after_last_record_ms": ms(self.end.saturating_sub(self.last)),
            "middle_job_cpu_s_per_m": cpu.map(|c| c.0), "middle_broker_cpu_s_per_m": cpu.map(|c| c.1),
            "middle_busy_cores": cpu.map(|c| c.2),
        })
    }
}

/// Watches `count`, from `started` until it reaches `records`, every millisecond.
struct Watch {
    started: Instant,
    task: tokio::task::JoinHandle<Option<Marks>>,
}

impl Watch {
    fn start(records: u64, count: impl Fn() -> u64 + Send + 'static) -> Watch {
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let (tenth, ninth) = (records.div_ceil(10), (records * 9).div_ceil(10));
            let (mut first, mut at_tenth, mut at_ninth) = (None, None, None);
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while started.elapsed() < Duration::from_secs(300) {
                tick.tick().await;
                let (n, t) = (count(), started.elapsed());
                if n > 0 {
                    first.get_or_insert(t);
                }
                if n >= tenth && at_tenth.is_none() {
                    at_tenth = Some(Mark::take(t, n));
                }
                if n >= ninth && at_ninth.is_none() {
                    at_ninth = Some(Mark::take(t, n));
                }
                if n >= records {
                    return Some(Marks { first: first?, tenth: at_tenth?, ninth: at_ninth?, last: t, end: t });
                }
            }
            None
        });
        Watch { started, task }
    }

    /// The run's rate, with `end` (a time since [`Watch::start`]) as its end. A watch that
    /// has not seen every record within a second of the end reports no marks.
    async fn rate(self, records: u64, end: Duration) -> Rate {
        let whole = records as f64 / end.as_secs_f64();
        let mut task = self.task;
        let marks = match tokio::time::timeout(Duration::from_secs(1), &mut task).await {
            Ok(Ok(Some(m))) => Some(Marks { end, ..m }),
            _ => {
                task.abort();
                None
            }
        };
        Rate { whole, marks, redelivered: None, polls: None }
    }
}

/// Records per second of our consumer, from creating it to the last record accepted, in
/// share fetches of up to `fetch` records and polls of up to `poll`.
async fn ours(c: &KafkaCluster, topic: &str, records: u64, fetch: usize, poll: usize) -> Result<Rate, Error> {
    let g = group_ready(c, topic).await?;
    let seen = Arc::new(AtomicU64::new(0));
    let watch = Watch::start(records, {
        let seen = seen.clone();
        move || seen.load(Ordering::Relaxed)
    });
    let mut config = KafkaShareConsumerConfig::new(&g);
    config.fetch_max_records = fetch;
    let mut m = KafkaShareConsumer::new(c, config).await?;
    m.subscribe(&[topic]).await?;
    let (mut redelivered, mut polls) = (0u64, 0u64);
    while seen.load(Ordering::Relaxed) < records {
        let batch = m.poll(poll, Duration::from_millis(500)).await?;
        polls += u64::from(!batch.is_empty());
        redelivered += batch.iter().filter(|r| r.is_redelivery()).count() as u64;
        for r in &batch {
            m.acknowledge(r, AcknowledgeType::Accept).await?;
        }
        let n = seen.fetch_add(batch.len() as u64, Ordering::Relaxed) + batch.len() as u64;
        if watch.started.elapsed() > Duration::from_secs(300) {
            return Err(format!("only {n} of {records} records in 300 s").into());
        }
    }
    m.commit().await?;
    let end = watch.started.elapsed();
    m.close().await?;
    Ok(Rate { redelivered: Some(redelivered), polls: Some(polls), ..watch.rate(records, end).await })
}

/// Records each poll of the pipeline's source asks for, and of the reference runs, so
/// that a poll takes a whole share fetch. The raw consumer keeps 500, the default of
/// Kafka's tool it is compared with.
const PIPELINE_POLL_RECORDS: usize = WHOLE_FETCH_POLL_RECORDS;

/// The raw consumer's share fetches and polls: Kafka's default `max.poll.records`, as
/// the Java tool runs.
const RAW_FETCH: usize = 500;
const RAW_POLL: usize = 500;

/// What `kafka_bench RECORDS ROUNDS PARALLELISM consumer` compares: our consumer at
/// each setting (name, records a share fetch asks for, records a poll hands out)
/// against Kafka's tool at the `max.poll.records` given (which sets both for it).
const CONSUMER_SETTINGS: [(&str, usize, usize, usize); 3] = [
    ("defaults: fetches and polls of 500", RAW_FETCH, RAW_POLL, RAW_POLL),
    (
        "whole fetches: fetches and polls of 10,000",
        WHOLE_FETCH_POLL_RECORDS,
        WHOLE_FETCH_POLL_RECORDS,
        WHOLE_FETCH_POLL_RECORDS,
    ),
    ("polls of 500 from fetches of 10,000 (the tool at 500)", WHOLE_FETCH_POLL_RECORDS, 500, 500),
];

/// Our consumer against Kafka's tool at each of [`CONSUMER_SETTINGS`], `rounds` rounds
/// on each topic, the runs of a round in a rotating order; each of the tool's runs is
/// shared by the settings it is the reference of.
async fn consumer_only(
    c: &KafkaCluster,
    bootstrap: &str,
    broker: &str,
    records: u64,
    rounds: u32,
    topics: &[(i32, String)],
    out: &mut results::Results,
) -> Result<(), Error> {
    // (partitions, setting, ours, theirs)
    let mut figures: Vec<(i32, &str, f64, f64)> = Vec::new();
    let mut java_settings: Vec<usize> = CONSUMER_SETTINGS.iter().map(|s| s.3).collect();
    java_settings.sort_unstable();
    java_settings.dedup();
    for round in 0..rounds {
        for (partitions, topic) in topics {
            // Runs: the tool at each max.poll.records, then ours at each setting.
            let runs = java_settings.len() + CONSUMER_SETTINGS.len();
            let mut order: Vec<usize> = (0..runs).collect();
            order.rotate_left(round as usize % runs);
            let mut theirs: Vec<(usize, Cost)> = Vec::new();
            let mut mine: Vec<(usize, Cost)> = Vec::new();
            for run in order {
                settle().await;
                if let Some(&max_poll) = java_settings.get(run) {
                    let java_run = java(c, bootstrap, topic, records, Some(max_poll));
                    theirs.push((max_poll, measured(broker, records, true, java_run).await?));
                } else {
                    let (_, fetch, poll, _) = CONSUMER_SETTINGS[run - java_settings.len()];
                    let our_run = ours(c, topic, records, fetch, poll);
                    mine.push((run - java_settings.len(), measured(broker, records, false, our_run).await?));
                }
            }
            for (i, cost) in &mine {
                let (name, fetch, poll, max_poll) = CONSUMER_SETTINGS[*i];
                let java = theirs.iter().find(|(m, _)| *m == max_poll).map(|(_, c)| c).ok_or("no run of the tool")?;
                println!(
                    "round {round}: consumer, {partitions} partition(s), {name}: shareflow {:.0} rec/s, \
                     kafka-share-consumer-perf-test {:.0} rec/s, ratio {:.2}",
                    cost.rate(),
                    java.rate(),
                    cost.rate() / java.rate()
                );
                let mut row = against_java("consumer", round, *partitions, cost, java);
                row["setting"] = name.into();
                row["fetch_max_records"] = fetch.into();
                row["poll_records"] = poll.into();
                row["java_max_poll_records"] = max_poll.into();
                row["shareflow_polls"] = cost.run.polls.into();
                // Each run's span, for `scripts/kafka-requests --consumer`.
                row["started_unix_ms"] = cost.started_unix_ms.into();
                row["ended_unix_ms"] = cost.ended_unix_ms.into();
                row["java_started_unix_ms"] = java.started_unix_ms.into();
                row["java_ended_unix_ms"] = java.ended_unix_ms.into();
                out.record(row);
                figures.push((*partitions, name, cost.rate(), java.rate()));
            }
        }
    }
    println!("== medians (min-max) of {rounds} rounds, {records} records of 1 KiB");
    for (partitions, _) in topics {
        for (name, ..) in CONSUMER_SETTINGS {
            let of: Vec<&(i32, &str, f64, f64)> =
                figures.iter().filter(|f| f.0 == *partitions && f.1 == name).collect();
            println!(
                "consumer, {partitions} partition(s), {name}: shareflow {} rec/s | kafka-share-consumer-perf-test {} \
                 rec/s | ratio {}",
                spread(&of.iter().map(|f| f.2).collect::<Vec<_>>()),
                spread(&of.iter().map(|f| f.3).collect::<Vec<_>>()),
                ratio_spread(&of.iter().map(|f| f.2 / f.3).collect::<Vec<_>>()),
            );
        }
    }
    Ok(())
}

/// Records per second of `members` members of our share consumer that poll as the
/// pipeline's source does (`PIPELINE_POLL_RECORDS` records, its default poll timeout),
/// from creating them until the last record is accepted and, with an `output`, until
/// every record written to it is acknowledged.
///
/// With an `output` the members share one `TopicWriter` (as the sink's subtasks share a
/// checkpoint's producer) and queue each record into it as they read it: no runtime, no
/// ledger, no transactions, acceptance before the writes are durable. That is less work
/// than the pipeline does, for reading and writing the same records with the same
/// settings: the reference it is held to. Without an `output` they only read: the
/// control that tells the cost of writing from the cost of more members.
async fn members_run(
    c: &KafkaCluster,
    topic: &str,
    output: Option<&str>,
    records: u64,
    members: u32,
) -> Result<Rate, Error> {
    let g = group_ready(c, topic).await?;
    let seen = Arc::new(AtomicU64::new(0));
    let watch = Watch::start(records, {
        let seen = seen.clone();
        move || seen.load(Ordering::Relaxed)
    });
    let started = watch.started;
    let writer = match output {
        Some(o) => Some(Arc::new(tokio::sync::Mutex::new(c.writer(o).await?))),
        None => None,
    };
    let done_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let redelivered = Arc::new(AtomicU64::new(0));
    let polls = Arc::new(AtomicU64::new(0));
    // The members wait for a settled assignment before they poll, as the pipeline's
    // source subtasks do.
    let gate = Arc::new(JoinGate::new(members as usize, Duration::from_secs(10)));
    let mut tasks = tokio::task::JoinSet::new();
    for member in 0..members {
        let (c, g, topic, gate) = (c.clone(), g.clone(), topic.to_string(), gate.clone());
        let (writer, seen, done_at, redelivered) = (writer.clone(), seen.clone(), done_at.clone(), redelivered.clone());
        let polls = polls.clone();
        tasks.spawn(async move {
            let mut config = KafkaShareConsumerConfig::new(&g);
            config.fetch_max_records = PIPELINE_POLL_RECORDS;
            config.fetch_max_wait = DEFAULT_POLL_TIMEOUT;
            let mut m = KafkaShareConsumer::new(&c, config).await?;
            m.subscribe(&[topic.as_str()]).await?;
            gate.settle(member as usize, &mut m).await?;
            while seen.load(Ordering::Relaxed) < records {
                if started.elapsed() > Duration::from_secs(300) {
                    return Err(format!("only {} of {records} records in 300 s", seen.load(Ordering::Relaxed)).into());
                }
                let batch = m.poll(PIPELINE_POLL_RECORDS, DEFAULT_POLL_TIMEOUT).await?;
                if batch.is_empty() {
                    continue;
                }
                let again = batch.iter().filter(|r| r.is_redelivery()).count() as u64;
                redelivered.fetch_add(again, Ordering::Relaxed);
                polls.fetch_add(1, Ordering::Relaxed);
                if let Some(w) = &writer {
                    let values: Vec<_> =
                        batch.iter().map(|r| (r.key.clone(), r.value.clone().unwrap_or_default())).collect();
                    w.lock().await.send(values).await?;
                }
                for r in &batch {
                    m.acknowledge(r, AcknowledgeType::Accept).await?;
                }
                let n = batch.len() as u64;
                if seen.fetch_add(n, Ordering::Relaxed) + n >= records {
                    // The member that counts the last record stops the clock. Every member
                    // queues a batch before counting it, so this flush covers every write.
                    if let Some(w) = &writer {
                        w.lock().await.flush().await?;
                    }
                    m.commit().await?;
                    *done_at.lock().map_err(|_| "clock lock poisoned")? = Some(Instant::now());
                }
            }
            m.commit().await?;
            m.close().await?;
            Ok::<(), Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let done = done_at.lock().map_err(|_| "clock lock poisoned")?.ok_or("no member counted the last record")?;
    if let Some(w) = writer {
        let w = Arc::try_unwrap(w).map_err(|_| "the writer is still shared after every member ended")?.into_inner();
        let (written, read) = (w.close().await?, seen.load(Ordering::Relaxed));
        if written != read {
            return Err(format!("wrote {written} of the {read} records read").into());
        }
    }
    let (redelivered, polls) = (Some(redelivered.load(Ordering::Relaxed)), Some(polls.load(Ordering::Relaxed)));
    Ok(Rate { redelivered, polls, ..watch.rate(records, done - started).await })
}

/// Records per second the Java tool reports (its nMsg.sec column), at its default
/// `max.poll.records` (500) or at `max_poll`.
async fn java(
    c: &KafkaCluster,
    bootstrap: &str,
    topic: &str,
    records: u64,
    max_poll: Option<usize>,
) -> Result<Rate, Error> {
    let lib =
        std::env::var("SHAREFLOW_KAFKA_LIB").map_err(|_| "set SHAREFLOW_KAFKA_LIB: eval \"$(./scripts/kafka env)\"")?;
    let g = group_ready(c, topic).await?;
    let out = Command::new("java")
        .args(["-cp", &format!("{lib}/*"), "org.apache.kafka.tools.ShareConsumerPerformance"])
        .args(["--bootstrap-server", bootstrap, "--topic", topic, "--group", &g])
        .args(["--num-records", &records.to_string(), "--timeout", "60000"])
        .args(
            max_poll.map(|n| ["--command-property".to_string(), format!("max.poll.records={n}")]).into_iter().flatten(),
        )
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.contains(','));
    let header: Vec<&str> =
        lines.next().ok_or("no header from ShareConsumerPerformance")?.split(',').map(str::trim).collect();
    let values: Vec<&str> =
        lines.next().ok_or("no figures from ShareConsumerPerformance")?.split(',').map(str::trim).collect();
    let col = header.iter().position(|h| *h == "nMsg.sec").ok_or("no nMsg.sec column")?;
    Ok(values.get(col).ok_or("short line")?.parse::<f64>()?.into())
}

/// Records per second of a `TopicWriter` writing `records` records of `value` to
/// `topic`, from creating it to the last record acknowledged.
async fn our_writer(c: &KafkaCluster, topic: &str, records: u64, value: &Bytes) -> Result<Rate, Error> {
    let started = Instant::now();
    let mut w = c.writer(topic).await?;
    w.send((0..records).map(|_| (None, value.clone()))).await?;
    let written = w.close().await?;
    if written != records {
        return Err(format!("the writer wrote {written} of {records} records").into());
    }
    Ok((records as f64 / started.elapsed().as_secs_f64()).into())
}

/// Records per second Kafka's `kafka-producer-perf-test`
/// (`org.apache.kafka.tools.ProducerPerformance`) reports for `records` records of 1 KiB,
/// idempotent, acks=all, 1 MiB batches and 2 ms linger like our writer.
fn java_writer(bootstrap: &str, topic: &str, records: u64) -> Result<Rate, Error> {
    let lib =
        std::env::var("SHAREFLOW_KAFKA_LIB").map_err(|_| "set SHAREFLOW_KAFKA_LIB: eval \"$(./scripts/kafka env)\"")?;
    let out = Command::new("java")
        // A fixed locale: the tool prints its figures with %f.
        .args(["-Duser.language=en", "-Duser.country=US"])
        .args(["-cp", &format!("{lib}/*"), "org.apache.kafka.tools.ProducerPerformance"])
        .args(["--topic", topic, "--num-records", &records.to_string(), "--record-size", "1024"])
        .args(["--throughput", "-1", "--producer-props", &format!("bootstrap.servers={bootstrap}")])
        .args(["acks=all", "enable.idempotence=true", "batch.size=1048576", "linger.ms=2"])
        .output()?;
    if !out.status.success() {
        return Err(
            format!("ProducerPerformance failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr)).into()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // The summary line: "N records sent, R records/sec (M MB/sec), ... 50th, ...".
    let summary = text
        .lines()
        .find(|l| l.contains("50th"))
        .ok_or_else(|| format!("no summary line from ProducerPerformance: {}", String::from_utf8_lossy(&out.stderr)))?;
    let rate = summary.split(',').nth(1).and_then(|f| f.split_whitespace().next()).ok_or("no records/sec field")?;
    Ok(rate.parse::<f64>()?.into())
}

/// A results row of one of our clients (`mine`) against Kafka's Java tool for the same
/// work (`theirs`), in one round.
fn against_java(kind: &str, round: u32, partitions: i32, mine: &Cost, theirs: &Cost) -> serde_json::Value {
    serde_json::json!({
        "kind": kind, "round": round, "partitions": partitions,
        "shareflow": mine.rate(), "java": theirs.rate(),
        "shareflow_cpu_s_per_m": mine.client_cpu_per_m, "java_cpu_s_per_m": theirs.client_cpu_per_m,
        "broker_cpu_s_per_m_shareflow": mine.broker_cpu_per_m, "broker_cpu_s_per_m_java": theirs.broker_cpu_per_m,
    })
}

/// The reference run: members of our raw consumer, as many as the pipeline's source
/// subtasks, writing every record they read.
const RAW_WRITING: &str = "raw consumers writing their input";
/// Its control: the same members, reading only.
const RAW_MEMBERS: &str = "raw consumers reading only";

/// A sink that drops what it gets: the pipeline without the cost of writing output.
struct Discard;

#[async_trait]
impl Operator for Discard {
    async fn process_batch(
        &mut self,
        _batch: RecordBatch,
        _input: usize,
        _out: &mut Collector,
    ) -> shareflow::runtime::Result<()> {
        Ok(())
    }
}

/// The pipeline variants, each one stage more than the one before.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    /// share source -> discard, exactly-once.
    SourceOnly,
    /// share source -> SQL -> discard, exactly-once.
    WithSql,
    /// share source -> SQL -> Kafka sink, exactly-once.
    Full,
    /// share source -> SQL -> Kafka sink, at-least-once.
    FullAtLeastOnce,
}

impl Variant {
    const ALL: [Variant; 4] = [Variant::SourceOnly, Variant::WithSql, Variant::Full, Variant::FullAtLeastOnce];

    /// True for the variants with the Kafka sink.
    fn writes_output(self) -> bool {
        matches!(self, Variant::Full | Variant::FullAtLeastOnce)
    }

    fn name(self) -> &'static str {
        match self {
            Variant::SourceOnly => "source -> discard (exactly-once)",
            Variant::WithSql => "source -> SQL -> discard (exactly-once)",
            Variant::Full => "source -> SQL -> Kafka sink (exactly-once)",
            Variant::FullAtLeastOnce => "source -> SQL -> Kafka sink (at-least-once)",
        }
    }
}

/// The topic the Kafka sink variants of the run named `name` write to.
fn output_topic(name: &str) -> String {
    format!("{name}-output")
}

/// Before a run named `name` over `input`, outside its measurement: its share group,
/// ready (see [`group_ready`]), and the output topic, if `variant` writes one.
async fn prepare_run(c: &KafkaCluster, name: &str, input: &str, variant: Variant) -> Result<(), Error> {
    make_ready(c, name, input).await?;
    if variant.writes_output() {
        c.ensure_topic(&output_topic(name), 4, &[]).await?;
    }
    Ok(())
}

/// After a run named `name`: gives the disk back, deleting the per-group ledger and
/// intents topics it made and its output topic.
async fn clean_run(c: &KafkaCluster, name: &str, variant: Variant) -> Result<(), Error> {
    let mut done = vec![format!("{name}-bench-ledger"), format!("{name}-intents")];
    if variant.writes_output() {
        done.push(output_topic(name));
    }
    c.delete_topics(&done.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    Ok(())
}

/// Records per second through `variant` over `input` (4 partitions, already filled with
/// `records` records), `parallelism` subtasks per operator, 1 s checkpoints: from the
/// job's start to its end, as `shareflow demo --kafka` measures it. Each run is a new
/// share group, `name`; the Kafka sink variants write to [`output_topic`], which the
/// caller creates and deletes outside the measurement.
async fn pipeline(
    c: &KafkaCluster,
    input: &str,
    name: &str,
    records: u64,
    variant: Variant,
    parallelism: u32,
    out: &mut Option<Split>,
) -> Result<Rate, Error> {
    let output = &output_topic(name);
    let exactly_once = variant != Variant::FullAtLeastOnce;
    let txns = KafkaTransactions::new(c.clone(), KafkaTransactionsConfig::default().exactly_once(exactly_once));
    let metrics = Arc::new(SourceMetrics::default());
    let mut source = SourceSettings::new(name, &[input]);
    source.stop_when_drained = true;
    source.max_poll_records = PIPELINE_POLL_RECORDS;
    let job = JobBuilder::new();
    let stream = job
        .source(
            "share-source",
            record_schema(),
            KafkaShareSource::factory(c.clone(), txns.clone(), source, metrics.clone()),
        )
        .parallelism(parallelism);
    let stream = match variant {
        Variant::SourceOnly => stream,
        _ => stream
            .sql("transform", "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input")
            .parallelism(parallelism),
    };
    match variant {
        Variant::SourceOnly | Variant::WithSql => stream.sink("discard", |_| Discard).parallelism(parallelism),
        Variant::Full | Variant::FullAtLeastOnce => {
            stream.sink("kafka-sink", KafkaSink::factory(txns.clone(), output)).parallelism(parallelism)
        }
    };
    job.participant(txns);
    let storage = CheckpointStore::from_url(&format!("memory://{name}"), &[], name)?;
    let mut config = JobConfig::new(storage, name, "bench").checkpoint_interval(Duration::from_secs(1));
    config.channel_capacity = 8;
    let job = job.build(config)?;
    let live = job.metrics_handle();
    let watch = Watch::start(records, {
        let metrics = metrics.clone();
        move || metrics.records_emitted.load(Ordering::Relaxed)
    });
    job.run().await?;
    let elapsed = watch.started.elapsed();
    let emitted = metrics.records_emitted.load(Ordering::Relaxed);
    if emitted < records {
        return Err(format!("{}: {emitted} of {records} records emitted", variant.name()).into());
    }
    // Where the pipeline waits: an operator blocked on a full channel has a slower one
    // downstream of it. Summed over the operator's subtasks, as a share of the run.
    let of_run = |d: Duration| d.as_secs_f64() / elapsed.as_secs_f64();
    let blocked: Vec<(String, f64)> =
        live.snapshot().operators.into_iter().map(|(op, m)| (op, of_run(m.backpressure))).collect();
    let waits: Vec<String> = blocked.iter().map(|(op, b)| format!("{op} {:.0} %", 100.0 * b)).collect();
    let nanos = |c: &std::sync::atomic::AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
    let split = Split {
        poll_wait: of_run(nanos(&metrics.poll_wait_nanos)),
        intent_wait: of_run(nanos(&metrics.intent_wait_nanos)),
        most_blocked: blocked.iter().map(|(_, b)| *b).fold(0.0, f64::max),
    };
    println!(
        "  {}: backpressure per operator (subtasks summed): {}; the source's {parallelism} subtasks waited in polls \
         that returned records {:.0} %, for intents {:.0} % of the run (summed, of {} %)",
        variant.name(),
        waits.join(", "),
        100.0 * split.poll_wait,
        100.0 * split.intent_wait,
        100 * parallelism,
    );
    *out = Some(split);
    let redelivered = Some(metrics.records_redelivered.load(Ordering::Relaxed));
    let polls = Some(metrics.intents_written.load(Ordering::Relaxed));
    Ok(Rate { redelivered, polls, ..watch.rate(emitted, elapsed).await })
}

/// Where one pipeline run's time went, as shares of the run summed over subtasks (so up
/// to the parallelism): the source's waits in polls that returned records and for its
/// intents, and the most any one operator was blocked on a full channel downstream.
#[derive(Debug, Clone, Copy)]
struct Split {
    poll_wait: f64,
    intent_wait: f64,
    most_blocked: f64,
}

/// Before each measured run: the broker's delayed work of the run before (segment
/// deletion, topic removal) is done, so that its CPU is not counted in this run.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// A results row of a `kind: pipeline` run (a pipeline variant, the raw consumer, a
/// reference run): `fields`, its cost and, where it counted as it went, its marks.
fn pipeline_row(round: u32, variant: &str, cost: &Cost, fields: serde_json::Value) -> serde_json::Value {
    let mut row = serde_json::json!({
        "kind": "pipeline", "round": round, "variant": variant, "rate": cost.rate(),
        "job_cpu_s_per_m": cost.client_cpu_per_m, "broker_cpu_s_per_m": cost.broker_cpu_per_m,
        "started_unix_ms": cost.started_unix_ms, "ended_unix_ms": cost.ended_unix_ms,
    });
    let counted = serde_json::json!({ "redelivered": cost.run.redelivered, "polls": cost.run.polls });
    for extra in [fields, cost.run.marks.map_or(serde_json::Value::Null, |m| m.json()), counted] {
        if let (Some(row), serde_json::Value::Object(extra)) = (row.as_object_mut(), extra) {
            row.extend(extra);
        }
    }
    row
}

/// How a run's rate reads in a progress line: the whole run, its middle, and its fixed
/// costs at either end.
fn describe(cost: &Cost) -> String {
    let counted = cost.run.redelivered.map_or(String::new(), |n| format!(", {n} records redelivered"))
        + &cost.run.polls.map_or(String::new(), |n| format!(", {n} polls with records"));
    let rate = match cost.run.marks {
        Some(m) => format!(
            "{:.0} rec/s (middle 80 %: {}{}; first record at {} ms, end {} ms after the last)",
            cost.rate(),
            m.middle_rate().map_or("-".into(), |r| format!("{r:.0} rec/s")),
            m.middle_cpu().map_or(String::new(), |(job, broker, busy)| format!(
                ", CPU s per M records job {job:.2} broker {broker:.2}, {busy:.2} cores busy"
            )),
            m.first.as_millis(),
            m.end.saturating_sub(m.last).as_millis()
        ),
        None => format!("{:.0} rec/s", cost.rate()),
    };
    rate + &counted
}

/// The middle rates of `costs` (see [`Marks`]), and their ratios to those of the same
/// round of the raw consumer (`raw`) and of a `reference` run, as a summary line reads.
fn middle_figures(costs: &[Cost], raw: &[Cost], reference: Option<&[Cost]>) -> String {
    let middle = |c: &Cost| c.run.marks.and_then(|m| m.middle_rate());
    let rates: Vec<f64> = costs.iter().filter_map(middle).collect();
    if rates.is_empty() {
        return "-".into();
    }
    let of = |against: &[Cost]| -> String {
        let ratios: Vec<f64> = costs.iter().zip(against).filter_map(|(c, a)| Some(middle(c)? / middle(a)?)).collect();
        if ratios.is_empty() {
            "-".into()
        } else {
            format!("{:.2}", median(ratios))
        }
    };
    let mut line = format!("{} rec/s, / raw consumer {}", spread(&rates), of(raw));
    if let Some(reference) = reference {
        line += &format!(", / reference {}", of(reference));
    }
    let cpu: Vec<(f64, f64, f64)> = costs.iter().filter_map(|c| c.run.marks?.middle_cpu()).collect();
    if !cpu.is_empty() {
        let m = |f: fn(&(f64, f64, f64)) -> f64| median(cpu.iter().map(f).collect());
        line += &format!(
            ", CPU s per M records job {:.2} broker {:.2}, {:.2} cores busy",
            m(|c| c.0),
            m(|c| c.1),
            m(|c| c.2)
        );
    }
    line
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn spread(v: &[f64]) -> String {
    let (lo, hi) = min_max(v);
    format!("{:.1} k ({:.1}-{:.1} k)", median(v.to_vec()) / 1e3, lo / 1e3, hi / 1e3)
}

/// The median and min-max of ratios.
fn ratio_spread(v: &[f64]) -> String {
    let (lo, hi) = min_max(v);
    format!("{:.2} ({lo:.2}-{hi:.2})", median(v.to_vec()))
}

/// The smallest and the largest of `v`.
fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| (l.min(*x), h.max(*x)))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let bootstrap = std::env::var("SHAREFLOW_KAFKA_BOOTSTRAP")
        .map_err(|_| "set SHAREFLOW_KAFKA_BOOTSTRAP: ./scripts/kafka start && eval \"$(./scripts/kafka env)\"")?;
    let mut args = std::env::args().skip(1);
    let records: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(200_000);
    let rounds: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let parallelism: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2);
    if records == 0 || rounds == 0 || parallelism == 0 {
        return Err("RECORDS, ROUNDS and PARALLELISM must be at least 1".into());
    }
    let consumer_settings = match args.next().as_deref() {
        None => false,
        Some("consumer") => true,
        Some(other) => return Err(format!("unknown mode {other:?}: the only one is `consumer`").into()),
    };
    let broker = broker_pid()?;
    cpu_seconds(&broker, false).map_err(|e| format!("cannot read the broker's CPU time: {e}"))?;
    let c = KafkaCluster::connect(&bootstrap).await?;
    let value = Bytes::from(vec![b'x'; 1024]);
    let mut out = results::Results::create(
        if consumer_settings { "kafka_consumer_bench" } else { "kafka_bench" },
        serde_json::json!({ "records": records, "rounds": rounds, "parallelism": parallelism }),
    );

    // One topic per partition count, filled once; every run reads it in a group of its own.
    let mut topics = Vec::new();
    for partitions in [1, 4] {
        let topic = unique(&format!("bench-{partitions}p"));
        c.ensure_topic(&topic, partitions, &[]).await?;
        c.produce(&topic, (0..records).map(|_| (None, value.clone()))).await?;
        topics.push((partitions, topic));
    }
    let input = topics[1].1.clone();
    if consumer_settings {
        // One unrecorded read warms up a freshly started broker.
        ours(&c, &input, records, RAW_FETCH, RAW_POLL).await?;
        println!("(warm-up done: one read, not recorded)");
        let run = consumer_only(&c, &bootstrap, &broker, records, rounds, &topics, &mut out).await;
        let names: Vec<&str> = topics.iter().map(|(_, t)| t.as_str()).collect();
        c.delete_topics(&names).await?;
        return run;
    }
    // A broker just started runs its code interpreted at first: one unrecorded read, and
    // one unrecorded run of each pipeline variant (without them the broker's CPU per
    // record fell by half from the first round to the fifth).
    ours(&c, &input, records, RAW_FETCH, RAW_POLL).await?;
    for variant in Variant::ALL {
        let name = unique("bench-warmup");
        prepare_run(&c, &name, &input, variant).await?;
        pipeline(&c, &input, &name, records, variant, parallelism, &mut None).await?;
        clean_run(&c, &name, variant).await?;
    }
    println!("(warm-up done: one read and one run of each variant, not recorded)");

    let mut consumer: Vec<(i32, f64, f64)> = Vec::new();
    let mut raw_costs: Vec<Cost> = Vec::new();
    let mut writing: Vec<Cost> = Vec::new();
    let mut reading: Vec<Cost> = Vec::new();
    let mut producers: Vec<(f64, f64)> = Vec::new();
    let mut variants: Vec<(Variant, Cost, Split)> = Vec::new();
    for round in 0..rounds {
        for (partitions, topic) in &topics {
            settle().await;
            let theirs = measured(&broker, records, true, java(&c, &bootstrap, topic, records, None)).await?;
            settle().await;
            let mine = measured(&broker, records, false, ours(&c, topic, records, RAW_FETCH, RAW_POLL)).await?;
            println!(
                "round {round}: consumer, {partitions} partition(s): shareflow {:.0} rec/s, kafka-share-consumer-perf-test {:.0} rec/s",
                mine.rate(), theirs.rate()
            );
            out.record(against_java("consumer", round, *partitions, &mine, &theirs));
            consumer.push((*partitions, mine.rate(), theirs.rate()));
            if *partitions == 4 {
                println!("round {round}: raw consumer, 4 partitions: {}", describe(&mine));
                out.record(pipeline_row(round, "raw consumer", &mine, serde_json::Value::Null));
                raw_costs.push(mine);
                // The reference runs, in turns: reading only first in even rounds.
                let mut references = [RAW_MEMBERS, RAW_WRITING];
                if round % 2 == 1 {
                    references.reverse();
                }
                for reference in references {
                    let output = (reference == RAW_WRITING).then(|| unique("bench-copy"));
                    if let Some(o) = &output {
                        c.ensure_topic(o, 4, &[]).await?;
                    }
                    settle().await;
                    let run = members_run(&c, topic, output.as_deref(), records, parallelism);
                    let cost = measured(&broker, records, false, run).await;
                    if let Some(o) = &output {
                        c.delete_topics(&[o.as_str()]).await?;
                    }
                    let cost = cost?;
                    println!(
                        "round {round}: {reference}: {}, CPU s per M records: job {:.2}, broker {:.2}",
                        describe(&cost),
                        cost.client_cpu_per_m,
                        cost.broker_cpu_per_m
                    );
                    out.record(pipeline_row(round, reference, &cost, serde_json::Value::Null));
                    if reference == RAW_WRITING {
                        writing.push(cost);
                    } else {
                        reading.push(cost);
                    }
                }
                let (ours_out, theirs_out) = (unique("bench-write-ours"), unique("bench-write-java"));
                for t in [&ours_out, &theirs_out] {
                    c.ensure_topic(t, 4, &[]).await?;
                }
                settle().await;
                let theirs =
                    measured(&broker, records, true, async { java_writer(&bootstrap, &theirs_out, records) }).await?;
                settle().await;
                let mine = measured(&broker, records, false, our_writer(&c, &ours_out, records, &value)).await?;
                c.delete_topics(&[ours_out.as_str(), theirs_out.as_str()]).await?;
                println!(
                    "round {round}: producer, 4 partitions: shareflow's TopicWriter {:.0} rec/s, kafka-producer-perf-test {:.0} rec/s",
                    mine.rate(), theirs.rate()
                );
                out.record(against_java("producer", round, 4, &mine, &theirs));
                producers.push((mine.rate(), theirs.rate()));
            }
        }
        // Each round starts at another variant, so that none always follows the same one.
        let mut order = Variant::ALL;
        order.rotate_left(round as usize % Variant::ALL.len());
        for variant in order {
            let name = unique("bench-pipeline");
            prepare_run(&c, &name, &input, variant).await?;
            settle().await;
            let mut split = None;
            let run = pipeline(&c, &input, &name, records, variant, parallelism, &mut split);
            let cost = measured(&broker, records, false, run).await?;
            let split = split.ok_or("the pipeline run reported no split")?;
            clean_run(&c, &name, variant).await?;
            println!(
                "round {round}: {}: {}, CPU s per M records: job {:.2}, broker {:.2}",
                variant.name(),
                describe(&cost),
                cost.client_cpu_per_m,
                cost.broker_cpu_per_m
            );
            out.record(pipeline_row(
                round,
                variant.name(),
                &cost,
                serde_json::json!({
                    "source_poll_wait_share": split.poll_wait, "source_intent_wait_share": split.intent_wait,
                    "most_blocked_operator_share": split.most_blocked,
                }),
            ));
            variants.push((variant, cost, split));
        }
    }
    let names: Vec<&str> = topics.iter().map(|(_, t)| t.as_str()).collect();
    c.delete_topics(&names).await?;

    println!("== medians (min-max) of {rounds} rounds, {records} records of 1 KiB");
    for partitions in [1, 4] {
        let of = |f: fn(&(i32, f64, f64)) -> f64| -> Vec<f64> {
            consumer.iter().filter(|x| x.0 == partitions).map(f).collect()
        };
        let ratio: Vec<f64> = consumer.iter().filter(|x| x.0 == partitions).map(|x| x.1 / x.2).collect();
        println!(
            "consumer, {partitions} partition(s): shareflow {} rec/s | kafka-share-consumer-perf-test {} rec/s | ratio {:.2}",
            spread(&of(|x| x.1)),
            spread(&of(|x| x.2)),
            median(ratio)
        );
    }
    println!(
        "producer, 4 partitions: shareflow's TopicWriter {} rec/s | kafka-producer-perf-test {} rec/s | ratio {:.2}",
        spread(&producers.iter().map(|x| x.0).collect::<Vec<_>>()),
        spread(&producers.iter().map(|x| x.1).collect::<Vec<_>>()),
        median(producers.iter().map(|x| x.0 / x.1).collect())
    );
    let raw: Vec<f64> = consumer.iter().filter(|x| x.0 == 4).map(|x| x.1).collect();
    let members: Vec<f64> = reading.iter().map(|c| c.rate()).collect();
    let bound: Vec<f64> = writing.iter().map(|c| c.rate()).collect();
    for (name, costs, rates) in [(RAW_MEMBERS, &reading, &members), (RAW_WRITING, &writing, &bound)] {
        println!(
            "{name}: {} rec/s | / raw consumer {:.2} | middle 80 %: {} | CPU s per M records: job {:.2}, broker {:.2}",
            spread(rates),
            median(rates.iter().zip(&raw).map(|(w, r)| w / r).collect()),
            middle_figures(costs, &raw_costs, None),
            median(costs.iter().map(|c| c.client_cpu_per_m).collect()),
            median(costs.iter().map(|c| c.broker_cpu_per_m).collect()),
        );
    }
    println!(
        "{RAW_WRITING} / {RAW_MEMBERS}, the cost of writing: {:.2}",
        median(bound.iter().zip(&members).map(|(w, r)| w / r).collect())
    );
    for variant in Variant::ALL {
        let costs: Vec<Cost> = variants.iter().filter(|(v, ..)| *v == variant).map(|(_, c, _)| *c).collect();
        let splits: Vec<Split> = variants.iter().filter(|(v, ..)| *v == variant).map(|(.., s)| *s).collect();
        let rates: Vec<f64> = costs.iter().map(|c| c.rate()).collect();
        // Same round against same round: the machine's drift hits both.
        let ratio: Vec<f64> = rates.iter().zip(&raw).map(|(p, r)| p / r).collect();
        // Against the reference run that does the same I/O: writing or reading only.
        let (reference, name) = if variant.writes_output() { (&bound, RAW_WRITING) } else { (&members, RAW_MEMBERS) };
        let of_reference: Vec<f64> = rates.iter().zip(reference).map(|(p, b)| p / b).collect();
        let pct = |f: fn(&Split) -> f64| 100.0 * median(splits.iter().map(f).collect());
        let reference_costs = if variant.writes_output() { &writing } else { &reading };
        println!(
            "{}: {} rec/s | / raw consumer {:.2} | / {name} {:.2} | middle 80 %: {} | CPU s per M records: job {:.2}, \
             broker {:.2} | source waits: poll {:.0} %, intents {:.0} %; most blocked operator {:.0} %",
            variant.name(),
            spread(&rates),
            median(ratio),
            median(of_reference),
            middle_figures(&costs, &raw_costs, Some(reference_costs.as_slice())),
            median(costs.iter().map(|c| c.client_cpu_per_m).collect()),
            median(costs.iter().map(|c| c.broker_cpu_per_m).collect()),
            pct(|s| s.poll_wait),
            pct(|s| s.intent_wait),
            pct(|s| s.most_blocked),
        );
    }
    Ok(())
}
