//! The record index: where each stored batch lies, the buffers not written yet, the
//! open segment files and the read cache; reading a batch from its segment.

use super::*;

/// The record index: where each stored batch lies, the buffers not written yet, open
/// segment files and a bounded cache of batches read.
#[derive(Debug, Default)]
pub(super) struct RecordIndex {
    pub(super) locs: BTreeMap<Lsn, Loc>,
    pub(super) pending: BTreeMap<Lsn, Bytes>,
    /// Open segment files, at most [`OPEN_SEGMENTS`], the oldest opened closed first.
    pub(super) files: HashMap<Lsn, Arc<std::fs::File>>,
    pub(super) files_order: VecDeque<Lsn>,
    pub(super) cache: HashMap<Lsn, Bytes>,
    pub(super) cache_order: VecDeque<Lsn>,
    pub(super) cache_bytes: usize,
}

/// Segment files kept open for reads.
const OPEN_SEGMENTS: usize = 64;

impl JournalCore {
    /// A batch's buffer, checked, wherever it lives: memory, not yet written, the read
    /// cache, or its segment (read from the OS page cache), kept in the read cache: for
    /// deliveries, which come back for the same batches.
    pub(crate) fn load_batch(&self, tp: &TopicPartition, batch: &LogBatch) -> Result<Bytes> {
        self.load(tp, batch, true)
    }

    /// [`load_batch`](Self::load_batch) without keeping what it reads from a segment:
    /// for plain fetches, which read a topic through once and would push out of the
    /// cache what deliveries use (a scan of 20,000,000 records filled it to its 64 MiB).
    pub(crate) fn read_batch(&self, tp: &TopicPartition, batch: &LogBatch) -> Result<Bytes> {
        self.load(tp, batch, false)
    }

    fn load(&self, tp: &TopicPartition, batch: &LogBatch, keep: bool) -> Result<Bytes> {
        let lsn = match &batch.data {
            BatchData::Inline(data) => return Ok(data.clone()),
            BatchData::Stored(lsn) => *lsn,
        };
        let mut index = shareflow_share::sync::lock(&self.records);
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
        let meta = crate::batch::verify(&data).map_err(|e| damaged(e.to_string()))?;
        if meta.count != batch.count {
            return Err(damaged(format!("they hold {} records, the log says {}", meta.count, batch.count)));
        }
        if !keep {
            return Ok(data);
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
    pub(super) fn snapshot_index(&self, state: &BrokerState) -> Result<(Vec<(Lsn, Loc)>, Referenced)> {
        let index = shareflow_share::sync::lock(&self.records);
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
}
