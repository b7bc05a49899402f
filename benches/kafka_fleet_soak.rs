//! Fleet soak: three instances of the main Kafka job (`shareflow run --kafka`) in one
//! share group, on the Kafka broker and the S3 server that `scripts/kafka` and
//! `scripts/s3` start, for a long time at a steady input rate, with churn:
//! - every 60 s one instance is killed with SIGKILL and started again under its name;
//! - every 5 min one instance is replaced by a new name: alternately retired with
//!   SIGTERM (`--delete-ledger-on-retire`), and killed with SIGKILL and left for the
//!   others to adopt;
//! - every 60 s `shareflow instances gc --apply` runs, as an operator's cron would.
//!
//! A producer writes RATE records per second to the input topic (4 partitions), each
//! value carrying its id and its produce time; a reader follows the output topic
//! read_committed and counts every id. Every 10 s a sample line records the records
//! produced and committed, duplicates, the end-to-end latency of the window (produce
//! to visible read_committed, p50 and p99), each instance's resident memory, the
//! group's transactional ids, its topics, and the bytes its ledger and intents topics
//! hold on the broker's disk. At the end the producer stops, the bench waits for the
//! output to catch up, stops the instances with SIGTERM and reads the whole output once
//! more: every id exactly once, or the bench fails.
//!
//! Checkpoints and the instance registry live on the S3 server. The results go to
//! `docs/results/kafka_fleet_soak.jsonl`, the chart to `docs/plots/fleet.png`
//! (`scripts/plots`).
//!
//! ```text
//! eval "$(scripts/kafka env)"; eval "$(scripts/s3 env)"
//! cargo bench --bench kafka_fleet_soak -- [MINUTES] [RATE]    # default 30 and 5000
//! ```

#![allow(clippy::unwrap_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use shareflow::connector::kafka::KafkaCluster;

#[path = "support/results.rs"]
mod results;

const PARTITIONS: i32 = 4;
const VALUE_BYTES: usize = 100;
const KILL_EVERY: Duration = Duration::from_secs(60);
const REPLACE_EVERY: Duration = Duration::from_secs(300);
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How long the output may take to catch up once the producer stopped.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);

fn env(key: &str, start: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is not set: {start}, then eval its env output"))
}

fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as u64
}

/// `rec-{id:010}-{micros:016}-` padded with `x`: the demo's id, then the produce time.
fn value(id: u64, micros: u64) -> Bytes {
    let mut v = format!("rec-{id:010}-{micros:016}-").into_bytes();
    v.resize(VALUE_BYTES, b'x');
    Bytes::from(v)
}

/// The id and produce time of an output value (the job upper-cases it).
fn parse(v: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(v.get(..31)?).ok()?;
    if !text[..4].eq_ignore_ascii_case("rec-") {
        return None;
    }
    Some((text[4..14].parse().ok()?, text[15..31].parse().ok()?))
}

/// Resident memory of process `pid` in MiB, 0 when it is gone.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Bytes of the `.log` segment files of every partition directory under `data` whose
/// name starts with `topic_prefix` and passes `keep`.
fn disk_bytes(data: &Path, topic_prefix: &str, keep: impl Fn(&str) -> bool) -> u64 {
    let Ok(dirs) = std::fs::read_dir(data) else { return 0 };
    let mut total = 0;
    for dir in dirs.flatten() {
        let name = dir.file_name().to_string_lossy().to_string();
        if !name.starts_with(topic_prefix) || !keep(&name) {
            continue;
        }
        for f in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
            if f.file_name().to_string_lossy().ends_with(".log") {
                total += f.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    total
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// What the reader saw of the output.
#[derive(Default)]
struct Seen {
    /// Times each id was seen, by id.
    counts: Vec<u8>,
    distinct: u64,
    duplicates: u64,
    /// Latencies (ms) of the current window, and of the whole run.
    window: Vec<u64>,
    all: Vec<u64>,
}

impl Seen {
    fn add(&mut self, id: u64, produced_micros: u64, now_micros: u64) {
        let i = id as usize;
        if self.counts.len() <= i {
            self.counts.resize(i + 1 + (1 << 16), 0);
        }
        self.counts[i] = self.counts[i].saturating_add(1);
        if self.counts[i] == 1 {
            self.distinct += 1;
            let ms = now_micros.saturating_sub(produced_micros) / 1000;
            self.window.push(ms);
            self.all.push(ms);
        } else {
            self.duplicates += 1;
        }
    }
}

/// One instance process of the fleet.
struct Member {
    name: String,
    child: Child,
    stderr: PathBuf,
}

struct Fleet {
    binary: &'static str,
    bootstrap: String,
    group: String,
    checkpoints: String,
    dir: PathBuf,
    aws: Vec<(&'static str, String)>,
    started: u32,
}

impl Fleet {
    fn start(&mut self, name: &str) -> Member {
        self.started += 1;
        let stderr = self.dir.join(format!("{name}-{}.err", self.started));
        let child = Command::new(self.binary)
            .args(["run", "--kafka", &self.bootstrap, "--group", &self.group, "--instance", name])
            .args(["--checkpoints", &self.checkpoints, "--interval", "1000", "--checkpoint-timeout", "5000"])
            .args(["--adoption-timeout", "10000", "--parallelism", "1", "--partitions", "4"])
            .args(["--delete-ledger-on-retire", "--json"])
            .env("SHAREFLOW_LOG", "warn")
            .env("MALLOC_ARENA_MAX", "2")
            .envs(self.aws.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start shareflow run");
        Member { name: name.to_string(), child, stderr }
    }

    /// `shareflow instances gc --apply`: the ledgers it deleted.
    fn gc(&self) -> usize {
        let out = Command::new(self.binary)
            .args(["instances", "gc", "--checkpoints", &self.checkpoints, "--kafka", &self.bootstrap])
            .args(["--group", &self.group, "--apply"])
            .envs(self.aws.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run instances gc");
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "instances gc failed: {text}");
        text.lines().filter(|l| l.contains("deleted")).count()
    }
}

fn sigterm_and_wait(m: &mut Member, limit: Duration) -> Option<i32> {
    let _ = Command::new("kill").args(["-TERM", &m.child.id().to_string()]).status();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = m.child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = m.child.kill();
    let _ = m.child.wait();
    None
}

fn sigkill(m: &mut Member) {
    let _ = m.child.kill();
    let _ = m.child.wait();
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Produces `rate` records per second to `topic` until `stop`, counting them in
/// `produced`.
async fn produce(cluster: KafkaCluster, topic: String, rate: u64, produced: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut writer = cluster.writer(&topic).await.expect("input writer");
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    while !stop.load(Ordering::SeqCst) {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let from = produced.load(Ordering::SeqCst);
        if due <= from {
            continue;
        }
        let now = unix_micros();
        writer.send((from..due).map(|id| (None, value(id, now)))).await.expect("produce");
        writer.flush().await.expect("produce");
        produced.store(due, Ordering::SeqCst);
    }
    writer.close().await.expect("close the input writer");
}

/// Follows `topic` read_committed into `seen` until `stop`, then reads once more to
/// the end: every committed record of the topic, each read once.
async fn follow(cluster: KafkaCluster, topic: String, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    let mut from: Vec<i64> = Vec::new();
    loop {
        let last = stop.load(Ordering::SeqCst);
        match cluster.read_committed_from(&topic, &from).await {
            Ok((records, ends)) => {
                let now = unix_micros();
                let mut s = seen.lock().unwrap();
                for (_, _, _, v) in records {
                    let (id, at) = v.as_deref().and_then(parse).expect("an output value of the soak");
                    s.add(id, at, now);
                }
                from = ends;
            }
            Err(e) => {
                eprintln!("fleet soak: reading the output failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        }
        if last {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The group's transactional ids (all, and open), topics, and the bytes on disk of its
/// ledger topics and of its intents topic.
async fn footprint(cluster: &KafkaCluster, group: &str, data: &Path) -> serde_json::Value {
    let prefix = format!("{group}-");
    let ids = cluster.transactional_ids(&prefix).await.unwrap_or_default();
    let open = ids.iter().filter(|(_, state)| state == "Ongoing").count();
    let topics: Vec<String> =
        cluster.topics().await.unwrap_or_default().into_iter().filter(|t| t.starts_with(&prefix)).collect();
    let ledgers = topics.iter().filter(|t| t.ends_with("-ledger")).count();
    let ledger_bytes = disk_bytes(data, &prefix, |d| d.rsplit_once('-').is_some_and(|(t, _)| t.ends_with("-ledger")));
    let intents_bytes = disk_bytes(data, &format!("{group}-intents-"), |_| true);
    // Entries between each topic's start (compaction moves it) and its end.
    let (mut ledger_entries, mut intents_entries) = (0i64, 0i64);
    for t in topics.iter().filter(|t| t.ends_with("-ledger") || **t == format!("{group}-intents")) {
        let (Ok(start), Ok(end)) = (cluster.start_offsets(t).await, cluster.end_offsets(t, false).await) else {
            continue;
        };
        let held: i64 = end.iter().zip(&start).map(|(e, s)| e - s).sum();
        if t.ends_with("-ledger") {
            ledger_entries += held;
        } else {
            intents_entries += held;
        }
    }
    serde_json::json!({
        "ledger_entries": ledger_entries,
        "intents_entries": intents_entries,
        "txn_ids": ids.len(),
        "txn_open": open,
        "topics": topics.len(),
        "ledger_topics": ledgers,
        "ledger_mib": ledger_bytes as f64 / (1 << 20) as f64,
        "intents_mib": intents_bytes as f64 / (1 << 20) as f64,
    })
}

struct Churn {
    members: Vec<Member>,
    kills: u32,
    replacements: u32,
    next_name: u32,
    unexpected_exits: u32,
}

impl Churn {
    /// A name no instance of the soak had: `i1`, `i2`, ...
    fn fresh_name(&mut self) -> String {
        self.next_name += 1;
        format!("i{}", self.next_name)
    }

    /// Starts again a member that exited on its own, recording it: under its name, or
    /// under a new one if it exited fenced (3), as its message tells an operator to.
    fn revive(&mut self, fleet: &mut Fleet, results: &mut results::Results, secs: f64) {
        for i in 0..self.members.len() {
            if let Ok(Some(status)) = self.members[i].child.try_wait() {
                self.unexpected_exits += 1;
                let m = &self.members[i];
                eprintln!("fleet soak: {} exited by itself ({status}):\n{}", m.name, tail(&m.stderr));
                results.record(serde_json::json!({"kind": "event", "secs": secs, "event": "exited",
                    "instance": m.name, "status": status.to_string(), "stderr": tail(&m.stderr)}));
                let name = if status.code() == Some(3) { self.fresh_name() } else { m.name.clone() };
                self.members[i] = fleet.start(&name);
            }
        }
    }

    fn kill_one(&mut self, fleet: &mut Fleet, results: &mut results::Results, secs: f64) {
        let i = self.kills as usize % self.members.len();
        self.kills += 1;
        sigkill(&mut self.members[i]);
        let name = self.members[i].name.clone();
        self.members[i] = fleet.start(&name);
        results.record(serde_json::json!({"kind": "event", "secs": secs, "event": "sigkill", "instance": name}));
    }

    fn replace_one(&mut self, fleet: &mut Fleet, results: &mut results::Results, secs: f64) {
        let i = self.replacements as usize % self.members.len();
        let graceful = self.replacements.is_multiple_of(2);
        self.replacements += 1;
        let old = self.members[i].name.clone();
        let how = if graceful {
            let code = sigterm_and_wait(&mut self.members[i], Duration::from_secs(60));
            assert_eq!(code, Some(0), "{old} did not retire on SIGTERM:\n{}", tail(&self.members[i].stderr));
            "retired"
        } else {
            sigkill(&mut self.members[i]);
            "killed, left for adoption"
        };
        let new = self.fresh_name();
        self.members[i] = fleet.start(&new);
        results.record(serde_json::json!({"kind": "event", "secs": secs, "event": "replaced", "old": old,
            "new": new, "how": how}));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let minutes: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(30.0);
    let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5_000);
    let bootstrap = env("SHAREFLOW_KAFKA_BOOTSTRAP", "start Kafka with ./scripts/kafka start");
    let data = PathBuf::from(env("SHAREFLOW_KAFKA_DATA", "start Kafka with ./scripts/kafka start"));
    let endpoint = env("SHAREFLOW_S3_ENDPOINT", "start the S3 server with ./scripts/s3 start");
    let bucket = std::env::var("SHAREFLOW_S3_BUCKET").unwrap_or_else(|_| "shareflow".into());
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let aws = vec![
        ("AWS_ACCESS_KEY_ID", var("SHAREFLOW_S3_ACCESS_KEY")),
        ("AWS_SECRET_ACCESS_KEY", var("SHAREFLOW_S3_SECRET_KEY")),
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_REGION", "us-east-1".into()),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(soak(minutes, rate, bootstrap, data, bucket, aws));
}

async fn soak(
    minutes: f64,
    rate: u64,
    bootstrap: String,
    data: PathBuf,
    bucket: String,
    aws: Vec<(&'static str, String)>,
) {
    let tag = unix_micros() % 1_000_000_000;
    let group = format!("fleet{tag}");
    let (input, output) = (format!("{group}-input"), format!("{group}-output"));
    let cluster = KafkaCluster::connect(&bootstrap).await.expect("connect to Kafka");
    cluster.ensure_topic(&input, PARTITIONS, &[]).await.expect("input topic");
    cluster.ensure_topic(&output, PARTITIONS, &[]).await.expect("output topic");
    let expiration = cluster.broker_config("transactional.id.expiration.ms").await.ok().flatten();
    let dir = tempfile::tempdir().expect("a directory for the instances' stderr");
    let mut fleet = Fleet {
        binary: env!("CARGO_BIN_EXE_shareflow"),
        bootstrap,
        group: group.clone(),
        checkpoints: format!("s3://{bucket}/{group}"),
        dir: dir.path().to_path_buf(),
        aws,
        started: 0,
    };
    let mut results = results::Results::create(
        "kafka_fleet_soak",
        serde_json::json!({"minutes": minutes, "rate": rate, "instances": 3, "group": group,
            "transactional_id_expiration_ms": expiration}),
    );
    println!(
        "fleet soak: group {group}, {minutes} min at {rate} records/s, transactional.id.expiration.ms {expiration:?}"
    );
    let mut churn = Churn {
        members: ["a", "b", "c"].iter().map(|n| fleet.start(n)).collect(),
        kills: 0,
        replacements: 0,
        next_name: 0,
        unexpected_exits: 0,
    };
    let (produced, stop_producing, stop_reading) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let producer =
        tokio::spawn(produce(cluster.clone(), input.clone(), rate, produced.clone(), stop_producing.clone()));
    let reader = tokio::spawn(follow(cluster.clone(), output.clone(), seen.clone(), stop_reading.clone()));

    let started = Instant::now();
    let total = Duration::from_secs_f64(minutes * 60.0);
    let (mut next_kill, mut next_replace, mut next_sample) = (KILL_EVERY, REPLACE_EVERY, SAMPLE_EVERY);
    let mut gc_deleted = 0;
    let mut last = (0u64, Instant::now());
    while started.elapsed() < total {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let secs = started.elapsed().as_secs_f64();
        churn.revive(&mut fleet, &mut results, secs);
        if started.elapsed() >= next_replace {
            next_replace += REPLACE_EVERY;
            next_kill += KILL_EVERY; // the replacement is this minute's churn
            churn.replace_one(&mut fleet, &mut results, secs);
        } else if started.elapsed() >= next_kill {
            next_kill += KILL_EVERY;
            churn.kill_one(&mut fleet, &mut results, secs);
            gc_deleted += fleet.gc();
        }
        if started.elapsed() >= next_sample {
            next_sample += SAMPLE_EVERY;
            let fp = footprint(&cluster, &group, &data).await;
            let (distinct, duplicates, p50, p99) = {
                let mut s = seen.lock().unwrap();
                let mut w = std::mem::take(&mut s.window);
                w.sort_unstable();
                (s.distinct, s.duplicates, percentile(&w, 0.5), percentile(&w, 0.99))
            };
            let rate_now = (distinct - last.0) as f64 / last.1.elapsed().as_secs_f64();
            last = (distinct, Instant::now());
            let rss: Vec<f64> = churn.members.iter().map(|m| rss_mib(m.child.id())).collect();
            let mut line = serde_json::json!({"kind": "sample", "secs": secs,
                "produced": produced.load(Ordering::SeqCst), "committed": distinct, "duplicates": duplicates,
                "records_per_second": rate_now, "latency_p50_ms": p50, "latency_p99_ms": p99,
                "rss_mib": rss, "instances": churn.members.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
                "gc_deleted": gc_deleted});
            if let (Some(line), serde_json::Value::Object(fp)) = (line.as_object_mut(), fp) {
                line.extend(fp);
            }
            println!("fleet soak: {line}");
            results.record(line);
        }
    }
    // The producer stops; the output catches up; the instances retire.
    stop_producing.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    let produced = produced.load(Ordering::SeqCst);
    let drain = Instant::now();
    while seen.lock().unwrap().distinct < produced && drain.elapsed() < DRAIN_LIMIT {
        churn.revive(&mut fleet, &mut results, started.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drained_in = drain.elapsed().as_secs_f64();
    for m in &mut churn.members {
        let code = sigterm_and_wait(m, Duration::from_secs(60));
        assert_eq!(code, Some(0), "{} did not retire at the end:\n{}", m.name, tail(&m.stderr));
    }
    // What the retirements committed too: the reader's last pass reads to the end.
    stop_reading.store(true, Ordering::SeqCst);
    reader.await.unwrap();
    gc_deleted += fleet.gc();
    let end_footprint = footprint(&cluster, &group, &data).await;
    finish(produced, &seen, &churn, gc_deleted, drained_in, end_footprint, &mut results);
}

/// Checks every id once (the reader read every committed record of the output once,
/// from its start to its end after the instances retired) and records the summary.
fn finish(
    produced: u64,
    seen: &Mutex<Seen>,
    churn: &Churn,
    gc_deleted: usize,
    drained_in: f64,
    end_footprint: serde_json::Value,
    results: &mut results::Results,
) {
    let s = seen.lock().unwrap();
    let count = |id: u64| s.counts.get(id as usize).copied().unwrap_or(0);
    let missing = (0..produced).filter(|id| count(*id) == 0).count();
    let duplicated = (0..produced).filter(|id| count(*id) > 1).count();
    let foreign = (produced as usize..s.counts.len()).filter(|id| s.counts[*id] > 0).count();
    let output_records: u64 = s.counts.iter().map(|c| u64::from(*c)).sum();
    drop(s);
    let mut all = std::mem::take(&mut seen.lock().unwrap().all);
    all.sort_unstable();
    let summary = serde_json::json!({"kind": "summary", "produced": produced, "output_records": output_records,
        "missing": missing, "duplicated": duplicated, "foreign": foreign,
        "latency_p50_ms": percentile(&all, 0.5), "latency_p99_ms": percentile(&all, 0.99),
        "latency_max_ms": all.last().copied().unwrap_or(0), "kills": churn.kills,
        "replacements": churn.replacements, "unexpected_exits": churn.unexpected_exits, "gc_deleted": gc_deleted,
        "drained_in_s": drained_in, "footprint_end": end_footprint});
    println!("fleet soak: {summary}");
    results.record(summary);
    assert_eq!((missing, duplicated, foreign), (0, 0, 0), "the output is not every input record exactly once");
    assert_eq!(churn.unexpected_exits, 0, "instances exited by themselves (see the event lines)");
}
