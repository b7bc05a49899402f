//! Recovery time and ledger bytes read on a real Kafka 4.x broker after a job of 10 and
//! of 10,000 checkpoints (issue 12, "bounded recovery on Kafka").
//!
//! Each run drives the Kafka participant the way the runtime does, on a fresh group:
//! per checkpoint an intent of 10 offsets, one output record, prepare and commit. The
//! last checkpoint is left prepared, as a crash would leave it. Then a new participant
//! recovers three times (open, pending, abort what is pending, take over, highest
//! checkpoint id), and the median time is printed with the ledger records and bytes the
//! recovery read. The same is done with trimming off (`ledger_summary_every` = never),
//! the ledger as it was before it was summarised.
//!
//! ```text
//! ./scripts/kafka start && eval "$(./scripts/kafka env)"
//! cargo run --release --features kafka --example kafka_ledger_recovery [-- CHECKPOINTS...]
//! ```

use std::time::{Duration, Instant};

use bytes::Bytes;
use shareflow::connector::kafka::{KafkaCluster, KafkaTransactions, KafkaTransactionsConfig, LedgerRange};
use shareflow::connector::share::ProducerRecord;
use shareflow::runtime::{PrepareOutcome, TransactionParticipant, TransactionTemplate};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn unique(base: &str) -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{base}-{ms}")
}

/// The offsets checkpoint `n` processed.
fn range(n: u64) -> LedgerRange {
    LedgerRange { topic: "input".into(), partition: 0, first: (n as i64 - 1) * 10, last: n as i64 * 10 - 1 }
}

/// One checkpoint's work and its two-phase commit; `commit` false leaves it prepared.
async fn checkpoint(
    p: &KafkaTransactions,
    template: &TransactionTemplate,
    out: &str,
    n: u64,
    commit: bool,
) -> Result<(), Error> {
    let t = template.transaction(n);
    p.begin(&t).await?;
    p.write_intent(n, 0, vec![range(n)]).await?;
    p.send(n, vec![ProducerRecord { partition: None, ..ProducerRecord::new(out, 0, Bytes::from(format!("{n}"))) }])
        .await?;
    if p.prepare(&t).await? != PrepareOutcome::Prepared {
        return Err(format!("checkpoint {n} did not prepare").into());
    }
    if commit {
        p.commit(&t).await?;
    }
    Ok(())
}

/// What one recovery took.
struct Recovery {
    seconds: f64,
    entries: u64,
    bytes: u64,
    replayed: usize,
}

async fn recover(
    c: &KafkaCluster,
    config: &KafkaTransactionsConfig,
    template: &TransactionTemplate,
) -> Result<Recovery, Error> {
    let started = Instant::now();
    let q = KafkaTransactions::new(c.clone(), config.clone());
    q.open(template).await?;
    for t in q.pending(template).await? {
        q.abort(&t.id).await?;
    }
    q.take_over(template).await?;
    q.highest_checkpoint_id(template).await?;
    let seconds = started.elapsed().as_secs_f64();
    let reads = q.ledger_reads();
    Ok(Recovery { seconds, entries: reads.entries, bytes: reads.bytes, replayed: q.queued_replay().len() })
}

async fn run(c: &KafkaCluster, checkpoints: u64, trim: bool) -> Result<(), Error> {
    let name = unique(&format!("ledger-{checkpoints}"));
    let out = format!("{name}-output");
    c.ensure_topic(&out, 1, &[]).await?;
    let template = TransactionTemplate::new(&name, "job")?;
    let mut config = KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(120));
    if !trim {
        config = config.ledger_summary_every(u64::MAX);
    }
    let p = KafkaTransactions::new(c.clone(), config.clone());
    p.open(&template).await?;
    p.take_over(&template).await?;
    let started = Instant::now();
    for n in 1..=checkpoints {
        checkpoint(&p, &template, &out, n, true).await?;
        if n % 2_000 == 0 {
            eprintln!("  {n} checkpoints after {:.0} s", started.elapsed().as_secs_f64());
        }
    }
    let run_seconds = started.elapsed().as_secs_f64();
    // The crash: the next checkpoint is prepared and never decided.
    checkpoint(&p, &template, &out, checkpoints + 1, false).await?;
    // Let the background note and compaction of the last commit finish, as they would
    // in the half second before the next checkpoint.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(p);
    let intents = format!("{name}-intents");
    let commits = format!("{name}-job-ledger");
    let span = |s: Vec<i64>, e: Vec<i64>| format!("{}..{}", s[0], e[0]);
    let intents_span = span(c.start_offsets(&intents).await?, c.end_offsets(&intents, false).await?);
    let commits_span = span(c.start_offsets(&commits).await?, c.end_offsets(&commits, false).await?);
    let mut recoveries = Vec::new();
    for _ in 0..3 {
        recoveries.push(recover(c, &config, &template).await?);
    }
    let first_replayed = recoveries[0].replayed;
    recoveries.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let median = &recoveries[1];
    println!(
        "{checkpoints:>6} checkpoints, trimming {}: run {run_seconds:.1} s ({:.2} ms per checkpoint); intents topic offsets {intents_span}, commits topic {commits_span}; recovery median {:.3} s (min {:.3}, max {:.3}), read {} ledger records, {} bytes; replayed {first_replayed} range(s)",
        if trim { "on " } else { "off" },
        1000.0 * run_seconds / checkpoints as f64,
        median.seconds,
        recoveries[0].seconds,
        recoveries[2].seconds,
        median.entries,
        median.bytes,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let bootstrap = std::env::var("SHAREFLOW_KAFKA_BOOTSTRAP")
        .map_err(|_| "set SHAREFLOW_KAFKA_BOOTSTRAP: ./scripts/kafka start && eval \"$(./scripts/kafka env)\"")?;
    let mut sizes: Vec<u64> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    if sizes.is_empty() {
        sizes = vec![10, 10_000];
    }
    let c = KafkaCluster::connect(&bootstrap).await?;
    for &n in &sizes {
        run(&c, n, true).await?;
        run(&c, n, false).await?;
    }
    Ok(())
}
