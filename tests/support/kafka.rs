//! Where the Kafka broker started by `scripts/kafka` is, if it is.
#![allow(unreachable_pub, dead_code)]

use std::time::Duration;

use bytes::Bytes;
use shareflow::connector::kafka::KafkaCluster;

/// The broker's bootstrap address, or `None` with the reason printed. Under CI (or
/// `SHAREFLOW_REQUIRE_SERVERS=1`, which `./scripts/test` sets) a missing broker is a
/// failure, never a skip.
pub fn bootstrap() -> Option<String> {
    match std::env::var("SHAREFLOW_KAFKA_BOOTSTRAP") {
        Ok(b) => Some(b),
        Err(_) => {
            let why = "SHAREFLOW_KAFKA_BOOTSTRAP is not set: start Kafka with ./scripts/kafka start and \
                       eval \"$(./scripts/kafka env)\" (./scripts/test does both)";
            assert!(
                std::env::var("CI").is_err() && std::env::var("SHAREFLOW_REQUIRE_SERVERS").is_err(),
                "this run must test against the real Kafka broker: {why}"
            );
            eprintln!("skipping the real-Kafka test: {why}");
            None
        }
    }
}

/// Connects, or panics naming the address: the variable is set, so the broker must be up.
pub async fn cluster() -> Option<KafkaCluster> {
    let b = bootstrap()?;
    Some(KafkaCluster::connect(&b).await.unwrap_or_else(|e| panic!("cannot reach Kafka at {b}: {e}")))
}

/// A name unique to this process and call, for topics and groups.
pub fn unique(base: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{base}-{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// `n` records with values `v-0`..`v-{n-1}` and keys `k-i`.
pub fn numbered(n: u64) -> Vec<(Option<Bytes>, Bytes)> {
    (0..n).map(|i| (Some(Bytes::from(format!("k-{i}"))), Bytes::from(format!("v-{i}")))).collect()
}

/// Polls until `deadline` passes or `done` says stop.
pub async fn until<F: FnMut() -> bool>(deadline: Duration, mut done: F) {
    let end = tokio::time::Instant::now() + deadline;
    while !done() && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The transactional ids starting with `prefix` the broker knows, with their states.
pub async fn transactional_ids(c: &KafkaCluster, prefix: &str) -> Vec<(String, String)> {
    c.transactional_ids(prefix).await.expect("list transactions")
}

/// Every committed value of `topic`, read by Kafka's Java console consumer (the jars of
/// `./scripts/kafka`); `None` when `SHAREFLOW_KAFKA_LIB` is not set.
pub fn read_committed_with_java(bootstrap: &str, topic: &str) -> Option<Vec<String>> {
    let lib = std::env::var("SHAREFLOW_KAFKA_LIB").ok()?;
    let out = std::process::Command::new("java")
        .args(["-cp", &format!("{lib}/*"), "org.apache.kafka.tools.consumer.ConsoleConsumer"])
        .args(["--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning"])
        .args(["--isolation-level", "read_committed", "--timeout-ms", "20000"])
        .stderr(std::process::Stdio::null())
        .output()
        .expect("run the Java console consumer");
    Some(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}
