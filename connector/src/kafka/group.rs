//! [`GroupLedger`]: one process's live view of its share group's intents topic. A tailer
//! task reads the topic from its start in log order into a [`ClaimIndex`]; the
//! participant asks it whether a delivery is covered, whether its own intents lost, and
//! what it must replay. The rules are [`super::claims`]; this is the I/O around them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::claims::{ClaimIndex, Claimant, Holdings};
use super::ledger::{replay_piece, LedgerEntry, LedgerRange, RangeSet};
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
    /// Replay work not yet taken by every source subtask.
    queue: Vec<Queued>,
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
        self.queue.extend(ranges.into_iter().map(|range| Queued { range, taken: BTreeSet::new(), parallelism: 0 }));
        n
    }
}

/// Takes the pieces of `subtask` of `parallelism` out of `queue`, for `topics`.
fn take_pieces(queue: &mut Vec<Queued>, subtask: u32, parallelism: u32, topics: &[String]) -> Vec<LedgerRange> {
    let parallelism = parallelism.max(1);
    let mut mine = Vec::new();
    for q in queue.iter_mut().filter(|q| topics.contains(&q.range.topic)) {
        if q.taken.insert(subtask) {
            q.parallelism = parallelism;
            mine.extend(replay_piece(&q.range, subtask, parallelism));
        }
    }
    queue.retain(|q| q.parallelism == 0 || q.taken.len() < q.parallelism as usize);
    mine
}

/// The pieces of `queue` no subtask took yet, in offset order.
fn pieces_left(queue: &[Queued]) -> Vec<LedgerRange> {
    let mut out = Vec::new();
    for q in queue {
        if q.parallelism == 0 {
            out.push(q.range.clone());
        } else {
            let left = (0..q.parallelism).filter(|s| !q.taken.contains(s));
            out.extend(left.filter_map(|s| replay_piece(&q.range, s, q.parallelism)));
        }
    }
    out.sort_by(|a, b| (&a.topic, a.partition, a.first).cmp(&(&b.topic, b.partition, b.first)));
    out
}

/// A range queued for replay, and the subtasks that took their piece of it.
#[derive(Debug)]
struct Queued {
    range: LedgerRange,
    taken: BTreeSet<u32>,
    /// The parallelism of the subtasks taking it; 0 until the first takes its piece.
    parallelism: u32,
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

    /// Takes the queued replay work of `subtask` of `parallelism` for `topics`: its
    /// piece of every queued range ([`replay_piece`]). A range leaves the queue once
    /// every subtask took its piece.
    pub(crate) fn take_replay(&self, subtask: u32, parallelism: u32, topics: &[String]) -> Vec<LedgerRange> {
        take_pieces(&mut self.lock().queue, subtask, parallelism, topics)
    }

    /// The replay work queued and not taken yet: the pieces no subtask took.
    pub(crate) fn queued(&self) -> Vec<LedgerRange> {
        pieces_left(&self.lock().queue)
    }

    /// The highest generation and epoch the intents of `prefix` name.
    pub(crate) fn highest(&self, prefix: &str) -> (Option<u32>, Option<u64>) {
        let g = self.lock();
        (g.index.highest_generation(prefix), g.index.highest_epoch(prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(topic: &str, first: i64, last: i64) -> Queued {
        Queued {
            range: LedgerRange { topic: topic.into(), partition: 0, first, last },
            taken: BTreeSet::new(),
            parallelism: 0,
        }
    }

    #[test]
    fn every_subtask_takes_its_piece_once_and_the_queue_empties() {
        let topics = vec!["in".to_string()];
        let mut queue = vec![queued("in", 0, 999), queued("in", 5_000, 5_000), queued("other", 0, 9)];
        let a = take_pieces(&mut queue, 1, 2, &topics);
        // Taking again returns nothing new.
        assert!(take_pieces(&mut queue, 1, 2, &topics).is_empty());
        // What is left is exactly what subtask 0 will take, and the other topic's range.
        let left = pieces_left(&queue);
        let b = take_pieces(&mut queue, 0, 2, &topics);
        let mut expected_left = b.clone();
        expected_left.push(LedgerRange { topic: "other".into(), partition: 0, first: 0, last: 9 });
        expected_left.sort_by_key(|r| (r.topic.clone(), r.first));
        assert_eq!(left, expected_left);
        // Both together cover the two ranges of "in" exactly, half of the long one each.
        let mut all: Vec<(i64, i64)> = a.iter().chain(&b).map(|r| (r.first, r.last)).collect();
        all.sort();
        assert_eq!(all, vec![(0, 499), (500, 999), (5_000, 5_000)]);
        // Only the range of a topic nobody took is left.
        assert_eq!(queue.len(), 1);
        assert_eq!(pieces_left(&queue), vec![LedgerRange { topic: "other".into(), partition: 0, first: 0, last: 9 }]);
    }
}
