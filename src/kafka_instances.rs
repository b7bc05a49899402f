//! `shareflow demo --kafka HOST:PORT --instances N`: N `shareflow run` processes of the
//! main job in one share group on a real Kafka 4.x broker (decision 0008), with a seeded
//! schedule of faults, and an independent read_committed check of the output at the end.
//!
//! With `--kills K` (K >= 1) the schedule is: instance `i1` is SIGKILLed for good (a live
//! one must adopt it; the demo measures how long until its work is committed), then K
//! SIGKILLs of random live instances, each restarted under its own name; halfway through
//! a new instance joins; at the end one is paused with SIGSTOP past the adoption timeout
//! and resumed, and must stop fenced. With `--kills 0` the instances just run: the
//! throughput figures.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use shareflow_checkpoint::CheckpointStore;
use shareflow_connector::kafka::KafkaCluster;

use crate::demo::{identity, value_of};
use crate::kafka_demo::check;
use crate::kafka_job::{input_topic, output_topic};

/// Settings of a multi-instance run.
#[derive(Debug, Clone)]
pub(crate) struct InstancesOptions {
    /// `host:port` of the broker.
    pub(crate) bootstrap: String,
    /// The share group; topics `{name}-input` and `{name}-output`.
    pub(crate) name: String,
    /// Records to produce first.
    pub(crate) records: u64,
    /// Bytes per record value.
    pub(crate) value_len: usize,
    /// Instances started at first.
    pub(crate) instances: u32,
    /// Restartable SIGKILLs; with any, also a kill for good, a join and a pause.
    pub(crate) kills: usize,
    /// Seed of the schedule.
    pub(crate) seed: u64,
    /// Checkpoint interval of every instance.
    pub(crate) interval: Duration,
    /// Checkpoint timeout of every instance.
    pub(crate) checkpoint_timeout: Duration,
    /// Silence before adoption.
    pub(crate) adoption_timeout: Duration,
    /// Subtasks per operator in every instance.
    pub(crate) parallelism: u32,
    /// Partitions of the topics.
    pub(crate) partitions: u32,
    /// At most this many records per second through each instance.
    pub(crate) max_rate: Option<u64>,
    /// The checkpoint root every instance shares; `None`: a directory under `target/`.
    pub(crate) checkpoints: Option<String>,
    /// Print the schedule and progress to stderr.
    pub(crate) progress: bool,
    /// Append each process's whole stderr to `{logs}/{instance}.log`.
    pub(crate) logs: Option<std::path::PathBuf>,
}

impl InstancesOptions {
    /// Defaults for a fresh run on `bootstrap`.
    pub(crate) fn new(bootstrap: &str, name: &str, instances: u32) -> Self {
        Self {
            bootstrap: bootstrap.into(),
            name: name.into(),
            records: 100_000,
            value_len: 100,
            instances,
            kills: 0,
            seed: 1,
            interval: Duration::from_millis(500),
            checkpoint_timeout: Duration::from_secs(3),
            adoption_timeout: Duration::from_secs(5),
            parallelism: 2,
            partitions: 4,
            max_rate: None,
            checkpoints: None,
            progress: true,
            logs: None,
        }
    }

    /// Refuses settings the schedule cannot carry out, naming the setting.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.instances == 0 {
            return Err("--instances must be >= 1".into());
        }
        if self.kills > 0 && self.instances < 2 {
            return Err(format!(
                "--kills {} needs --instances >= 2: the instance killed for good must have a live one to adopt it",
                self.kills
            ));
        }
        if self.adoption_timeout <= self.interval + self.checkpoint_timeout {
            return Err(format!(
                "--adoption-timeout {} ms must be longer than --interval plus --checkpoint-timeout ({} ms): a live \
                 instance in the middle of a checkpoint would be adopted",
                self.adoption_timeout.as_millis(),
                (self.interval + self.checkpoint_timeout).as_millis()
            ));
        }
        if self.records == 0 {
            return Err("--records must be >= 1 with --instances: the run ends when every record is committed".into());
        }
        Ok(())
    }
}

/// What one instance name did over all its processes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct InstanceCounts {
    /// Processes started under the name.
    pub(crate) processes: u32,
    /// Of them, SIGKILLed by the schedule.
    pub(crate) killed: u32,
    /// Records emitted, summed over its processes (the last progress line of each).
    pub(crate) emitted: u64,
    /// Seconds its processes ran, summed.
    pub(crate) seconds: f64,
    /// How its last process ended: `retired`, `killed`, `fenced` or `failed`.
    pub(crate) end: String,
    /// Adoptions its last process reported, if it retired.
    pub(crate) adoptions: u64,
}

/// What a multi-instance run did and what the check found.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct InstancesSummary {
    /// The schedule's seed.
    pub(crate) seed: u64,
    /// Records in the input topic.
    pub(crate) input_records: u64,
    /// Output records visible to read_committed readers.
    pub(crate) output_records: u64,
    /// Extra copies in the output.
    pub(crate) duplicates: u64,
    /// Input records missing from the output.
    pub(crate) lost: u64,
    /// Per instance name.
    #[serde(serialize_with = "instances_json")]
    pub(crate) instances: BTreeMap<String, InstanceCounts>,
    /// `(adopted, adopter)` as the instance registry records them at the end.
    #[serde(serialize_with = "adoptions_json")]
    pub(crate) adoptions: Vec<(String, String)>,
    /// Processes that stopped because another fenced them.
    pub(crate) fenced: u32,
    /// SIGKILLs sent, the one for good included.
    pub(crate) sigkills: u32,
    /// The instance paused past the adoption timeout, if any.
    pub(crate) paused: Option<String>,
    /// Seconds from the kill for good until the registry recorded its adoption.
    pub(crate) adoption_seconds: Option<f64>,
    /// Seconds from the kill for good until every record its intents named was committed.
    pub(crate) adopted_output_seconds: Option<f64>,
    /// Records the killed instance's intents named and no committed output held at the kill.
    pub(crate) adopted_uncommitted: u64,
    /// Transactional ids of the group on the broker at the end.
    pub(crate) transactional_ids: usize,
    /// Of them, Ongoing or Prepare*.
    pub(crate) open_transactions: Vec<String>,
    /// Records per second through all instances, from the first start to the last commit.
    pub(crate) records_per_second: f64,
    /// Seconds from the first start until every record was committed.
    pub(crate) seconds: f64,
}

/// Each instance's counts as JSON, with its rate.
fn instances_json<S: serde::Serializer>(instances: &BTreeMap<String, InstanceCounts>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(serde::Serialize)]
    struct Counts<'a> {
        processes: u32,
        killed: u32,
        emitted: u64,
        seconds: f64,
        records_per_second: f64,
        end: &'a str,
        adoptions: u64,
    }
    s.collect_map(instances.iter().map(|(name, c)| {
        let counts = Counts {
            processes: c.processes,
            killed: c.killed,
            emitted: c.emitted,
            seconds: c.seconds,
            records_per_second: c.records_per_second(),
            end: &c.end,
            adoptions: c.adoptions,
        };
        (name, counts)
    }))
}

/// Adoptions as `{"adopted", "by"}` objects.
fn adoptions_json<S: serde::Serializer>(adoptions: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    #[derive(serde::Serialize)]
    struct Adoption<'a> {
        adopted: &'a str,
        by: &'a str,
    }
    s.collect_seq(adoptions.iter().map(|(adopted, by)| Adoption { adopted, by }))
}

impl InstanceCounts {
    /// Records per second while its processes ran.
    pub(crate) fn records_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.emitted as f64 / self.seconds
        } else {
            0.0
        }
    }
}

impl InstancesSummary {
    /// True when the output equals the input and nothing is left open.
    pub(crate) fn clean(&self) -> bool {
        self.duplicates == 0 && self.lost == 0 && self.open_transactions.is_empty()
    }

    /// One JSON object: the summary, serialized.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Human-readable lines.
    pub(crate) fn to_text(&self) -> String {
        let mut s = format!(
            "seed:                    {}\ninput records:           {}\noutput (read_committed): {}\nduplicates:              {}\n\
             lost:                    {}\nSIGKILLs:                {}\nfenced processes:        {}\nopen transactions:       {}\n\
             transactional ids:       {}\nthroughput:              {:.0} records/s ({:.1} s)\n",
            self.seed,
            self.input_records,
            self.output_records,
            self.duplicates,
            self.lost,
            self.sigkills,
            self.fenced,
            self.open_transactions.len(),
            self.transactional_ids,
            self.records_per_second,
            self.seconds
        );
        for (a, by) in &self.adoptions {
            s += &format!("adoption:                {a} by {by}\n");
        }
        if let (Some(a), Some(o)) = (self.adoption_seconds, self.adopted_output_seconds) {
            s += &format!(
                "kill for good -> adopted: {a:.1} s; -> its {} uncommitted records committed: {o:.1} s\n",
                self.adopted_uncommitted
            );
        }
        for (name, c) in &self.instances {
            s += &format!(
                "{name}: {} processes ({} killed), {} emitted, {:.0} records/s, ended {}\n",
                c.processes,
                c.killed,
                c.emitted,
                c.records_per_second(),
                c.end
            );
        }
        s.trim_end().to_string()
    }
}

/// A seeded xorshift: the whole schedule follows from `--seed`.
struct Schedule(u64);

impl Schedule {
    fn below(&mut self, n: u64) -> u64 {
        let mut s = self.0;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        self.0 = s;
        s % n.max(1)
    }
}

/// The input the instances share, to ask the group what is left of it.
struct Input<'a> {
    cluster: &'a KafkaCluster,
    group: &'a str,
    topic: &'a str,
}

/// One running `shareflow run` process and what its stderr said.
struct Process {
    name: String,
    child: Child,
    started: Instant,
    /// The last progress count, and the last lines of stderr.
    seen: Arc<Mutex<(u64, Vec<String>)>>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Process {
    fn start(options: &InstancesOptions, name: &str, checkpoints: &str) -> Result<Self, BoxError> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the shareflow executable: {e}"))?;
        let ms = |d: Duration| d.as_millis().to_string();
        let mut command = Command::new(exe);
        command
            .args(["run", "--kafka", &options.bootstrap, "--group", &options.name, "--instance", name])
            .args(["--checkpoints", checkpoints, "--interval", &ms(options.interval)])
            .args(["--checkpoint-timeout", &ms(options.checkpoint_timeout)])
            .args(["--adoption-timeout", &ms(options.adoption_timeout)])
            .args(["--parallelism", &options.parallelism.to_string()])
            .args(["--partitions", &options.partitions.to_string(), "--json"]);
        if let Some(r) = options.max_rate {
            command.args(["--max-rate", &r.to_string()]);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start instance {name}: {e}"))?;
        let seen = Arc::new(Mutex::new((0, Vec::new())));
        let mut log = match &options.logs {
            Some(dir) => {
                let path = dir.join(format!("{name}.log"));
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| format!("cannot open the log file {}: {e}", path.display()))?;
                writeln!(f, "=== process {} of {name} started", child.id())
                    .map_err(|e| format!("cannot write the log file {}: {e}", path.display()))?;
                Some(f)
            }
            None => None,
        };
        if let Some(stderr) = child.stderr.take() {
            let s = seen.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                    // A failing log write must not stop the reader: the pipe would fill.
                    if let Some(f) = &mut log {
                        if writeln!(f, "{line}").is_err() {
                            log = None;
                        }
                    }
                    let Ok(mut g) = s.lock() else { return };
                    match line.strip_prefix("progress: ").and_then(|l| l.split(' ').next()?.parse().ok()) {
                        Some(n) => g.0 = n,
                        None => {
                            g.1.push(line);
                            if g.1.len() > 40 {
                                g.1.remove(0);
                            }
                        }
                    }
                }
            });
        }
        Ok(Self { name: name.into(), child, started: Instant::now(), seen })
    }

    fn emitted(&self) -> u64 {
        self.seen.lock().map_or(0, |g| g.0)
    }

    fn tail(&self) -> String {
        self.seen.lock().map(|g| g.1.join("\n")).unwrap_or_default()
    }

    /// Waits at most 120 s until the process emits records, or until the group has
    /// nothing left for it: a process started while the others drain the last of the
    /// input may never get a record (one joiner, SIGKILLed and restarted with 12 s of
    /// input left, got none), and that is no fault.
    async fn wait_processing(&mut self, input: &Input<'_>) -> Result<(), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut next_look = Instant::now() + Duration::from_secs(1);
        while self.emitted() == 0 {
            if Instant::now() >= next_look {
                next_look = Instant::now() + Duration::from_secs(1);
                if input.cluster.share_group_backlog(input.group, input.topic).await.is_ok_and(|b| b.drained()) {
                    return Ok(());
                }
            }
            if let Some(status) = self.child.try_wait()? {
                return Err(format!(
                    "instance {} ended before it processed anything ({status}):\n{}",
                    self.name,
                    self.tail()
                )
                .into());
            }
            if Instant::now() > deadline {
                return Err(format!("instance {} processed nothing within 120 s:\n{}", self.name, self.tail()).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn signal(&self, signal: &str) -> Result<(), BoxError> {
        let ok = Command::new("kill").args([signal, &self.child.id().to_string()]).status()?.success();
        if ok {
            Ok(())
        } else {
            Err(format!("kill {signal} {} (pid {}) failed", self.name, self.child.id()).into())
        }
    }

    /// SIGKILL, then reap.
    fn sigkill(mut self, counts: &mut InstanceCounts) {
        let _ = self.child.kill(); // SIGKILL on Unix.
        let _ = self.child.wait();
        counts.killed += 1;
        counts.end = "killed".into();
        self.account(counts);
    }

    /// Adds this process's records and running time to its name's counts.
    fn account(&self, counts: &mut InstanceCounts) {
        counts.emitted += self.emitted();
        counts.seconds += self.started.elapsed().as_secs_f64();
    }

    /// Waits at most `timeout` for the exit; its status, stdout and stderr tail.
    async fn wait_exit(mut self, timeout: Duration) -> Result<(ExitStatus, String, String, Self), BoxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let mut out = String::new();
                if let Some(mut o) = self.child.stdout.take() {
                    let _ = std::io::Read::read_to_string(&mut o, &mut out);
                }
                // Let the stderr reader catch the last lines.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let tail = self.tail();
                return Ok((status, out, tail, self));
            }
            if Instant::now() > deadline {
                let tail = self.tail();
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!("instance {} did not exit within {timeout:?}:\n{tail}", self.name).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The distinct record ids committed to the output so far, read incrementally: each
/// [`advance`](Self::advance) reads only what was committed since the last one.
#[derive(Debug, Default)]
struct CommittedOutput {
    next: Vec<i64>,
    ids: HashSet<u64>,
}

impl CommittedOutput {
    async fn advance(&mut self, cluster: &KafkaCluster, output: &str) -> Result<&HashSet<u64>, BoxError> {
        let (records, ends) = cluster.read_committed_from(output, &self.next).await?;
        self.ids.extend(records.iter().filter_map(|(_, _, _, v)| v.as_deref().and_then(identity)));
        self.next = ends;
        Ok(&self.ids)
    }
}

/// The record ids the intents of `prefix` name, read from the intents topic and the input.
async fn named_by(cluster: &KafkaCluster, group: &str, prefix: &str, input: &str) -> Result<HashSet<u64>, BoxError> {
    let mut offsets: HashMap<i32, Vec<(i64, i64)>> = HashMap::new();
    for intent in cluster.group_intents(group).await?.into_iter().filter(|i| i.by.prefix == prefix) {
        for r in intent.ranges.into_iter().filter(|r| r.topic == input) {
            offsets.entry(r.partition).or_default().push((r.first, r.last));
        }
    }
    let records = cluster.read_committed(input).await?;
    Ok(records
        .iter()
        .filter(|(p, o, _, _)| offsets.get(p).is_some_and(|rs| rs.iter().any(|(a, b)| a <= o && o <= b)))
        .filter_map(|(_, _, _, v)| v.as_deref().and_then(identity))
        .collect())
}

/// Runs the schedule, then checks the output.
pub(crate) async fn run(options: &InstancesOptions) -> Result<InstancesSummary, BoxError> {
    options.validate()?;
    let setup = Setup::prepare(options).await?;
    let mut state = Run::new(options, &setup);
    state.start_all().await?;
    if options.kills > 0 {
        state.kill_for_good().await?;
        state.kill_and_restart().await?;
        state.pause_past_adoption().await?;
    }
    state.finish_input().await?;
    state.retire().await?;
    state.check_output().await
}

/// What the instances share on the broker's side, set up before the first starts.
struct Setup {
    /// The checkpoint root every instance shares.
    checkpoints: String,
    /// The instance registry under that root.
    registry: shareflow_checkpoint::instances::InstanceRegistry,
    /// The broker.
    cluster: KafkaCluster,
    /// The input topic.
    input: String,
    /// The output topic.
    output: String,
}

impl Setup {
    /// Opens the checkpoint root, creates the topics, sets the group's limits and
    /// produces the whole input.
    async fn prepare(options: &InstancesOptions) -> Result<Self, BoxError> {
        // The checkpoint root opens before anything is produced.
        let checkpoints =
            options.checkpoints.clone().unwrap_or_else(|| crate::kafka_demo::default_checkpoints(&options.name));
        let registry = CheckpointStore::from_url(&checkpoints, &[], "instances")?.registry();
        let cluster = KafkaCluster::connect(&options.bootstrap).await?;
        let (input, output) = (input_topic(&options.name), output_topic(&options.name));
        cluster.ensure_topic(&input, options.partitions as i32, &[]).await?;
        cluster.ensure_topic(&output, options.partitions as i32, &[]).await?;
        crate::kafka_demo::demo_group_limits(&cluster, &options.name).await?;
        let mut id = 0;
        while id < options.records {
            let n = 20_000.min(options.records - id);
            cluster.produce(&input, (id..id + n).map(|i| (None, Bytes::from(value_of(i, options.value_len))))).await?;
            id += n;
        }
        Ok(Self { checkpoints, registry, cluster, input, output })
    }
}

/// A run under way: what the steps of the schedule read and change.
struct Run<'a> {
    options: &'a InstancesOptions,
    setup: &'a Setup,
    /// The input, to ask the group what is left of it.
    shared: Input<'a>,
    rng: Schedule,
    summary: InstancesSummary,
    /// When the first instance started.
    started: Instant,
    committed: CommittedOutput,
    /// The processes running now.
    live: Vec<Process>,
}

impl<'a> Run<'a> {
    /// A run of `options` on `setup`, its clock started, no instance yet.
    fn new(options: &'a InstancesOptions, setup: &'a Setup) -> Self {
        let shared = Input { cluster: &setup.cluster, group: &options.name, topic: &setup.input };
        let rng = Schedule(options.seed | 1);
        let summary = InstancesSummary { seed: options.seed, ..InstancesSummary::default() };
        let started = Instant::now();
        Self { options, setup, shared, rng, summary, started, committed: CommittedOutput::default(), live: Vec::new() }
    }

    /// Prints `what` to stderr at the seconds since the first start, with progress on.
    fn say(&self, what: String) {
        if self.options.progress {
            eprintln!("{:>6.1} s: {what}", self.started.elapsed().as_secs_f64());
        }
    }

    /// Starts the instances `i1` to `iN` and waits until each processes records.
    async fn start_all(&mut self) -> Result<(), BoxError> {
        for n in 1..=self.options.instances {
            let name = format!("i{n}");
            self.live.push(Process::start(self.options, &name, &self.setup.checkpoints)?);
            self.summary.instances.entry(name).or_default().processes += 1;
        }
        for p in &mut self.live {
            p.wait_processing(&self.shared).await?;
        }
        self.say(format!("{} instances processing", self.live.len()));
        Ok(())
    }

    /// SIGKILLs `i1` for good after a seeded while, and measures how long until the
    /// registry records its adoption, and until every record its intents named and no
    /// committed output held at the kill is committed.
    async fn kill_for_good(&mut self) -> Result<(), BoxError> {
        let (options, setup) = (self.options, self.setup);
        // i1 dies for good: a live instance must adopt it and replay what it named.
        tokio::time::sleep(Duration::from_millis(500 + self.rng.below(2_000))).await;
        let gone = self.live.remove(0);
        self.say(format!("SIGKILL {} for good (emitted {})", gone.name, gone.emitted()));
        let killed_at = Instant::now();
        let name = gone.name.clone();
        gone.sigkill(self.summary.instances.entry(name.clone()).or_default());
        self.summary.sigkills += 1;
        let committed_at_kill = self.committed.advance(&setup.cluster, &setup.output).await?.clone();
        let deadline = killed_at + options.adoption_timeout * 4 + Duration::from_secs(60);
        let adopted = async {
            loop {
                if setup.registry.observe().await?.iter().any(|r| r.prefix == name && r.adoption_done) {
                    return Ok::<_, BoxError>(killed_at.elapsed().as_secs_f64());
                }
                if Instant::now() > deadline {
                    return Err(format!("nobody adopted {name} within {:?} of its kill", deadline - killed_at).into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        // Meanwhile, what it named: its last intent writes have landed a second after
        // the kill, long before anyone may adopt it.
        let named = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            named_by(&setup.cluster, &options.name, &name, &setup.input).await
        };
        let (adopted, named) = tokio::join!(adopted, named);
        self.summary.adoption_seconds = Some(adopted?);
        let named = named?;
        self.summary.adopted_uncommitted = named.difference(&committed_at_kill).count() as u64;
        loop {
            // Timed at the read's start: it takes the last stable offsets first, so what
            // it returns was committed within milliseconds of that.
            let read_at = killed_at.elapsed().as_secs_f64();
            if self.committed.advance(&setup.cluster, &setup.output).await?.is_superset(&named) {
                self.summary.adopted_output_seconds = Some(read_at);
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the records {name} named were not all committed within {:?}",
                    deadline - killed_at
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.say(format!(
            "{name} adopted after {:.1} s; its {} uncommitted records committed after {:.1} s",
            self.summary.adoption_seconds.unwrap_or_default(),
            self.summary.adopted_uncommitted,
            self.summary.adopted_output_seconds.unwrap_or_default()
        ));
        Ok(())
    }

    /// The restartable SIGKILLs: each of a random live instance after a seeded while,
    /// restarted under its own name; halfway through, a new instance joins.
    async fn kill_and_restart(&mut self) -> Result<(), BoxError> {
        let (options, setup) = (self.options, self.setup);
        let joiner = format!("i{}", options.instances + 1);
        for kill in 0..options.kills {
            if kill == options.kills / 2 {
                self.say(format!("{joiner} joins"));
                let mut p = Process::start(options, &joiner, &setup.checkpoints)?;
                p.wait_processing(&self.shared).await?;
                self.summary.instances.entry(joiner.clone()).or_default().processes += 1;
                self.live.push(p);
            }
            tokio::time::sleep(Duration::from_millis(300 + self.rng.below(2_000))).await;
            let victim = self.live.remove(self.rng.below(self.live.len() as u64) as usize);
            let name = victim.name.clone();
            self.say(format!("SIGKILL {name} (emitted {})", victim.emitted()));
            victim.sigkill(self.summary.instances.entry(name.clone()).or_default());
            self.summary.sigkills += 1;
            tokio::time::sleep(Duration::from_millis(self.rng.below(1_500))).await;
            let mut again = Process::start(options, &name, &setup.checkpoints)?;
            self.summary.instances.entry(name.clone()).or_default().processes += 1;
            again.wait_processing(&self.shared).await?;
            self.live.push(again);
        }
        Ok(())
    }

    /// Pauses a random live instance with SIGSTOP past the adoption timeout: another
    /// adopts and fences it; resumed, it must stop with an error instead of committing
    /// anything.
    async fn pause_past_adoption(&mut self) -> Result<(), BoxError> {
        let paused = self.live.remove(self.rng.below(self.live.len() as u64) as usize);
        self.say(format!("SIGSTOP {}", paused.name));
        paused.signal("-STOP")?;
        tokio::time::sleep(self.options.adoption_timeout * 2 + Duration::from_secs(2)).await;
        paused.signal("-CONT")?;
        self.say(format!("SIGCONT {}", paused.name));
        self.summary.paused = Some(paused.name.clone());
        let (status, _, tail, p) = paused.wait_exit(Duration::from_secs(120)).await?;
        let counts = self.summary.instances.entry(p.name.clone()).or_default();
        p.account(counts);
        if status.success() || !(tail.contains("fenced") || tail.contains("adopt")) {
            return Err(
                format!("{} was adopted while paused, yet it did not stop fenced ({status}):\n{tail}", p.name).into()
            );
        }
        counts.end = "fenced".into();
        self.summary.fenced += 1;
        Ok(())
    }

    /// Waits until the survivors have committed every record, everything adopted
    /// included, and times the run; an instance that ends on its own fails it.
    async fn finish_input(&mut self) -> Result<(), BoxError> {
        let (options, setup) = (self.options, self.setup);
        // The survivors finish the input, including everything adopted.
        let deadline = Instant::now() + Duration::from_secs(600 + options.records / 500);
        loop {
            let distinct = self.committed.advance(&setup.cluster, &setup.output).await?.len() as u64;
            if distinct >= options.records {
                break;
            }
            for p in &mut self.live {
                if let Some(status) = p.child.try_wait()? {
                    return Err(format!("instance {} ended on its own ({status}):\n{}", p.name, p.tail()).into());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("only {distinct} of {} records committed by the deadline", options.records).into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.summary.seconds = self.started.elapsed().as_secs_f64();
        self.summary.records_per_second = options.records as f64 / self.summary.seconds;
        self.say("every record committed; SIGTERM the instances".into());
        Ok(())
    }

    /// Stops the survivors with SIGTERM and adds up what each did: each must stop
    /// cleanly, with a last JSON summary saying so.
    async fn retire(&mut self) -> Result<(), BoxError> {
        for p in &self.live {
            p.signal("-TERM")?;
        }
        for p in std::mem::take(&mut self.live) {
            let (status, out, tail, p) = p.wait_exit(Duration::from_secs(120)).await?;
            let counts = self.summary.instances.entry(p.name.clone()).or_default();
            let last: serde_json::Value =
                out.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(serde_json::Value::Null);
            if !status.success() || last["stopped"] != serde_json::Value::Bool(true) {
                counts.end = "failed".into();
                return Err(format!("instance {} did not stop cleanly ({status}): {last}\n{tail}", p.name).into());
            }
            counts.end = "retired".into();
            counts.adoptions = last["adoptions"].as_u64().unwrap_or_default();
            // Its own count is exact; the progress line lags by up to a second.
            counts.emitted += last["emitted"].as_u64().unwrap_or_default();
            counts.seconds += p.started.elapsed().as_secs_f64();
        }
        Ok(())
    }

    /// The independent check: the output read_committed against the input, the group's
    /// transactions left open, and the adoptions the registry records. Returns the
    /// summary of the run.
    async fn check_output(self) -> Result<InstancesSummary, BoxError> {
        let (options, setup, mut summary) = (self.options, self.setup, self.summary);
        let (cluster, input, output) = (&setup.cluster, &setup.input, &setup.output);
        cluster.wait_stable(output, Duration::from_secs(30)).await?;
        let out: Vec<Bytes> = cluster.read_committed(output).await?.into_iter().filter_map(|(_, _, _, v)| v).collect();
        summary.input_records = cluster.end_offsets(input, false).await?.iter().map(|&o| o.max(0) as u64).sum();
        summary.output_records = out.len() as u64;
        (summary.duplicates, summary.lost) = check(summary.input_records, &out);
        let ids = cluster.transactional_ids(&format!("{}-", options.name)).await?;
        summary.transactional_ids = ids.len();
        summary.open_transactions =
            ids.into_iter().filter(|(_, st)| st == "Ongoing" || st.starts_with("Prepare")).map(|(id, _)| id).collect();
        summary.adoptions = setup
            .registry
            .observe()
            .await?
            .into_iter()
            .filter_map(|r| Some((r.prefix, r.adopted_by?)))
            .filter(|(a, _)| summary.instances.contains_key(a))
            .collect();
        Ok(summary)
    }
}
