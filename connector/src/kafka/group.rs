//! [`GroupLedger`]: one process's live view of its share group's intents topic. A tailer
//! task reads the topic from its start in log order into a [`ClaimIndex`]; the
//! participant asks it whether a delivery is covered, whether its own intents lost, and
//! what it must replay. The rules are [`super::claims`]; this is the I/O around them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::claims::{ClaimIndex, Claimant, Holdings};
use super::ledger::{replay_owner, LedgerEntry, LedgerRange, RangeSet};
use super::{kafka_error, KafkaCluster};
use crate::error::{Error, ErrorKind, Result};

/// Partition key.
type Tp = (Arc<str>, i32);

/// One intent of a share group's intents topic `{group}-intents`, as a tool or an
/// operator reads it: `by`'s source subtask `subtask` processes `ranges` in epoch `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupIntent {
    /// The attempt that wrote it.
    pub by: Claimant,
    /// The epoch (checkpoint id) whose transaction carries the output.
    pub epoch: u64,
    /// The source subtask.
    pub subtask: u32,
    /// The offsets it names.
    pub ranges: Vec<LedgerRange>,
}

impl KafkaCluster {
    /// Every intent the instances of share group `group` wrote, in log order (read
    /// once, from the start of `{group}-intents` to its end). A record that is not an
    /// intent is an error of kind Data naming its offset: only shareflow instances of
    /// this group may write the topic.
    pub async fn group_intents(&self, group: &str) -> Result<Vec<GroupIntent>> {
        let topic = format!("{group}-intents");
        let mut out = Vec::new();
        for (_, offset, _, value) in self.read_topic(&topic, false).await? {
            match LedgerEntry::decode(value.as_deref().unwrap_or_default()) {
                Ok(LedgerEntry::Intent { by, epoch, subtask, ranges }) => {
                    out.push(GroupIntent { by, epoch, subtask, ranges })
                }
                Ok(other) => {
                    return Err(Error::Corrupt {
                        path: format!("kafka topic {topic} partition 0 offset {offset}"),
                        reason: format!("{} in the intents topic, which holds intents only", other.describe()),
                    })
                }
                Err(reason) => {
                    return Err(Error::Corrupt {
                        path: format!("kafka topic {topic} partition 0 offset {offset}"),
                        reason: format!("not a ledger entry: {reason}"),
                    })
                }
            }
        }
        Ok(out)
    }
}

/// What the tailer and the participant share.
#[derive(Debug, Default)]
struct Inner {
    /// Bumped by every [`GroupLedger::start`]: a tailer of an older one stops.
    session: u64,
    topic: String,
    index: ClaimIndex,
    /// Set once the current attempt took its own prefix over.
    holdings: Option<Holdings>,
    committed: BTreeSet<(Claimant, u64)>,
    /// Offsets queued for replay in this attempt.
    scheduled: HashMap<Tp, RangeSet>,
    /// Offsets this attempt's intents name (before the tailer sees them).
    own: HashMap<Tp, RangeSet>,
    /// Replay work not yet taken by a source subtask.
    queue: Vec<LedgerRange>,
    /// The tailer applied an intent of a held claimant since the last plan.
    dirty: bool,
    /// Why the tailer stopped, if it failed.
    failed: Option<(ErrorKind, String)>,
}

impl Inner {
    /// Plans the replay of everything held and not yet queued, and queues it.
    fn plan(&mut self) -> usize {
        self.dirty = false;
        let Some(h) = &self.holdings else { return 0 };
        let ranges = self.index.replay(h, &self.committed, &self.scheduled);
        for r in &ranges {
            self.scheduled.entry((Arc::from(r.topic.as_str()), r.partition)).or_default().insert(r.first, r.last);
        }
        let n = ranges.len();
        self.queue.extend(ranges);
        n
    }
}

/// The group-wide claims of one process, fed by a tailer of the intents topic.
#[derive(Debug)]
pub(crate) struct GroupLedger {
    cluster: KafkaCluster,
    inner: Mutex<Inner>,
    /// The tailer's position: the next offset of the intents topic it will read.
    position: tokio::sync::watch::Sender<i64>,
    tailer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for GroupLedger {
    fn drop(&mut self) {
        if let Some(h) = crate::common::sync::lock(&self.tailer).take() {
            h.abort();
        }
    }
}

impl GroupLedger {
    /// A ledger view on `cluster`, not tailing yet.
    pub(crate) fn new(cluster: KafkaCluster) -> Arc<Self> {
        Arc::new(Self {
            cluster,
            inner: Mutex::new(Inner::default()),
            position: tokio::sync::watch::channel(0).0,
            tailer: Mutex::new(None),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::common::sync::lock(&self.inner)
    }

    /// Forgets everything and tails `topic` from its start: a new attempt.
    pub(crate) fn start(self: &Arc<Self>, topic: &str) {
        let session = {
            let mut g = self.lock();
            let session = g.session + 1;
            *g = Inner { session, topic: topic.to_string(), ..Inner::default() };
            session
        };
        self.position.send_replace(0);
        let me = self.clone();
        let topic = topic.to_string();
        let handle = tokio::spawn(async move {
            if let Err(e) = me.tail(&topic, session).await {
                tracing::error!(topic = %topic, error = %e, "the intents tailer stopped");
                let mut g = me.lock();
                if g.session == session {
                    g.failed = Some((e.kind(), e.to_string()));
                }
                drop(g);
                // Wake the waiters: they see the failure.
                me.position.send_modify(|_| {});
            }
        });
        if let Some(old) = crate::common::sync::lock(&self.tailer).replace(handle) {
            old.abort();
        }
    }

    async fn tail(&self, topic: &str, session: u64) -> Result<()> {
        // Its own connections: its fetches wait for new intents, and on the job's
        // shared socket every intent write would queue behind them.
        let client = self.cluster.dedicated_client().await?;
        let consumer = client
            .consumer_without_group()
            .build()
            .await
            .map_err(|e| kafka_error(format!("tail the intents topic {topic}"), e))?;
        consumer.assign(topic, vec![0]).await.map_err(|e| kafka_error(format!("assign {topic}"), e))?;
        consumer.seek(topic, 0, 0).await.map_err(|e| kafka_error(format!("seek {topic}"), e))?;
        loop {
            let records =
                consumer.poll(Duration::from_millis(100)).await.map_err(|e| kafka_error(format!("tail {topic}"), e))?;
            {
                let mut g = self.lock();
                if g.session != session {
                    return Ok(());
                }
                for r in records {
                    let bytes = r.value.as_deref().unwrap_or_default();
                    match LedgerEntry::decode(bytes) {
                        Ok(LedgerEntry::Intent { by, epoch, ranges, .. }) => {
                            g.index.apply(&by, epoch, &ranges);
                            if g.holdings.as_ref().is_some_and(|h| h.holds(&by)) {
                                g.dirty = true;
                            }
                        }
                        Ok(other) => {
                            return Err(Error::Corrupt {
                                path: format!("kafka topic {topic} partition 0 offset {}", r.offset),
                                reason: format!(
                                    "{} in the intents topic, which holds intents only; is another application \
                                     writing to it?",
                                    other.describe()
                                ),
                            })
                        }
                        Err(reason) => {
                            return Err(Error::Corrupt {
                                path: format!("kafka topic {topic} partition 0 offset {}", r.offset),
                                reason: format!(
                                    "not a ledger entry: {reason}. The intents topic must be written by shareflow \
                                     instances of this group only"
                                ),
                            })
                        }
                    }
                }
                if g.dirty {
                    let n = g.plan();
                    if n > 0 {
                        tracing::warn!(ranges = n, "late intents of a held claimant: replaying them");
                    }
                }
            }
            if let Some(p) = consumer.position(topic, 0).await {
                self.position.send_if_modified(|old| {
                    let changed = *old != p;
                    *old = p;
                    changed
                });
            }
        }
    }

    fn failure(&self) -> Option<Error> {
        self.lock().failed.clone().map(|(kind, reason)| Error::Kafka {
            op: "tail the intents topic".into(),
            reason,
            kind,
            source: None,
        })
    }

    /// Waits until the tailer has read past log offset `offset` of the intents topic.
    pub(crate) async fn wait_past(&self, offset: i64, timeout: Duration) -> Result<()> {
        let mut rx = self.position.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            if *rx.borrow_and_update() > offset {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Internal("the intents tailer's position channel closed".into())),
                Err(_) => {
                    let topic = self.lock().topic.clone();
                    return Err(Error::Kafka {
                        op: format!("read the intents topic {topic}"),
                        reason: format!(
                            "the tailer did not reach offset {offset} within {timeout:?} (at {}); is the broker \
                             overloaded?",
                            *rx.borrow()
                        ),
                        kind: ErrorKind::Unavailable,
                        source: None,
                    });
                }
            }
        }
    }

    /// Waits until the tailer has read everything written to the intents topic so far.
    pub(crate) async fn catch_up(&self, timeout: Duration) -> Result<()> {
        let topic = self.lock().topic.clone();
        let end = self.cluster.end_offsets(&topic, false).await?.first().copied().unwrap_or(0);
        self.wait_past(end - 1, timeout).await
    }

    /// The current attempt is `me`: it holds its own earlier generations.
    pub(crate) fn set_me(&self, me: Claimant) {
        self.lock().holdings = Some(Holdings::new(me));
    }

    /// The current attempt now holds `adopted` (if any) and knows these committed
    /// epochs; plans and queues what it must replay. Returns how many ranges it queued.
    pub(crate) fn hold(&self, adopted: Option<&str>, committed: impl IntoIterator<Item = (Claimant, u64)>) -> usize {
        let mut g = self.lock();
        if let (Some(p), Some(h)) = (adopted, g.holdings.as_mut()) {
            h.adopted.insert(p.to_string());
        }
        g.committed.extend(committed);
        g.plan()
    }

    /// Records that an intent of the current attempt names `ranges`.
    pub(crate) fn cover_own(&self, ranges: &[LedgerRange]) {
        let mut g = self.lock();
        for r in ranges {
            g.own.entry((Arc::from(r.topic.as_str()), r.partition)).or_default().insert(r.first, r.last);
        }
    }

    /// For each `(topic, partition, offset)`, whether an intent names it: its output is
    /// committed or some instance replays it, so a delivery of it is accepted and
    /// dropped. One lock for the whole poll.
    pub(crate) fn covered<'a>(&self, records: impl IntoIterator<Item = (&'a Arc<str>, i32, i64)>) -> Vec<bool> {
        let g = self.lock();
        records
            .into_iter()
            .map(|(t, p, o)| {
                g.index.owner(t, p, o).is_some() || g.own.get(&(t.clone(), p)).is_some_and(|s| s.contains(o))
            })
            .collect()
    }

    /// The pieces of `ranges` (intents of the current attempt) another claimant owns.
    pub(crate) fn lost(&self, ranges: &[LedgerRange]) -> Result<Vec<LedgerRange>> {
        let g = self.lock();
        let h = g.holdings.as_ref().ok_or_else(|| Error::Internal("claims checked before the attempt began".into()))?;
        Ok(g.index.lost(h, ranges))
    }

    /// The prefixes other than `prefix` whose intents name offsets `prefix` owns
    /// ([`ClaimIndex::reclaimers`]).
    pub(crate) fn reclaimers(&self, prefix: &str) -> BTreeSet<String> {
        self.lock().index.reclaimers(prefix)
    }

    /// Takes the queued replay work of `subtask` of `parallelism` for `topics`.
    pub(crate) fn take_replay(&self, subtask: u32, parallelism: u32, topics: &[String]) -> Vec<LedgerRange> {
        let mut g = self.lock();
        if g.queue.is_empty() {
            return Vec::new();
        }
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut g.queue)
            .into_iter()
            .partition(|r| topics.contains(&r.topic) && replay_owner(&r.topic, r.partition, parallelism) == subtask);
        g.queue = rest;
        mine
    }

    /// The replay work queued and not taken yet.
    pub(crate) fn queued(&self) -> Vec<LedgerRange> {
        self.lock().queue.clone()
    }

    /// The highest generation and epoch the intents of `prefix` name.
    pub(crate) fn highest(&self, prefix: &str) -> (Option<u32>, Option<u64>) {
        let g = self.lock();
        (g.index.highest_generation(prefix), g.index.highest_epoch(prefix))
    }
}
