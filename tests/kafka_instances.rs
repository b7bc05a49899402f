//! N shareflow processes in one share group on a real Kafka 4.x broker, checkpoints on
//! the S3 server (decision 0008): SIGKILLed at random seeded moments and restarted, one
//! killed for good and adopted, one joining late, one paused with SIGSTOP past the
//! adoption timeout and resumed. Kafka's Java console consumer reads the output
//! read_committed: it must equal the input exactly once. Replay a failure with
//! `SHAREFLOW_KAFKA_INSTANCES_SEED=<seed>`.

mod support;

use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::demo::{identity, value_of};
use support::kafka::{cluster, read_committed_with_java, unique};

const RECORDS: u64 = 100_000;
/// Restartable kills; the permanent one comes on top.
const KILLS: usize = 6;
const ADOPTION_TIMEOUT_MS: u64 = 5_000;
/// Per instance: slow enough that the schedule lands while work remains.
const MAX_RATE: u64 = 1_000;

/// One running `shareflow run` process and what its stderr said.
struct Instance {
    name: String,
    child: Child,
    /// The last progress count, and the last lines of stderr.
    seen: Arc<Mutex<(u64, Vec<String>)>>,
}

impl Instance {
    fn start(bootstrap: &str, group: &str, name: &str, checkpoints: &str) -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let mut child = Command::new(env!("CARGO_BIN_EXE_shareflow"))
            .args(["run", "--kafka", bootstrap, "--group", group, "--instance", name, "--checkpoints", checkpoints])
            .args([
                "--interval",
                "500",
                "--checkpoint-timeout",
                "3000",
                "--adoption-timeout",
                &ADOPTION_TIMEOUT_MS.to_string(),
            ])
            .args(["--parallelism", "2", "--partitions", "4", "--max-rate", &MAX_RATE.to_string(), "--json"])
            .env("AWS_ACCESS_KEY_ID", var("SHAREFLOW_S3_ACCESS_KEY"))
            .env("AWS_SECRET_ACCESS_KEY", var("SHAREFLOW_S3_SECRET_KEY"))
            .env("AWS_ENDPOINT_URL", var("SHAREFLOW_S3_ENDPOINT"))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("SHAREFLOW_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start shareflow run");
        let seen = Arc::new(Mutex::new((0, Vec::new())));
        let stderr = child.stderr.take().expect("piped");
        let s = seen.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut g = s.lock().expect("stderr lock");
                if let Some(n) = line.strip_prefix("progress: ").and_then(|l| l.split(' ').next()?.parse().ok()) {
                    g.0 = n;
                } else {
                    g.1.push(line);
                    if g.1.len() > 40 {
                        g.1.remove(0);
                    }
                }
            }
        });
        Self { name: name.into(), child, seen }
    }

    fn emitted(&self) -> u64 {
        self.seen.lock().expect("stderr lock").0
    }

    fn tail(&self) -> String {
        self.seen.lock().expect("stderr lock").1.join("\n")
    }

    /// Waits until the process has emitted records (it is processing), at most 120 s.
    fn wait_processing(&mut self, seed: u64) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.emitted() == 0 {
            if let Some(status) = self.child.try_wait().expect("status") {
                panic!("seed {seed}: {} ended on its own ({status}):\n{}", self.name, self.tail());
            }
            assert!(Instant::now() < deadline, "seed {seed}: {} never started processing:\n{}", self.name, self.tail());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().expect("kill").success();
        assert!(ok, "kill {sig} {}", self.name);
    }

    fn sigkill(mut self) {
        self.child.kill().expect("SIGKILL"); // Child::kill is SIGKILL on Unix.
        let _ = self.child.wait();
    }

    /// Waits at most `timeout` for the process to exit; its status and stdout.
    fn wait_exit(mut self, timeout: Duration, seed: u64) -> (std::process::ExitStatus, String, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("status") {
                let mut out = String::new();
                if let Some(mut o) = self.child.stdout.take() {
                    let _ = std::io::Read::read_to_string(&mut o, &mut out);
                }
                std::thread::sleep(Duration::from_millis(200));
                return (status, out, self.tail());
            }
            if Instant::now() > deadline {
                let tail = self.tail();
                self.child.kill().ok();
                panic!("seed {seed}: {} did not exit within {timeout:?}:\n{tail}", self.name);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_killed_paused_and_joining_keep_the_output_exactly_once() {
    let Some(c) = cluster().await else { return };
    let Some(_) = support::s3::s3_store() else { return };
    let bootstrap = support::kafka::bootstrap().expect("set");
    let seed = std::env::var("SHAREFLOW_KAFKA_INSTANCES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("schedule seed {seed} (replay: SHAREFLOW_KAFKA_INSTANCES_SEED={seed})");
    let mut s = seed | 1;
    let mut next = move |below: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % below.max(1)
    };
    let group = unique("instances");
    let (input, output) = (format!("{group}-input"), format!("{group}-output"));
    c.ensure_topic(&input, 4, &[]).await.expect("input topic");
    c.ensure_topic(&output, 4, &[]).await.expect("output topic");
    c.produce(&input, (0..RECORDS).map(|i| (None, Bytes::from(value_of(i, 100))))).await.expect("produce");
    let bucket = std::env::var("SHAREFLOW_S3_BUCKET").unwrap_or_else(|_| "shareflow".into());
    let checkpoints = format!("s3://{bucket}/{group}");
    let start = |name: &str| Instance::start(&bootstrap, &group, name, &checkpoints);

    let started = Instant::now();
    let mut live: Vec<Instance> = ["i1", "i2", "i3"].into_iter().map(start).collect();
    for i in &mut live {
        i.wait_processing(seed);
    }
    // i1 dies for good: a live instance must adopt it.
    std::thread::sleep(Duration::from_millis(500 + next(2_000)));
    let i1 = live.remove(0);
    eprintln!("{:>5.1} s: SIGKILL i1 for good (emitted {})", started.elapsed().as_secs_f64(), i1.emitted());
    i1.sigkill();
    for kill in 0..KILLS {
        if kill == 2 {
            eprintln!("{:>5.1} s: i4 joins", started.elapsed().as_secs_f64());
            let mut i4 = start("i4");
            i4.wait_processing(seed);
            live.push(i4);
        }
        std::thread::sleep(Duration::from_millis(300 + next(2_000)));
        let victim = live.remove(next(live.len() as u64) as usize);
        let name = victim.name.clone();
        eprintln!("{:>5.1} s: SIGKILL {name} (emitted {})", started.elapsed().as_secs_f64(), victim.emitted());
        victim.sigkill();
        std::thread::sleep(Duration::from_millis(next(1_500)));
        let mut again = start(&name);
        again.wait_processing(seed);
        live.push(again);
    }
    // One is paused past the adoption timeout: another adopts and fences it, and once
    // resumed it stops with an error instead of committing anything.
    let paused = live.remove(next(live.len() as u64) as usize);
    eprintln!("{:>5.1} s: SIGSTOP {}", started.elapsed().as_secs_f64(), paused.name);
    paused.signal("-STOP");
    std::thread::sleep(Duration::from_millis(2 * ADOPTION_TIMEOUT_MS + 2_000));
    paused.signal("-CONT");
    eprintln!("{:>5.1} s: SIGCONT {}", started.elapsed().as_secs_f64(), paused.name);
    let paused_name = paused.name.clone();
    let (status, _, tail) = paused.wait_exit(Duration::from_secs(120), seed);
    assert!(!status.success(), "seed {seed}: the adopted {paused_name} must not go on: {status}\n{tail}");
    assert!(
        tail.contains("adopt") || tail.contains("fenced"),
        "seed {seed}: {paused_name} exited ({status}) but not fenced:\n{tail}"
    );

    // The survivors finish the input, including everything adopted.
    let deadline = Instant::now() + Duration::from_secs(420);
    loop {
        let values = c.read_committed(&output).await.expect("read");
        let distinct: std::collections::HashSet<u64> =
            values.iter().filter_map(|(_, _, _, v)| v.as_deref().and_then(identity)).collect();
        if distinct.len() as u64 >= RECORDS {
            break;
        }
        let emitted: Vec<(String, u64)> = live.iter().map(|i| (i.name.clone(), i.emitted())).collect();
        assert!(
            Instant::now() < deadline,
            "seed {seed}: only {} of {RECORDS} distinct records committed; live {emitted:?}\n{}",
            distinct.len(),
            live.iter().map(|i| format!("--- {}\n{}", i.name, i.tail())).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    eprintln!("{:>5.1} s: every record committed; SIGTERM the survivors", started.elapsed().as_secs_f64());
    for i in &live {
        i.signal("-TERM");
    }
    for i in live {
        let name = i.name.clone();
        let (status, out, tail) = i.wait_exit(Duration::from_secs(120), seed);
        assert!(status.success(), "seed {seed}: {name} did not stop cleanly ({status}):\n{tail}");
        let last = out.lines().last().unwrap_or_default().to_string();
        assert!(last.contains("\"stopped\":true"), "seed {seed}: {name}: {last}");
        eprintln!("{name}: {last}");
    }

    let values = read_committed_with_java(&bootstrap, &output)
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
    // Nothing is left open or prepared.
    let ids = c.transactional_ids(&format!("{group}-")).await.expect("list transactions");
    eprintln!("transactional ids left: {}", ids.len());
    let open: Vec<_> = ids.iter().filter(|(_, st)| st == "Ongoing" || st.starts_with("Prepare")).collect();
    assert!(open.is_empty(), "seed {seed}: transactions left open: {open:?}");
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
