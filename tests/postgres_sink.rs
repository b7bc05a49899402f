//! The PostgreSQL sink on a real server (`scripts/postgres`): exactly once by two-phase
//! commit through seeded crashes at every fault point (among them between `PREPARE
//! TRANSACTION` and the manifest, and between `COMMIT PREPARED` and notify), an upsert,
//! rows the table refuses, and the errors a job gets before its first attempt.
//!
//! `SHAREFLOW_SEED=n` runs one seed of the campaign; `SHAREFLOW_PG_SEEDS=k` runs k
//! (default 12).

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;
#[path = "support/postgres.rs"]
mod pg;
#[path = "support/rng.rs"]
mod rng;

use std::sync::Arc;
use std::time::Duration;

use eos::storage_on;
use object_store::memory::InMemory;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::embedded::{BrokerDeadLetters, BrokerTransactions};
use shareflow::connector::postgres::{PostgresCommitter, PostgresSettings, PostgresSink, WriteMode};
use shareflow::connector::share::ProducerRecord;
use shareflow::connector::DeadLetterSettings;
use shareflow::runtime::{JobBuilder, JobConfig, RestartStrategy, RuntimeError};

const INPUT: &str = "pg-in";

/// An in-memory broker with `values` in `partitions` partitions of the input, in turn.
async fn broker(values: &[String], partitions: u32) -> EmbeddedBroker {
    let broker = EmbeddedBroker::open(BrokerOptions::in_memory().default_config(eos::share_config())).await.unwrap();
    broker.create_topic(INPUT, partitions).await.unwrap();
    broker.create_topic("pg-dlq", 1).await.unwrap();
    let records = values
        .iter()
        .enumerate()
        .map(|(i, v)| ProducerRecord {
            partition: Some((i as u32 % partitions) as i32),
            ..ProducerRecord::new(INPUT, 0, v.clone().into_bytes()).with_key(format!("k{}", i % 5).into_bytes())
        })
        .collect();
    broker.produce(records).await.unwrap();
    broker
}

/// The job: share source -> `query` -> the PostgreSQL sink, exactly once; and its
/// broker participant, for dead letters.
fn job_with(
    broker: &EmbeddedBroker,
    group: &str,
    query: &str,
    settings: &PostgresSettings,
    parallelism: u32,
) -> (JobBuilder, Arc<BrokerTransactions>) {
    let (job, stream, txns) = eos::drained_source(broker, group, INPUT, eos::share_config(), parallelism);
    stream
        .sql("to-row", query)
        .parallelism(parallelism)
        .sink("postgres-sink", PostgresSink::factory(settings.clone()))
        .parallelism(parallelism)
        .participant(PostgresCommitter::new(settings.clone()));
    (job, txns)
}

fn job(broker: &EmbeddedBroker, group: &str, query: &str, settings: &PostgresSettings, parallelism: u32) -> JobBuilder {
    job_with(broker, group, query, settings, parallelism).0
}

fn config(group: &str, interval_ms: u64, restarts: u32) -> JobConfig {
    let mut c = JobConfig::new(storage_on(Arc::new(InMemory::new()), "c"), group, "job")
        .checkpoint_interval(Duration::from_millis(interval_ms))
        .checkpoint_timeout(Duration::from_secs(15))
        .restart(RestartStrategy::FixedDelay { attempts: restarts, delay: Duration::from_millis(10) });
    c.tolerable_checkpoint_failures = 3;
    c
}

const ID_QUERY: &str =
    "SELECT CAST(CAST(value AS VARCHAR) AS BIGINT) AS id, concat('row-', CAST(value AS VARCHAR)) AS body FROM input";

async fn run_seed(url: &str, seed: u64) -> Result<usize, String> {
    let mut rng = rng::Rng::new(seed);
    let n = 200 + rng.below(300);
    let partitions = 1 + rng.below(3) as u32;
    let parallelism = 1 + rng.below(3) as u32;
    let client = pg::client(url).await;
    let table = pg::unique(&format!("campaign_{seed}"));
    client.batch_execute(&format!("CREATE TABLE {table} (id bigint NOT NULL, body text)")).await.unwrap();
    let values: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let broker = broker(&values, partitions).await;
    let group = format!("pg{seed}x{}", std::process::id());
    let settings = PostgresSettings { url: url.to_string(), table: table.clone(), mode: WriteMode::Insert };
    let job =
        job(&broker, &group, ID_QUERY, &settings, parallelism).build(config(&group, 5 + rng.below(30), 12)).unwrap();
    let points = eos::demo::fault_points();
    let mut crashes = Vec::new();
    for _ in 0..1 + rng.below(3) {
        crashes.push((points[rng.below(points.len() as u64) as usize].to_string(), rng.below(3) as u32));
    }
    let schedule = format!("seed {seed}: {n} records, {partitions} partitions, parallelism {parallelism}, {crashes:?}");
    job.failpoints().schedule(crashes);
    let result = job.run().await;
    let fired = job.failpoints().fired();
    result.map_err(|e| format!("{schedule}: the job failed: {e} (fired {fired:?})"))?;
    let rows = client
        .query(&format!("SELECT id, count(*) FROM {table} GROUP BY id HAVING count(*) > 1 LIMIT 5"), &[])
        .await
        .unwrap();
    if !rows.is_empty() {
        let twice: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        return Err(format!("{schedule}: fired {fired:?}: ids written twice: {twice:?}"));
    }
    let count: i64 = client.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap().get(0);
    if count as u64 != n {
        return Err(format!("{schedule}: fired {fired:?}: {count} rows of {n}"));
    }
    let left = pg::prepared(&client, &format!("{group}-")).await;
    if !left.is_empty() {
        return Err(format!("{schedule}: prepared transactions left after the job stopped: {left:?}"));
    }
    client.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
    Ok(fired.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_lands_once_through_crashes_at_every_fault_point() {
    let Some(url) = pg::url() else { return };
    let seeds = eos::campaign_seeds("SHAREFLOW_PG_SEEDS", 12);
    let (mut fired, mut failures) = (0, Vec::new());
    for &seed in &seeds {
        match run_seed(&url, seed).await {
            Ok(n) => fired += n,
            Err(why) => {
                eprintln!("{why}\n  replay: SHAREFLOW_SEED={seed} cargo test --test postgres_sink");
                failures.push(seed);
            }
        }
    }
    eos::campaign_verdict("postgres campaign", seeds.len(), &failures, fired);
}

/// An upsert keeps each key's last value, though the job crashes after writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upsert_keeps_each_keys_last_value() {
    let Some(url) = pg::url() else { return };
    let client = pg::client(&url).await;
    let table = pg::unique("upsert");
    client
        .batch_execute(&format!("CREATE TABLE {table} (k text PRIMARY KEY, v bigint, n int DEFAULT 7)"))
        .await
        .unwrap();
    let values: Vec<String> = (0..300).map(|i| i.to_string()).collect();
    let broker = broker(&values, 1).await;
    let group = format!("pgup{}", std::process::id());
    let settings =
        PostgresSettings { url: url.clone(), table: table.clone(), mode: WriteMode::Upsert { key: vec!["k".into()] } };
    let query = "SELECT CAST(key AS VARCHAR) AS k, CAST(CAST(value AS VARCHAR) AS BIGINT) AS v FROM input";
    let job = job(&broker, &group, query, &settings, 1).build(config(&group, 20, 5)).unwrap();
    job.failpoints().schedule(vec![(shareflow::connector::points::SINK_AFTER_WRITE.to_string(), 3)]);
    job.run().await.unwrap();
    assert!(!job.failpoints().fired().is_empty(), "the crash fired");
    let rows = client.query(&format!("SELECT k, v, n FROM {table} ORDER BY k"), &[]).await.unwrap();
    let got: Vec<(String, i64, i32)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    // Key k{i % 5}: the last i of each residue below 300, and the column the query does
    // not give keeps its default.
    let want: Vec<(String, i64, i32)> = (0..5).map(|r| (format!("k{r}"), 295 + r as i64, 7)).collect();
    assert_eq!(got, want);
}

/// Rows the table refuses (a CHECK constraint, a value its column cannot parse) become
/// dead letters of cause `sink` with dead letters, and the rest land once; without, the
/// job fails naming the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_table_refuses_are_dead_letters_or_fail_the_job_naming_the_row() {
    use shareflow::connector::dead_letters::{header, HEADER_CAUSE};
    use shareflow::connector::share::{IsolationLevel, TopicPartition};
    let Some(url) = pg::url() else { return };
    let client = pg::client(&url).await;
    for dead_letters in [true, false] {
        let table = pg::unique("refused");
        client.batch_execute(&format!("CREATE TABLE {table} (id bigint CHECK (id >= 0), body text)")).await.unwrap();
        // -5 breaks the CHECK; "x7" is no bigint (the SQL passes it on as text).
        let values: Vec<String> = (0..100)
            .map(|i| {
                if i == 13 {
                    "-5".into()
                } else if i == 57 {
                    "x7".into()
                } else {
                    i.to_string()
                }
            })
            .collect();
        let broker = broker(&values, 2).await;
        let group = format!("pgbad{}{dead_letters}", std::process::id());
        let settings = PostgresSettings { url: url.clone(), table: table.clone(), mode: WriteMode::Insert };
        let query = "SELECT CAST(value AS VARCHAR) AS id, 'b' AS body FROM input";
        let (builder, txns) = job_with(&broker, &group, query, &settings, 2);
        if dead_letters {
            builder.dead_letters(BrokerDeadLetters::new(broker.clone(), Some(txns), DeadLetterSettings::new("pg-dlq")));
        }
        let job = builder.build(config(&group, 20, if dead_letters { 5 } else { 0 })).unwrap();
        let result = job.run().await;
        let ids: Vec<i64> = client
            .query(&format!("SELECT id FROM {table} ORDER BY id"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if dead_letters {
            result.unwrap();
            let want: Vec<i64> = (0..100).filter(|i| *i != 13 && *i != 57).collect();
            assert_eq!(ids, want);
            let letters =
                broker.fetch_all(&TopicPartition::new("pg-dlq", 0), IsolationLevel::ReadCommitted).await.unwrap();
            let mut got: Vec<String> = letters
                .iter()
                .map(|r| {
                    assert_eq!(header(&r.headers, HEADER_CAUSE), Some("sink"));
                    String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()
                })
                .collect();
            got.sort();
            assert_eq!(got, vec!["-5\tb\n".to_string(), "x7\tb\n".to_string()]);
        } else {
            let e = result.unwrap_err().to_string();
            assert!(e.contains(&table) && (e.contains("line") || e.contains("violates")), "{e}");
            assert!(ids.is_empty(), "nothing committed: {ids:?}");
            // The failed job's prepared rows wait for its next start, holding their
            // locks: decide them as that recovery would (no manifest: roll back).
            for gid in pg::prepared(&client, &format!("{group}-")).await {
                client.batch_execute(&format!("ROLLBACK PREPARED '{gid}'")).await.unwrap();
            }
        }
        client.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
    }
}

/// A table that does not exist, and a column the table lacks, are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_or_column_is_refused_by_name() {
    let Some(url) = pg::url() else { return };
    let client = pg::client(&url).await;
    let broker = broker(&["1".to_string()], 1).await;
    let missing = PostgresSettings { url: url.clone(), table: "no_such_table".into(), mode: WriteMode::Insert };
    let e: RuntimeError =
        job(&broker, "pgmiss", ID_QUERY, &missing, 1).build(config("pgmiss", 20, 0)).unwrap().run().await.unwrap_err();
    assert!(e.to_string().contains("no_such_table") && e.to_string().contains("create it"), "{e}");
    assert!(broker.transactions().await.unwrap().is_empty(), "refused before any transaction began");
    let table = pg::unique("narrow");
    client.batch_execute(&format!("CREATE TABLE {table} (id bigint)")).await.unwrap();
    let narrow = PostgresSettings { url: url.clone(), table: table.clone(), mode: WriteMode::Insert };
    let e = job(&broker, "pgnarrow", ID_QUERY, &narrow, 1)
        .build(config("pgnarrow", 20, 0))
        .unwrap()
        .run()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("\"body\"") && e.to_string().contains(&table), "{e}");
    let down = PostgresSettings { url: "postgres://nobody@127.0.0.1:9/none".into(), table, mode: WriteMode::Insert };
    let e = job(&broker, "pgdown", ID_QUERY, &down, 1).build(config("pgdown", 20, 0)).unwrap().run().await.unwrap_err();
    assert!(e.to_string().contains("cannot connect to PostgreSQL at postgres://nobody@127.0.0.1:9/none"), "{e}");
}

/// One instance of group `group` writing into `settings`' table as prefix `prefix`, its
/// checkpoints under `chk/{prefix}` of `store`; its source throttled to `rate` records a
/// second when given.
fn pg_instance(
    broker: &EmbeddedBroker,
    store: &Arc<dyn object_store::ObjectStore>,
    (group, prefix): (&str, &str),
    settings: &PostgresSettings,
    (restarts, rate, until_drained): (u32, Option<u64>, bool),
) -> shareflow::runtime::Job {
    use shareflow::checkpoint::{CheckpointPaths, CheckpointStore};
    let (job, stream, _) = eos::drained_source_with(broker, (group, INPUT, eos::share_config()), 2, |s| {
        s.max_records_per_second = rate;
        s.max_poll_records = rate.map_or(40, |r| (r / 100).max(1) as usize);
        s.stop_when_drained = until_drained;
    });
    stream
        .sql("to-row", ID_QUERY)
        .parallelism(2)
        .sink("postgres-sink", PostgresSink::factory(settings.clone()))
        .parallelism(2)
        .participant(PostgresCommitter::new(settings.clone()));
    let storage = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", prefix).unwrap());
    let config = JobConfig::new(storage, group, prefix)
        .checkpoint_interval(Duration::from_millis(20))
        // Wide for a loaded machine, where an instance that never restarts would fail at
        // its first timed-out checkpoint.
        .checkpoint_timeout(Duration::from_millis(1_000))
        .restart(RestartStrategy::FixedDelay { attempts: restarts, delay: Duration::from_millis(10) })
        .instance(shareflow::runtime::InstanceConfig::new(Duration::from_millis(2_500)));
    job.build(config).unwrap()
}

/// Instance `a` dies right after a manifest, its rows prepared in PostgreSQL. Instance
/// `b` adopts it: `a`'s decided transaction is committed from `b`, the rest rolled back,
/// and `b` writes what returns to the group. Every id lands once, nothing is left
/// prepared, and `a`, fenced, never runs (nor commits) again under its prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_instances_prepared_rows_are_decided_by_its_adopter_and_it_is_fenced() {
    use shareflow::runtime::failpoint::points;
    let Some(url) = pg::url() else { return };
    let client = pg::client(&url).await;
    let table = pg::unique("adopted");
    client.batch_execute(&format!("CREATE TABLE {table} (id bigint NOT NULL, body text)")).await.unwrap();
    const N: u64 = 3_000;
    let values: Vec<String> = (0..N).map(|i| i.to_string()).collect();
    let broker = broker(&values, 2).await;
    let group = format!("pgadopt{}", std::process::id());
    let settings = PostgresSettings { url: url.clone(), table: table.clone(), mode: WriteMode::Insert };
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
    let a = pg_instance(&broker, &store, (&group, "a"), &settings, (0, Some(10_000), true));
    a.failpoints().schedule(vec![(points::AFTER_MANIFEST.to_string(), 1)]);
    let err = a.run().await.unwrap_err();
    assert!(err.to_string().contains(points::AFTER_MANIFEST), "{err}");
    assert!(!pg::prepared(&client, &format!("{group}-a-")).await.is_empty(), "a left rows prepared");

    let count = |sql: String| {
        let client = &client;
        async move { client.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    // b runs until a is adopted and every row is in (a's records come back to the group
    // only once b adopts a, past the adoption timeout).
    let b = pg_instance(&broker, &store, (&group, "b"), &settings, (3, None, false));
    let stop = b.stop_handle();
    let (report, ()) = tokio::join!(b.run(), async {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while count(format!("SELECT count(*) FROM {table}")).await < N as i64 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.stop();
    });
    let report = report.unwrap();
    assert_eq!(report.metrics.checkpoints.instances_adopted, 1, "{report:?}");
    assert_eq!(count(format!("SELECT count(*) FROM {table}")).await, N as i64);
    assert_eq!(count(format!("SELECT count(DISTINCT id) FROM {table}")).await, N as i64);
    assert!(pg::prepared(&client, &format!("{group}-")).await.is_empty(), "nothing left prepared");

    let again = pg_instance(&broker, &store, (&group, "a"), &settings, (0, None, true));
    let err = again.run().await.unwrap_err();
    assert_eq!(err.kind(), shareflow::runtime::ErrorKind::Fenced, "{err}");
    assert_eq!(count(format!("SELECT count(*) FROM {table}")).await, N as i64, "the fenced instance wrote nothing");
    client.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
}

/// A zombie: instance `a`, once it has committed rows, prepares its next checkpoint's
/// rows and then stalls, its manifest and its heartbeats held up, until `b` adopts it
/// and rolls the prepared rows back. `a` then wakes and writes its (stale) manifest
/// deciding that checkpoint, but its commit is fenced: those rows are never committed.
/// Every id lands once, from `b`'s replay, and nothing of the group is left prepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_zombies_prepared_rows_are_never_committed() {
    use object_store::ObjectStoreExt as _;
    use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
    let Some(url) = pg::url() else { return };
    let client = pg::client(&url).await;
    let table = pg::unique("zombie");
    client.batch_execute(&format!("CREATE TABLE {table} (id bigint NOT NULL, body text)")).await.unwrap();
    const N: u64 = 3_000;
    let values: Vec<String> = (0..N).map(|i| i.to_string()).collect();
    let broker = broker(&values, 2).await;
    let group = format!("pgzombie{}", std::process::id());
    let settings = PostgresSettings { url: url.clone(), table: table.clone(), mode: WriteMode::Insert };
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 11));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    // a never stops on its own (a drained input would end it, and the stall below would
    // then land on b's manifest): it ends only fenced. At 1,000 records/s it still has
    // input when the stall comes, so the stalled checkpoint holds prepared rows.
    let a = pg_instance(&broker, &store, (&group, "a"), &settings, (0, Some(1_000), false));
    let b = pg_instance(&broker, &store, (&group, "b"), &settings, (3, Some(2_000), false));
    let stop_b = b.stop_handle();
    let count = |sql: String| {
        let client = &client;
        async move { client.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    let (ra, (held, rb)) = tokio::join!(
        async {
            let ra = tokio::time::timeout(Duration::from_secs(90), a.run()).await;
            // b goes on until every row is in: a's held records return only with b's
            // adoption.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while count(format!("SELECT count(*) FROM {table}")).await < N as i64
                && std::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop_b.stop();
            ra
        },
        async {
            // Once a has committed rows, its next manifest stalls (b is not running yet:
            // the only manifests written are a's)...
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while count(format!("SELECT count(*) FROM {table}")).await == 0 && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The stall outlasts b's start, the adoption timeout and the adoption, with
            // room for a loaded machine.
            faulty.inject(FaultRule::once(StoreOp::Put, "/_metadata", Fault::Latency(Duration::from_secs(10))));
            // ...and its heartbeats stall too: it goes silent.
            while faulty.injected().is_empty() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            faulty.inject(FaultRule::always(
                StoreOp::Put,
                "_instances/a/heartbeat",
                Fault::Latency(Duration::from_secs(15)),
            ));
            // The stalled checkpoint's rows are prepared (the sink prepares at the
            // barrier, before the manifest): these are what must never commit.
            let held = pg::prepared(&client, &format!("{group}-a-")).await;
            (held, tokio::time::timeout(Duration::from_secs(90), b.run()).await)
        }
    );
    let injected = faulty.injected();
    let stale_manifest = injected.first().and_then(|i| i.split(' ').next_back()).unwrap_or_default().to_string();
    assert!(stale_manifest.starts_with("chk/a/chk-"), "a's manifest stalled: {injected:?}");
    assert!(!held.is_empty(), "a's stalled checkpoint held prepared rows");
    let err = ra.expect("a ends").expect_err("a is fenced");
    assert_eq!(err.kind(), shareflow::runtime::ErrorKind::Fenced, "{err}");
    let rb = rb.expect("b ends").expect("b ends well");
    assert_eq!(rb.metrics.checkpoints.instances_adopted, 1, "{rb:?}");
    assert!(
        store.head(&object_store::path::Path::from(stale_manifest.as_str())).await.is_ok(),
        "the zombie wrote its stale manifest"
    );
    assert_eq!(count(format!("SELECT count(*) FROM {table}")).await, N as i64, "the zombie's rows are not in");
    assert_eq!(count(format!("SELECT count(DISTINCT id) FROM {table}")).await, N as i64);
    assert!(pg::prepared(&client, &format!("{group}-")).await.is_empty(), "nothing left prepared");
    client.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
}
