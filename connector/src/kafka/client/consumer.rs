//! [`KafkaShareConsumer`]: the [`ShareConsumer`] contract over the wire to a real Kafka
//! 4.x broker (ShareGroupHeartbeat, ShareFetch with share sessions, ShareAcknowledge).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use krafka::share_consumer::{AcknowledgementMode as KafkaAckMode, ShareConsumer as Inner};
use krafka::ConsumerRecord;

use super::thread::ClientThread;
use super::{kafka_error, KafkaCluster};
use shareflow_share::{AcknowledgeType, MemberId, Record, ShareAcknowledgements, ShareConsumer, TransactionHandle};
use shareflow_share::{Error, ErrorKind, Result};

/// A poll size above what one share fetch can bring to a member of up to 5 partitions,
/// so that each poll takes a whole fetch: the `max_poll_records` of `shareflow run` and
/// `demo --kafka`, and of the pipeline in `kafka_bench`.
///
/// A share fetch asks for `max.poll.records` records, and the broker hands out whole
/// producer batches past it, so a fetch can bring more than a poll takes. A poll that
/// takes part of a fetch leaves the rest held for the next polls, and the exactly-once
/// source writes a ledger intent per poll (decision 0025). A fetch brings at most what
/// a member's partitions hold locked: `group.share.partition.max.record.locks` each,
/// 2,000 by default.
pub const WHOLE_FETCH_POLL_RECORDS: usize = 10_000;

/// Kafka's default acquisition lock (`group.share.record.lock.duration.ms`), for a
/// member that has not learnt the broker's yet.
const DEFAULT_LOCK: Duration = Duration::from_secs(30);

/// Settings of a [`KafkaShareConsumer`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KafkaShareConsumerConfig {
    /// The share group.
    pub group: String,
    /// Most records one share fetch asks for: the client's `max.poll.records`. The
    /// broker finishes a producer batch past it, and a poll hands out at most its own
    /// `max_records`: the consumer holds the rest for the next polls, still locked, and
    /// fetches again once every record of the fetch was handed out and settled. The
    /// acknowledgements of those polls then go with that fetch. Their locks run while
    /// they are held: what is still held half a lock duration (30 s by default) after
    /// the fetch goes back to the group, delivery count raised, so size a fetch to what
    /// the job handles in a few seconds.
    pub fetch_max_records: usize,
    /// How long the broker may hold a fetch open waiting for records.
    pub fetch_max_wait: Duration,
}

impl KafkaShareConsumerConfig {
    /// Defaults: fetches of 500 records (Kafka's default `max.poll.records`), held up to
    /// 100 ms.
    pub fn new(group: &str) -> Self {
        Self { group: group.to_string(), fetch_max_records: 500, fetch_max_wait: Duration::from_millis(100) }
    }
}

/// A delivered record's identity. It hashes its offset and partition only, with a
/// multiply-and-rotate hasher: a poll's records differ there, and the topic (one `Arc`
/// shared by every record of a fetch) is compared on a match, by pointer first.
#[derive(Debug, Clone)]
struct Key {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
}

/// True when `(topic, partition, offset)` `a` and `b` name the same record: offsets
/// first, and topics by pointer before their names.
fn same_record(a: (&Arc<str>, i32, i64), b: (&Arc<str>, i32, i64)) -> bool {
    a.2 == b.2 && a.1 == b.1 && (Arc::ptr_eq(a.0, b.0) || a.0 == b.0)
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        same_record((&self.topic, self.partition, self.offset), (&other.topic, other.partition, other.offset))
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64((self.offset as u64) ^ ((self.partition as u64) << 48));
    }
}

/// The hasher of [`Key`]: one multiplication by an odd constant and a rotation, enough to
/// spread consecutive offsets over a hash table's buckets. Not for untrusted keys: the
/// offsets come from the broker this member polled.
#[derive(Default)]
struct OffsetHasher(u64);

impl std::hash::Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(26);
    }
}

/// How this member settled a record, before the acknowledgement goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Accept,
    Release,
    Reject,
}

/// Where a record of the last fetch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Not settled: not handed out yet, or handed out and not acknowledged.
    Open,
    /// Settled by this member; the acknowledgement is not passed to the client yet.
    Pending(Settle),
    /// Settled and passed to the client (or its lock is gone with its partition).
    Done,
}

/// The records of the last share fetch, kept in the order the client returned them
/// (never moved or copied), with where each stands ([`Held`]).
///
/// A fetch can bring more than a poll hands out: polls hand its records out in order,
/// up to their `max_records` each, and the next fetch waits until every record was
/// handed out and settled. Acknowledgements wait here until then ([`Held::Pending`]),
/// and go to the client just before that fetch, which carries them, or at a commit or
/// close.
///
/// A record handed out is found by topic, partition and offset: first at the cursor,
/// where the next record in poll order is (the source settles a poll's records in that
/// order), and otherwise through a hash index of [`Key`]s built on the first lookup
/// that misses there. A poll settled in order never hashes; one whose ledger-covered
/// records are accepted before the fresh ones, or whose records are renewed first,
/// builds the index once per fetch.
#[derive(Default)]
struct Delivered {
    records: Vec<ConsumerRecord>,
    held: Vec<Held>,
    /// Records `..handed` were handed out (or skipped, settled).
    handed: usize,
    /// The member epoch of the fetch, or [`STALE_EPOCH`] when the membership moved
    /// around it.
    epoch: i32,
    /// When the fetch arrived.
    fetched_at: Option<std::time::Instant>,
    /// Records renewed since the last commit: the renewals go with it.
    renewing: Vec<usize>,
    /// Where the record after the last one looked up is.
    cursor: usize,
    index: std::sync::OnceLock<HashMap<Key, usize, std::hash::BuildHasherDefault<OffsetHasher>>>,
}

impl Delivered {
    /// Holds `records`, a new fetch's, all open and none handed out. Call it only once
    /// every record of the previous fetch was settled and passed on.
    fn replace(&mut self, records: Vec<ConsumerRecord>, epoch: i32, fetched_at: std::time::Instant) {
        self.fetched_at = Some(fetched_at);
        self.renewing.clear();
        self.held.clear();
        self.held.resize(records.len(), Held::Open);
        self.records = records;
        self.handed = 0;
        self.epoch = epoch;
        self.cursor = 0;
        self.index = std::sync::OnceLock::new();
    }

    /// Takes every record of the fetch out with where it stands, leaving nothing held:
    /// for the client's thread to give back the open ones and pass on the settled ones.
    fn take_fetch(&mut self) -> (Vec<ConsumerRecord>, Vec<Held>) {
        self.renewing.clear();
        self.handed = 0;
        self.cursor = 0;
        self.index = std::sync::OnceLock::new();
        (std::mem::take(&mut self.records), std::mem::take(&mut self.held))
    }

    /// Hands out the next open records, up to `max`, in fetch order.
    fn hand_out(&mut self, max: usize) -> Vec<Record> {
        let mut out = Vec::with_capacity(max.min(self.records.len() - self.handed));
        while self.handed < self.records.len() && out.len() < max {
            if self.held[self.handed] == Held::Open {
                out.push(to_record(&self.records[self.handed]));
            }
            self.handed += 1;
        }
        out
    }

    /// Records of the fetch not handed out yet.
    fn surplus(&self) -> usize {
        self.records.len() - self.handed
    }

    /// Acknowledgements not passed to the client yet.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.held.iter().filter(|h| matches!(h, Held::Pending(_))).count()
    }

    /// Records handed out and not settled yet.
    fn open(&self) -> usize {
        self.held[..self.handed].iter().filter(|h| **h == Held::Open).count()
    }

    /// The position of the open record handed out at `offset` of `topic`'s
    /// `partition`, if there is one.
    fn position(&self, topic: &Arc<str>, partition: i32, offset: i64) -> Option<usize> {
        let at_cursor = self
            .records
            .get(self.cursor)
            .is_some_and(|r| same_record((&r.topic, r.partition, r.offset), (topic, partition, offset)));
        let i = if at_cursor {
            self.cursor
        } else {
            let index = self.index.get_or_init(|| {
                let mut index = HashMap::with_capacity_and_hasher(self.records.len(), Default::default());
                for (i, r) in self.records.iter().enumerate() {
                    index.insert(Key { topic: r.topic.clone(), partition: r.partition, offset: r.offset }, i);
                }
                index
            });
            *index.get(&Key { topic: topic.clone(), partition, offset })?
        };
        (i < self.handed && self.held[i] == Held::Open).then_some(i)
    }

    /// Marks the record at `i` as looked up and moves it to `to`.
    fn mark(&mut self, i: usize, to: Held) {
        self.cursor = i + 1;
        self.held[i] = to;
    }

    /// The acknowledgements not passed to the client yet, in fetch order, each marked
    /// [`Held::Done`] as it is taken.
    fn take_pending(&mut self) -> impl Iterator<Item = (&ConsumerRecord, Settle)> + '_ {
        self.records.iter().zip(self.held.iter_mut()).filter_map(|(r, h)| match *h {
            Held::Pending(s) => {
                *h = Held::Done;
                Some((r, s))
            }
            _ => None,
        })
    }
}

/// The epoch a fetch is stamped with when the membership moved around it (the member
/// was fenced, or a new assignment came while it held partitions): no epoch equals it,
/// so what the fetch left held goes back instead of out.
const STALE_EPOCH: i32 = -1;

/// A share-group member on a real Kafka broker, in explicit acknowledgement mode.
///
/// Kafka's rule holds: every record a poll returned must be settled (ACCEPT, RELEASE
/// or REJECT) before the next poll; RENEW keeps the lock and leaves it unsettled, and
/// goes to the broker with the next commit, which reports a renewal the broker refused
/// (a lock that expired). A share fetch may bring more than a poll hands out
/// (see [`KafkaShareConsumerConfig::fetch_max_records`]); ACCEPT, RELEASE and REJECT
/// wait until every record of the fetch was handed out and settled, and ride on the
/// next ShareFetch, or go at once with [`commit`](ShareConsumer::commit). A member
/// that stops without [`close`](ShareConsumer::close) or a commit loses the
/// acknowledgements it kept: their records come back when their locks expire. KIP-1289 transactional acknowledgement does not
/// exist on stock brokers: [`acknowledge_batches_transactional`](ShareConsumer::acknowledge_batches_transactional)
/// fails with a message saying so.
pub struct KafkaShareConsumer {
    config: KafkaShareConsumerConfig,
    inner: Inner,
    /// Where the client lives, and where each fetch runs with what goes before it.
    client: ClientThread,
    /// The fetch under way on the client's thread: set while a poll waits for it, and
    /// left by a poll dropped before it ended, for the next poll (or the commit or close)
    /// to take its records.
    fetching: Option<tokio::task::JoinHandle<Fetched>>,
    member: MemberId,
    delivered: Delivered,
    /// Records whose partition the group took from this member before they were
    /// settled: in all, and since the last poll.
    revoked: u64,
    revoked_since_poll: u64,
}

impl std::fmt::Debug for KafkaShareConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaShareConsumer")
            .field("group", &self.config.group)
            .field("member", &self.member)
            .field("unsettled", &self.delivered.open())
            .field("held", &self.delivered.surplus())
            .finish_non_exhaustive()
    }
}

impl KafkaShareConsumer {
    /// A member of `config.group` on `cluster`. It joins on [`subscribe`](ShareConsumer::subscribe).
    pub async fn new(cluster: &KafkaCluster, config: KafkaShareConsumerConfig) -> Result<Self> {
        if config.fetch_max_records == 0 || config.fetch_max_records > i32::MAX as usize {
            return Err(Error::InvalidConfig {
                key: "fetch_max_records (max.poll.records)".into(),
                value: config.fetch_max_records.to_string(),
                rule: format!("must be between 1 and {}", i32::MAX),
            });
        }
        // Its own connections, as each Java client has: a share fetch waits up to
        // `fetch_max_wait` for records, and on the job's shared socket the intent
        // writes and the sink's produces would queue behind it.
        let client = ClientThread::start(&config.group)?;
        let (cluster, settings) = (cluster.clone(), config.clone());
        let inner = client
            .run(async move {
                let kafka = cluster.dedicated_client().await?;
                kafka
                    .share_consumer(settings.group.clone())
                    .acknowledgement_mode(KafkaAckMode::Explicit)
                    .max_poll_records(settings.fetch_max_records as i32)
                    .fetch_max_wait(settings.fetch_max_wait)
                    .build()
                    .await
                    .map_err(|e| kafka_error(format!("create share consumer of group {}", settings.group), e))
            })
            .await??;
        Ok(Self {
            config,
            inner,
            client,
            fetching: None,
            member: MemberId(String::new()),
            delivered: Delivered::default(),
            revoked: 0,
            revoked_since_poll: 0,
        })
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.config.group
    }

    /// Records handed out by the last poll and not settled yet.
    pub fn unsettled(&self) -> usize {
        self.delivered.open()
    }

    /// Records of the last fetch not handed out yet: the next polls hand them out
    /// before the member fetches again.
    pub fn held(&self) -> usize {
        self.delivered.surplus()
    }

    /// The partitions the group's coordinator assigned this member, by topic: empty
    /// until a heartbeat brought an assignment. A new share group assigns a partition
    /// only once its state is initialised, so a member's first assignment can take one
    /// heartbeat interval.
    pub fn assignment(&self) -> std::collections::BTreeMap<String, Vec<i32>> {
        self.inner
            .assignment()
            .into_iter()
            .map(|(topic, mut partitions)| {
                partitions.sort_unstable();
                (topic, partitions)
            })
            .collect()
    }

    /// Records delivered to this member whose partition the group then assigned
    /// elsewhere before their acknowledgements reached the client (another member
    /// joined, say), or whose locks went with a fence. Their acknowledgements cannot be
    /// sent any more: they settle locally, are counted when they are passed on (at the
    /// next fetch, renewal, commit or close), and the broker gives the records back to
    /// the group, delivery count raised, when their locks expire (at once after a
    /// fence). The exactly-once source covers them through its ledger.
    pub fn revoked_unsettled(&self) -> u64 {
        self.revoked
    }

    /// The member epoch the coordinator last gave this member: 0 before it joined (and
    /// while it rejoins after a fence). A member's epoch is the group epoch of the
    /// assignment it holds, so a member whose epoch is below another's holds an
    /// assignment that does not count the members that joined since.
    pub fn member_epoch(&self) -> i32 {
        self.inner.member_epoch()
    }

    /// Sends a heartbeat at once rather than at the next interval, and installs the
    /// assignment it brings: a member learns of a newer assignment without waiting up to
    /// a heartbeat interval (5 s by default). For use before the first poll, as
    /// [`JoinGate`](super::JoinGate) does: partitions taken away by it lose no records
    /// then.
    pub async fn heartbeat_now(&mut self) -> Result<()> {
        let topics = self.inner.subscription();
        if topics.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "group {}: heartbeat before subscribe; subscribe to the topics first",
                self.config.group
            )));
        }
        // Subscribing again to the same topics sends the joining heartbeat with the
        // current member id and epoch: the coordinator answers with the member's
        // current assignment, and the group epoch does not change.
        let inner = self.inner.clone();
        self.client
            .run(async move { inner.subscribe(topics.iter()).await })
            .await?
            .map_err(|e| kafka_error(format!("heartbeat in group {}", self.config.group), e))
    }

    /// The acquisition lock duration the broker reported, once known.
    pub fn lock_duration(&self) -> Option<Duration> {
        self.inner.acquisition_lock_timeout()
    }

    /// Sends buffered acknowledgements and returns the partitions whose
    /// acknowledgements the broker refused, with the reason (a lock that expired:
    /// INVALID_RECORD_STATE). Transport failures are errors.
    pub async fn commit_outcome(&mut self) -> Result<Vec<(String, i32, String)>> {
        self.finish_fetch().await?;
        // The renewals and acknowledgements kept since the last fetch or commit go to
        // the client on its thread, with the commit: it waits for every one of them.
        // Handed over from here, the client's request manager could send and settle
        // some before the commit began waiting, and their refusals would go unseen.
        let mut renewing = std::mem::take(&mut self.delivered.renewing);
        renewing.sort_unstable();
        renewing.dedup();
        let renew: Vec<(usize, ConsumerRecord)> = renewing
            .into_iter()
            .filter(|&i| self.delivered.held[i] == Held::Open)
            .map(|i| (i, self.delivered.records[i].clone()))
            .collect();
        let settle: Vec<(ConsumerRecord, Settle)> =
            self.delivered.take_pending().map(|(r, settle)| (r.clone(), settle)).collect();
        let (inner, epoch) = (self.inner.clone(), self.delivered.epoch);
        let (refused, results) = self
            .client
            .run(async move {
                let renewals = renew.into_iter().map(|(i, r)| (r, Ack::Renew(i)));
                let settled = settle.into_iter().map(|(r, s)| (r, Ack::Settle(s)));
                let refused: Vec<Refused> =
                    renewals.chain(settled).filter_map(|(r, what)| pass(&inner, epoch, r, what)).collect();
                (refused, inner.commit().await)
            })
            .await?;
        self.refusals(refused)?;
        let results = results.map_err(|e| kafka_error(format!("acknowledge in group {}", self.config.group), e))?;
        let mut refused = Vec::new();
        for (tp, r) in results {
            if let Err(e) = r {
                refused.push((tp.topic.to_string(), tp.partition, e.to_string()));
            }
        }
        Ok(refused)
    }

    /// True while `record`, handed out by the last poll, is not settled: not accepted,
    /// released or rejected, and its partition not taken away.
    pub fn is_unsettled(&self, record: &Record) -> bool {
        self.delivered.position(&record.topic, record.partition, record.offset).is_some()
    }

    /// Counts a record whose partition was taken away before its acknowledgement
    /// reached the client.
    fn count_revoked(&mut self) {
        self.revoked += 1;
        self.revoked_since_poll += 1;
    }

    /// Waits for the fetch under way on the client's thread, if there is one, and holds
    /// its records. Cancel safe: dropped, the fetch stays under way for the next call.
    async fn finish_fetch(&mut self) -> Result<()> {
        let Some(task) = self.fetching.as_mut() else { return Ok(()) };
        let joined = self.client.joined(task).await;
        self.fetching = None;
        let fetched = joined?;
        self.refusals(fetched.refused)?;
        let got = match fetched.polled {
            Some(Ok(got)) => got,
            Some(Err(e)) => return Err(kafka_error(format!("poll share group {}", self.config.group), e)),
            None => Vec::new(),
        };
        if fetched.member != self.member.0 {
            self.member = MemberId(fetched.member);
        }
        self.delivered.replace(got, fetched.epoch, fetched.at);
        Ok(())
    }

    /// Counts the records the client refused because it forgot them (settling a
    /// renewed one), and returns the first other refusal as an error naming its record.
    fn refusals(&mut self, refused: Vec<Refused>) -> Result<()> {
        let mut first_error = None;
        for Refused { record: r, what, error, forgotten } in refused {
            if forgotten {
                self.count_revoked();
                if let Ack::Renew(i) = what {
                    self.delivered.held[i] = Held::Done;
                }
            } else if first_error.is_none() {
                let what = match what {
                    Ack::Settle(settle) => format!("{settle:?}"),
                    Ack::Renew(_) => "Renew".into(),
                };
                let op = format!("{what} {}-{}@{} in group {}", r.topic, r.partition, r.offset, self.config.group);
                first_error = Some(kafka_error(op, error));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// True when `topic`'s `partition` was taken from the member of `inner` while it stayed a
/// member (its epoch is above 0, and its assignment lacks the partition): its locks then
/// stay held until they expire. A fence is told by the epoch moving instead
/// ([`forgotten`]).
fn revoked_partition(inner: &Inner, topic: &str, partition: i32) -> bool {
    inner.member_epoch() > 0 && !inner.assignment().get(topic).is_some_and(|partitions| partitions.contains(&partition))
}

/// True when the client refused to acknowledge a record of `topic`'s `partition`, from a
/// fetch of member epoch `fetch_epoch`, with `e` because it forgot the record: the client
/// forgets the unsettled records of a partition the group took away, or of every
/// partition at a fence (the membership moved since the fetch). Nothing can settle them
/// but their locks' expiry, or the fence, which released them.
fn forgotten(inner: &Inner, fetch_epoch: i32, e: &krafka::KrafkaError, topic: &str, partition: i32) -> bool {
    matches!(e, krafka::KrafkaError::IllegalState { .. })
        && (inner.member_epoch() != fetch_epoch || revoked_partition(inner, topic, partition))
}

/// An acknowledgement handed to the client: a settlement, or the renewal of the record
/// at a place in the fetch.
#[derive(Debug, Clone, Copy)]
enum Ack {
    Settle(Settle),
    /// The renewal of the record at this place in the fetch, to settle it if the
    /// client forgot it.
    Renew(usize),
}

/// An acknowledgement the client refused on the client's thread.
struct Refused {
    record: ConsumerRecord,
    what: Ack,
    error: krafka::KrafkaError,
    /// The client forgot the record ([`forgotten`]): counted, not an error.
    forgotten: bool,
}

/// What a fetch on the client's thread did.
struct Fetched {
    refused: Vec<Refused>,
    /// The poll's records; `None` when a refused acknowledgement stopped it.
    polled: Option<std::result::Result<Vec<ConsumerRecord>, krafka::KrafkaError>>,
    /// The member epoch the records are stamped with ([`STALE_EPOCH`] if the membership
    /// moved around the poll).
    epoch: i32,
    member: String,
    /// When the client handed the records over.
    at: std::time::Instant,
}

impl Settle {
    /// Hands this acknowledgement of `r` to the client.
    fn send(self, inner: &Inner, r: &ConsumerRecord) -> std::result::Result<(), krafka::KrafkaError> {
        match self {
            Settle::Accept => inner.ack(r),
            Settle::Release => inner.release(r),
            Settle::Reject => inner.reject(r),
        }
    }
}

/// Hands `what` of `r` to the client, returning what it refused, if anything.
fn pass(inner: &Inner, fetch_epoch: i32, r: ConsumerRecord, what: Ack) -> Option<Refused> {
    let sent = match what {
        Ack::Settle(settle) => settle.send(inner, &r),
        Ack::Renew(_) => inner.renew(&r),
    };
    let error = sent.err()?;
    let forgotten = forgotten(inner, fetch_epoch, &error, &r.topic, r.partition);
    Some(Refused { record: r, what, error, forgotten })
}

/// Gives back the open records of a fetch taken out of [`Delivered`] and passes its
/// settled ones on, returning what the client refused. A record the client forgot with
/// its partition is not this member's to release.
fn settle_fetch(inner: &Inner, (records, held): (Vec<ConsumerRecord>, Vec<Held>), fetch_epoch: i32) -> Vec<Refused> {
    let mut refused = Vec::new();
    for (r, h) in records.into_iter().zip(held) {
        match h {
            Held::Open => {
                let _ = inner.release(&r);
            }
            Held::Done => {}
            Held::Pending(settle) => refused.extend(pass(inner, fetch_epoch, r, Ack::Settle(settle))),
        }
    }
    refused
}

/// On the client's thread, in this order and with nothing else running there between
/// them: gives back the open records of the last fetch, passes its settled ones on, and
/// polls, so that the client's request manager finds them all when it plans the fetch
/// and sends them with it. A refused acknowledgement that is not a forgotten record
/// stops it before the poll.
async fn settle_and_fetch(
    inner: Inner,
    fetch: (Vec<ConsumerRecord>, Vec<Held>),
    fetch_epoch: i32,
    timeout: Duration,
) -> Fetched {
    // Only what was never handed out is open here (a poll refuses to start while a
    // record handed out is open): it goes back rather than out.
    let refused = settle_fetch(&inner, fetch, fetch_epoch);
    let (before, held_partitions) = (inner.member_epoch(), !inner.assignment().is_empty());
    let polled = if refused.iter().all(|r| r.forgotten) { Some(inner.poll(timeout).await) } else { None };
    // Read as soon as the client hands the records over. A fetch is stale when the
    // member was fenced (epoch 0 until it rejoins), or its epoch moved during the poll
    // while it held partitions: records of a partition it lost, or acquired before a
    // fence, may be among them. A first fetch waits for the member's first assignment,
    // whose epoch this is.
    let at = std::time::Instant::now();
    let after = inner.member_epoch();
    let epoch = if after <= 0 || (after != before && held_partitions) { STALE_EPOCH } else { after };
    Fetched { refused, polled, epoch, member: inner.member_id(), at }
}

pub(crate) fn to_record(r: &ConsumerRecord) -> Record {
    Record {
        // The fetch's own topic name: every record of it shares the one allocation.
        topic: r.topic.clone(),
        partition: r.partition,
        offset: r.offset,
        key: r.key.clone(),
        value: r.value.clone(),
        timestamp_ms: r.timestamp,
        delivery_count: r.delivery_count.unwrap_or(1),
        headers: r.headers.iter().map(|(k, v)| (k.clone(), v.clone().unwrap_or_default())).collect(),
    }
}

/// How long a subscribe waits for a group coordinator that is not ready yet.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(30);

#[async_trait]
impl ShareConsumer for KafkaShareConsumer {
    fn member_id(&self) -> &MemberId {
        &self.member
    }

    async fn subscribe(&mut self, topics: &[&str]) -> Result<()> {
        // A coordinator that is not ready yet (a new cluster, a group whose coordinator
        // moved) answers the first heartbeat with an error that asking again clears:
        // wait it out for a bounded time, as Kafka's clients do.
        let deadline = std::time::Instant::now() + SUBSCRIBE_WAIT;
        let mut backoff = Duration::from_millis(100);
        loop {
            let (inner, names): (Inner, Vec<String>) =
                (self.inner.clone(), topics.iter().map(|t| t.to_string()).collect());
            match self.client.run(async move { inner.subscribe(names).await }).await? {
                Ok(()) => break,
                Err(e) if super::error::coordinator_not_ready(&e) && std::time::Instant::now() < deadline => {
                    tracing::info!(group = %self.config.group, error = %e, "the group's coordinator is not ready; asking again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(kafka_error(format!("subscribe group {} to {topics:?}", self.config.group), e)),
            }
        }
        self.member = MemberId(self.inner.member_id());
        Ok(())
    }

    async fn poll(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<Record>> {
        if self.revoked_since_poll > 0 {
            tracing::info!(
                group = %self.config.group,
                records = self.revoked_since_poll,
                "records of partitions assigned to another member before they were settled; the broker gives them \
                 back when their locks expire"
            );
            self.revoked_since_poll = 0;
        }
        if max_records == 0 {
            return Err(Error::InvalidRequest(format!(
                "group {}: a poll of 0 records; ask for at least 1",
                self.config.group
            )));
        }
        let open = self.delivered.open();
        if open > 0 {
            return Err(Error::InvalidRequest(format!(
                "group {}: {open} records of the previous poll are not settled; ACCEPT, RELEASE or REJECT each before \
                 polling again",
                self.config.group,
            )));
        }
        if self.fetching.is_none() && self.delivered.surplus() > 0 {
            // Half the lock is what a record handed out has left at least, as the
            // exactly-once source's intents need. Otherwise the member's assignment
            // changed since the fetch (or it was fenced and its locks are gone), or the
            // fetch is old: what it holds goes back with the next fetch rather than out,
            // since its partition may be another member's now, or its locks about to
            // expire.
            let lock = self.inner.acquisition_lock_timeout().unwrap_or(DEFAULT_LOCK);
            let fresh = self.delivered.fetched_at.is_some_and(|at| at.elapsed() < lock / 2);
            if fresh && self.inner.member_epoch() == self.delivered.epoch {
                let out = self.delivered.hand_out(max_records);
                if !out.is_empty() {
                    return Ok(out);
                }
            }
        }
        if self.fetching.is_none() {
            let (inner, epoch) = (self.inner.clone(), self.delivered.epoch);
            let fetch = self.delivered.take_fetch();
            self.fetching = Some(self.client.spawn(settle_and_fetch(inner, fetch, epoch, timeout)));
        }
        self.finish_fetch().await?;
        Ok(self.delivered.hand_out(max_records))
    }

    async fn acknowledge(&mut self, record: &Record, ack_type: AcknowledgeType) -> Result<()> {
        let Some(i) = self.delivered.position(&record.topic, record.partition, record.offset) else {
            return Err(Error::InvalidRequest(format!(
                "group {}: {}-{}@{} was not delivered to this member by its last poll, or is settled already",
                self.config.group, record.topic, record.partition, record.offset
            )));
        };
        let to = match ack_type {
            AcknowledgeType::Accept => Held::Pending(Settle::Accept),
            AcknowledgeType::Release => Held::Pending(Settle::Release),
            AcknowledgeType::Reject => Held::Pending(Settle::Reject),
            AcknowledgeType::Renew => {
                self.delivered.renewing.push(i);
                Held::Open
            }
        };
        self.delivered.mark(i, to);
        Ok(())
    }

    async fn acknowledge_batches_transactional(
        &mut self,
        acks: &ShareAcknowledgements,
        txn: &TransactionHandle,
    ) -> Result<()> {
        Err(Error::Kafka {
            op: format!("acknowledge {} records into {}", acks.record_count(), txn.id),
            reason: "stock Kafka brokers do not implement KIP-1289 transactional acknowledgements; \
                     use KafkaShareSource with KafkaTransactions, which reaches exactly-once through the ledger"
                .into(),
            kind: ErrorKind::Invalid,
            source: None,
        })
    }

    async fn commit(&mut self) -> Result<()> {
        let refused = self.commit_outcome().await?;
        if let Some((topic, partition, reason)) = refused.first() {
            return Err(Error::Kafka {
                op: format!("acknowledge {topic}-{partition} in group {}", self.config.group),
                reason: format!("the broker refused it: {reason} (did the acquisition lock expire?)"),
                kind: ErrorKind::Invalid,
                source: None,
            });
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        // A fetch under way ends first, so that its records go back too. The kept
        // acknowledgements go with the close; unsettled records, handed out or held, go
        // back at once rather than waiting for their locks.
        let fetched = self.finish_fetch().await;
        let (inner, epoch) = (self.inner.clone(), self.delivered.epoch);
        let fetch = self.delivered.take_fetch();
        let (refused, closed) = self
            .client
            .run(async move {
                let refused = settle_fetch(&inner, fetch, epoch);
                (refused, inner.close().await)
            })
            .await?;
        let passed = self.refusals(refused);
        let closed = closed.map_err(|e| kafka_error(format!("close member of group {}", self.config.group), e));
        fetched.and(passed).and(closed)
    }
}

#[cfg(test)]
#[path = "consumer_tests.rs"]
mod tests;
