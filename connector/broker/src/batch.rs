//! The stored form of a batch of records: one buffer, one allocation, checked on read.
//!
//! Layout (little endian), decision 0020:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | format version: 1, or 2 when a record has headers |
//! | 1..5 | record count (u32) |
//! | 5..13 | newest timestamp (i64, ms) |
//! | 13..21 | bytes of keys and values (u64) |
//! | 21..25 | CRC-32C of bytes 0..21 followed by the records |
//! | 25.. | records |
//!
//! Each record: timestamp as a zigzag varint, key length + 1 and value length + 1 as
//! varints (0: none), then the key and value bytes. Version 2 follows each with its
//! header count as a varint and each header's name length, name, value length and value
//! (lengths as varints). A record read from a batch is a slice of the batch's buffer:
//! reading a batch allocates once, whatever its size (headers aside).

use bytes::{Bytes, BytesMut};

use super::log::LogRecord;

/// Version of the batch layout without headers.
const VERSION: u8 = 1;
/// Version of the batch layout with headers.
const VERSION_HEADERS: u8 = 2;
/// Size of the header before the records.
pub(crate) const HEADER_LEN: usize = 25;

/// Why bytes are not a valid batch. The caller names the file and the offsets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BatchError {
    #[error("a batch of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown batch format version {0}")]
    Version(u8),
    #[error("batch checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("batch record {0} is cut short")]
    Truncated(u32),
    #[cfg(test)]
    #[error("{0} bytes follow the batch's last record")]
    Trailing(usize),
}

/// A batch's header fields: what the broker keeps in memory about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMeta {
    pub(crate) count: u32,
    pub(crate) max_timestamp_ms: i64,
    pub(crate) bytes: u64,
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.extend_from_slice(&[(v as u8) | 0x80]);
        v >>= 7;
    }
    out.extend_from_slice(&[v as u8]);
}

fn get_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn opt_len(b: &Option<Bytes>) -> u64 {
    b.as_ref().map_or(0, |b| b.len() as u64 + 1)
}

/// Encodes records as one batch buffer.
pub(crate) fn encode(records: &[LogRecord]) -> Bytes {
    let payload: usize = records
        .iter()
        .map(|r| 30 + r.key.as_ref().map_or(0, Bytes::len) + r.value.as_ref().map_or(0, Bytes::len))
        .sum();
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload);
    out.resize(HEADER_LEN, 0);
    let mut max_ts = i64::MIN;
    let mut bytes = 0u64;
    let headers = records.iter().any(|r| !r.headers.is_empty());
    for r in records {
        max_ts = max_ts.max(r.timestamp_ms);
        put_varint(&mut out, zigzag(r.timestamp_ms));
        put_varint(&mut out, opt_len(&r.key));
        put_varint(&mut out, opt_len(&r.value));
        for part in [&r.key, &r.value].into_iter().flatten() {
            out.extend_from_slice(part);
            bytes += part.len() as u64;
        }
        if headers {
            put_varint(&mut out, r.headers.len() as u64);
            for (name, value) in &r.headers {
                put_varint(&mut out, name.len() as u64);
                out.extend_from_slice(name.as_bytes());
                put_varint(&mut out, value.len() as u64);
                out.extend_from_slice(value);
            }
        }
    }
    out[0] = if headers { VERSION_HEADERS } else { VERSION };
    out[1..5].copy_from_slice(&(records.len() as u32).to_le_bytes());
    out[5..13].copy_from_slice(&max_ts.to_le_bytes());
    out[13..21].copy_from_slice(&bytes.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..21]), &out[HEADER_LEN..]);
    out[21..25].copy_from_slice(&crc.to_le_bytes());
    out.freeze()
}

/// The header of a batch, checking its length and version but not its checksum (the
/// journal frame around it has one of its own; [`decode`] checks the batch's).
pub(crate) fn meta(batch: &[u8]) -> Result<BatchMeta, BatchError> {
    if batch.len() < HEADER_LEN {
        return Err(BatchError::Short(batch.len()));
    }
    if batch[0] != VERSION && batch[0] != VERSION_HEADERS {
        return Err(BatchError::Version(batch[0]));
    }
    let le8 = |r: std::ops::Range<usize>| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&batch[r]);
        a
    };
    Ok(BatchMeta {
        count: u32::from_le_bytes([batch[1], batch[2], batch[3], batch[4]]),
        max_timestamp_ms: i64::from_le_bytes(le8(5..13)),
        bytes: u64::from_le_bytes(le8(13..21)),
    })
}

/// One record of a batch: slices of the batch's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchRecord {
    pub(crate) timestamp_ms: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    pub(crate) headers: Vec<(String, Bytes)>,
}

/// Checks a batch's length, version and checksum; returns its header.
pub(crate) fn verify(batch: &[u8]) -> Result<BatchMeta, BatchError> {
    let m = meta(batch)?;
    let stored = u32::from_le_bytes([batch[21], batch[22], batch[23], batch[24]]);
    let computed = crc32c::crc32c_append(crc32c::crc32c(&batch[..21]), &batch[HEADER_LEN..]);
    if stored != computed {
        return Err(BatchError::Checksum { stored, computed });
    }
    Ok(m)
}

/// The records of a batch already [`verify`]-ed (or made by [`encode`]), lazily, each a
/// slice of `batch`. Damage still ends in an error, never a panic.
pub(crate) fn records(batch: &Bytes) -> Records<'_> {
    let count = meta(batch).map_or(0, |m| m.count);
    let headers = batch.first() == Some(&VERSION_HEADERS);
    Records { batch, pos: HEADER_LEN.min(batch.len()), index: 0, count, headers }
}

/// Iterator of [`records`].
pub(crate) struct Records<'a> {
    batch: &'a Bytes,
    pos: usize,
    index: u32,
    count: u32,
    headers: bool,
}

impl Records<'_> {
    fn next_record(&mut self) -> Result<BatchRecord, BatchError> {
        let i = self.index;
        let batch = self.batch;
        let ts = get_varint(batch, &mut self.pos).ok_or(BatchError::Truncated(i))?;
        let klen = get_varint(batch, &mut self.pos).ok_or(BatchError::Truncated(i))?;
        let vlen = get_varint(batch, &mut self.pos).ok_or(BatchError::Truncated(i))?;
        let mut take = |len: u64| -> Result<Option<Bytes>, BatchError> {
            if len == 0 {
                return Ok(None);
            }
            let n = usize::try_from(len - 1).map_err(|_| BatchError::Truncated(i))?;
            let end = self.pos.checked_add(n).filter(|&e| e <= batch.len()).ok_or(BatchError::Truncated(i))?;
            let part = batch.slice(self.pos..end);
            self.pos = end;
            Ok(Some(part))
        };
        let key = take(klen)?;
        let value = take(vlen)?;
        let mut headers = Vec::new();
        if self.headers {
            let n = get_varint(batch, &mut self.pos).ok_or(BatchError::Truncated(i))?;
            for _ in 0..n {
                let name = self.take_exact(i)?;
                let name = String::from_utf8(name.to_vec()).map_err(|_| BatchError::Truncated(i))?;
                headers.push((name, self.take_exact(i)?));
            }
        }
        Ok(BatchRecord { timestamp_ms: unzigzag(ts), key, value, headers })
    }

    /// A varint length and that many bytes.
    fn take_exact(&mut self, i: u32) -> Result<Bytes, BatchError> {
        let len = get_varint(self.batch, &mut self.pos).ok_or(BatchError::Truncated(i))?;
        let n = usize::try_from(len).map_err(|_| BatchError::Truncated(i))?;
        let end = self.pos.checked_add(n).filter(|&e| e <= self.batch.len()).ok_or(BatchError::Truncated(i))?;
        let part = self.batch.slice(self.pos..end);
        self.pos = end;
        Ok(part)
    }
}

impl Iterator for Records<'_> {
    type Item = Result<BatchRecord, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.index >= self.count {
            return None;
        }
        let r = self.next_record();
        self.index = if r.is_ok() { self.index + 1 } else { self.count };
        Some(r)
    }
}

/// Checks a batch and returns all its records, each a slice of `batch`.
#[cfg(test)]
pub(crate) fn decode(batch: &Bytes) -> Result<Vec<BatchRecord>, BatchError> {
    let m = verify(batch)?;
    let mut it = records(batch);
    // The count is checked against what the bytes hold, not trusted for an allocation.
    let mut out = Vec::with_capacity((m.count as usize).min(batch.len() / 3));
    for r in it.by_ref() {
        out.push(r?);
    }
    if it.pos != batch.len() {
        return Err(BatchError::Trailing(batch.len() - it.pos));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ts: i64, key: Option<&[u8]>, value: Option<&[u8]>) -> LogRecord {
        LogRecord {
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            timestamp_ms: ts,
            headers: Vec::new(),
        }
    }

    #[test]
    fn headers_round_trip_in_version_2_and_damage_is_refused() {
        let h = |n: &str, v: &[u8]| (n.to_string(), Bytes::copy_from_slice(v));
        let mut with = rec(7, Some(b"k"), Some(b"v"));
        with.headers = vec![h("__dlq.errors.topic", b"in"), h("empty", b""), h("", b"no name")];
        let records = vec![rec(5, None, Some(b"plain")), with];
        let b = encode(&records);
        assert_eq!(b[0], VERSION_HEADERS);
        let back = decode(&b).unwrap();
        assert!(back[0].headers.is_empty());
        assert_eq!(back[1].headers, records[1].headers);
        assert_eq!(back[1].value.as_deref(), Some(&b"v"[..]));
        for n in 0..b.len() {
            assert!(decode(&b.slice(..n)).is_err(), "cut at {n}");
        }
        // Without headers the layout stays version 1.
        assert_eq!(encode(&records[..1])[0], VERSION);
    }

    #[test]
    fn a_batch_round_trips_with_every_shape_of_record() {
        let big = vec![7u8; 300];
        let records = vec![
            rec(0, None, None),
            rec(-1, Some(b""), Some(b"")),
            rec(i64::MAX, Some(b"k"), None),
            rec(i64::MIN, None, Some(&big)),
            rec(1_700_000_000_000, Some(b"key"), Some(b"value")),
        ];
        let b = encode(&records);
        let m = meta(&b).unwrap();
        assert_eq!(m, BatchMeta { count: 5, max_timestamp_ms: i64::MAX, bytes: 1 + 300 + 3 + 5 });
        let back = decode(&b).unwrap();
        let want: Vec<BatchRecord> = records
            .iter()
            .map(|r| BatchRecord {
                timestamp_ms: r.timestamp_ms,
                key: r.key.clone(),
                value: r.value.clone(),
                headers: Vec::new(),
            })
            .collect();
        assert_eq!(back, want);
        // Records are slices of the one buffer.
        let v = back[3].value.as_ref().unwrap();
        assert!(b.as_ptr_range().contains(&v.as_ptr()));
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
    }

    #[test]
    fn damage_is_a_typed_error_never_a_panic() {
        let b = encode(&[rec(5, Some(b"key"), Some(b"value")), rec(6, None, Some(b"v2"))]);
        // Every single flipped byte and every cut is refused.
        for i in 0..b.len() {
            let mut d = b.to_vec();
            d[i] ^= 0x40;
            assert!(decode(&Bytes::from(d)).is_err(), "flip at {i}");
        }
        for n in 0..b.len() {
            assert!(decode(&b.slice(..n)).is_err(), "cut at {n}");
        }
        assert_eq!(decode(&b.slice(..3)), Err(BatchError::Short(3)));
        let mut v = b.to_vec();
        v[0] = 9;
        assert_eq!(meta(&v), Err(BatchError::Version(9)));
        assert!(matches!(decode(&b.slice(..b.len() - 1)), Err(BatchError::Checksum { .. })));
    }
}
