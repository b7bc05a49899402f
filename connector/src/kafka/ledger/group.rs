//! [`GroupLedger`]: one process's live view of its share group's intents topic. A tailer
//! task reads the topic from its start in log order into a [`ClaimIndex`]; the
//! participant asks it whether a delivery is covered, whether its own intents lost, and
//! what it must replay. The rules are [`super::claims`]; this is the I/O around them.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::claims::{ClaimIndex, Holdings};
use super::entries::{replay_piece, Claimant, LedgerEntry, LedgerRange, LedgerSummary, RangeSet};
use super::log::LedgerLog;
use crate::kafka::client::{kafka_error, KafkaCluster};
use shareflow_checkpoint::CheckpointId;
use shareflow_share::{Error, ErrorKind, Result};

/// Partition key.
type Tp = (Arc<str>, i32);

/// How much the tailer's fetch asks the broker to gather before it answers, and how long
/// the broker may hold the fetch for it. Every poll of every source subtask writes an
/// intent (about 700 per million records of 1 KiB); answered as soon as one lands, each
/// could cost the broker a fetch of its own, and on a machine the job shares with the
/// broker that CPU is taken from the pipeline. Held up to 20 ms, a fetch carries the
/// intents of that time together (decision 0024). A checkpoint's prepare waits for the
/// tailer (once per checkpoint, for the checkpoint's last intent), so it waits up to
/// 20 ms more.
const TAIL_FETCH_MIN_BYTES: i32 = 64 << 10;
/// See [`TAIL_FETCH_MIN_BYTES`].
const TAIL_FETCH_MAX_WAIT: Duration = Duration::from_millis(20);

/// One intent of a share group's intents topic `{group}-intents`, as a tool or an
/// operator reads it: `by`'s source subtask `subtask` processes `ranges` in checkpoint
/// `checkpoint_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupIntent {
    /// The attempt that wrote it.
    pub by: Claimant,
    /// The checkpoint whose transaction carries the output.
    pub checkpoint_id: CheckpointId,
    /// The offsets it names.
    pub ranges: Vec<LedgerRange>,
}

impl KafkaCluster {
    /// Every intent the intents topic of share group `group` still holds, in log order
    /// (read once, from its start to its end). Once the topic was trimmed, that is the
    /// open intents of the summary it starts from, then every intent after it. A record
    /// that is not a ledger entry of the intents topic is an error of kind Data naming
    /// its offset: only shareflow instances of this group may write the topic.
    pub async fn group_intents(&self, group: &str) -> Result<Vec<GroupIntent>> {
        let topic = format!("{group}-intents");
        let mut reader = IntentsReader::default();
        let mut out = Vec::new();
        let mut from = vec![0];
        // A live instance may trim the topic while it is read: read on to an end
        // measured after the reader missed records (see `after_catch_up`).
        for _ in 0..CATCH_UP_ROUNDS {
            let (records, ends) = self.read_topic_from(&topic, false, &from).await?;
            for (_, offset, _, value) in records {
                let entry = decode_intents_entry(&topic, offset, value.as_deref().unwrap_or_default())?;
                for event in reader.feed(offset, entry) {
                    match event {
                        ReadEvent::Seed(s) => out.extend(s.open.into_iter().map(|i| GroupIntent {
                            by: i.by,
                            checkpoint_id: i.checkpoint_id,
                            ranges: i.ranges,
                        })),
                        ReadEvent::Entry(_, LedgerEntry::Intent { by, checkpoint_id, ranges, .. }) => {
                            out.push(GroupIntent { by, checkpoint_id, ranges })
                        }
                        ReadEvent::Entry(..) => {}
                    }
                }
            }
            let read_to = ends.first().copied().unwrap_or(0);
            let waiting = reader.waiting();
            let now = match waiting {
                Some(_) => self.end_offsets(&topic, false).await?.first().copied().unwrap_or(0),
                None => read_to,
            };
            match after_catch_up(waiting, read_to, now) {
                CatchUp::Done => return Ok(out),
                CatchUp::ReadTo(_) => from = vec![read_to],
                CatchUp::Unsummarised(start) => return Err(unsummarised(&topic, start)),
            }
        }
        match reader.waiting() {
            Some(start) => Err(unsummarised(&topic, start)),
            None => Ok(out),
        }
    }
}

/// A record of the intents topic `topic` at `offset`, decoded: an intent, a commit note
/// or a summary. Anything else is corruption, named by its offset.
fn decode_intents_entry(topic: &str, offset: i64, bytes: &[u8]) -> Result<LedgerEntry> {
    let corrupt =
        |reason: String| Error::Corrupt { path: format!("kafka topic {topic} partition 0 offset {offset}"), reason };
    match LedgerEntry::decode(bytes) {
        Ok(LedgerEntry::Commit { .. }) => Err(corrupt(
            "a commit entry in the intents topic, which holds intents, commit notes and summaries only; is another \
             application writing to it?"
                .into(),
        )),
        Ok(entry) => Ok(entry),
        Err(reason) => Err(corrupt(format!(
            "not a ledger entry: {reason}. The intents topic must be written by shareflow instances of this group only"
        ))),
    }
}

/// The error of an intents topic that starts at `start` > 0 with no summary of what
/// was below it.
fn unsummarised(topic: &str, start: i64) -> Error {
    Error::Corrupt {
        path: format!("kafka topic {topic} partition 0"),
        reason: format!(
            "the topic starts at offset {start}, but no summary of the entries below it follows: were its records \
             deleted by hand? The claims below it are gone; recreating the topic empty gives up exactly-once for \
             the work in flight"
        ),
    }
}

/// Rounds of [`GroupLedger::catch_up`] before a reader still waiting for a summary is
/// taken for corruption.
const CATCH_UP_ROUNDS: usize = 8;

/// What a catch-up does after its tailer read the intents topic up to `read_to` (the end
/// it measured), given the summary the reader still waits for, if any, and the topic's
/// end measured after that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CatchUp {
    /// Nothing is missing.
    Done,
    /// Read on to this end: the reader jumped over records another instance trimmed
    /// after `read_to` was measured, and the summary that explains the trim was written
    /// before it, so it lies below this end.
    ReadTo(i64),
    /// The reader starts at this offset with no summary of what was below it anywhere
    /// up to the end: the records were deleted by hand.
    Unsummarised(i64),
}

/// See [`CatchUp`]. Pure.
fn after_catch_up(waiting: Option<i64>, read_to: i64, end_now: i64) -> CatchUp {
    match waiting {
        None => CatchUp::Done,
        Some(_) if end_now > read_to => CatchUp::ReadTo(end_now),
        Some(start) => CatchUp::Unsummarised(start),
    }
}

/// What reading the intents topic yields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadEvent {
    /// Start from this summary: the index it describes replaces what was read before.
    Seed(LedgerSummary),
    /// Apply this intent or commit note, read at this offset.
    Entry(i64, LedgerEntry),
}

/// Turns the records of the intents topic, read in log order from wherever it starts,
/// into what to apply. Pure.
///
/// The topic's offsets are contiguous (no transactions write it, nothing compacts it).
/// A reader that starts at offset 0 applies every intent and note and skips summaries.
/// One that starts above 0, or finds records missing because the topic was trimmed past
/// it, holds back what it reads until a summary of everything below its start arrives
/// (one with `upto` at or above it), starts from that summary, and then applies what it
/// held back from `upto` on.
#[derive(Debug, Default)]
pub(crate) struct IntentsReader {
    /// The next offset expected; `None` before the first record.
    next: Option<i64>,
    /// Waiting for a summary: the offset it started or jumped to, and what it held back.
    waiting: Option<(i64, Vec<(i64, LedgerEntry)>)>,
    /// The highest `upto` of a summary it read.
    summarised: i64,
}

impl IntentsReader {
    /// The record at `offset` holds `entry`: what to apply now, in order.
    pub(crate) fn feed(&mut self, offset: i64, entry: LedgerEntry) -> Vec<ReadEvent> {
        let expected = self.next.unwrap_or(0);
        if offset < expected {
            return Vec::new(); // read before
        }
        if offset > expected {
            // Starts above 0, or trimmed past what was read: what came before is gone.
            self.waiting = Some((offset, Vec::new()));
        }
        self.next = Some(offset + 1);
        if let LedgerEntry::Summary(s) = &entry {
            self.summarised = self.summarised.max(s.upto);
        }
        match (&mut self.waiting, entry) {
            (None, LedgerEntry::Summary(_)) => Vec::new(),
            (None, entry) => vec![ReadEvent::Entry(offset, entry)],
            (Some((start, _)), LedgerEntry::Summary(s)) if s.upto >= *start => {
                let upto = s.upto;
                let held = self.waiting.take().map(|w| w.1).unwrap_or_default();
                let mut out = vec![ReadEvent::Seed(s)];
                out.extend(held.into_iter().filter(|(o, _)| *o >= upto).map(|(o, e)| ReadEvent::Entry(o, e)));
                out
            }
            (Some(_), LedgerEntry::Summary(_)) => Vec::new(),
            (Some((_, held)), entry) => {
                held.push((offset, entry));
                Vec::new()
            }
        }
    }

    /// The offset it started or jumped to, while it waits for a summary of what lies
    /// below.
    pub(crate) fn waiting(&self) -> Option<i64> {
        self.waiting.as_ref().map(|w| w.0)
    }

    /// The highest `upto` of the summaries read (0 if none).
    pub(crate) fn summarised(&self) -> i64 {
        self.summarised
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
    committed: BTreeSet<(Claimant, CheckpointId)>,
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
    /// The tailer's reading of the topic's order, trims and summaries.
    reader: IntentsReader,
    /// The index describes the entries below this offset.
    applied: i64,
}

impl Inner {
    /// Applies what the reader yields.
    fn apply(&mut self, event: ReadEvent) {
        let held = |g: &Inner, by: &Claimant| g.holdings.as_ref().is_some_and(|h| h.holds(by));
        match event {
            ReadEvent::Seed(summary) => {
                tracing::info!(upto = summary.upto, open = summary.open.len(), "intents: starting from a summary");
                self.index = ClaimIndex::from_summary(&summary);
                self.dirty |= self.holdings.is_some();
            }
            ReadEvent::Entry(_, LedgerEntry::Intent { by, checkpoint_id, ranges, .. }) => {
                self.index.apply(&by, checkpoint_id, &ranges);
                if held(self, &by) {
                    self.dirty = true;
                }
            }
            ReadEvent::Entry(_, LedgerEntry::Committed { by, checkpoint_id }) => {
                self.index.committed(&by, checkpoint_id)
            }
            // The decoder lets only intents, notes and summaries through, and the
            // reader never yields a summary as an entry.
            ReadEvent::Entry(..) => {}
        }
    }

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
    /// Writes commit notes and summaries (outside any transaction), as it writes intents.
    log: Arc<LedgerLog>,
    /// A compaction is running.
    compacting: AtomicBool,
    /// Ledger records the tailer read, and their value bytes.
    read_entries: AtomicU64,
    read_bytes: AtomicU64,
}

/// The largest summary written: a summary must fit the broker's default
/// `message.max.bytes` (1 MiB) with room for the batch framing.
const SUMMARY_MAX_BYTES: usize = 900 << 10;

/// What [`GroupLedger::compact`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compaction {
    /// The summary describes the intents topic below this offset, and the topic now
    /// starts there.
    pub upto: i64,
    /// The summary's size in bytes.
    pub summary_bytes: usize,
    /// The commits topic's new start offset, if it was trimmed.
    pub commits_start: Option<i64>,
}

/// How long a tailer may take to see that its session ended and close its consumer.
const TAILER_STOP_LIMIT: Duration = Duration::from_secs(5);

/// Waits for a tailer whose session ended, aborting it after [`TAILER_STOP_LIMIT`].
async fn end_tailer(mut handle: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(TAILER_STOP_LIMIT, &mut handle).await.is_err() {
        handle.abort();
    }
}

impl Drop for GroupLedger {
    fn drop(&mut self) {
        if let Some(h) = shareflow_share::sync::lock(&self.tailer).take() {
            h.abort();
        }
    }
}

impl GroupLedger {
    /// A ledger view on `cluster`, not tailing yet, writing its notes and summaries
    /// through `log`.
    pub(crate) fn new(cluster: KafkaCluster, log: Arc<LedgerLog>) -> Arc<Self> {
        Arc::new(Self {
            cluster,
            inner: Mutex::new(Inner::default()),
            position: tokio::sync::watch::channel(0).0,
            tailer: Mutex::new(None),
            log,
            compacting: AtomicBool::new(false),
            read_entries: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        shareflow_share::sync::lock(&self.inner)
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
        if let Some(old) = shareflow_share::sync::lock(&self.tailer).replace(handle) {
            // The old session's tailer sees the new session at its next poll and closes
            // its consumer; one that hangs is aborted.
            tokio::spawn(end_tailer(old));
        }
    }

    /// Stops tailing: the tailer closes its consumer (aborted if it takes longer than
    /// [`TAILER_STOP_LIMIT`]). [`start`](Self::start) tails again.
    pub(crate) async fn stop(&self) {
        self.lock().session += 1;
        let tailer = shareflow_share::sync::lock(&self.tailer).take();
        if let Some(handle) = tailer {
            end_tailer(handle).await;
        }
    }

    async fn tail(&self, topic: &str, session: u64) -> Result<()> {
        // Its own connections: its fetches wait for new intents, and on the job's
        // shared socket every intent write would queue behind them.
        let client = self.cluster.dedicated_client().await?;
        // From the log start: a fetch below it (the topic was trimmed past this reader)
        // restarts there, and the reader waits for the summary of what it missed.
        let consumer = client
            .consumer_without_group()
            .auto_offset_reset(krafka::consumer::AutoOffsetReset::Earliest)
            .fetch_min_bytes(TAIL_FETCH_MIN_BYTES)
            .fetch_max_wait(TAIL_FETCH_MAX_WAIT)
            .build()
            .await
            .map_err(|e| kafka_error(format!("tail the intents topic {topic}"), e))?;
        let followed = self.follow(&consumer, topic, session).await;
        let _ = tokio::time::timeout(TAILER_STOP_LIMIT, consumer.close()).await;
        followed
    }

    /// Reads `topic` with `consumer` into the ledger's view, while `session` is current.
    async fn follow(&self, consumer: &krafka::consumer::Consumer, topic: &str, session: u64) -> Result<()> {
        consumer.assign(topic, vec![0]).await.map_err(|e| kafka_error(format!("assign {topic}"), e))?;
        consumer.seek_to_beginning(topic, 0).await.map_err(|e| kafka_error(format!("seek {topic}"), e))?;
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
                    self.read_entries.fetch_add(1, Ordering::Relaxed);
                    self.read_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    let entry = decode_intents_entry(topic, r.offset, bytes)?;
                    for event in g.reader.feed(r.offset, entry) {
                        g.apply(event);
                    }
                    if g.reader.waiting().is_none() {
                        g.applied = r.offset + 1;
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
                // Published under the lock, and only while this session is current: a
                // `start` in between resets the position, and an old tailer must not
                // write its own over that.
                let g = self.lock();
                if g.session != session {
                    return Ok(());
                }
                self.position.send_if_modified(|old| {
                    let changed = *old != p;
                    *old = p;
                    changed
                });
                drop(g);
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
        let mut end = self.cluster.end_offsets(&topic, false).await?.first().copied().unwrap_or(0);
        // Each round reads to an end measured after the last: another instance's
        // compaction can trim the topic meanwhile, bounded by the instances' rounds.
        for _ in 0..CATCH_UP_ROUNDS {
            self.wait_past(end - 1, timeout).await?;
            let waiting = self.lock().reader.waiting();
            let now = match waiting {
                Some(_) => self.cluster.end_offsets(&topic, false).await?.first().copied().unwrap_or(0),
                None => end,
            };
            match after_catch_up(waiting, end, now) {
                CatchUp::Done => return Ok(()),
                CatchUp::ReadTo(next) => end = next,
                CatchUp::Unsummarised(start) => return Err(unsummarised(&topic, start)),
            }
        }
        match self.lock().reader.waiting() {
            Some(start) => Err(unsummarised(&topic, start)),
            None => Ok(()),
        }
    }

    /// Writes the note that `by` committed checkpoint `checkpoint_id` to the intents
    /// topic (outside any transaction; call it only once the commit is done).
    pub(crate) async fn write_note(&self, by: Claimant, checkpoint_id: CheckpointId) -> Result<()> {
        let topic = self.lock().topic.clone();
        let entry = LedgerEntry::Committed { by, checkpoint_id };
        self.log.write(&topic, &entry).await.map(drop)
    }

    /// The pairs of `committed` whose intents are still open here: their commit notes
    /// are missing (a crash came between the commit and its note).
    pub(crate) fn unnoted(&self, committed: &[(Claimant, CheckpointId)]) -> Vec<(Claimant, CheckpointId)> {
        self.lock().index.open_among(committed)
    }

    /// How many entries were read since the last summary (or the topic's start).
    pub(crate) fn unsummarised_entries(&self) -> i64 {
        let g = self.lock();
        g.applied - g.reader.summarised()
    }

    /// Ledger records the tailer read, and their bytes.
    pub(crate) fn read_stats(&self) -> (u64, u64) {
        (self.read_entries.load(Ordering::Relaxed), self.read_bytes.load(Ordering::Relaxed))
    }

    /// The index's size: intents still open, and ranges held.
    pub(crate) fn index_size(&self) -> (usize, usize) {
        let g = self.lock();
        (g.index.intent_count(), g.index.range_count())
    }

    /// Writes a summary of everything the tailer applied, trims the intents topic below
    /// it, and, given `commits` (this attempt's commits topic and prefix), trims the
    /// commits topic below the first commit entry still needed: one whose checkpoint has
    /// open intents here, or the last one (it carries the highest generation and
    /// checkpoint id).
    /// Returns `None` if a compaction is running already or the reader waits for a
    /// summary, or the summary would not fit one record.
    pub(crate) async fn compact(&self, commits: Option<(&str, &str)>) -> Result<Option<Compaction>> {
        if self.compacting.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        let result = self.compact_now(commits).await;
        self.compacting.store(false, Ordering::Release);
        result
    }

    async fn compact_now(&self, commits: Option<(&str, &str)>) -> Result<Option<Compaction>> {
        let (topic, summary) = {
            let g = self.lock();
            if g.reader.waiting().is_some() || g.applied == 0 {
                return Ok(None);
            }
            (g.topic.clone(), g.index.summary(g.applied))
        };
        let upto = summary.upto;
        let entry = LedgerEntry::Summary(summary);
        let summary_bytes = entry.encode()?.len();
        if summary_bytes > SUMMARY_MAX_BYTES {
            tracing::warn!(
                topic = %topic,
                bytes = summary_bytes,
                "the intents summary is too large for one record; the topic is not trimmed (is an instance dead and \
                 never adopted?)"
            );
            return Ok(None);
        }
        self.log.write(&topic, &entry).await?;
        self.cluster.delete_records(&topic, 0, upto).await?;
        let commits_start = match commits {
            Some((commits_topic, prefix)) => self.trim_commits(commits_topic, prefix).await?,
            None => None,
        };
        tracing::info!(topic = %topic, upto, summary_bytes, ?commits_start, "compacted the ledger");
        Ok(Some(Compaction { upto, summary_bytes, commits_start }))
    }

    /// Trims `prefix`'s commits topic `topic` below its first entry still needed.
    async fn trim_commits(&self, topic: &str, prefix: &str) -> Result<Option<i64>> {
        // Committed entries first, then the tailer caught up: every intent of a
        // checkpoint read here is durable before its commit, so the index has seen it.
        let entries: Vec<(i64, Claimant, CheckpointId)> = self
            .log
            .read_commits(topic, true)
            .await?
            .into_iter()
            .map(|(offset, generation, checkpoint_id, _)| (offset, Claimant::new(prefix, generation), checkpoint_id))
            .collect();
        self.catch_up(Duration::from_secs(60)).await?;
        let pairs: Vec<(Claimant, CheckpointId)> = entries.iter().map(|(_, c, e)| (c.clone(), *e)).collect();
        let needed: BTreeSet<(Claimant, CheckpointId)> = self.unnoted(&pairs).into_iter().collect();
        let first = entries.first().map(|e| e.0);
        let point = entries
            .iter()
            .filter(|(_, c, e)| needed.contains(&(c.clone(), *e)))
            .map(|e| e.0)
            .chain(entries.last().map(|e| e.0))
            .min();
        match (first, point) {
            (Some(first), Some(point)) if point > first => {
                Ok(Some(self.cluster.delete_records(topic, 0, point).await?))
            }
            _ => Ok(None),
        }
    }

    /// The current attempt is `me`: it holds its own earlier generations.
    pub(crate) fn set_me(&self, me: Claimant) {
        self.lock().holdings = Some(Holdings::new(me));
    }

    /// The current attempt now holds `adopted` (if any) and knows these committed
    /// checkpoints; plans and queues what it must replay. Returns how many ranges it queued.
    pub(crate) fn hold(
        &self,
        adopted: Option<&str>,
        committed: impl IntoIterator<Item = (Claimant, CheckpointId)>,
    ) -> usize {
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
            .map(|(t, p, o)| g.index.covered(t, p, o) || g.own.get(&(t.clone(), p)).is_some_and(|s| s.contains(o)))
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

    /// The highest generation and checkpoint id the intents of `prefix` name.
    pub(crate) fn highest(&self, prefix: &str) -> (Option<u32>, Option<CheckpointId>) {
        let g = self.lock();
        (g.index.highest_generation(prefix), g.index.highest_checkpoint_id(prefix))
    }
}

#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;
