//! The manifest (`_metadata`): the commit decision of a checkpoint.

use serde::{Deserialize, Serialize};

use crate::envelope::{self, Magic};
use crate::error::{CheckpointError, Result};

/// Magic of manifest files.
pub const MANIFEST_MAGIC: Magic = Magic(*b"SFCM");
/// Magic of state files.
pub const STATE_MAGIC: Magic = Magic(*b"SFCS");
/// The manifest format this build writes and the newest it reads.
pub const MANIFEST_VERSION: u16 = 1;
/// The state-file envelope version this build writes and the newest it reads.
pub const STATE_VERSION: u16 = 1;

/// One operator subtask's state, as the manifest records it: a state file, or the
/// state itself inlined into the manifest when it is small (as Flink inlines state below
/// `state.storage.fs.memory-threshold`), which saves a PUT per subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFileRef {
    /// Operator name.
    pub operator: String,
    /// Subtask index.
    pub subtask: u32,
    /// Size of the file in bytes, envelope included; for inline state, of the payload.
    pub size: u64,
    /// CRC-32C of the whole file; for inline state, of the payload.
    pub crc32c: u32,
    /// The state payload itself, when inlined; `None` for a state file.
    pub inline: Option<bytes::Bytes>,
}

impl StateFileRef {
    /// A reference that carries `payload` inline.
    pub fn inline(operator: &str, subtask: u32, payload: &[u8]) -> Self {
        Self {
            operator: operator.to_string(),
            subtask,
            size: payload.len() as u64,
            crc32c: crc32c::crc32c(payload),
            inline: Some(bytes::Bytes::copy_from_slice(payload)),
        }
    }
}

/// Where a transactional participant's transaction stood when the manifest was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParticipantState {
    /// Prepared: the manifest decides it commits.
    Prepared,
    /// Already committed (a re-published manifest, or a participant that commits early).
    Committed,
}

/// The transaction a participant (a source, a sink) prepared for this checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionRecord {
    /// Participant name, e.g. `share-source` or `topic-sink`.
    pub participant: String,
    /// Its transaction id, `{groupId}-{prefix}-{checkpointId}`.
    pub transaction_id: String,
    /// Its state at manifest time.
    pub state: ParticipantState,
}

/// A checkpoint's manifest. Written last, with `PutMode::Create`, and never overwritten:
/// its existence is the decision to commit every transaction it lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Job id.
    pub job_id: String,
    /// Checkpoint id.
    pub checkpoint_id: u64,
    /// Creation time, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Every state file of the checkpoint.
    pub state_files: Vec<StateFileRef>,
    /// The transactions the checkpoint commits.
    pub transactions: Vec<TransactionRecord>,
}

impl Manifest {
    /// Encodes the manifest in its envelope.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let payload = postcard::to_allocvec(self)
            .map_err(|e| CheckpointError::Internal(format!("cannot encode manifest: {e}")))?;
        Ok(envelope::encode(MANIFEST_MAGIC, MANIFEST_VERSION, &payload))
    }

    /// Decodes and checks a manifest read from `path`.
    pub fn decode(path: &str, bytes: &[u8]) -> Result<Self> {
        let payload =
            envelope::decode(MANIFEST_MAGIC, MANIFEST_VERSION, bytes).map_err(|e| CheckpointError::corrupt(path, e))?;
        let manifest: Manifest = postcard::from_bytes(payload)
            .map_err(|e| CheckpointError::corrupt(path, format!("manifest payload does not decode: {e}")))?;
        Ok(manifest)
    }

    /// Total bytes of state.
    pub fn state_bytes(&self) -> u64 {
        self.state_files.iter().map(|f| f.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            job_id: "j".into(),
            checkpoint_id: 3,
            created_at_ms: 1,
            state_files: vec![
                StateFileRef { operator: "src".into(), subtask: 0, size: 10, crc32c: 7, inline: None },
                StateFileRef::inline("sink", 1, b"small"),
            ],
            transactions: vec![TransactionRecord {
                participant: "share-source".into(),
                transaction_id: "g-p-3".into(),
                state: ParticipantState::Prepared,
            }],
        }
    }

    #[test]
    fn round_trip() {
        let m = sample();
        assert_eq!(Manifest::decode("x", &m.encode().unwrap()).unwrap(), m);
    }

    #[test]
    fn corrupt_truncated_and_newer_manifests_name_file_and_reason() {
        let bytes = sample().encode().unwrap();
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let mut newer = bytes.clone();
        newer[4] = 9; // version 9
        for (bad, reason) in
            [(flipped, "checksum"), (bytes[..bytes.len() - 2].to_vec(), "truncated"), (newer, "version")]
        {
            let err = Manifest::decode("chk-3/_metadata", &bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Data);
            let msg = err.to_string();
            assert!(msg.contains("chk-3/_metadata") && msg.contains(reason), "{msg}");
        }
    }
}
