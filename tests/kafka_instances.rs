//! N shareflow processes in one share group on a real Kafka 4.x broker (decision 0008).
//!
//! - `shareflow demo --kafka --instances 3 --kills 6`, checkpoints on the S3 server:
//!   SIGKILLed at random seeded moments and restarted, one killed for good and adopted,
//!   one joining late, one paused with SIGSTOP past the adoption timeout and resumed.
//!   Kafka's Java console consumer reads the output read_committed: it must equal the
//!   input exactly once. Replay a failure with `SHAREFLOW_KAFKA_INSTANCES_SEED=<seed>`.
//! - The same instance name started twice, in 20 rounds of kills.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use support::demo::{identity, number, shareflow_with_env, value_of};
use support::kafka::{cluster, read_committed_with_java, unique};

const RECORDS: u64 = 100_000;
/// Restartable kills; the kill for good comes on top.
const KILLS: u64 = 6;
/// Far above a restart's gap: an instance SIGKILLed and restarted under its name must
/// register again before the others find it silent past this, or they adopt it (rightly)
/// and the restart stops fenced. At 5 s, on a loaded CI machine (a debug binary, three
/// test binaries at once), the restart of i4 0.5 s after its kill stopped so: adopted by
/// i3 (seed 1796668106746050454).
const ADOPTION_TIMEOUT_MS: u64 = 10_000;
/// Per instance: slow enough that the schedule lands while work remains.
const MAX_RATE: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_killed_paused_and_joining_keep_the_output_exactly_once() {
    let Some(c) = cluster().await else { return };
    let Some(_) = support::s3::s3_store() else { return };
    let bootstrap = support::kafka::bootstrap().expect("set");
    let seed = std::env::var("SHAREFLOW_KAFKA_INSTANCES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("schedule seed {seed} (replay: SHAREFLOW_KAFKA_INSTANCES_SEED={seed})");
    let group = unique("instances");
    let bucket = std::env::var("SHAREFLOW_S3_BUCKET").unwrap_or_else(|_| "shareflow".into());
    let checkpoints = format!("s3://{bucket}/{group}");
    // Every process's whole stderr, for the post-mortem of a failing seed.
    let logs = std::env::temp_dir().join(&group);
    eprintln!("instance logs in {}", logs.display());
    let logs_arg = logs.display().to_string();
    let numbers = [RECORDS, KILLS, ADOPTION_TIMEOUT_MS, MAX_RATE, seed].map(|n| n.to_string());
    let [records, kills, adoption, rate, seed_arg] = numbers.each_ref().map(String::as_str);
    let args = [
        "demo",
        "--kafka",
        &bootstrap,
        "--instances",
        "3",
        "--name",
        &group,
        "--records",
        records,
        "--kills",
        kills,
        "--seed",
        seed_arg,
        "--checkpoints",
        &checkpoints,
        "--interval",
        "500",
        "--checkpoint-timeout",
        "3000",
        "--adoption-timeout",
        adoption,
        "--max-rate",
        rate,
        "--logs",
        &logs_arg,
        "--json",
    ]
    .map(String::from);
    let run = tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        shareflow_with_env(&a, &support::s3::aws_env(), Duration::from_secs(900))
    })
    .await
    .expect("thread");
    let s = run.summary().unwrap_or_else(|| panic!("seed {seed}: no summary: {run:?}"));
    eprintln!("seed {seed}: {s}");
    assert_eq!(run.code, 0, "seed {seed}: {}", run.stderr);
    // The demo's own check: output = input, nothing open or prepared at the end.
    assert_eq!(
        (number(&s, "input_records"), number(&s, "output_records"), number(&s, "duplicates"), number(&s, "lost")),
        (RECORDS, RECORDS, 0, 0),
        "seed {seed}"
    );
    assert_eq!(s["open_transactions"], serde_json::json!([]), "seed {seed}");
    // The whole schedule ran: the kill for good was adopted and the paused one fenced.
    assert_eq!(number(&s, "sigkills"), KILLS + 1, "seed {seed}");
    assert!(number(&s, "fenced") >= 1, "seed {seed}: the paused instance must stop fenced");
    let adopted: Vec<&str> =
        s["adoptions"].as_array().expect("adoptions").iter().filter_map(|a| a["adopted"].as_str()).collect();
    assert!(adopted.contains(&"i1"), "seed {seed}: i1 was killed for good and must be adopted: {adopted:?}");
    assert!(adopted.contains(&s["paused"].as_str().expect("paused")), "seed {seed}: the paused one must be adopted");
    // The joiner runs to the end, unless the schedule paused it (it picks the paused one
    // among all live instances), and then it must stop fenced like any paused one.
    let joiner_end = if s["paused"] == "i4" { "fenced" } else { "retired" };
    assert_eq!(s["instances"]["i4"]["end"], joiner_end, "seed {seed}: the joiner's end (paused: {})", s["paused"]);
    // Every instance did work. (A count is the last progress line a process printed, so a
    // SIGKILLed process's is a lower bound, and their sum can fall short of the input:
    // the output checks above and below are the exact ones.)
    for (name, i) in s["instances"].as_object().expect("instances") {
        assert!(number(i, "emitted") > 0, "seed {seed}: instance {name} emitted nothing: {i}");
        // Its log holds one header per process started under the name.
        let log = std::fs::read_to_string(logs.join(format!("{name}.log"))).expect("instance log");
        let started = log.lines().filter(|l| l.starts_with("=== process ")).count() as u64;
        assert_eq!(started, number(i, "processes"), "seed {seed}: {name}.log");
    }

    // Kafka's own reader agrees, independently of the demo.
    let values = read_committed_with_java(&bootstrap, &format!("{group}-output"))
        .expect("SHAREFLOW_KAFKA_LIB: ./scripts/kafka env sets it; the check must be Kafka's own reader");
    let mut count: HashMap<u64, u32> = HashMap::new();
    for v in &values {
        let id = identity(v.as_bytes()).unwrap_or_else(|| panic!("seed {seed}: foreign output value {v:?}"));
        *count.entry(id).or_default() += 1;
    }
    let duplicates: u32 = count.values().map(|n| n - 1).sum();
    let lost = (0..RECORDS).filter(|id| !count.contains_key(id)).count();
    assert_eq!(
        (values.len() as u64, duplicates, lost),
        (RECORDS, 0, 0),
        "seed {seed}: output must equal input exactly once"
    );
    let ids = c.transactional_ids(&format!("{group}-")).await.expect("list transactions");
    let open: Vec<_> = ids.iter().filter(|(_, st)| st == "Ongoing" || st.starts_with("Prepare")).collect();
    assert!(open.is_empty(), "seed {seed}: transactions left open: {open:?}");
}

/// A `shareflow run` process of the same-prefix rounds; its stderr goes to a file.
struct Run(Child, std::path::PathBuf);

/// A fresh group on the Kafka broker: its input and output topics (2 partitions each)
/// and a checkpoint root on the file system.
struct Fresh {
    c: shareflow::connector::kafka::KafkaCluster,
    bootstrap: String,
    group: String,
    input: String,
    output: String,
    dir: tempfile::TempDir,
    checkpoints: String,
}

/// [`Fresh`] for a group named after `name`; `None` without a broker (outside CI).
async fn fresh(name: &str) -> Option<Fresh> {
    let c = cluster().await?;
    let bootstrap = support::kafka::bootstrap().expect("set");
    let group = unique(name);
    let (input, output) = (format!("{group}-input"), format!("{group}-output"));
    c.ensure_topic(&input, 2, &[]).await.expect("input topic");
    c.ensure_topic(&output, 2, &[]).await.expect("output topic");
    let dir = tempfile::tempdir().expect("checkpoint dir");
    let checkpoints = format!("file://{}/checkpoints", dir.path().display());
    Some(Fresh { c, bootstrap, group, input, output, dir, checkpoints })
}

/// The distinct demo records committed to `output`, read_committed; a record committed
/// twice fails the test.
async fn committed_once(c: shareflow::connector::kafka::KafkaCluster, output: String) -> u64 {
    let mut count: HashMap<u64, u32> = HashMap::new();
    for (_, _, _, v) in c.read_committed(&output).await.expect("read") {
        *count.entry(v.as_deref().and_then(identity).expect("a demo value")).or_default() += 1;
    }
    assert_eq!(count.values().map(|n| n - 1).sum::<u32>(), 0, "duplicated output");
    count.len() as u64
}

impl Run {
    fn start(bootstrap: &str, group: &str, checkpoints: &str, stderr: std::path::PathBuf) -> Self {
        Self::start_as("same", bootstrap, group, checkpoints, stderr)
    }

    fn start_as(instance: &str, bootstrap: &str, group: &str, checkpoints: &str, stderr: std::path::PathBuf) -> Self {
        Self::start_with(instance, bootstrap, group, checkpoints, stderr, &[])
    }

    fn start_with(
        instance: &str,
        bootstrap: &str,
        group: &str,
        checkpoints: &str,
        stderr: std::path::PathBuf,
        extra: &[&str],
    ) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_shareflow"))
            .args(["run", "--kafka", bootstrap, "--group", group, "--instance", instance, "--checkpoints", checkpoints])
            .args(extra)
            .args(["--interval", "300", "--checkpoint-timeout", "3000"])
            .args(if extra.contains(&"--adoption-timeout") { &[][..] } else { &["--adoption-timeout", "60000"][..] })
            .args(["--parallelism", "2", "--partitions", "2", "--json"])
            .env("SHAREFLOW_LOG", "warn")
            .envs(support::s3::aws_env())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start shareflow run");
        Self(child, stderr)
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().expect("status")
    }

    /// Sends SIGTERM (a graceful stop: a final checkpoint, then retirement) and waits
    /// at most 60 s for the exit; its status, with stderr for the messages.
    async fn sigterm_and_wait(&mut self) -> (std::process::ExitStatus, String) {
        let term = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status().expect("kill");
        assert!(term.success());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.exited() {
                let err = self.stderr();
                assert!(!err.contains("without close()"), "a graceful stop closes its Kafka clients: {err}");
                return (status, err);
            }
            assert!(tokio::time::Instant::now() < deadline, "no exit 60 s after SIGTERM: {}", self.stderr());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn sigkill(mut self) {
        self.0.kill().expect("SIGKILL"); // Child::kill is SIGKILL on Unix.
        let _ = self.0.wait();
    }

    /// What it wrote to stderr.
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

/// Two live `shareflow run` processes of one name: the later one fences the earlier,
/// which stops at once (no restart that would take the prefix back) with exit code 3
/// and a message that names the instance, the newer incarnation and what to do; the
/// later one commits the whole input exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_run_stops_with_its_own_exit_code_and_says_who_fenced_it() {
    let Some(Fresh { c, bootstrap, group, input, output, dir, checkpoints }) = fresh("fenced-exit").await else {
        return;
    };
    const RECORDS: u64 = 2_000;
    c.produce(&input, (0..RECORDS / 2).map(|i| (None, Bytes::from(value_of(i, 32))))).await.expect("produce");
    let mut first = Run::start(&bootstrap, &group, &checkpoints, dir.path().join("first.err"));
    // The first commits some output before the second starts (a debug build's first
    // commit on a loaded machine took more than 60 s once).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while c.read_committed(&output).await.expect("read").is_empty() {
        assert!(first.exited().is_none(), "the first run exited alone: {}", first.stderr());
        let now = tokio::time::Instant::now();
        assert!(now < deadline, "the first run committed nothing in 120 s: {}", first.stderr());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A restart before this point (a cold broker may time checkpoints out) is not the
    // fencing's: only what the first run writes from here on is checked for restarts.
    let before_second = first.stderr().len();
    let mut second = Run::start(&bootstrap, &group, &checkpoints, dir.path().join("second.err"));
    c.produce(&input, (RECORDS / 2..RECORDS).map(|i| (None, Bytes::from(value_of(i, 32))))).await.expect("produce");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = first.exited() {
            break status;
        }
        assert!(second.exited().is_none(), "the later run exited: {}", second.stderr());
        assert!(tokio::time::Instant::now() < deadline, "the earlier run still runs 60 s after the later started");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let err = first.stderr();
    assert_eq!(status.code(), Some(3), "{err}");
    assert!(err.contains("stopped, fenced: instance same is fenced: incarnation"), "{err}");
    assert!(err.contains("started after this one"), "names the newer incarnation: {err}");
    assert!(err.contains("stop it, then start this one again"), "says what to do: {err}");
    assert!(!err[before_second.min(err.len())..].contains("restarting"), "a fenced run does not restart: {err}");
    assert!(!err.contains("without close()"), "a fenced run closes its Kafka clients: {err}");
    // The later one goes on: the whole input, exactly once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let values = c.read_committed(&output).await.expect("read");
        let mut count: HashMap<u64, u32> = HashMap::new();
        for (_, _, _, v) in &values {
            *count.entry(v.as_deref().and_then(identity).expect("a demo value")).or_default() += 1;
        }
        assert_eq!(count.values().map(|n| n - 1).sum::<u32>(), 0, "duplicated output");
        if count.len() as u64 == RECORDS {
            break;
        }
        assert!(second.exited().is_none(), "the later run exited: {}", second.stderr());
        assert!(tokio::time::Instant::now() < deadline, "{} of {RECORDS} committed", count.len());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    second.sigkill();
}

/// `demo --kafka` started twice with one `--name`: the later start fences the earlier,
/// which stops at once with exit code 3 (it used to fail four times with
/// InvalidProducerEpoch and exit 1), while the later one finishes the input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_demo_of_one_name_fences_the_first_which_exits_3() {
    let Some(Fresh { bootstrap, group, dir, checkpoints, .. }) = fresh("demo-twice").await else { return };
    let demo = |records: &str, err: &str| {
        Command::new(env!("CARGO_BIN_EXE_shareflow"))
            .args([
                "demo",
                "--kafka",
                &bootstrap,
                "--name",
                &group,
                "--records",
                records,
                "--checkpoints",
                &checkpoints,
            ])
            .args(["--max-rate", "5000", "--crashes", "0", "--no-verify", "--json"])
            .env("SHAREFLOW_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(err)).expect("stderr file"))
            .spawn()
            .expect("start shareflow demo")
    };
    let mut first = Run(demo("60000", "first.err"), dir.path().join("first.err"));
    // The first has committed some checkpoints (its summary counts them) before the
    // second starts: wait until its checkpoint root has a manifest.
    let root = dir.path().join("checkpoints").join(&group);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !std::fs::read_dir(&root).is_ok_and(|d| d.flatten().any(|e| e.path().join("_metadata").exists())) {
        assert!(first.exited().is_none(), "the first demo exited: {}", first.stderr());
        assert!(tokio::time::Instant::now() < deadline, "the first demo completed no checkpoint in 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = Run(demo("0", "second.err"), dir.path().join("second.err"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = first.exited() {
            break status;
        }
        assert!(tokio::time::Instant::now() < deadline, "the first demo still runs 90 s after the second started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let err = first.stderr();
    assert_eq!(status.code(), Some(3), "{err}");
    assert!(err.contains("stopped, fenced"), "{err}");
    assert!(!err.contains("failed 4 times"), "{err}");
    second.sigkill();
}

/// The ledger topic of an adopted instance, deleted by `instances gc` once the adoption
/// ended, is not needed again: its adopter, restarted, takes the adopted prefix over
/// again from the commit notes, and the output stays exactly once. (It failed every
/// attempt with "unknown topic" before, found by the fleet soak.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopters_restart_needs_no_collected_ledger_of_the_instance_it_adopted() {
    let Some(Fresh { c, bootstrap, group, input, output, dir, checkpoints }) = fresh("adopted-gc").await else {
        return;
    };
    let gone_ledger = format!("{group}-gone-ledger");
    let committed = |c: &shareflow::connector::kafka::KafkaCluster| committed_once(c.clone(), output.clone());
    // Fast, but far above a start's gap between beats on a loaded machine (see
    // ADOPTION_TIMEOUT_MS): the two start together, and each watches the other.
    let fast = ["--adoption-timeout", "10000"];
    let start =
        |name: &str, err: &str| Run::start_with(name, &bootstrap, &group, &checkpoints, dir.path().join(err), &fast);
    c.produce(&input, (0..1_000).map(|i| (None, Bytes::from(value_of(i, 32))))).await.expect("produce");
    let gone = start("gone", "gone.err");
    let mut adopter = start("adopter", "adopter.err");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !c.topics().await.expect("topics").contains(&gone_ledger) || committed(&c).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "gone made no ledger or nothing committed in 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gone.sigkill();
    // The adopter adopts it; then gc deletes its ledger.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_shareflow"))
            .args(["instances", "gc", "--checkpoints", &checkpoints, "--kafka", &bootstrap, "--group", &group])
            .arg("--apply")
            .output()
            .expect("run instances gc");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains(&format!("deleted {gone_ledger}: instance gone was adopted by adopter")) {
            break;
        }
        assert!(adopter.exited().is_none(), "the adopter exited: {}", adopter.stderr());
        assert!(tokio::time::Instant::now() < deadline, "gone not adopted and collected in 90 s: {text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The adopter is killed and starts again: it takes "gone" over again.
    adopter.sigkill();
    let mut again = start("adopter", "again.err");
    c.produce(&input, (1_000..2_000).map(|i| (None, Bytes::from(value_of(i, 32))))).await.expect("produce");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while committed(&c).await < 2_000 {
        assert!(again.exited().is_none(), "the restarted adopter exited: {}", again.stderr());
        assert!(tokio::time::Instant::now() < deadline, "2,000 not committed in 90 s: {}", again.stderr());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(!again.stderr().contains("unknown topic"), "{}", again.stderr());
    let (status, err) = again.sigterm_and_wait().await;
    assert!(status.success(), "{status}: {err}");
}

/// `shareflow instances gc` on Kafka: the ledger topic of an instance that retired goes
/// (listed by default, deleted with --apply), a live instance's stays; the retired
/// instance starts again afterwards under its name and the output stays exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_gc_deletes_the_ledgers_of_retired_instances_only() {
    let Some(Fresh { c, bootstrap, group, input, output, dir, checkpoints }) = fresh("ledger-gc").await else { return };
    let (gone_ledger, live_ledger) = (format!("{group}-gone-ledger"), format!("{group}-live-ledger"));
    let committed = |c: &shareflow::connector::kafka::KafkaCluster| committed_once(c.clone(), output.clone());
    // Generous: a debug build's first commit on a loaded machine can take a minute.
    let wait_for = || tokio::time::Instant::now() + Duration::from_secs(120);
    c.produce(&input, (0..500).map(|i| (None, Bytes::from(value_of(i, 32))))).await.expect("produce");
    // "gone" commits the input, then retires on SIGTERM.
    let mut gone = Run::start_as("gone", &bootstrap, &group, &checkpoints, dir.path().join("gone.err"));
    let deadline = wait_for();
    while committed(&c).await < 500 {
        assert!(gone.exited().is_none(), "gone exited: {}", gone.stderr());
        assert!(tokio::time::Instant::now() < deadline, "gone did not commit the input in 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, err) = gone.sigterm_and_wait().await;
    assert!(status.success(), "{status}: {err}");
    // "live" runs.
    let live = Run::start_as("live", &bootstrap, &group, &checkpoints, dir.path().join("live.err"));
    let deadline = wait_for();
    while !c.topics().await.expect("topics").contains(&live_ledger) {
        assert!(tokio::time::Instant::now() < deadline, "live made no ledger in 120 s: {}", live.stderr());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gc = |apply: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shareflow"));
        cmd.args(["instances", "gc", "--checkpoints", &checkpoints, "--kafka", &bootstrap, "--group", &group]);
        if apply {
            cmd.arg("--apply");
        }
        let out = cmd.output().expect("run instances gc");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let dry = gc(false);
    assert!(dry.contains(&format!("would delete {gone_ledger}: instance gone retired")), "{dry}");
    assert!(dry.contains(&format!("kept {live_ledger}: instance live is live")), "{dry}");
    assert!(c.topics().await.expect("topics").contains(&gone_ledger), "a dry run deletes nothing");
    let applied = gc(true);
    assert!(applied.contains(&format!("deleted {gone_ledger}: instance gone retired")), "{applied}");
    assert!(applied.contains(&format!("kept {live_ledger}")), "{applied}");
    let deadline = wait_for();
    loop {
        let topics = c.topics().await.expect("topics");
        assert!(topics.contains(&live_ledger), "the live ledger was deleted");
        if !topics.contains(&gone_ledger) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{gone_ledger} still listed 60 s after its deletion");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // "gone" starts again, beside "live": more input, every record once.
    let mut again = Run::start_with(
        "gone",
        &bootstrap,
        &group,
        &checkpoints,
        dir.path().join("again.err"),
        &["--delete-ledger-on-retire"],
    );
    c.produce(&input, (500..1_000).map(|i| (None, Bytes::from(value_of(i, 32))))).await.expect("produce");
    let deadline = wait_for();
    while committed(&c).await < 1_000 {
        assert!(again.exited().is_none(), "gone's second start exited: {}", again.stderr());
        assert!(tokio::time::Instant::now() < deadline, "1,000 not committed in 120 s");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(committed(&c).await, 1_000);
    // Retired with --delete-ledger-on-retire: its ledger topic goes at once.
    let (status, err) = again.sigterm_and_wait().await;
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains(&format!("deleted the ledger topic {gone_ledger}")), "{err}");
    let deadline = wait_for();
    while c.topics().await.expect("topics").contains(&gone_ledger) {
        assert!(tokio::time::Instant::now() < deadline, "{gone_ledger} still listed 60 s after the retirement");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(c.topics().await.expect("topics").contains(&live_ledger), "the live ledger stays");
    live.sigkill();
}

/// Two processes started with the same `--instance`, in 20 rounds: the later one fences
/// the earlier, either one is SIGKILLed at a random moment and a replacement started.
/// Never both live: after every round the output holds every record produced so far,
/// exactly once. The checkpoint root (and registry) is on the S3 server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_instance_started_twice_fences_the_earlier_in_every_round() {
    let Some(c) = cluster().await else { return };
    let bootstrap = support::kafka::bootstrap().expect("set");
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    eprintln!("seed {seed}");
    let mut s = seed | 1;
    let mut next = move |below: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % below.max(1)
    };
    let group = unique("same-prefix");
    let (input, output) = (format!("{group}-input"), format!("{group}-output"));
    c.ensure_topic(&input, 2, &[]).await.expect("input topic");
    c.ensure_topic(&output, 2, &[]).await.expect("output topic");
    let dir = tempfile::tempdir().expect("stderr dir");
    // The checkpoint root on the S3 server: the registry's create-only claims and
    // fencing under S3's semantics (without a server, outside CI, on the file system).
    let checkpoints = match support::s3::s3_store() {
        Some((_, url)) => format!("{url}/{group}"),
        None => format!("file://{}/checkpoints", dir.path().display()),
    };
    let mut started = 0;
    let mut start = || {
        started += 1;
        Run::start(&bootstrap, &group, &checkpoints, dir.path().join(format!("run-{started}.err")))
    };
    const ROUNDS: u64 = 20;
    const BATCH: u64 = 500;
    let mut live = start();
    for round in 0..ROUNDS {
        let first = round * BATCH;
        c.produce(&input, (first..first + BATCH).map(|i| (None, Bytes::from(value_of(i, 32))))).await.expect("produce");
        // A second process under the same name, while the first runs.
        let mut second = start();
        tokio::time::sleep(Duration::from_millis(next(2_500))).await;
        // Kill either one.
        if next(2) == 0 {
            eprintln!("round {round}: SIGKILL the earlier process");
            live.sigkill();
        } else {
            eprintln!("round {round}: SIGKILL the later process");
            second.sigkill();
            second = live;
        }
        live = second;
        // Every record so far is committed once; a process that exits was fenced, and
        // is replaced.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = live.exited() {
                let err = live.stderr();
                assert_eq!(status.code(), Some(3), "seed {seed} round {round}: a run exits only when fenced: {err}");
                assert!(err.contains("stopped, fenced"), "seed {seed} round {round}: {err}");
                live = start();
            }
            let values = c.read_committed(&output).await.expect("read");
            let mut count: HashMap<u64, u32> = HashMap::new();
            for (_, _, _, v) in &values {
                let id = v.as_deref().and_then(identity).expect("a demo value");
                *count.entry(id).or_default() += 1;
            }
            let duplicates: u32 = count.values().map(|n| n - 1).sum();
            assert_eq!(duplicates, 0, "seed {seed} round {round}: duplicated output");
            if count.len() as u64 == first + BATCH {
                break;
            }
            assert!(count.len() as u64 <= first + BATCH, "seed {seed} round {round}: foreign output");
            assert!(
                tokio::time::Instant::now() < deadline,
                "seed {seed} round {round}: {} of {} committed",
                count.len(),
                first + BATCH
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    live.sigkill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_bad_settings_by_name() {
    let Some(bootstrap) = support::kafka::bootstrap() else { return };
    let group = unique("run-bad");
    let checkpoints = format!("memory://{group}");
    let base = ["run", "--kafka", bootstrap.as_str(), "--group", group.as_str(), "--instance", "i1"];
    // An adoption timeout that a checkpoint can outlast adopts live instances.
    let mut args = base.to_vec();
    args.extend(["--checkpoints", &checkpoints, "--interval", "1000", "--adoption-timeout", "2000"]);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    let run = tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        support::demo::shareflow(&a, Duration::from_secs(120))
    })
    .await
    .expect("thread");
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("adoption.timeout.ms=2000"), "{}", run.stderr);
    // The checkpoint root is required: every instance must share it.
    let run = tokio::task::spawn_blocking(move || {
        support::demo::shareflow(
            &["run", "--kafka", "127.0.0.1:1", "--group", "g", "--instance", "i"],
            Duration::from_secs(30),
        )
    })
    .await
    .expect("thread");
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--checkpoints is required"), "{}", run.stderr);
}

/// `demo --kafka --instances` checks its whole schedule before it touches the broker
/// (none listens on port 1): each bad setting is named.
#[test]
fn demo_instances_refuses_bad_settings_before_it_starts() {
    let table: [(&[&str], &str); 6] = [
        (&["--instances", "2", "--logs", "/dev/null/logs"], "--logs /dev/null/logs: cannot make the directory"),
        (&["--instances", "1", "--kills", "2"], "--kills 2 needs --instances >= 2"),
        (&["--instances", "0"], "invalid value '0' for '--instances <N>'"),
        (&["--instances", "2", "--adoption-timeout", "1000"], "--adoption-timeout 1000 ms must be longer"),
        (&["--instances", "2", "--value-bytes", "8"], "invalid value '8' for '--value-bytes <B>'"),
        (&["--instances", "2", "--crashes", "1"], "use --kills and --seed"),
    ];
    for (extra, message) in table {
        let mut args = vec!["demo", "--kafka", "127.0.0.1:1"];
        args.extend_from_slice(extra);
        let run = support::demo::shareflow(&args, Duration::from_secs(30));
        assert_eq!(run.code, 2, "{extra:?}: {run:?}");
        assert!(run.stderr.contains(message), "{extra:?}: {}", run.stderr);
    }
}
