//! `shareflow txn list`: the transactions of an embedded broker (read-only, safe next to
//! a live one) or of a Kafka broker, with their age and timeout, and on the embedded
//! broker the checkpoint whose manifest decides each.

use std::collections::BTreeMap;
use std::time::Duration;

use shareflow_checkpoint::protocol::decides_commit;
use shareflow_checkpoint::CheckpointId;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the transactions are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TxnSource {
    /// An embedded broker's directory.
    Dir(String),
    /// A Kafka broker, `HOST:PORT`.
    #[cfg(feature = "kafka")]
    Kafka(String),
}

/// A participant of `txn resolve` or `txn commit|abort`, and what closes it.
type Opened = (shareflow::runtime::Participant, Box<dyn FnOnce() + Send>);

impl TxnSource {
    /// The participant that decides `prefix`'s transactions here, and what closes it.
    /// `read_only` (a dry run) opens the embedded broker beside a live one and checks no
    /// liveness. Otherwise the embedded broker's directory is taken exclusively (a
    /// running job's broker holds it, and the refusal names the holder), and on Kafka a
    /// live instance of the prefix under `checkpoints` is refused.
    async fn participant(&self, checkpoints: &str, prefix: &str, read_only: bool) -> Result<Opened, BoxError> {
        match self {
            TxnSource::Dir(dir) => {
                use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
                // The directory lock, not the prefix, refuses a live job here.
                let _ = (checkpoints, prefix);
                has_broker(dir)?;
                let options = BrokerOptions::local_dir(dir)?;
                let broker = if read_only {
                    EmbeddedBroker::open_read_only(options).await?
                } else {
                    EmbeddedBroker::open(options).await?
                };
                let p: shareflow::runtime::Participant =
                    shareflow::connector::embedded::BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
                Ok((p, Box::new(move || broker.close())))
            }
            #[cfg(feature = "kafka")]
            TxnSource::Kafka(bootstrap) => {
                if !read_only {
                    refuse_live(checkpoints, prefix).await?;
                }
                Ok((kafka_adopter(bootstrap).await?, Box::new(|| {})))
            }
        }
    }

    /// `--dir` or `--kafka` (not both); neither is the demo's embedded directory.
    pub(crate) fn from_options(dir: Option<String>, kafka: Option<String>) -> Result<Self, String> {
        match (dir, kafka) {
            (Some(_), Some(_)) => Err("give --dir (embedded broker) or --kafka (Kafka), not both".into()),
            #[cfg(feature = "kafka")]
            (None, Some(k)) => Ok(TxnSource::Kafka(k)),
            #[cfg(not(feature = "kafka"))]
            (None, Some(_)) => Err(crate::WITHOUT_KAFKA.into()),
            (d, None) => Ok(TxnSource::Dir(d.unwrap_or_else(|| "target/shareflow-demo/broker".into()))),
        }
    }
}

/// The options of `txn list`, all checked before anything is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnList {
    pub(crate) source: TxnSource,
    /// Only this share group's.
    pub(crate) group: Option<String>,
    /// Only this prefix's (instance's); needs the group.
    pub(crate) prefix: Option<String>,
    /// The checkpoint root whose manifests decide the transactions (embedded broker).
    pub(crate) checkpoints: Option<String>,
    pub(crate) json: bool,
}

impl TxnList {
    /// Checks the combination of options.
    pub(crate) fn new(
        dir: Option<String>,
        kafka: Option<String>,
        group: Option<String>,
        prefix: Option<String>,
        checkpoints: Option<String>,
        json: bool,
    ) -> Result<Self, String> {
        if prefix.is_some() && group.is_none() {
            return Err("--prefix needs --group: a prefix is an instance of one share group".into());
        }
        let source = match (dir, kafka) {
            (Some(_), Some(_)) => return Err("give --dir (embedded broker) or --kafka (Kafka), not both".into()),
            #[cfg(feature = "kafka")]
            (None, Some(k)) => {
                if checkpoints.is_some() {
                    return Err(
                        "--checkpoints decides embedded-broker transactions; on Kafka a transactional id is a \
                                slot of the pool, whose checkpoint the prefix's commits topic names"
                            .into(),
                    );
                }
                TxnSource::Kafka(k)
            }
            #[cfg(not(feature = "kafka"))]
            (None, Some(_)) => return Err(crate::WITHOUT_KAFKA.into()),
            (d, None) => TxnSource::Dir(d.unwrap_or_else(|| "target/shareflow-demo/broker".into())),
        };
        Ok(Self { source, group, prefix, checkpoints, json })
    }

    /// The id prefix the filters ask for: `{group}-` or `{group}-{prefix}-`.
    fn id_prefix(&self) -> String {
        match (&self.group, &self.prefix) {
            (Some(g), Some(p)) => format!("{g}-{p}-"),
            (Some(g), None) => format!("{g}-"),
            _ => String::new(),
        }
    }

    /// Lists them on stdout: a table, or one JSON array with `--json`.
    pub(crate) async fn run(&self) -> Result<(), BoxError> {
        let rows = match &self.source {
            TxnSource::Dir(dir) => self.embedded(dir).await?,
            #[cfg(feature = "kafka")]
            TxnSource::Kafka(bootstrap) => self.kafka(bootstrap).await?,
        };
        if self.json {
            println!("{}", serde_json::to_string(&rows.iter().map(Row::to_json).collect::<Vec<_>>())?);
            return Ok(());
        }
        println!(
            "{:<44} {:<14} {:>9} {:>9} {:>12} {:>9}  decided by",
            "transaction", "state", "age", "timeout", "pending acks", "produced"
        );
        for r in &rows {
            println!(
                "{:<44} {:<14} {:>9} {:>9} {:>12} {:>9}  {}",
                r.id,
                r.state,
                r.age.map_or("-".into(), seconds),
                seconds(r.timeout),
                r.pending_acks.map_or("-".into(), |n| n.to_string()),
                r.produced.map_or("-".into(), |n| n.to_string()),
                r.decided_by.as_deref().unwrap_or("-"),
            );
        }
        if rows.is_empty() {
            println!(
                "(no transactions{})",
                if self.id_prefix().is_empty() { String::new() } else { format!(" under {}*", self.id_prefix()) }
            );
        }
        Ok(())
    }

    async fn embedded(&self, dir: &str) -> Result<Vec<Row>, BoxError> {
        use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
        has_broker(dir)?;
        // The manifests first: a root that cannot open fails before the broker is read.
        let root = match &self.checkpoints {
            Some(url) => Some(shareflow::checkpoint::CheckpointStore::from_url(url, &[], "txn-list")?),
            None => None,
        };
        // Read-only: changes nothing on disk and works while a job's broker holds the
        // directory.
        let broker = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir)?).await?;
        let now = shareflow::checkpoint::now_ms();
        let wanted = self.id_prefix();
        let txns: Vec<_> =
            broker.transactions().await?.into_iter().filter(|t| t.id.to_string().starts_with(&wanted)).collect();
        // For each prefix, which manifest names which transaction.
        let mut deciders: BTreeMap<String, BTreeMap<String, CheckpointId>> = BTreeMap::new();
        if let Some(root) = &root {
            for t in &txns {
                let prefix = t.id.prefix().to_string();
                if deciders.contains_key(&prefix) {
                    continue;
                }
                let mut named = BTreeMap::new();
                // The job id of an instance is its prefix.
                if let Ok(job) = root.sibling(&prefix) {
                    for c in job.list_checkpoints().await? {
                        for r in c.manifest.iter().flat_map(|m| m.transactions.iter()) {
                            named.entry(r.transaction_id.clone()).or_insert(c.checkpoint_id);
                        }
                    }
                }
                deciders.insert(prefix, named);
            }
        }
        Ok(txns
            .into_iter()
            .map(|t| {
                let id = t.id.to_string();
                let decided_by = root.as_ref().map(|_| match deciders.get(t.id.prefix()).and_then(|m| m.get(&id)) {
                    Some(n) => format!("checkpoint {n}"),
                    None if t.state.is_pending() => "no manifest: recovery aborts it".to_string(),
                    None => "no manifest".to_string(),
                });
                Row {
                    state: t.state.to_string(),
                    age: Some(Duration::from_millis(now.saturating_sub(t.created_at_ms))),
                    timeout: t.timeout,
                    pending_acks: Some(t.pending_ack_records),
                    produced: Some(t.produced_records),
                    decided_by,
                    producer: None,
                    id,
                }
            })
            .collect())
    }

    #[cfg(feature = "kafka")]
    async fn kafka(&self, bootstrap: &str) -> Result<Vec<Row>, BoxError> {
        let cluster = shareflow::connector::kafka::KafkaCluster::connect(bootstrap).await?;
        let now = shareflow::checkpoint::now_ms();
        Ok(cluster
            .describe_transactions(&self.id_prefix())
            .await?
            .into_iter()
            .map(|t| Row {
                state: t.state,
                age: t.started_at_ms.map(|s| Duration::from_millis(now.saturating_sub(s))),
                timeout: t.timeout,
                pending_acks: None,
                produced: None,
                decided_by: None,
                producer: Some((t.producer_id, t.producer_epoch, t.partitions)),
                id: t.id,
            })
            .collect())
    }
}

/// Refuses a `--dir` that holds no embedded broker, naming it.
fn has_broker(dir: &str) -> Result<(), BoxError> {
    if std::path::Path::new(dir).join("broker").exists() {
        Ok(())
    } else {
        Err(format!("no embedded broker in {dir}: give the broker directory with --dir").into())
    }
}

/// One listed transaction.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    id: String,
    state: String,
    /// Since it began; `None`: no transaction open (Kafka).
    age: Option<Duration>,
    timeout: Duration,
    /// Acknowledgements staged in it (embedded broker).
    pending_acks: Option<u64>,
    /// Records produced into it (embedded broker).
    produced: Option<u64>,
    /// With `--checkpoints`: the checkpoint whose manifest names it.
    decided_by: Option<String>,
    /// Producer id, epoch, and partitions written (Kafka).
    producer: Option<(i64, i16, usize)>,
}

/// A listed transaction's JSON form; the producer's fields only on Kafka.
#[derive(serde::Serialize)]
struct RowJson<'a> {
    id: &'a str,
    state: &'a str,
    age_seconds: Option<f64>,
    timeout_seconds: f64,
    pending_acks: Option<u64>,
    produced: Option<u64>,
    decided_by: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    producer_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    producer_epoch: Option<i16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<usize>,
}

impl Row {
    fn to_json(&self) -> RowJson<'_> {
        RowJson {
            id: &self.id,
            state: &self.state,
            age_seconds: self.age.map(|a| a.as_secs_f64()),
            timeout_seconds: self.timeout.as_secs_f64(),
            pending_acks: self.pending_acks,
            produced: self.produced,
            decided_by: self.decided_by.as_deref(),
            producer_id: self.producer.map(|p| p.0),
            producer_epoch: self.producer.map(|p| p.1),
            partitions: self.producer.map(|p| p.2),
        }
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(
        dir: Option<&str>,
        kafka: Option<&str>,
        group: Option<&str>,
        prefix: Option<&str>,
    ) -> Result<TxnList, String> {
        let s = |o: Option<&str>| o.map(String::from);
        TxnList::new(s(dir), s(kafka), s(group), s(prefix), None, false)
    }

    #[test]
    fn an_explicit_decision_follows_the_recovery_rule_unless_forced() {
        use Explicit::{Do, Refuse};
        use HandDecision::{Abort, Commit};
        // (op, n, newest complete checkpoint, force) -> done (forced?) or refused
        type Case = (HandDecision, u64, Option<u64>, bool, Option<bool>);
        let table: [Case; 10] = [
            (Commit, 2, Some(2), false, Some(false)),
            (Commit, 1, Some(2), false, Some(false)),
            (Commit, 3, Some(2), false, None),
            (Commit, 3, None, false, None),
            (Commit, 3, Some(2), true, Some(true)),
            (Abort, 3, Some(2), false, Some(false)),
            (Abort, 3, None, false, Some(false)),
            (Abort, 2, Some(2), false, None),
            (Abort, 2, Some(5), true, Some(true)),
            (Commit, 2, Some(2), true, Some(false)),
        ];
        for (op, n, restored, force, want) in table {
            let got = explicit_decision(op, "g-p-n", n, restored, force);
            match (want, &got) {
                (Some(forced), Do { op: o, forced: f }) => {
                    assert_eq!((*o, *f), (op, forced), "{op:?} {n} {restored:?}")
                }
                (None, Refuse(why)) => assert!(why.contains("g-p-n") && why.contains("--force"), "{why}"),
                _ => panic!("{op:?} {n} {restored:?} {force}: {got:?}"),
            }
        }
    }

    #[test]
    fn options_are_checked_together() {
        assert!(list(Some("d"), Some("k:1"), None, None).unwrap_err().contains("not both"));
        assert!(list(None, None, None, Some("p")).unwrap_err().contains("--prefix needs --group"));
        let l = list(None, None, Some("g"), Some("i1")).expect("ok");
        assert_eq!(l.source, TxnSource::Dir("target/shareflow-demo/broker".into()));
        assert_eq!(l.id_prefix(), "g-i1-");
        assert_eq!(list(Some("d"), None, Some("g"), None).expect("ok").id_prefix(), "g-");
        assert_eq!(list(Some("d"), None, None, None).expect("ok").id_prefix(), "");
        #[cfg(feature = "kafka")]
        {
            let e = TxnList::new(None, Some("k:1".into()), None, None, Some("file:///x".into()), false).unwrap_err();
            assert!(e.contains("--checkpoints decides embedded-broker transactions"), "{e}");
        }
    }
}

/// `txn resolve`: decide what a stopped job left pending on an embedded broker, from its
/// checkpoints, as its restart would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnResolve {
    /// The embedded broker's directory, or Kafka.
    pub(crate) source: TxnSource,
    /// The checkpoint root of the group's instances.
    pub(crate) checkpoints: String,
    pub(crate) group: String,
    /// The job's prefix (its job id under the root).
    pub(crate) prefix: String,
    pub(crate) dry_run: bool,
    pub(crate) json: bool,
}

impl TxnResolve {
    /// Checks the options; every one but `--dir` and the flags is required.
    pub(crate) fn new(
        source: TxnSource,
        checkpoints: Option<String>,
        group: Option<String>,
        prefix: Option<String>,
        dry_run: bool,
        json: bool,
    ) -> Result<Self, String> {
        let need = |v: Option<String>, what: &str| v.ok_or_else(|| format!("txn resolve needs {what}"));
        Ok(Self {
            source,
            checkpoints: need(checkpoints, "--checkpoints URL: the manifests decide")?,
            group: need(group, "--group G")?,
            prefix: need(prefix, "--prefix P: the stopped job's prefix")?,
            dry_run,
            json,
        })
    }

    /// Resolves (or, with `--dry-run`, plans) and prints each decision.
    pub(crate) async fn run(&self) -> Result<(), BoxError> {
        let storage = shareflow::checkpoint::CheckpointStore::from_url(&self.checkpoints, &[], &self.prefix)?;
        let template = shareflow::runtime::TransactionTemplate::new(&self.group, &self.prefix)?;
        let (participant, close) = self.source.participant(&self.checkpoints, &self.prefix, self.dry_run).await?;
        let done = shareflow::runtime::resolve_pending(&[participant], &template, &storage, self.dry_run).await;
        close();
        let done = done?;
        if self.json {
            println!("{}", serde_json::to_string(&done)?);
            return Ok(());
        }
        let verb = if self.dry_run { "would" } else { "did" };
        for r in &done {
            println!("{verb} {}: {} ({})", r.action, r.transaction, r.participant);
        }
        if done.is_empty() {
            println!("nothing pending under {}-{}", self.group, self.prefix);
        }
        Ok(())
    }
}

/// `checkpoints inspect N --json`: the manifest and the verdict on each state file.
#[derive(serde::Serialize)]
struct InspectJson<'a> {
    job: &'a str,
    checkpoint: CheckpointId,
    created_at_ms: u64,
    transactions: Vec<TransactionJson<'a>>,
    state_files: Vec<StateFileJson<'a>>,
}

/// A transaction a manifest names.
#[derive(serde::Serialize)]
struct TransactionJson<'a> {
    participant: &'a str,
    transaction: &'a str,
    state: String,
}

/// A state file a manifest names, read back and checked.
#[derive(serde::Serialize)]
struct StateFileJson<'a> {
    operator: &'a str,
    subtask: u32,
    part: u32,
    bytes: u64,
    inline: bool,
    shared_offset: Option<u64>,
    check: &'a str,
}

/// `checkpoints inspect N`: one checkpoint's manifest, its transactions and state files,
/// each state file read back and checked against its size and CRC-32C.
pub(crate) async fn inspect_checkpoint(url: &str, job: &str, id: CheckpointId, json: bool) -> Result<(), BoxError> {
    let store = shareflow::checkpoint::CheckpointStore::from_url(url, &[], job)?;
    let manifest = store.read_manifest(id).await.map_err(|e| {
        format!("checkpoint {id} of job {job} under {url}: {e} (list them with `shareflow checkpoints`)")
    })?;
    let dir = store.paths().checkpoint_dir(id);
    let mut files = Vec::new();
    for f in &manifest.state_files {
        let verdict = match store.read_state(&dir, f).await {
            Ok(_) => "verified".to_string(),
            Err(e) => format!("FAILS: {e}"),
        };
        files.push((f, verdict));
    }
    let failed = files.iter().filter(|(_, v)| v != "verified").count();
    if json {
        let transactions = manifest.transactions.iter().map(|t| TransactionJson {
            participant: &t.participant,
            transaction: &t.transaction_id,
            state: format!("{:?}", t.state),
        });
        let state_files = files.iter().map(|(f, check)| StateFileJson {
            operator: &f.operator,
            subtask: f.subtask,
            part: f.part,
            bytes: f.size,
            inline: f.inline.is_some(),
            shared_offset: f.offset,
            check,
        });
        let inspected = InspectJson {
            job: &manifest.job_id,
            checkpoint: manifest.checkpoint_id,
            created_at_ms: manifest.created_at_ms,
            transactions: transactions.collect(),
            state_files: state_files.collect(),
        };
        println!("{}", serde_json::to_string(&inspected)?);
    } else {
        let age = shareflow::checkpoint::now_ms().saturating_sub(manifest.created_at_ms);
        println!(
            "checkpoint {} of job {} ({:.1} s old): its manifest decodes",
            manifest.checkpoint_id,
            manifest.job_id,
            age as f64 / 1e3
        );
        println!("transactions it decides:");
        for t in &manifest.transactions {
            println!("  {:<40} {:<20} {:?}", t.transaction_id, t.participant, t.state);
        }
        println!("state files:");
        for (f, v) in &files {
            let place = match (&f.inline, f.offset) {
                (Some(_), _) => "inline".to_string(),
                (None, Some(offset)) => format!("{} @{offset}", shareflow::checkpoint::SHARED_STATE_NAME),
                (None, None) => "file".to_string(),
            };
            let part = if f.part > 0 { format!(" part {}", f.part) } else { String::new() };
            println!("  {:<24} {:>4} {:>10} bytes {place:<6} {v}{part}", f.operator, f.subtask, f.size);
        }
        if files.is_empty() {
            println!("  (none: the job's operators keep no state)");
        }
    }
    if failed > 0 {
        return Err(format!("{failed} state file(s) of checkpoint {id} fail verification").into());
    }
    Ok(())
}

/// What `txn commit` or `txn abort` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandDecision {
    Commit,
    Abort,
}

/// What an explicit `txn commit|abort` of T(n) does, from what the checkpoints decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Explicit {
    /// Carry it out: the manifests agree (or `--force` overrides them, `forced`).
    Do { op: HandDecision, forced: bool },
    /// Refused, and why.
    Refuse(String),
}

/// The rule of an explicit decision is recovery's ([`decides_commit`], under
/// `plan_recovery`): T(n) commits iff a complete checkpoint `restored` >= n exists.
/// Against that rule only `--force` acts.
pub(crate) fn explicit_decision(
    op: HandDecision,
    id: &str,
    n: CheckpointId,
    restored: Option<CheckpointId>,
    force: bool,
) -> Explicit {
    let decided = decides_commit(restored, n);
    match (op, decided, force) {
        (HandDecision::Commit, true, _) | (HandDecision::Abort, false, _) => Explicit::Do { op, forced: false },
        (_, _, true) => Explicit::Do { op, forced: true },
        (HandDecision::Commit, false, false) => Explicit::Refuse(format!(
            "no complete checkpoint decides {id}: {}, so committing it publishes output and acknowledgements no \
             restored state counts (a restart processes them again). `shareflow txn resolve` decides as a restart \
             would; --force commits anyway",
            match restored {
                Some(r) => format!("the newest complete checkpoint is {r}, below {n}"),
                None => "the job has no complete checkpoint".into(),
            }
        )),
        (HandDecision::Abort, true, false) => Explicit::Refuse(format!(
            "complete checkpoint {} covers {id}, so its manifest decided to commit it; aborting it loses output \
             that the restored state counts as done. `shareflow txn resolve` commits it; --force aborts anyway",
            restored.unwrap_or(n)
        )),
    }
}

/// `txn commit|abort ID`: one transaction of a stopped job, decided by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnDecide {
    pub(crate) op: HandDecision,
    /// The transaction id `{group}-{prefix}-{checkpoint}`.
    pub(crate) id: String,
    pub(crate) group: String,
    pub(crate) source: TxnSource,
    /// The checkpoint root whose manifests decide.
    pub(crate) checkpoints: String,
    pub(crate) force: bool,
    pub(crate) json: bool,
}

impl TxnDecide {
    /// Checks the options: the id, `--group` and `--checkpoints` are required.
    pub(crate) fn new(
        op: HandDecision,
        id: Option<String>,
        source: TxnSource,
        group: Option<String>,
        checkpoints: Option<String>,
        force: bool,
        json: bool,
    ) -> Result<Self, String> {
        let verb = match op {
            HandDecision::Commit => "txn commit",
            HandDecision::Abort => "txn abort",
        };
        let id = id.ok_or_else(|| format!("{verb} needs a transaction id: {verb} GROUP-PREFIX-N --group GROUP"))?;
        let group =
            group.ok_or_else(|| format!("{verb} needs --group G: it tells the group from the prefix in {id}"))?;
        shareflow::checkpoint::TransactionId::parse(&id, &group).map_err(|e| format!("{verb} {id}: {e}"))?;
        let checkpoints =
            checkpoints.ok_or_else(|| format!("{verb} needs --checkpoints URL: the job's manifests decide {id}"))?;
        Ok(Self { op, id, group, source, checkpoints, force, json })
    }

    /// Decides the transaction and prints what it did.
    pub(crate) async fn run(&self) -> Result<(), BoxError> {
        use shareflow::runtime::PrepareOutcome;
        let txn = shareflow::checkpoint::TransactionId::parse(&self.id, &self.group)?;
        let (prefix, n) = (txn.prefix().to_string(), txn.checkpoint_id());
        let template = shareflow::runtime::TransactionTemplate::new(&self.group, &prefix)?;
        let storage = shareflow::checkpoint::CheckpointStore::from_url(&self.checkpoints, &[], &prefix)?;
        let policy = shareflow::checkpoint::protocol::RetentionPolicy::default();
        let restored = storage.recover(&policy).await?.plan.restored_id();
        let op = match explicit_decision(self.op, &self.id, n, restored, self.force) {
            Explicit::Refuse(why) => return Err(why.into()),
            Explicit::Do { op, forced } => {
                if forced {
                    eprintln!("warning: --force overrides the checkpoints; exactly-once does not hold for {}", self.id);
                }
                op
            }
        };
        let (participant, close) = self.source.participant(&self.checkpoints, &prefix, false).await?;
        // Looked up before the prefix is taken: taking it aborts what never prepared.
        let pending = participant.pending(&template).await?;
        let Some(found) = pending.iter().find(|t| t.id.checkpoint_id() == n) else {
            close();
            let open: Vec<String> = pending.iter().map(|t| t.id.to_string()).collect();
            return Err(format!(
                "no open transaction {} on {}: it committed or aborted already, or never began (open under the \
                 prefix: {}). `shareflow txn list` shows what is open",
                self.id,
                self.where_(),
                if open.is_empty() { "none".to_string() } else { open.join(", ") }
            )
            .into());
        };
        if op == HandDecision::Commit && !found.prepared {
            close();
            return Err(format!(
                "{} never prepared (it is ONGOING): the job stopped before its checkpoint's prepare, and taking the \
                 prefix to commit it aborts it. Only an abort is left for it",
                self.id
            )
            .into());
        }
        let result = async {
            participant.open(&template).await?;
            match op {
                HandDecision::Commit => {
                    if participant.prepare(&txn).await? == PrepareOutcome::AlreadyAborted {
                        return Err(format!("{} was aborted before it could commit", self.id).into());
                    }
                    participant.commit(&txn).await?;
                    Ok::<_, BoxError>("committed")
                }
                HandDecision::Abort => {
                    // Taking the prefix may have aborted it already.
                    if participant.pending(&template).await?.iter().any(|t| t.id.checkpoint_id() == n) {
                        participant.abort(&txn).await?;
                    }
                    Ok("aborted")
                }
            }
        }
        .await;
        let action = match result {
            Ok(a) => a,
            Err(e) => {
                close();
                return Err(e);
            }
        };
        close();
        if self.json {
            #[derive(serde::Serialize)]
            struct Decided<'a> {
                transaction: &'a str,
                action: &'a str,
                forced: bool,
                participant: &'a str,
            }
            let decided =
                Decided { transaction: &self.id, action, forced: self.force, participant: participant.name() };
            println!("{}", serde_json::to_string(&decided)?);
        } else {
            println!("{action} {} ({})", self.id, participant.name());
        }
        Ok(())
    }

    fn where_(&self) -> String {
        match &self.source {
            TxnSource::Dir(d) => format!("the embedded broker in {d}"),
            #[cfg(feature = "kafka")]
            TxnSource::Kafka(k) => format!("Kafka at {k}"),
        }
    }
}

/// The Kafka participant's adopter view on `bootstrap`: it decides a prefix's
/// transactions and owns no attempt of its own.
#[cfg(feature = "kafka")]
async fn kafka_adopter(bootstrap: &str) -> Result<shareflow::runtime::Participant, BoxError> {
    use shareflow::connector::kafka::{KafkaCluster, KafkaTransactions, KafkaTransactionsConfig};
    let cluster = KafkaCluster::connect(bootstrap).await?;
    let owner = KafkaTransactions::new(cluster, KafkaTransactionsConfig::default());
    Ok(shareflow::runtime::TransactionParticipant::adopter(owner.as_ref())
        .ok_or("the Kafka participant has no adopter view")?)
}

/// How long `txn` commands on Kafka watch an instance's heartbeat before they act.
#[cfg(feature = "kafka")]
const LIVE_WATCH: Duration = Duration::from_secs(3);

/// Refuses if the instance `prefix` under the checkpoint root `checkpoints` is live: its
/// heartbeat moves within [`LIVE_WATCH`] (measured on this machine's clock only). A
/// retired or adopted instance, or one that never beat, is not live.
#[cfg(feature = "kafka")]
pub(crate) async fn refuse_live(checkpoints: &str, prefix: &str) -> Result<(), BoxError> {
    let registry = shareflow::checkpoint::CheckpointStore::from_url(checkpoints, &[], prefix)?.registry();
    let first = registry.record(prefix).await?;
    if first.retired || first.adopted_by.is_some() || first.heartbeat.is_none() {
        return Ok(());
    }
    tokio::time::sleep(LIVE_WATCH).await;
    let second = registry.record(prefix).await?;
    if second.heartbeat != first.heartbeat || second.incarnation != first.incarnation {
        return Err(format!(
            "instance {prefix} is live: its heartbeat under {checkpoints} moved within {LIVE_WATCH:?}. Stop it \
             first; a live instance decides its own transactions"
        )
        .into());
    }
    Ok(())
}
