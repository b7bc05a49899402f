//! The snapshot file: the state in checksummed frames of at most 64 MiB behind a first
//! frame that gives the total length and the frame count, and its payload by version.

use super::*;

/// A snapshot file's parts: a first frame whose payload is the total length (u64 LE)
/// and the number of frames after it (u32 LE), then `state` in frames of at most
/// `frame_bytes`, each with its own header and checksum. The parts slice `state`
/// without copying it, so the store writes them as they are.
pub(super) fn snapshot_frames(state: bytes::Bytes, frame_bytes: usize, version: u16) -> Vec<bytes::Bytes> {
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
pub(super) fn snapshot_payload(file: &[u8]) -> std::result::Result<(u16, std::borrow::Cow<'_, [u8]>), String> {
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
pub(super) fn decode_snapshot(
    version: u16,
    payload: &[u8],
) -> std::result::Result<(BrokerState, Vec<(Lsn, Loc)>), String> {
    let decoded = if version >= SNAPSHOT_META_VERSION {
        postcard::from_bytes(payload)
    } else {
        crate::log::with_legacy_batches(|| postcard::from_bytes(payload)).map(|state| (state, Vec::new()))
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
