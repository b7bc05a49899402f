//! The versioned envelope around every durable file and journal frame.
//!
//! Layout (little endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic, chosen by the kind of file |
//! | 4..6 | format version |
//! | 6..8 | reserved, zero |
//! | 8..12 | payload length |
//! | 12..16 | CRC-32C of bytes 0..12 followed by the payload |
//! | 16.. | payload |
//!
//! The checksum covers the header too, so a flipped length or version is caught even
//! when the payload happens to fit.

use std::fmt;

/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 16;

/// Largest payload an envelope may carry (1 GiB). Guards against a corrupt length
/// field asking for an absurd allocation.
pub const MAX_PAYLOAD_LEN: usize = 1 << 30;

/// Four bytes that identify the kind of file inside an envelope.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Magic(pub [u8; 4]);

impl fmt::Debug for Magic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Display for Magic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why bytes failed to decode as an envelope. The caller adds the file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Fewer bytes than a header, or than the header's length field promises.
    #[error("truncated: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes the envelope needs.
        needed: usize,
        /// Bytes that were there.
        available: usize,
    },
    /// The first four bytes are not the expected magic.
    #[error("bad magic: expected {expected}, found {found}")]
    BadMagic {
        /// The magic the reader expected.
        expected: Magic,
        /// The magic that was there.
        found: Magic,
    },
    /// A format version this build cannot read.
    #[error("unknown format version {found} (this build reads up to {supported})")]
    UnknownVersion {
        /// The version in the header.
        found: u16,
        /// The newest version this build understands.
        supported: u16,
    },
    /// The length field is larger than [`MAX_PAYLOAD_LEN`].
    #[error("length field {len} exceeds the limit of {MAX_PAYLOAD_LEN} bytes")]
    LengthTooLarge {
        /// The length in the header.
        len: usize,
    },
    /// Bytes left over after a whole-file envelope.
    #[error("length mismatch: header says {declared} payload bytes, file has {actual}")]
    LengthMismatch {
        /// Payload length in the header.
        declared: usize,
        /// Payload bytes present.
        actual: usize,
    },
    /// The CRC-32C does not match.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the bytes read.
        computed: u32,
    },
}

/// Wraps `payload` in an envelope.
pub fn encode(magic: Magic, version: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    encode_into(&mut out, magic, version, payload);
    out
}

/// Appends an envelope around `payload` to `out`, for files that hold many frames.
pub fn encode_into(out: &mut Vec<u8>, magic: Magic, version: u16, payload: &[u8]) {
    out.extend_from_slice(&header(magic, version, payload));
    out.extend_from_slice(payload);
}

/// The header of the envelope around `payload`, for a writer that sends the payload
/// without copying it behind the header. `payload` must not exceed [`MAX_PAYLOAD_LEN`]
/// (a reader refuses such a frame); split larger data into several frames.
pub fn header(magic: Magic, version: u16, payload: &[u8]) -> [u8; HEADER_LEN] {
    debug_assert!(payload.len() <= MAX_PAYLOAD_LEN);
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&magic.0);
    h[4..6].copy_from_slice(&version.to_le_bytes());
    h[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..12]), payload);
    h[12..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Decodes a file that is exactly one envelope. Extra trailing bytes are an error.
pub fn decode(magic: Magic, max_version: u16, bytes: &[u8]) -> Result<&[u8], EnvelopeError> {
    let frame = decode_frame(magic, max_version, bytes)?;
    let rest = bytes.len() - frame.len;
    if rest != 0 {
        return Err(EnvelopeError::LengthMismatch { declared: frame.payload.len(), actual: bytes.len() - HEADER_LEN });
    }
    Ok(frame.payload)
}

/// One decoded frame from the front of a byte slice.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The format version in the header.
    pub version: u16,
    /// The checked payload.
    pub payload: &'a [u8],
    /// Bytes the whole frame occupies, header included.
    pub len: usize,
}

/// Decodes the envelope at the front of `bytes`, leaving whatever follows it.
pub fn decode_frame(magic: Magic, max_version: u16, bytes: &[u8]) -> Result<Frame<'_>, EnvelopeError> {
    let header =
        bytes.get(..HEADER_LEN).ok_or(EnvelopeError::Truncated { needed: HEADER_LEN, available: bytes.len() })?;
    let found = Magic([header[0], header[1], header[2], header[3]]);
    if found != magic {
        return Err(EnvelopeError::BadMagic { expected: magic, found });
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version == 0 || version > max_version {
        return Err(EnvelopeError::UnknownVersion { found: version, supported: max_version });
    }
    let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    if len > MAX_PAYLOAD_LEN {
        return Err(EnvelopeError::LengthTooLarge { len });
    }
    let stored = u32::from_le_bytes([header[12], header[13], header[14], header[15]]);
    let payload = bytes
        .get(HEADER_LEN..HEADER_LEN + len)
        .ok_or(EnvelopeError::Truncated { needed: HEADER_LEN + len, available: bytes.len() })?;
    let computed = crc32c::crc32c_append(crc32c::crc32c(&header[..12]), payload);
    if computed != stored {
        return Err(EnvelopeError::ChecksumMismatch { stored, computed });
    }
    Ok(Frame { version, payload, len: HEADER_LEN + len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const M: Magic = Magic(*b"TEST");

    #[test]
    fn round_trip() {
        let bytes = encode(M, 3, b"hello");
        assert_eq!(bytes.len(), HEADER_LEN + 5);
        assert_eq!(decode(M, 3, &bytes), Ok(&b"hello"[..]));
    }

    #[test]
    fn wrong_magic_is_named() {
        let bytes = encode(Magic(*b"XXXX"), 1, b"a");
        let err = decode(M, 1, &bytes).unwrap_err();
        assert!(matches!(err, EnvelopeError::BadMagic { .. }));
        assert!(err.to_string().contains("TEST"), "{err}");
    }

    #[test]
    fn newer_version_is_rejected() {
        let bytes = encode(M, 2, b"a");
        assert_eq!(decode(M, 1, &bytes), Err(EnvelopeError::UnknownVersion { found: 2, supported: 1 }));
    }

    #[test]
    fn truncation_is_detected() {
        let bytes = encode(M, 1, b"abcdef");
        for cut in 0..bytes.len() {
            let err = decode(M, 1, &bytes[..cut]).unwrap_err();
            assert!(matches!(err, EnvelopeError::Truncated { .. }), "cut {cut}: {err}");
        }
    }

    #[test]
    fn trailing_bytes_are_a_length_mismatch() {
        let mut bytes = encode(M, 1, b"abc");
        bytes.push(0);
        assert!(matches!(decode(M, 1, &bytes), Err(EnvelopeError::LengthMismatch { .. })));
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let bytes = encode(M, 1, b"payload bytes");
        for i in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[i / 8] ^= 1 << (i % 8);
            assert!(decode(M, 1, &flipped).is_err(), "flip of bit {i} went unnoticed");
        }
    }

    #[test]
    fn frames_decode_in_sequence() {
        let mut out = Vec::new();
        encode_into(&mut out, M, 1, b"one");
        encode_into(&mut out, M, 1, b"two");
        let first = decode_frame(M, 1, &out).unwrap();
        assert_eq!(first.payload, b"one");
        let second = decode_frame(M, 1, &out[first.len..]).unwrap();
        assert_eq!(second.payload, b"two");
        assert_eq!(first.len + second.len, out.len());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(M, 1, &bytes);
            let _ = decode_frame(M, 1, &bytes);
        }

        #[test]
        fn any_payload_round_trips(payload in proptest::collection::vec(any::<u8>(), 0..512), version in 1u16..5) {
            let bytes = encode(M, version, &payload);
            prop_assert_eq!(decode(M, 5, &bytes), Ok(&payload[..]));
        }
    }
}
