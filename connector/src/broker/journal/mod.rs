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

use super::fault::{self, Faults};
use super::log::{BatchData, LogBatch};
use super::state::{BrokerState, Command, Entry};
use crate::error::{Error, Result};
use crate::share::TopicPartition;

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
}

/// Where a stored batch buffer lies: `len` bytes from byte `pos` of the segment whose
/// first lsn is `segment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Loc {
    pub(crate) segment: Lsn,
    pub(crate) pos: u64,
    pub(crate) len: u32,
}

/// The record index: where each stored batch lies, the buffers not written yet, open
/// segment files and a bounded cache of batches read.
#[derive(Debug, Default)]
struct RecordIndex {
    locs: BTreeMap<Lsn, Loc>,
    pending: BTreeMap<Lsn, Bytes>,
    /// Open segment files, at most [`OPEN_SEGMENTS`], the oldest opened closed first.
    files: HashMap<Lsn, Arc<std::fs::File>>,
    files_order: VecDeque<Lsn>,
    cache: HashMap<Lsn, Bytes>,
    cache_order: VecDeque<Lsn>,
    cache_bytes: usize,
}

/// Segment files kept open for reads.
const OPEN_SEGMENTS: usize = 64;

/// How far a local journal write goes before the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `fdatasync` every group commit: survives power loss.
    #[default]
    Fsync,
    /// Leave the bytes in the OS page cache: survives a crash of the process, not of the
    /// machine. Faster; for tests and benchmarks.
    ProcessCrash,
}

const ROLL_BYTES: u64 = 64 << 20;

/// Appends group commits to an open segment file in a local directory.
#[derive(Debug)]
struct Appender {
    wal_dir: PathBuf,
    durability: Durability,
    /// The open segment: first lsn, file, bytes written.
    active: Option<(Lsn, std::fs::File, u64)>,
    roll: bool,
    /// The broker closed: no byte may reach the directory after its lock is released.
    closed: bool,
    faults: Faults,
}

/// Makes a file's creation, rename or removal in `dir` durable.
fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl Appender {
    /// Appends `bytes` (entries `first..`) and returns the first lsn of the segment that
    /// holds them, the byte they start at in it, and whether that segment is new.
    fn append(&mut self, first: Lsn, bytes: &[u8]) -> std::io::Result<(Lsn, u64, bool)> {
        use std::io::Write;
        if self.closed {
            return Err(std::io::Error::other("the broker is closed"));
        }
        let full = self.active.as_ref().is_some_and(|(_, _, size)| *size >= ROLL_BYTES);
        let mut created = false;
        if self.active.is_none() || full || self.roll {
            if !self.wal_dir.exists() {
                std::fs::create_dir_all(&self.wal_dir)?;
                if let (Durability::Fsync, Some(parent)) = (self.durability, self.wal_dir.parent()) {
                    sync_dir(parent)?;
                }
            }
            let path = self.wal_dir.join(format!("{first:020}.seg"));
            // A kill between creating a segment and writing to it leaves it empty;
            // recovery removes such a file, but should one remain, an empty file with
            // the right name is exactly what we were about to create.
            let file = match std::fs::OpenOptions::new().create_new(true).append(true).open(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && std::fs::metadata(&path)?.len() == 0 => {
                    std::fs::OpenOptions::new().append(true).open(&path)?
                }
                other => other?,
            };
            if self.durability == Durability::Fsync {
                sync_dir(&self.wal_dir)?;
            }
            let rolled = self.active.is_some();
            self.active = Some((first, file, 0));
            self.roll = false;
            created = true;
            if rolled {
                self.faults.hit(fault::SEGMENT_ROLL).map_err(std::io::Error::other)?;
            }
        }
        let Some((segment, file, size)) = self.active.as_mut() else {
            return Err(std::io::Error::other("no active journal segment"));
        };
        let at = *size;
        let mut disk_full = || -> std::io::Result<()> {
            // A full disk takes part of a write: half the group, then ENOSPC.
            if self.faults.hit(fault::DISK_FULL).is_err() {
                file.write_all(&bytes[..bytes.len() / 2])?;
                return Err(std::io::ErrorKind::StorageFull.into());
            }
            Ok(())
        };
        if let Err(e) = disk_full().and_then(|()| file.write_all(bytes)).and_then(|()| match self.durability {
            Durability::Fsync => file.sync_data(),
            Durability::ProcessCrash => Ok(()),
        }) {
            // Part of the group may be on disk: cut it off, so that the segment ends at
            // its last whole entry (a full disk leaves no torn frame behind), and roll.
            let _ = file.set_len(at);
            self.roll = true;
            return Err(e);
        }
        *size += bytes.len() as u64;
        Ok((*segment, at, created))
    }
}

impl Journal {
    /// Returns once `lsn` is durable, writing the pending group commit if nobody is.
    pub(crate) async fn sync(&self, lsn: Lsn) -> Result<()> {
        if *self.durable.borrow() >= lsn {
            return Ok(()); // the common case for a command that wrote nothing
        }
        let mut rx = self.durable.subscribe();
        loop {
            if *rx.borrow_and_update() >= lsn {
                return Ok(());
            }
            let job = {
                let mut b = self.lock()?;
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
    pub(crate) fn snapshot_detached(&self, lsn: Lsn, state: BrokerState) {
        let journal = self.clone();
        tokio::spawn(async move {
            let result = async {
                // Every batch of the state is durable once `lsn` is, and only then does
                // the record index know where each one lies.
                journal.sync(lsn).await?;
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
}

/// A damaged frame is a torn tail (the last write did not finish, or its last entry is
/// damaged) when nothing valid can follow it: it is cut short, its declared extent runs
/// exactly to the end of the file, or only zeros follow. Anything else is corruption.
fn is_torn_tail(rest: &[u8], error: &envelope::EnvelopeError) -> bool {
    if matches!(error, envelope::EnvelopeError::Truncated { .. }) || rest.iter().all(|&b| b == 0) {
        return true;
    }
    if rest.len() >= envelope::HEADER_LEN {
        let declared = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]) as usize;
        return envelope::HEADER_LEN + declared == rest.len()
            && matches!(error, envelope::EnvelopeError::ChecksumMismatch { .. });
    }
    false
}

/// Whether a whole valid entry frame starts anywhere after the first byte of `rest`.
/// A kill tears only the end of the last write, so nothing valid follows a torn tail:
/// if something does, the damage is corruption (a flipped length, say), not a tear.
fn valid_frame_follows(rest: &[u8]) -> bool {
    let magic = ENTRY_MAGIC.0;
    (1..rest.len().saturating_sub(magic.len()))
        .filter(|&i| rest[i..].starts_with(&magic))
        .any(|i| envelope::decode_frame(ENTRY_MAGIC, FORMAT_VERSION, &rest[i..]).is_ok())
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
            }),
            durable: watch::Sender::new(0),
            records: Mutex::new(RecordIndex::default()),
            faults,
            replay_bound_bytes: tuning.replay_bound_bytes,
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

    /// Removes temporary upload files (`name#n`) that a kill during a snapshot write
    /// left in a local directory (object stores write whole objects, so leave none;
    /// and the local store's listing hides them, hence `std::fs`).
    async fn remove_unfinished_uploads(&self) -> Result<()> {
        let Some((root, durability)) = &self.local else { return Ok(()) };
        for dir in [root.join("wal"), root.join("snapshot")] {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            let mut removed = false;
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().contains('#') {
                    tracing::warn!(path = %entry.path().display(), "removing an unfinished journal upload");
                    std::fs::remove_file(entry.path()).map_err(|e| {
                        Error::storage(entry.path().display(), format!("cannot remove an unfinished upload: {e}"), None)
                    })?;
                    removed = true;
                }
            }
            if removed && *durability == Durability::Fsync {
                sync_dir(&dir)
                    .map_err(|e| Error::storage(dir.display(), format!("cannot fsync the directory: {e}"), None))?;
            }
        }
        Ok(())
    }

    /// Cuts the last segment back to its first `good` bytes (removing it when that is
    /// none), durably.
    async fn cut_tail(&self, path: &Path, bytes: &bytes::Bytes, good: usize) -> Result<()> {
        match self.local_file(path) {
            Some(file) => {
                let cut = || -> std::io::Result<()> {
                    if good == 0 {
                        std::fs::remove_file(&file)?;
                    } else {
                        let f = std::fs::OpenOptions::new().write(true).open(&file)?;
                        f.set_len(good as u64)?;
                        f.sync_all()?;
                    }
                    match file.parent() {
                        Some(parent) => sync_dir(parent),
                        None => Ok(()),
                    }
                };
                cut().map_err(|e| Error::storage(path, format!("cannot cut back the torn journal tail ({e})"), None))
            }
            None => {
                let result = if good == 0 {
                    self.store.delete(path).await
                } else {
                    self.store.put(path, PutPayload::from_bytes(bytes.slice(..good))).await.map(|_| ())
                };
                result.map_err(|e| Error::storage(path, "cannot cut back the torn journal tail", Some(e)))
            }
        }
    }

    async fn list(&self, dir: &str, suffix: &str) -> Result<Vec<(Lsn, Path)>> {
        Ok(self.list_sized(dir, suffix).await?.into_iter().map(|(lsn, path, _)| (lsn, path)).collect())
    }

    /// [`list`](Self::list), with each file's size.
    async fn list_sized(&self, dir: &str, suffix: &str) -> Result<Vec<(Lsn, Path, u64)>> {
        let prefix = self.root.clone().join(dir);
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| Error::storage(&prefix, "cannot list the journal", Some(e)))?;
        let mut out = Vec::new();
        for meta in metas {
            let name = meta.location.filename().unwrap_or_default();
            if name.starts_with('.') || name.contains("#") {
                continue; // temporary upload files of the local store
            }
            let lsn = name.strip_suffix(suffix).and_then(|n| n.parse::<Lsn>().ok()).ok_or_else(|| {
                Error::corrupt(&meta.location, format!("unexpected file in the journal; expected <20 digits>{suffix}"))
            })?;
            out.push((lsn, meta.location, meta.size));
        }
        out.sort();
        Ok(out)
    }

    async fn get(&self, path: &Path) -> Result<bytes::Bytes> {
        let get = self.store.get(path).await.map_err(|e| Error::storage(path, "cannot read", Some(e)))?;
        get.bytes().await.map_err(|e| Error::storage(path, "cannot read", Some(e)))
    }

    async fn replay(&self, fresh: BrokerState) -> Result<Recovered> {
        // Segments first: a live broker (beside a read-only open) deletes segments only
        // after a newer snapshot exists, so this order never sees a gap between the
        // snapshot it reads and the segments it listed; a segment deleted after the
        // listing is a NotFound, which the read-only open retries.
        let segments = self.list_sized("wal", ".seg").await?;
        let mut state = fresh;
        let mut snapshot_lsn = 0;
        if let Some((lsn, path)) = self.list("snapshot", ".snap").await?.pop() {
            let bytes = self.get(&path).await?;
            let (version, payload) = snapshot_payload(&bytes).map_err(|e| Error::corrupt(&path, e))?;
            let index;
            (state, index) = decode_snapshot(version, &payload).map_err(|e| Error::corrupt(&path, e))?;
            self.check_index(&state, &index, &segments)?;
            crate::common::sync::lock(&self.records).locs = index.into_iter().collect();
            snapshot_lsn = lsn;
            if let Ok(mut b) = self.lock() {
                b.last_snapshot_bytes = bytes.len() as u64;
                b.last_snapshot_lsn = lsn;
            }
        }
        let mut next = snapshot_lsn + 1;
        let mut kept = Vec::new();
        let mut truncated_tail = None;
        let count = segments.len();
        let firsts: Vec<Lsn> = segments.iter().map(|(first, _, _)| *first).collect();
        for (i, (first, path, _)) in segments.into_iter().enumerate() {
            let is_last = i + 1 == count;
            // A segment whose entries the snapshot covers stays only while batches
            // point into it: it is not read again, so a reopen reads no records.
            if let Some(&following) = firsts.get(i + 1) {
                if following <= next {
                    kept.push((first, following - 1));
                    continue;
                }
            }
            let bytes = self.get(&path).await?;
            if bytes.is_empty() && is_last {
                // A kill between creating the segment and writing its first entry.
                tracing::warn!(path = %path, "empty last journal segment; removing it");
                truncated_tail = Some(format!("{path}: empty segment"));
                if !self.read_only {
                    self.cut_tail(&path, &bytes, 0).await?;
                }
                continue;
            }
            let mut pos = 0;
            let mut lsn = first;
            while pos < bytes.len() {
                let frame = match envelope::decode_frame(ENTRY_MAGIC, FORMAT_VERSION, &bytes[pos..]) {
                    Ok(f) => f,
                    // Only entries after the snapshot can be a torn tail: one it covers
                    // was durable before it, and a batch of it may be pointed at.
                    Err(e)
                        if is_last
                            && lsn >= next
                            && is_torn_tail(&bytes[pos..], &e)
                            && !valid_frame_follows(&bytes[pos..]) =>
                    {
                        tracing::warn!(path = %path, offset = pos, error = %e, "torn journal tail; truncating to the last good entry");
                        truncated_tail = Some(format!("{path} at byte {pos}: {e}"));
                        if !self.read_only {
                            self.cut_tail(&path, &bytes, pos).await?;
                        }
                        break;
                    }
                    Err(e) => {
                        return Err(Error::corrupt(
                            &path,
                            format!(
                            "journal entry at byte {pos} is damaged ({e}) and is not the torn tail of the last write; \
                                 refusing to guess. Restore the broker directory from a backup"
                        ),
                        ))
                    }
                };
                let frame_start = pos;
                pos += frame.len;
                let (entry_lsn, entry): (Lsn, Entry) = postcard::from_bytes(frame.payload).map_err(|e| {
                    Error::corrupt(&path, format!("entry at byte {} does not decode: {e}", pos - frame.len))
                })?;
                if entry_lsn != lsn {
                    return Err(Error::corrupt(
                        &path,
                        format!("entry at byte {} has lsn {entry_lsn}, expected {lsn}", pos - frame.len),
                    ));
                }
                lsn += 1;
                if entry_lsn < next {
                    continue; // already in the snapshot
                }
                if entry_lsn > next {
                    return Err(Error::corrupt(&path, format!("journal entries {next}..{entry_lsn} are missing")));
                }
                let outcome = state.apply(&entry).0.map_err(|e| {
                    Error::corrupt(&path, format!("entry {entry_lsn} does not apply to the recovered state: {e}"))
                })?;
                if let (
                    Command::Append { tp, batch, .. } | Command::Rewrite { tp, batch, .. },
                    super::state::Outcome::Produced { base_offset },
                ) = (&entry.command, &outcome)
                {
                    if self.stores_records() {
                        // The buffer is the frame's last bytes (see `Command::Append`).
                        let end = frame_start + envelope::HEADER_LEN + frame.payload.len();
                        let loc = Loc { segment: first, pos: (end - batch.len()) as u64, len: batch.len() as u32 };
                        state.store_batch(tp, *base_offset, entry_lsn);
                        crate::common::sync::lock(&self.records).locs.insert(entry_lsn, loc);
                    }
                }
                state.events = Default::default();
                next += 1;
            }
            if lsn > first {
                kept.push((first, lsn - 1));
            }
        }
        Ok(Recovered { state, next_lsn: next, segments: kept, truncated_tail })
    }

    /// Checks that every batch of a snapshot's state that lies in a segment has its
    /// place in the index, and that the segment is there and long enough. A missing or
    /// short segment is named, with the offsets it held.
    fn check_index(&self, state: &BrokerState, index: &[(Lsn, Loc)], segments: &[(Lsn, Path, u64)]) -> Result<()> {
        // Beside a live broker, a read-only open may list the segments before a newer
        // snapshot points into one created or grown since: a reason to read again
        // (`open_read_only` retries storage errors), not damage.
        self.check_index_inner(state, index, segments).map_err(|e| match e {
            Error::Corrupt { path, reason } if self.read_only => Error::Storage {
                path,
                reason: format!("{reason} (read-only: a live broker may have moved on since the listing)"),
                source: None,
            },
            e => e,
        })
    }

    fn check_index_inner(
        &self,
        state: &BrokerState,
        index: &[(Lsn, Loc)],
        segments: &[(Lsn, Path, u64)],
    ) -> Result<()> {
        let sizes: HashMap<Lsn, u64> = segments.iter().map(|(first, _, size)| (*first, *size)).collect();
        let locs: HashMap<Lsn, Loc> = index.iter().copied().collect();
        for (tp, log) in state.logs() {
            for b in log.batches() {
                let BatchData::Stored(lsn) = b.data else { continue };
                let what = || format!("offsets {}..={} of {tp} (journal entry {lsn})", b.base_offset, b.last_offset());
                let Some(loc) = locs.get(&lsn) else {
                    return Err(Error::corrupt(
                        self.root.clone().join("snapshot"),
                        format!("the snapshot's record index does not say where {} lie; the broker directory is damaged: restore it from a copy, or start a new directory", what()),
                    ));
                };
                let path = self.segment_path(loc.segment);
                match sizes.get(&loc.segment) {
                    None => {
                        return Err(Error::corrupt(
                            &path,
                            format!("the segment is missing, and it holds {}; restore the broker directory from a copy, or start a new directory", what()),
                        ))
                    }
                    Some(&size) if loc.pos.checked_add(u64::from(loc.len)).is_none_or(|end| end > size) => {
                        return Err(Error::corrupt(
                            &path,
                            format!(
                                "the segment is {size} bytes, cut short: {} lie at bytes {}..{}; restore the broker directory from a copy, or start a new directory",
                                what(),
                                loc.pos,
                                loc.pos + u64::from(loc.len)
                            ),
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
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

    /// A batch's buffer, checked, wherever it lives: memory, not yet written, the read
    /// cache, or its segment (read from the OS page cache).
    pub(crate) fn load_batch(&self, tp: &TopicPartition, batch: &LogBatch) -> Result<Bytes> {
        let lsn = match &batch.data {
            BatchData::Inline(data) => return Ok(data.clone()),
            BatchData::Stored(lsn) => *lsn,
        };
        let mut index = crate::common::sync::lock(&self.records);
        if let Some(data) = index.pending.get(&lsn).or_else(|| index.cache.get(&lsn)) {
            return Ok(data.clone());
        }
        let what = || format!("offsets {}..={} of {tp} (journal entry {lsn})", batch.base_offset, batch.last_offset());
        let Some(loc) = index.locs.get(&lsn).copied() else {
            return Err(Error::Internal(format!("the record index does not say where {} lie", what())));
        };
        let path = self.segment_path(loc.segment);
        let Some(file_path) = self.local_file(&path) else {
            return Err(Error::Internal(format!(
                "{} lie in a segment, and the journal is not a local directory",
                what()
            )));
        };
        let range = || format!("bytes {}..{}", loc.pos, loc.pos.saturating_add(u64::from(loc.len)));
        // A read-only view may be older than the live broker beside it, which deletes
        // segments its own snapshots no longer need: that is a stale view, not damage.
        let gone = |e: std::io::Error| -> Error {
            if self.read_only || e.kind() != std::io::ErrorKind::NotFound {
                let why = if self.read_only {
                    "the live broker beside this read-only view may have deleted it since; open it read-only again"
                } else {
                    "check the directory's device and permissions"
                };
                return Error::storage(
                    &path,
                    format!("cannot read {} of the segment, which hold {} ({e}); {why}", range(), what()),
                    None,
                );
            }
            Error::corrupt(
                &path,
                format!(
                    "cannot read {} of the segment, which hold {} ({e}); restore the broker directory from a copy, or \
                     start a new directory",
                    range(),
                    what()
                ),
            )
        };
        let file = match index.files.get(&loc.segment) {
            Some(f) => f.clone(),
            None => {
                let f = Arc::new(std::fs::File::open(&file_path).map_err(gone)?);
                if index.files.len() >= OPEN_SEGMENTS {
                    if let Some(old) = index.files_order.pop_front() {
                        index.files.remove(&old);
                    }
                }
                index.files.insert(loc.segment, f.clone());
                index.files_order.push_back(loc.segment);
                f
            }
        };
        let mut buf = vec![0u8; loc.len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf, loc.pos).map_err(gone)?;
        let data = Bytes::from(buf);
        let damaged = |why: String| {
            Error::corrupt(
                &path,
                format!(
                    "{} of the segment, which hold {}, are damaged ({why}); restore the broker directory from a copy, \
                     or start a new directory",
                    range(),
                    what()
                ),
            )
        };
        let meta = super::batch::verify(&data).map_err(|e| damaged(e.to_string()))?;
        if meta.count != batch.count {
            return Err(damaged(format!("they hold {} records, the log says {}", meta.count, batch.count)));
        }
        index.cache_bytes += data.len();
        index.cache.insert(lsn, data.clone());
        index.cache_order.push_back(lsn);
        while index.cache_bytes > READ_CACHE_BYTES {
            let Some(old) = index.cache_order.pop_front() else { break };
            if let Some(gone) = index.cache.remove(&old) {
                index.cache_bytes -= gone.len();
            }
        }
        Ok(data)
    }

    /// The record index a snapshot of `state` needs (where each of its stored batches
    /// lies), and the segments those batches point into: those must outlive the
    /// snapshot. Call once every entry of `state` is durable.
    fn snapshot_index(&self, state: &BrokerState) -> Result<(Vec<(Lsn, Loc)>, Referenced)> {
        let index = crate::common::sync::lock(&self.records);
        let mut out = Vec::new();
        let mut segments = HashSet::new();
        for (tp, log) in state.logs() {
            for b in log.batches() {
                let BatchData::Stored(lsn) = b.data else { continue };
                let loc = index.locs.get(&lsn).ok_or_else(|| {
                    Error::Internal(format!(
                        "the record index does not say where offsets {}..={} of {tp} (journal entry {lsn}) lie",
                        b.base_offset,
                        b.last_offset()
                    ))
                })?;
                segments.insert(loc.segment);
                out.push((lsn, *loc));
            }
        }
        out.sort_unstable_by_key(|(lsn, _)| *lsn);
        let lsns = out.iter().map(|(lsn, _)| *lsn).collect();
        Ok((out, Referenced { segments, lsns }))
    }

    /// Adds an entry to the next group commit and returns its lsn. Call under the state
    /// lock, right after applying the entry.
    ///
    /// The caller has already applied the entry to memory, so a failure here poisons the
    /// journal: memory is ahead of storage and every later call must fail.
    pub(crate) fn append(&self, entry: &Entry) -> Result<Lsn> {
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
        if let Command::Append { batch, .. } | Command::Rewrite { batch, .. } = &entry.command {
            if self.stores_records() {
                // The buffer is the entry's last field, so the frame ends with it.
                let at = b.bytes.len() - batch.len();
                debug_assert_eq!(&b.bytes[at..], &batch[..]);
                b.blobs.push((lsn, at, batch.len() as u32));
                crate::common::sync::lock(&self.records).pending.insert(lsn, batch.clone());
            }
        }
        b.next_lsn += 1;
        Ok(lsn)
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
                    let mut index = crate::common::sync::lock(&self.records);
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
            let mut index = crate::common::sync::lock(&self.records);
            index.locs.retain(|l, _| *l > lsn || referenced.lsns.contains(l));
            for (first, _) in &obsolete {
                index.files.remove(first);
            }
            let files = std::mem::take(&mut index.files_order);
            index.files_order = files.into_iter().filter(|f| index.files.contains_key(f)).collect();
        }
        for (i, (first, _)) in obsolete.into_iter().enumerate() {
            let p = self.segment_path(first);
            if let Err(e) = self.store.delete(&p).await {
                tracing::warn!(path = %p, error = %e, "cannot delete an obsolete journal segment; it is skipped on recovery");
            }
            if i == 0 {
                self.crash_point(fault::GC_AFTER_FIRST_DELETE)?;
            }
        }
        self.crash_point(fault::GC_BEFORE_OLD_SNAPSHOTS)?;
        for (old, p) in self.list("snapshot", ".snap").await? {
            if old < lsn {
                if let Err(e) = self.store.delete(&p).await {
                    tracing::warn!(path = %p, error = %e, "cannot delete an old journal snapshot");
                }
            }
        }
        Ok(())
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
        if let Ok(mut b) = self.lock() {
            b.failed.get_or_insert(Error::Closed { what: "embedded broker journal".into() });
        }
        if let Some(appender) = &self.appender {
            let mut a = crate::common::sync::lock(appender);
            a.closed = true;
            a.active = None;
        }
        self.durable.send_modify(|_| {});
    }

    /// The last lsn durable in storage.
    pub(crate) fn durable_lsn(&self) -> Lsn {
        *self.durable.borrow()
    }

    /// Fails once a write has failed (the journal is poisoned): memory may then be ahead
    /// of storage, so nothing may be read or written until the broker is reopened.
    pub(crate) fn check_healthy(&self) -> Result<()> {
        match &self.lock()?.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// A snapshot file's parts: a first frame whose payload is the total length (u64 LE)
/// and the number of frames after it (u32 LE), then `state` in frames of at most
/// `frame_bytes`, each with its own header and checksum. The parts slice `state`
/// without copying it, so the store writes them as they are.
fn snapshot_frames(state: bytes::Bytes, frame_bytes: usize, version: u16) -> Vec<bytes::Bytes> {
    let frame_bytes = frame_bytes.clamp(1, envelope::MAX_PAYLOAD_LEN);
    let count = state.len().div_ceil(frame_bytes);
    let mut first = Vec::with_capacity(envelope::HEADER_LEN + 12);
    let mut lengths = [0u8; 12];
    lengths[..8].copy_from_slice(&(state.len() as u64).to_le_bytes());
    lengths[8..].copy_from_slice(&(count as u32).to_le_bytes());
    envelope::encode_into(&mut first, SNAPSHOT_MAGIC, version, &lengths);
    let mut parts = Vec::with_capacity(1 + 2 * count);
    parts.push(bytes::Bytes::from(first));
    for i in 0..count {
        let piece = state.slice(i * frame_bytes..((i + 1) * frame_bytes).min(state.len()));
        parts.push(bytes::Bytes::copy_from_slice(&envelope::header(SNAPSHOT_MAGIC, version, &piece)));
        parts.push(piece);
    }
    parts
}

/// The state bytes of a snapshot file, checking every frame: the framed form of
/// [`snapshot_frames`], or the single frame older brokers wrote. The message says what
/// is wrong; the caller names the file.
fn snapshot_payload(file: &[u8]) -> std::result::Result<(u16, std::borrow::Cow<'_, [u8]>), String> {
    let first = envelope::decode_frame(SNAPSHOT_MAGIC, SNAPSHOT_META_VERSION, file).map_err(|e| e.to_string())?;
    let version = first.version;
    if version < SNAPSHOT_FRAMES_VERSION {
        // One frame holds the whole state (versions 2 and 3), already checked.
        if first.len != file.len() {
            return Err(format!("{} bytes follow the snapshot's single frame", file.len() - first.len));
        }
        return Ok((version, std::borrow::Cow::Borrowed(first.payload)));
    }
    let lengths: [u8; 12] = first
        .payload
        .try_into()
        .map_err(|_| format!("snapshot header frame of {} bytes, not 12", first.payload.len()))?;
    let total = u64::from_le_bytes(lengths[..8].try_into().unwrap_or_default());
    let count = u32::from_le_bytes(lengths[8..].try_into().unwrap_or_default());
    // The total is checked against what the frames hold, not trusted for an allocation.
    let mut state = Vec::with_capacity(usize::try_from(total).unwrap_or(0).min(file.len()));
    let mut pos = first.len;
    for i in 0..count {
        let frame = envelope::decode_frame(SNAPSHOT_MAGIC, SNAPSHOT_META_VERSION, &file[pos..])
            .map_err(|e| format!("snapshot frame {} of {count}: {e}", i + 1))?;
        if frame.version != version {
            return Err(format!(
                "snapshot frame {} of {count} has version {}, the first {version}",
                i + 1,
                frame.version
            ));
        }
        state.extend_from_slice(frame.payload);
        pos += frame.len;
    }
    if pos != file.len() {
        return Err(format!("{} bytes follow the last of the snapshot's {count} frames", file.len() - pos));
    }
    if state.len() as u64 != total {
        return Err(format!("the snapshot's frames hold {} bytes, its header says {total}", state.len()));
    }
    Ok((version, std::borrow::Cow::Owned(state)))
}

/// The state and record index in a snapshot's payload of `version`: from version 5 the
/// state with batches that point into segments, and the index that says where; before
/// it, the state with every batch's records inline, and no index.
fn decode_snapshot(version: u16, payload: &[u8]) -> std::result::Result<(BrokerState, Vec<(Lsn, Loc)>), String> {
    let decoded = if version >= SNAPSHOT_META_VERSION {
        postcard::from_bytes(payload)
    } else {
        super::log::with_legacy_batches(|| postcard::from_bytes(payload)).map(|state| (state, Vec::new()))
    };
    decoded.map_err(|e| format!("snapshot does not decode: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(parts: &[bytes::Bytes]) -> Vec<u8> {
        parts.iter().flat_map(|p| p.iter().copied()).collect()
    }

    #[test]
    fn a_snapshot_round_trips_through_frames_of_any_size() {
        let state: Vec<u8> = (0..1_000u32).map(|i| (i * 7 % 251) as u8).collect();
        // (state length, frame size) -> frames after the first
        for (len, frame, frames) in [(0, 64, 0), (1, 64, 1), (1_000, 1_000, 1), (1_000, 999, 2), (1_000, 7, 143)] {
            let parts = snapshot_frames(bytes::Bytes::from(state[..len].to_vec()), frame, SNAPSHOT_FRAMES_VERSION);
            assert_eq!(parts.len(), 1 + 2 * frames, "len {len}, frame {frame}");
            let f = file(&parts);
            assert_eq!(&*snapshot_payload(&f).unwrap().1, &state[..len], "len {len}, frame {frame}");
        }
    }

    #[test]
    fn a_snapshot_of_the_single_frame_format_still_reads() {
        let old = envelope::encode(SNAPSHOT_MAGIC, 3, b"state of a version 3 broker");
        assert_eq!(&*snapshot_payload(&old).unwrap().1, b"state of a version 3 broker");
        let mut longer = old.clone();
        longer.push(0);
        assert!(snapshot_payload(&longer).unwrap_err().contains("1 bytes follow the snapshot's single frame"));
    }

    #[test]
    fn damage_anywhere_in_a_framed_snapshot_is_refused_with_where() {
        let state: Vec<u8> = (0..100u8).collect();
        let good = file(&snapshot_frames(bytes::Bytes::from(state), 30, SNAPSHOT_META_VERSION));
        // A flipped payload byte in the third data frame.
        let mut flipped = good.clone();
        let third = (envelope::HEADER_LEN + 12) + 2 * (envelope::HEADER_LEN + 30) + envelope::HEADER_LEN + 5;
        flipped[third] ^= 1;
        let err = snapshot_payload(&flipped).unwrap_err();
        assert!(err.contains("frame 3 of 4"), "{err}");
        // Cut short, or with bytes after the last frame.
        let err = snapshot_payload(&good[..good.len() - 1]).unwrap_err();
        assert!(err.contains("frame 4 of 4"), "{err}");
        let mut longer = good.clone();
        longer.push(0);
        assert!(snapshot_payload(&longer).unwrap_err().contains("1 bytes follow"));
        // A header that claims more than the frames hold.
        let mut parts = snapshot_frames(bytes::Bytes::from(vec![1u8; 10]), 30, SNAPSHOT_FRAMES_VERSION);
        let mut lengths = [0u8; 12];
        lengths[..8].copy_from_slice(&11u64.to_le_bytes());
        lengths[8..].copy_from_slice(&1u32.to_le_bytes());
        parts[0] = envelope::encode(SNAPSHOT_MAGIC, SNAPSHOT_FRAMES_VERSION, &lengths).into();
        assert!(snapshot_payload(&file(&parts)).unwrap_err().contains("header says 11"));
    }
}
