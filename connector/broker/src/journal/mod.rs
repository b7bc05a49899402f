//! The broker's durable journal on an `object_store`.
//!
//! Layout under the broker's root:
//! - `wal/{first_lsn:020}.seg`: one object per group commit, holding one envelope
//!   frame per entry, each `(lsn, entry)` in postcard;
//! - `snapshot/{lsn:020}.snap`: the whole state as of `lsn`, in postcard, cut into
//!   envelope frames of at most 64 MiB behind a first frame that gives the total length
//!   and the frame count (older snapshots are one frame, which limited them to 1 GiB).
//!
//! Every state a process kill can leave opens again (decision 0002, "Kills"): a torn or
//! empty last segment is cut back (or removed) with a warning, an unfinished snapshot
//! upload is a temporary file that is ignored and removed, and on a local directory
//! under [`Durability::Fsync`] a snapshot, a truncation and every file creation or
//! removal are fsynced (file and directory) before anything relies on them.
//!
//! Object stores have no append, so on them a group commit writes a new segment. On a
//! local directory the journal appends to an open segment file instead (and rolls it
//! at 64 MiB or a snapshot): creating a file costs about 0.5 ms here, appending about
//! 1 us, `fdatasync` about 0.1 ms. Recovery, snapshots and deletion go through
//! `object_store` either way. Callers
//! append under the state lock (so log order is apply order) and then
//! [`sync`](Journal::sync): the first waiter becomes the writer for everything
//! buffered so far, the rest wait for it. A failed write poisons the journal: memory is
//! then ahead of storage, so every later call fails until the broker is reopened.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use shareflow_checkpoint::envelope::{self, Magic};
use tokio::sync::watch;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

mod appender;
mod records;
mod recovery;
mod snapshot_file;

pub use appender::Durability;
use appender::{sync_dir, Appender};
use records::RecordIndex;
use snapshot_file::{decode_snapshot, snapshot_frames, snapshot_payload};

use super::fault::{self, Faults};
use super::log::{BatchData, LogBatch};
use super::state::{BrokerState, Command, Entry};
use shareflow_share::TopicPartition;
use shareflow_share::{Error, Result};

const ENTRY_MAGIC: Magic = Magic(*b"SFJE");
const SNAPSHOT_MAGIC: Magic = Magic(*b"SFJS");
/// 2: transaction keys never reused, retention, members with a mode (decision 0002).
/// 3: `Trim` entries of topic retention. 4: `Append` entries, whose batch buffers stay
/// in the segments (decision 0020). Versions 2-4 read alike.
const FORMAT_VERSION: u16 = 4;
/// A snapshot cut into frames (see [`snapshot_frames`]), with its records inline.
/// Readers accept the single frame of versions 2 and 3 too.
const SNAPSHOT_FRAMES_VERSION: u16 = 4;
/// A framed snapshot of metadata only: the state, whose batches point into segments,
/// and the record index that says where (decision 0020).
const SNAPSHOT_META_VERSION: u16 = 5;
/// A snapshot starts at the latest once this many journal bytes were written since the
/// last one, records included: it bounds what a reopen replays.
pub(crate) const REPLAY_BOUND_BYTES: u64 = 256 << 20;

/// What a broker's options set in its journal beyond where it lives.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    /// Fault points armed (tests).
    pub(crate) faults: Faults,
    /// See [`REPLAY_BOUND_BYTES`].
    pub(crate) replay_bound_bytes: u64,
}

impl Default for Tuning {
    /// The defaults, but for what the environment sets for crash campaigns:
    /// `SHAREFLOW_CRASH_AT` (see [`Faults::from_env`]) and
    /// `SHAREFLOW_BROKER_SNAPSHOT_BYTES` (the replay bound, so that a short run takes
    /// snapshots).
    fn default() -> Self {
        let replay_bound_bytes = std::env::var("SHAREFLOW_BROKER_SNAPSHOT_BYTES")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(REPLAY_BOUND_BYTES, |b| b.max(1));
        Self { faults: Faults::from_env(), replay_bound_bytes }
    }
}
/// The batches read from segments that are kept in memory for the next reads.
const READ_CACHE_BYTES: usize = 64 << 20;
/// The largest frame of a snapshot's payload.
const SNAPSHOT_FRAME_BYTES: usize = 64 << 20;

/// Log sequence number of a journal entry; the first entry is 1.
pub(crate) type Lsn = u64;

#[derive(Debug)]
struct Buffered {
    bytes: Vec<u8>,
    first_lsn: Lsn,
    next_lsn: Lsn,
    writing: bool,
    failed: Option<Error>,
    /// (first, last) lsn of each segment written since the last snapshot.
    segments: Vec<(Lsn, Lsn)>,
    bytes_since_snapshot: u64,
    /// Of those, the bytes of batch buffers that stay in the segments.
    record_bytes_since_snapshot: u64,
    last_snapshot_bytes: u64,
    /// The lsn of the last snapshot (0: none).
    last_snapshot_lsn: Lsn,
    snapshotting: bool,
    /// Batch buffers in `bytes`: (lsn, position in `bytes`, length).
    blobs: Vec<(Lsn, usize, u32)>,
    /// Raised by each [`reload`](JournalCore::reload): the entries of an older
    /// generation that were not durable are lost, and their lsns are given again.
    generation: u64,
    /// The failure that the last reload recovered from: what a caller still waiting on
    /// a lost entry of an older generation gets.
    lost: Option<Error>,
    /// For each generation that ended, its last durable lsn: its entries up to there
    /// are kept, the rest were lost.
    kept: Vec<Lsn>,
}

/// An entry the journal took: its lsn in the journal's generation at the time, as
/// [`JournalCore::append`] returns it; [`Journal::sync`] waits for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    pub(crate) lsn: Lsn,
    generation: u64,
}

/// Where a stored batch buffer lies: `len` bytes from byte `pos` of the segment whose
/// first lsn is `segment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Loc {
    pub(crate) segment: Lsn,
    pub(crate) pos: u64,
    pub(crate) len: u32,
}

impl Journal {
    /// Returns once the entry is durable, writing the pending group commit if nobody
    /// is. An entry of an older generation than the journal's (lost in a
    /// [`reload`](JournalCore::reload)) is an error, even once a newer entry with its
    /// lsn is durable.
    pub(crate) async fn sync(&self, written: Written) -> Result<()> {
        let Written { lsn, generation } = written;
        let mut rx = self.durable.subscribe();
        loop {
            let job = {
                let mut b = self.lock()?;
                if b.generation != generation {
                    return match b.kept.get(generation as usize) {
                        Some(&kept) if lsn <= kept => Ok(()),
                        _ => Err(b.lost.clone().unwrap_or_else(|| Error::Internal("journal entry lost".into()))),
                    };
                }
                if *rx.borrow_and_update() >= lsn {
                    return Ok(());
                }
                if let Some(e) = &b.failed {
                    return Err(e.clone());
                }
                if !b.writing && !b.bytes.is_empty() {
                    b.writing = true;
                    let first = b.first_lsn;
                    let last = b.next_lsn - 1;
                    b.first_lsn = b.next_lsn;
                    Some((first, last, std::mem::take(&mut b.bytes), std::mem::take(&mut b.blobs)))
                } else {
                    None
                }
            };
            match job {
                Some((first, last, bytes, blobs)) => {
                    let core = self.core.clone();
                    tokio::spawn(async move { core.write_segment(first, last, bytes, blobs).await })
                        .await
                        .map_err(|e| Error::Internal(format!("journal writer task failed: {e}")))??
                }
                None => {
                    if rx.changed().await.is_err() {
                        return Err(Error::Closed { what: "journal".into() });
                    }
                }
            }
        }
    }

    /// Encodes `state` (every entry up to `lsn`) and writes it as a snapshot (see
    /// [`JournalCore::write_snapshot`]) in a task of its own, without waiting for it:
    /// the caller never waits the seconds a large snapshot takes. The encoding runs on
    /// a blocking thread. The claim taken with [`begin_snapshot`](Self::begin_snapshot)
    /// is released when the task ends, however it ends; a failure is logged and the next
    /// write tries again.
    pub(crate) fn snapshot_detached(&self, written: Written, state: BrokerState) {
        let journal = self.clone();
        let lsn = written.lsn;
        tokio::spawn(async move {
            let result = async {
                // Every batch of the state is durable once `lsn` is, and only then does
                // the record index know where each one lies.
                journal.sync(written).await?;
                let (index, referenced) = journal.core.snapshot_index(&state)?;
                let bytes = tokio::task::spawn_blocking(move || JournalCore::encode_snapshot(&state, &index))
                    .await
                    .map_err(|e| Error::Internal(format!("journal snapshot encoder failed: {e}")))??;
                journal.core.write_snapshot(lsn, bytes, referenced).await
            }
            .await;
            if let Err(e) = result {
                journal.abandon_snapshot();
                tracing::warn!(lsn, error = %e, "journal snapshot failed; will try again later");
            }
        });
    }
}

/// The durable journal. Cheap to clone; writes run in their own tasks, so a caller that
/// is cancelled mid-write (a crashed job's task) cannot leave the journal half-written
/// with nobody to finish it.
#[derive(Debug, Clone)]
pub(crate) struct Journal {
    core: Arc<JournalCore>,
}

impl std::ops::Deref for Journal {
    type Target = JournalCore;
    fn deref(&self) -> &JournalCore {
        &self.core
    }
}

#[derive(Debug)]
pub(crate) struct JournalCore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    buffered: Mutex<Buffered>,
    durable: watch::Sender<Lsn>,
    appender: Option<Arc<Mutex<Appender>>>,
    /// The journal's local directory and durability, when it is one.
    local: Option<(PathBuf, Durability)>,
    /// Opened for inspection: recovery repairs nothing and nothing is written.
    read_only: bool,
    records: Mutex<RecordIndex>,
    faults: Faults,
    replay_bound_bytes: u64,
    /// Held by each GC deletion and by `close`.
    gc_guard: Mutex<()>,
}

/// What a snapshot's batches point at: the segments GC must keep, and the journal
/// entries whose place the record index must keep.
#[derive(Debug, Default)]
pub(crate) struct Referenced {
    segments: HashSet<Lsn>,
    lsns: HashSet<Lsn>,
}

/// What [`Journal::recover`] found.
pub(crate) struct Recovered {
    pub(crate) state: BrokerState,
    pub(crate) next_lsn: Lsn,
    pub(crate) segments: Vec<(Lsn, Lsn)>,
    pub(crate) truncated_tail: Option<String>,
    /// What the open read, and how long it took.
    pub(crate) opened: Opened,
}

/// What opening a broker directory read, and how long each part took: the newest
/// snapshot (the metadata of everything held), then the journal written since it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Opened {
    /// Bytes of the snapshot read.
    pub snapshot_bytes: u64,
    /// Seconds spent reading, decoding and checking the snapshot.
    pub snapshot_secs: f64,
    /// Bytes of journal segments read after the snapshot.
    pub journal_bytes: u64,
    /// Journal entries applied after the snapshot.
    pub journal_entries: u64,
    /// Seconds spent reading and applying those entries.
    pub journal_secs: f64,
}

impl JournalCore {
    fn segment_path(&self, first: Lsn) -> Path {
        self.root.clone().join("wal").join(format!("{first:020}.seg"))
    }

    fn snapshot_path(&self, lsn: Lsn) -> Path {
        self.root.clone().join("snapshot").join(format!("{lsn:020}.snap"))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Buffered>> {
        self.buffered.lock().map_err(|_| Error::Internal("journal lock poisoned".into()))
    }

    /// Reads the newest snapshot and replays every later entry. A torn last segment is
    /// cut back to its last good frame with a warning; damage anywhere else is
    /// [`Error::Corrupt`].
    ///
    /// `local` is the journal's directory on the local file system when `store` is a
    /// `LocalFileSystem` over it: writes then append to segment files directly.
    ///
    /// `read_only` recovery changes nothing on disk: a torn tail is read up to its last
    /// good entry and left as it is (a live broker may be writing it), and the journal
    /// refuses every append.
    pub(crate) async fn recover(
        store: Arc<dyn ObjectStore>,
        root: Path,
        local: Option<(PathBuf, Durability)>,
        fresh: BrokerState,
        read_only: bool,
        tuning: Tuning,
    ) -> Result<(Journal, Recovered)> {
        let faults = tuning.faults.clone();
        let appender = local.clone().filter(|_| !read_only).map(|(dir, durability)| {
            Arc::new(Mutex::new(Appender {
                wal_dir: dir.join("wal"),
                durability,
                active: None,
                roll: false,
                closed: false,
                faults: faults.clone(),
            }))
        });
        let journal = JournalCore {
            appender,
            local,
            read_only,
            store,
            root,
            buffered: Mutex::new(Buffered {
                bytes: Vec::new(),
                first_lsn: 1,
                next_lsn: 1,
                writing: false,
                failed: None,
                segments: Vec::new(),
                bytes_since_snapshot: 0,
                record_bytes_since_snapshot: 0,
                last_snapshot_bytes: 0,
                last_snapshot_lsn: 0,
                snapshotting: false,
                blobs: Vec::new(),
                generation: 0,
                lost: None,
                kept: Vec::new(),
            }),
            durable: watch::Sender::new(0),
            records: Mutex::new(RecordIndex::default()),
            faults,
            replay_bound_bytes: tuning.replay_bound_bytes,
            gc_guard: Mutex::new(()),
        };
        if !read_only {
            journal.remove_unfinished_uploads().await?;
        }
        let recovered = journal.replay(fresh).await?;
        {
            let mut b = journal.lock()?;
            b.first_lsn = recovered.next_lsn;
            b.next_lsn = recovered.next_lsn;
            b.segments = recovered.segments.clone();
        }
        journal.durable.send_replace(recovered.next_lsn - 1);
        Ok((Journal { core: Arc::new(journal) }, recovered))
    }

    /// The local file behind a journal object, when the journal is a local directory.
    fn local_file(&self, path: &Path) -> Option<PathBuf> {
        let (dir, _) = self.local.as_ref()?;
        let relative = path.as_ref().strip_prefix(self.root.as_ref())?;
        Some(dir.join(relative.trim_start_matches('/')))
    }

    /// Fsyncs a file the object store wrote and the directory that names it, when the
    /// journal is a local directory under [`Durability::Fsync`].
    fn sync_local(&self, path: &Path) -> Result<()> {
        if !matches!(self.local, Some((_, Durability::Fsync))) {
            return Ok(());
        }
        let Some(file) = self.local_file(path) else { return Ok(()) };
        let sync = || -> std::io::Result<()> {
            if file.exists() {
                std::fs::File::open(&file)?.sync_all()?;
            }
            // The directory that names the file, and the one that names that
            // directory (the store may just have created it).
            for dir in file.ancestors().skip(1).take(2) {
                if dir.exists() {
                    sync_dir(dir)?;
                }
            }
            Ok(())
        };
        sync().map_err(|e| Error::storage(path, format!("cannot fsync ({e})"), None))
    }

    /// A fault point: when it fires, the journal stops as the process would have died
    /// there (it is poisoned: nothing more is written, every call fails).
    fn crash_point(&self, point: &'static str) -> Result<()> {
        self.faults.hit(point).inspect_err(|e| {
            if let Ok(mut b) = self.lock() {
                b.failed.get_or_insert(e.clone());
            }
            self.durable.send_modify(|_| {});
        })
    }

    /// Whether batch buffers stay in the journal's segments (a local directory), not in
    /// memory and snapshots (object stores: a segment per group commit would keep a
    /// great many small objects alive).
    pub(crate) fn stores_records(&self) -> bool {
        self.local.is_some()
    }

    /// Adds an entry to the next group commit and returns its lsn. Call under the state
    /// lock, right after applying the entry.
    ///
    /// The caller has already applied the entry to memory, so a failure here poisons the
    /// journal: memory is ahead of storage and every later call must fail.
    pub(crate) fn append(&self, entry: &Entry) -> Result<Written> {
        let mut b = self.lock()?;
        if let Some(e) = &b.failed {
            return Err(e.clone());
        }
        if self.read_only {
            return Err(Error::ReadOnly { what: "writing to the journal".into() });
        }
        let lsn = b.next_lsn;
        let payload = match postcard::to_allocvec(&(lsn, entry)) {
            Ok(p) => p,
            Err(e) => {
                let err = Error::Internal(format!("cannot encode journal entry {lsn}: {e}"));
                b.failed = Some(err.clone());
                return Err(err);
            }
        };
        envelope::encode_into(&mut b.bytes, ENTRY_MAGIC, FORMAT_VERSION, &payload);
        if let Command::Append { batch, .. } | Command::Rewrite { batch, .. } | Command::DeadLetter { batch, .. } =
            &entry.command
        {
            if self.stores_records() {
                // The buffer is the entry's last field, so the frame ends with it.
                let at = b.bytes.len() - batch.len();
                debug_assert_eq!(&b.bytes[at..], &batch[..]);
                b.blobs.push((lsn, at, batch.len() as u32));
                shareflow_share::sync::lock(&self.records).pending.insert(lsn, batch.clone());
            }
        }
        b.next_lsn += 1;
        Ok(Written { lsn, generation: b.generation })
    }

    async fn write_segment(&self, first: Lsn, last: Lsn, bytes: Vec<u8>, blobs: Vec<(Lsn, usize, u32)>) -> Result<()> {
        let len = bytes.len() as u64;
        let result = match &self.appender {
            Some(appender) => {
                let appender = appender.clone();
                tokio::task::spawn_blocking(move || {
                    appender.lock().map_err(|_| std::io::Error::other("appender lock poisoned"))?.append(first, &bytes)
                })
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)))
                .map(Some)
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded {
                        let dir = self.local.as_ref().map(|(d, _)| d.display().to_string()).unwrap_or_default();
                        return Error::DiskFull { dir, needed: len, free: e.to_string() };
                    }
                    Error::storage(
                        self.segment_path(first),
                        format!("journal append failed ({e}); the broker must be reopened to continue"),
                        None,
                    )
                })
            }
            None => {
                let path = self.segment_path(first);
                self.store.put(&path, PutPayload::from(bytes)).await.map(|_| None).map_err(|e| {
                    Error::storage(&path, "journal write failed; the broker must be reopened to continue", Some(e))
                })
            }
        };
        let mut b = self.lock()?;
        b.writing = false;
        match result {
            Ok(appended) => {
                match appended {
                    Some((segment, _, false)) => {
                        if let Some(entry) = b.segments.iter_mut().rev().find(|(f, _)| *f == segment) {
                            entry.1 = last;
                        }
                    }
                    Some((segment, _, true)) => b.segments.push((segment, last)),
                    None => b.segments.push((first, last)),
                }
                b.bytes_since_snapshot += len;
                b.record_bytes_since_snapshot += blobs.iter().map(|(_, _, n)| u64::from(*n)).sum::<u64>();
                drop(b);
                if let (Some((segment, at, _)), false) = (appended, blobs.is_empty()) {
                    // Where each buffer landed; before the durable lsn moves, so a reader
                    // that sees the entry finds its records (here, or still pending).
                    let mut index = shareflow_share::sync::lock(&self.records);
                    for (lsn, pos, n) in blobs {
                        index.locs.insert(lsn, Loc { segment, pos: at + pos as u64, len: n });
                        index.pending.remove(&lsn);
                    }
                }
                // Two writers can finish out of order (one drops the lock, the next
                // writes and reports first): the durable lsn only moves forward.
                self.durable.send_if_modified(|durable| {
                    let forward = last > *durable;
                    if forward {
                        *durable = last;
                    }
                    forward
                });
                Ok(())
            }
            Err(err) => {
                b.failed = Some(err.clone());
                drop(b);
                // Wake the waiters so they see the failure.
                self.durable.send_modify(|_| {});
                Err(err)
            }
        }
    }

    /// Whether to take a snapshot now: once the journal written since the last one
    /// outgrows that snapshot (so the journal costs at most about twice the state), or
    /// once it spans 4096 objects (so recovery reads a bounded number of them).
    ///
    /// When batch buffers stay in the segments, a snapshot does not hold them, so only
    /// the other bytes count against it; a snapshot also starts once the journal since
    /// the last one reaches [`REPLAY_BOUND_BYTES`], which bounds what a reopen replays,
    /// and lets segments that only deleted batches held go.
    pub(crate) fn wants_snapshot(&self) -> bool {
        let stores = self.stores_records();
        self.lock().is_ok_and(|b| {
            let grown =
                if stores { b.bytes_since_snapshot - b.record_bytes_since_snapshot } else { b.bytes_since_snapshot };
            let new_segments = b.segments.iter().filter(|(first, _)| *first > b.last_snapshot_lsn).count();
            !b.snapshotting
                && b.failed.is_none()
                && (grown >= (4 << 20).max(b.last_snapshot_bytes)
                    || (stores && b.bytes_since_snapshot >= self.replay_bound_bytes)
                    || new_segments >= 4096)
        })
    }

    /// Gives up a snapshot claimed with [`begin_snapshot`](Self::begin_snapshot).
    pub(crate) fn abandon_snapshot(&self) {
        if let Ok(mut b) = self.lock() {
            b.snapshotting = false;
        }
    }

    /// Claims the right to take a snapshot; returns false if one is under way.
    pub(crate) fn begin_snapshot(&self) -> bool {
        self.lock().is_ok_and(|mut b| !std::mem::replace(&mut b.snapshotting, true))
    }

    /// Writes `state`, which reflects every entry up to `lsn` (already durable), then
    /// drops the segments and snapshots it makes redundant: never a segment in
    /// `referenced`, which its batches point into.
    async fn write_snapshot(&self, lsn: Lsn, state_bytes: (u16, Vec<u8>), referenced: Referenced) -> Result<()> {
        let result = self.write_snapshot_inner(lsn, state_bytes, referenced).await;
        self.abandon_snapshot();
        result
    }

    async fn write_snapshot_inner(
        &self,
        lsn: Lsn,
        (version, state_bytes): (u16, Vec<u8>),
        referenced: Referenced,
    ) -> Result<()> {
        self.crash_point(fault::SNAPSHOT_BEFORE_WRITE)?;
        let frames = snapshot_frames(bytes::Bytes::from(state_bytes), SNAPSHOT_FRAME_BYTES, version);
        let size = frames.iter().map(|f| f.len() as u64).sum();
        let path = self.snapshot_path(lsn);
        self.store
            .put(&path, frames.into_iter().collect::<PutPayload>())
            .await
            .map_err(|e| Error::storage(&path, "cannot write journal snapshot", Some(e)))?;
        // The segments it covers are deleted next: it must be on disk first.
        self.sync_local(&path)?;
        self.crash_point(fault::SNAPSHOT_BEFORE_GC)?;
        // A closed journal's directory may belong to a new broker already.
        self.check_healthy()?;
        // The open segment may hold only entries the snapshot covers; it must not be
        // deleted while it is appended to, so roll it and delete it next time.
        let active = match &self.appender {
            Some(a) => a.lock().ok().and_then(|mut a| {
                a.roll = true;
                a.active.as_ref().map(|(first, _, _)| *first)
            }),
            None => None,
        };
        let obsolete: Vec<(Lsn, Lsn)> = {
            let mut b = self.lock()?;
            b.last_snapshot_bytes = size;
            b.last_snapshot_lsn = lsn;
            let (old, keep): (Vec<_>, Vec<_>) = b.segments.iter().partition(|(first, last)| {
                *last <= lsn && Some(*first) != active && !referenced.segments.contains(first)
            });
            b.segments = keep;
            b.bytes_since_snapshot = 0;
            b.record_bytes_since_snapshot = 0;
            old
        };
        {
            // Forget where deleted batches lay: the index keeps what the snapshot points
            // at and what came after it.
            let mut index = shareflow_share::sync::lock(&self.records);
            index.locs.retain(|l, _| *l > lsn || referenced.lsns.contains(l));
            for (first, _) in &obsolete {
                index.files.remove(first);
            }
            let files = std::mem::take(&mut index.files_order);
            index.files_order = files.into_iter().filter(|f| index.files.contains_key(f)).collect();
        }
        for (i, (first, _)) in obsolete.into_iter().enumerate() {
            let p = self.segment_path(first);
            if let Err(e) = self.delete_unless_closed(&p).await? {
                tracing::warn!(path = %p, error = %e, "cannot delete an obsolete journal segment; it is skipped on recovery");
            }
            if i == 0 {
                self.crash_point(fault::GC_AFTER_FIRST_DELETE)?;
            }
        }
        self.crash_point(fault::GC_BEFORE_OLD_SNAPSHOTS)?;
        for (old, p) in self.list("snapshot", ".snap").await? {
            if old < lsn {
                if let Err(e) = self.delete_unless_closed(&p).await? {
                    tracing::warn!(path = %p, error = %e, "cannot delete an old journal snapshot");
                }
            }
        }
        Ok(())
    }

    /// Deletes `path` unless the journal is closed or poisoned (then it fails): on a
    /// local directory under the guard `close` takes, so no GC step outlives a close.
    /// The inner result is the deletion's own.
    async fn delete_unless_closed(&self, path: &Path) -> Result<std::result::Result<(), String>> {
        match self.local_file(path) {
            Some(file) => {
                let _gc = shareflow_share::sync::lock(&self.gc_guard);
                self.check_healthy()?;
                Ok(match std::fs::remove_file(&file) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
                    _ => Ok(()),
                })
            }
            None => {
                self.check_healthy()?;
                Ok(self.store.delete(path).await.map_err(|e| e.to_string()))
            }
        }
    }

    /// A snapshot's payload and its frames' version (5): the state and the record index.
    /// Where batches stay in memory (object stores), the index is empty and the state
    /// holds their buffers.
    fn encode_snapshot(state: &BrokerState, index: &[(Lsn, Loc)]) -> Result<(u16, Vec<u8>)> {
        postcard::to_allocvec(&(state, index))
            .map(|b| (SNAPSHOT_META_VERSION, b))
            .map_err(|e| Error::Internal(format!("cannot encode broker snapshot: {e}")))
    }

    /// The lsn the next entry will get.
    pub(crate) fn next_lsn(&self) -> Lsn {
        self.lock().map_or(0, |b| b.next_lsn)
    }

    /// Closes the journal: every later append, sync and read fails with
    /// [`Error::Closed`], and once this returns no write of this journal reaches the
    /// directory any more (an append under way finishes first), so the directory lock
    /// can be released.
    pub(crate) fn close(&self) {
        // A snapshot's GC deletes nothing more once this returns: the directory may
        // belong to a new broker, which may still need what an older snapshot names.
        let _gc = shareflow_share::sync::lock(&self.gc_guard);
        if let Ok(mut b) = self.lock() {
            b.failed.get_or_insert(Error::Closed { what: "embedded broker journal".into() });
        }
        if let Some(appender) = &self.appender {
            let mut a = shareflow_share::sync::lock(appender);
            a.closed = true;
            a.active = None;
        }
        self.durable.send_modify(|_| {});
    }

    /// The last entry the journal took, in its current generation: what a command that
    /// wrote nothing waits for (call under the state lock, where the state was read).
    pub(crate) fn last_written(&self) -> Written {
        self.lock().map_or(Written { lsn: 0, generation: u64::MAX }, |b| Written {
            lsn: b.next_lsn.saturating_sub(1),
            generation: b.generation,
        })
    }

    /// After a journal write failed on a full disk, and only then: reads the directory
    /// again, as a reopen would, so that the broker's memory can be made to match what
    /// is on disk (entries not durable when the write failed are lost, as a crash
    /// would lose them; none of them was acknowledged). The journal stays failed until
    /// [`finish_reload`](Self::finish_reload) installs the result, which the caller
    /// does under the state lock with the recovered state.
    ///
    /// Returns `Ok(None)` when there is nothing to do now: the journal is healthy, or a
    /// write or snapshot is still under way (it fails soon; try again then). Any other
    /// failure (a fault point, a closed journal, an object store) is returned as it is:
    /// only a reopen recovers from those.
    pub(crate) async fn reload(&self, fresh: BrokerState) -> Result<Option<Recovered>> {
        {
            let mut b = self.lock()?;
            match &b.failed {
                None => return Ok(None),
                Some(Error::DiskFull { .. }) if !self.read_only && self.appender.is_some() => {}
                Some(e) => return Err(e.clone()),
            }
            if b.writing || b.snapshotting {
                return Ok(None);
            }
            // No snapshot starts until the reload is installed (or given up).
            b.snapshotting = true;
        }
        // No GC deletion is under way once the guard is had, and none starts while the
        // journal is failed (`delete_unless_closed`).
        drop(shareflow_share::sync::lock(&self.gc_guard));
        {
            let mut index = shareflow_share::sync::lock(&self.records);
            // Lsns after the durable ones will be given again: nothing cached may stay.
            *index = RecordIndex::default();
        }
        let recovered = self.replay(fresh).await;
        if recovered.is_err() {
            self.abandon_snapshot();
        }
        recovered.map(Some)
    }

    /// Installs what [`reload`](Self::reload) read: the next entry follows the last
    /// durable one, in a new generation, and the journal takes writes again. Call under
    /// the state lock, right after putting the recovered state in place.
    pub(crate) fn finish_reload(&self, next_lsn: Lsn, segments: Vec<(Lsn, Lsn)>) -> Result<()> {
        let mut b = self.lock()?;
        let Some(cause) = b.failed.take() else {
            return Err(Error::Internal("journal reload installed on a healthy journal".into()));
        };
        b.lost = Some(cause);
        b.kept.push(next_lsn - 1);
        b.generation += 1;
        b.bytes.clear();
        b.blobs.clear();
        b.first_lsn = next_lsn;
        b.next_lsn = next_lsn;
        b.segments = segments;
        b.snapshotting = false;
        if let Some(appender) = &self.appender {
            // The failed write rolled the segment already; roll again in case the
            // replay removed a segment it had emptied.
            shareflow_share::sync::lock(appender).roll = true;
        }
        drop(b);
        self.durable.send_modify(|durable| *durable = (*durable).max(next_lsn - 1));
        Ok(())
    }

    /// The last lsn durable in storage.
    pub(crate) fn durable_lsn(&self) -> Lsn {
        *self.durable.borrow()
    }

    /// Fails once a write has failed (the journal is poisoned): memory may then be ahead
    /// of storage, so nothing may be read or written until the broker is reopened, or
    /// (after a full disk) until a [`reload`](Self::reload) is installed.
    pub(crate) fn check_healthy(&self) -> Result<()> {
        match &self.lock()?.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}
