//! The exactly-once pipeline on a real Kafka broker (topic -> share source -> SQL ->
//! transactional Kafka sink), its process killed with SIGKILL at random moments and
//! restarted, checkpoints on the S3 server, checked by Kafka's own Java console consumer
//! reading read_committed.

mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::demo::{identity, input_topic, output_topic, value_of};
use support::kafka::{cluster, read_committed_with_java, unique};

const RECORDS: u64 = 100_000;
const KILLS: usize = 5;

/// A run of the job; `rate` throttles it so the kills land while work remains.
fn job(bootstrap: &str, name: &str, checkpoints: &str, rate: Option<u64>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shareflow"));
    cmd.args(["demo", "--kafka", bootstrap, "--name", name, "--records", "0", "--interval", "500"]).args([
        "--partitions",
        "4",
        "--parallelism",
        "2",
        "--checkpoints",
        checkpoints,
    ]);
    if let Some(r) = rate {
        cmd.args(["--max-rate", &r.to_string()]);
    }
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    cmd.env("AWS_ACCESS_KEY_ID", var("SHAREFLOW_S3_ACCESS_KEY"))
        .env("AWS_SECRET_ACCESS_KEY", var("SHAREFLOW_S3_SECRET_KEY"))
        .env("AWS_ENDPOINT_URL", var("SHAREFLOW_S3_ENDPOINT"))
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_REGION", "us-east-1")
        .env("SHAREFLOW_LOG", "warn");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_five_times_and_the_output_equals_the_input_exactly_once() {
    let Some(c) = cluster().await else { return };
    let Some(_) = support::s3::s3_store() else { return };
    let bootstrap = support::kafka::bootstrap().expect("set");
    let name = unique("sigkill");
    let (input, output) = (input_topic(&name), output_topic(&name));
    c.ensure_topic(&input, 4, &[]).await.expect("input topic");
    c.ensure_topic(&output, 4, &[]).await.expect("output topic");
    c.produce(&input, (0..RECORDS).map(|i| (None, Bytes::from(value_of(i, 100))))).await.expect("produce");
    let bucket = std::env::var("SHAREFLOW_S3_BUCKET").unwrap_or_else(|_| "shareflow".into());
    let checkpoints = format!("s3://{bucket}/{name}");

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    eprintln!("kill schedule seed {seed}");
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for kill in 0..KILLS {
        let mut child = job(&bootstrap, &name, &checkpoints, Some(5_000))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start");
        // Wait until the run is processing (its progress line counts emitted records),
        // then kill it at a random moment up to 4 s later.
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("progress: ").and_then(|l| l.split(' ').next()?.parse().ok()) {
                    let _ = tx.send(n);
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut emitted = 0;
        while emitted == 0 {
            assert!(Instant::now() < deadline, "run {} never started processing", kill + 1);
            if let Ok(n) = rx.recv_timeout(Duration::from_millis(100)) {
                emitted = n;
            }
            if let Some(status) = child.try_wait().expect("job status") {
                panic!("run {} ended on its own ({status}) before it was killed", kill + 1);
            }
        }
        let after = Duration::from_millis(next() % 4_000);
        std::thread::sleep(after);
        if let Some(status) = child.try_wait().expect("job status") {
            panic!("run {} ended on its own ({status}) before it was killed", kill + 1);
        }
        child.kill().expect("SIGKILL"); // Child::kill is SIGKILL on Unix.
        let status = child.wait().expect("reap");
        eprintln!("kill {}: SIGKILL {after:?} after it had emitted {emitted} records ({status})", kill + 1);
    }
    let started = Instant::now();
    let out = job(&bootstrap, &name, &checkpoints, None).arg("--json").output().expect("final run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the final run failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("final run took {:.1} s: {}", started.elapsed().as_secs_f64(), stdout.trim());

    let values = match read_committed_with_java(&bootstrap, &output) {
        Some(v) => v,
        None => {
            eprintln!("SHAREFLOW_KAFKA_LIB is not set; verifying with shareflow's own reader instead");
            c.wait_stable(&output, Duration::from_secs(30)).await.expect("ends");
            c.read_committed(&output)
                .await
                .expect("read")
                .into_iter()
                .filter_map(|(_, _, _, v)| v.map(|v| String::from_utf8_lossy(&v).to_string()))
                .collect()
        }
    };
    let mut count: HashMap<u64, u32> = HashMap::new();
    for v in &values {
        let id = identity(v.as_bytes()).unwrap_or_else(|| panic!("foreign output value {v:?}"));
        *count.entry(id).or_default() += 1;
    }
    let duplicates: u32 = count.values().map(|n| n - 1).sum();
    let lost = (0..RECORDS).filter(|id| !count.contains_key(id)).count();
    assert_eq!((values.len() as u64, duplicates, lost), (RECORDS, 0, 0), "output must equal input exactly once");
}
