//! Opening a journal: the newest snapshot, the segments after it, torn tails cut back,
//! and the check that every segment the snapshot points into is there.

use super::*;

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
    /// Removes temporary upload files (`name#n`) that a kill during a snapshot write
    /// left in a local directory (object stores write whole objects, so leave none;
    /// and the local store's listing hides them, hence `std::fs`).
    pub(super) async fn remove_unfinished_uploads(&self) -> Result<()> {
        let Some((root, durability)) = &self.local else { return Ok(()) };
        for dir in [root.join("wal"), root.join("snapshot")] {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            let mut removed = false;
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().contains('#') {
                    tracing::warn!(path = %entry.path().display(), "removing an unfinished journal upload");
                    match std::fs::remove_file(entry.path()) {
                        // Its writer (the snapshot of a handle closed just before this
                        // open) finished or removed it meanwhile.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(Error::storage(
                                entry.path().display(),
                                format!("cannot remove an unfinished upload: {e}"),
                                None,
                            ))
                        }
                        Ok(()) => {}
                    }
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

    pub(super) async fn list(&self, dir: &str, suffix: &str) -> Result<Vec<(Lsn, Path)>> {
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

    pub(super) async fn replay(&self, fresh: BrokerState) -> Result<Recovered> {
        // Segments first: a live broker (beside a read-only open) deletes segments only
        // after a newer snapshot exists, so this order never sees a gap between the
        // snapshot it reads and the segments it listed; a segment deleted after the
        // listing is a NotFound, which the read-only open retries.
        let started = std::time::Instant::now();
        let mut opened = Opened::default();
        let segments = self.list_sized("wal", ".seg").await?;
        let (mut state, snapshot_lsn) = self.read_snapshot(&segments, &mut opened).await?.unwrap_or((fresh, 0));
        opened.snapshot_secs = started.elapsed().as_secs_f64();
        let journal_started = std::time::Instant::now();
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
            opened.journal_bytes += bytes.len() as u64;
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
                // Only entries after the snapshot can be a torn tail: one it covers
                // was durable before it, and a batch of it may be pointed at.
                let may_be_torn = is_last && lsn >= next;
                let frame = self.next_frame(&path, &bytes, pos, may_be_torn, &mut truncated_tail).await?;
                let Some(frame) = frame else { break };
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
                    Command::Append { tp, batch, .. }
                    | Command::Rewrite { tp, batch, .. }
                    | Command::DeadLetter { tp, batch, .. },
                    crate::state::Outcome::Produced { base_offset },
                ) = (&entry.command, &outcome)
                {
                    if self.stores_records() {
                        // The buffer is the frame's last bytes (see `Command::Append`).
                        let end = frame_start + envelope::HEADER_LEN + frame.payload.len();
                        let loc = Loc { segment: first, pos: (end - batch.len()) as u64, len: batch.len() as u32 };
                        state.store_batch(tp, *base_offset, entry_lsn);
                        shareflow_share::sync::lock(&self.records).locs.insert(entry_lsn, loc);
                    }
                }
                state.events = Default::default();
                next += 1;
                opened.journal_entries += 1;
            }
            if lsn > first {
                kept.push((first, lsn - 1));
            }
        }
        opened.journal_secs = journal_started.elapsed().as_secs_f64();
        Ok(Recovered { state, next_lsn: next, segments: kept, truncated_tail, opened })
    }

    /// Reads the newest snapshot, if there is one: the state it holds, and its lsn. The
    /// batch index it carries is checked against `segments`, then installed.
    async fn read_snapshot(
        &self,
        segments: &[(Lsn, Path, u64)],
        opened: &mut Opened,
    ) -> Result<Option<(BrokerState, Lsn)>> {
        let Some((lsn, path)) = self.list("snapshot", ".snap").await?.pop() else { return Ok(None) };
        let bytes = self.get(&path).await?;
        opened.snapshot_bytes = bytes.len() as u64;
        let (version, payload) = snapshot_payload(&bytes).map_err(|e| Error::corrupt(&path, e))?;
        let (state, index) = decode_snapshot(version, &payload).map_err(|e| Error::corrupt(&path, e))?;
        self.check_index(&state, &index, segments)?;
        shareflow_share::sync::lock(&self.records).locs = index.into_iter().collect();
        if let Ok(mut b) = self.lock() {
            b.last_snapshot_bytes = bytes.len() as u64;
            b.last_snapshot_lsn = lsn;
        }
        Ok(Some((state, lsn)))
    }

    /// Decodes the entry frame at `pos` of a segment. A damaged frame that may be a torn
    /// tail (`may_be_torn`) and is one is cut off (unless read-only) and noted in
    /// `truncated_tail`: `None`, nothing more to read in this segment. Any other damage
    /// is corruption.
    async fn next_frame<'b>(
        &self,
        path: &Path,
        bytes: &'b bytes::Bytes,
        pos: usize,
        may_be_torn: bool,
        truncated_tail: &mut Option<String>,
    ) -> Result<Option<envelope::Frame<'b>>> {
        match envelope::decode_frame(ENTRY_MAGIC, FORMAT_VERSION, &bytes[pos..]) {
            Ok(f) => Ok(Some(f)),
            Err(e) if may_be_torn && is_torn_tail(&bytes[pos..], &e) && !valid_frame_follows(&bytes[pos..]) => {
                tracing::warn!(
                    path = %path,
                    offset = pos,
                    error = %e,
                    "torn journal tail; truncating to the last good entry"
                );
                *truncated_tail = Some(format!("{path} at byte {pos}: {e}"));
                if !self.read_only {
                    self.cut_tail(path, bytes, pos).await?;
                }
                Ok(None)
            }
            Err(e) => Err(Error::corrupt(
                path,
                format!(
                    "journal entry at byte {pos} is damaged ({e}) and is not the torn tail of the last write; \
                     refusing to guess. Restore the broker directory from a backup"
                ),
            )),
        }
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
        // The index is written sorted by lsn (`snapshot_index`): a binary search finds a
        // batch's place without a second map of every batch held. Nothing is built per
        // batch unless it is damaged: this loop is most of a large snapshot's reopen.
        let index = sorted_by_lsn(index);
        let index = &index[..];
        let find = |lsn: Lsn| index.binary_search_by_key(&lsn, |(l, _)| *l).ok().map(|i| &index[i].1);
        for (tp, log) in state.logs() {
            for b in log.batches() {
                let BatchData::Stored(lsn) = b.data else { continue };
                let what = || format!("offsets {}..={} of {tp} (journal entry {lsn})", b.base_offset, b.last_offset());
                let Some(loc) = find(lsn) else {
                    return Err(Error::corrupt(
                        self.root.clone().join("snapshot"),
                        format!("the snapshot's record index does not say where {} lie; the broker directory is damaged: restore it from a copy, or start a new directory", what()),
                    ));
                };
                match sizes.get(&loc.segment) {
                    None => {
                        return Err(Error::corrupt(
                            self.segment_path(loc.segment),
                            format!("the segment is missing, and it holds {}; restore the broker directory from a copy, or start a new directory", what()),
                        ))
                    }
                    Some(&size) if loc.pos.checked_add(u64::from(loc.len)).is_none_or(|end| end > size) => {
                        return Err(Error::corrupt(
                            self.segment_path(loc.segment),
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
}

/// `index` sorted by lsn: as it is, when it already is (every snapshot this build writes),
/// or a sorted copy.
fn sorted_by_lsn(index: &[(Lsn, Loc)]) -> std::borrow::Cow<'_, [(Lsn, Loc)]> {
    if index.windows(2).all(|w| w[0].0 <= w[1].0) {
        std::borrow::Cow::Borrowed(index)
    } else {
        let mut owned = index.to_vec();
        owned.sort_unstable_by_key(|(lsn, _)| *lsn);
        std::borrow::Cow::Owned(owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_is_searched_in_lsn_order_whatever_order_it_was_written_in() {
        let loc = |segment| Loc { segment, pos: 0, len: 1 };
        let written = [(1, loc(1)), (5, loc(1)), (9, loc(2))];
        assert!(matches!(sorted_by_lsn(&written), std::borrow::Cow::Borrowed(_)));
        let shuffled = [(9, loc(2)), (1, loc(1)), (5, loc(1))];
        let sorted = sorted_by_lsn(&shuffled);
        assert_eq!(sorted.iter().map(|(lsn, _)| *lsn).collect::<Vec<_>>(), [1, 5, 9]);
        assert_eq!(sorted.binary_search_by_key(&9, |(l, _)| *l).map(|i| sorted[i].1.segment), Ok(2));
    }
}
