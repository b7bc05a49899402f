//! The manifest (`_metadata`): the commit decision of a checkpoint.

use serde::{Deserialize, Serialize};

use crate::envelope::{self, Magic};
use crate::error::{CheckpointError, Result};
use crate::CheckpointId;

/// Magic of manifest files.
pub(crate) const MANIFEST_MAGIC: Magic = Magic(*b"SFCM");
/// Magic of state files.
pub(crate) const STATE_MAGIC: Magic = Magic(*b"SFCS");
/// The manifest format this build writes and the newest it reads. Version 3 added
/// [`StateFileRef::part`] (a large state split into parts of a bounded size); version 2
/// added [`StateFileRef::offset`] (state merged into one object per checkpoint). Older
/// manifests still read: each of their states is one part.
pub(crate) const MANIFEST_VERSION: u16 = 3;
/// The state-file envelope version this build writes and the newest it reads.
pub(crate) const STATE_VERSION: u16 = 1;

/// One operator subtask's state, as the manifest records it: the state itself inlined
/// into the manifest when it is small (as Flink inlines state below
/// `state.storage.fs.memory-threshold`), or an enveloped section of the checkpoint's one
/// shared state object (as Flink's file merging keeps state handles as offsets into a
/// shared file), or (manifests of version 1) a state file of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFileRef {
    /// Operator name.
    pub operator: String,
    /// Subtask index.
    pub subtask: u32,
    /// Size in bytes of the file or section, envelope included; for inline state, of
    /// the payload.
    pub size: u64,
    /// CRC-32C of the whole file or section; for inline state, of the payload.
    pub crc32c: u32,
    /// The state payload itself, when inlined; `None` otherwise.
    pub inline: Option<bytes::Bytes>,
    /// Where the section starts in the checkpoint's shared state object
    /// ([`SHARED_STATE_NAME`](crate::paths::SHARED_STATE_NAME)); `None` for inline state
    /// and for a state file of its own.
    pub offset: Option<u64>,
    /// Which part of the subtask's state this is. A state larger than the store's part
    /// limit is split into parts 0, 1, ... of at most that many payload bytes; its
    /// payload is their payloads in part order. Most states have only part 0.
    pub part: u32,
}

impl StateFileRef {
    /// A reference that carries `payload` inline.
    pub fn inline(operator: &str, subtask: u32, payload: &[u8]) -> Self {
        Self::inline_bytes(operator, subtask, bytes::Bytes::copy_from_slice(payload))
    }

    /// [`inline`](Self::inline) without copying `payload`.
    pub(crate) fn inline_bytes(operator: &str, subtask: u32, payload: bytes::Bytes) -> Self {
        Self {
            operator: operator.to_string(),
            subtask,
            size: payload.len() as u64,
            crc32c: crc32c::crc32c(&payload),
            inline: Some(payload),
            offset: None,
            part: 0,
        }
    }

    /// `operator-subtask`, with `.pK` for a part after the first: names this state in
    /// errors.
    pub fn label(&self) -> String {
        match self.part {
            0 => format!("{}-{}", self.operator, self.subtask),
            k => format!("{}-{}.p{k}", self.operator, self.subtask),
        }
    }
}

/// Version 1 of [`StateFileRef`]: no offset, every state file on its own.
#[derive(Deserialize)]
struct StateFileRefV1 {
    operator: String,
    subtask: u32,
    size: u64,
    crc32c: u32,
    inline: Option<bytes::Bytes>,
}

/// Version 1 of [`Manifest`].
#[derive(Deserialize)]
struct ManifestV1 {
    job_id: String,
    checkpoint_id: CheckpointId,
    created_at_ms: u64,
    state_files: Vec<StateFileRefV1>,
    transactions: Vec<TransactionRecord>,
}

impl From<ManifestV1> for ManifestV2 {
    fn from(m: ManifestV1) -> Self {
        let file = |f: StateFileRefV1| StateFileRefV2 {
            operator: f.operator,
            subtask: f.subtask,
            size: f.size,
            crc32c: f.crc32c,
            inline: f.inline,
            offset: None,
        };
        ManifestV2 {
            job_id: m.job_id,
            checkpoint_id: m.checkpoint_id,
            created_at_ms: m.created_at_ms,
            state_files: m.state_files.into_iter().map(file).collect(),
            transactions: m.transactions,
        }
    }
}

/// Version 2 of [`StateFileRef`]: no part, every state in one piece.
#[derive(Deserialize)]
struct StateFileRefV2 {
    operator: String,
    subtask: u32,
    size: u64,
    crc32c: u32,
    inline: Option<bytes::Bytes>,
    offset: Option<u64>,
}

/// Version 2 of [`Manifest`].
#[derive(Deserialize)]
struct ManifestV2 {
    job_id: String,
    checkpoint_id: CheckpointId,
    created_at_ms: u64,
    state_files: Vec<StateFileRefV2>,
    transactions: Vec<TransactionRecord>,
}

impl From<ManifestV2> for Manifest {
    fn from(m: ManifestV2) -> Self {
        Manifest {
            job_id: m.job_id,
            checkpoint_id: m.checkpoint_id,
            created_at_ms: m.created_at_ms,
            state_files: m
                .state_files
                .into_iter()
                .map(|f| StateFileRef {
                    operator: f.operator,
                    subtask: f.subtask,
                    size: f.size,
                    crc32c: f.crc32c,
                    inline: f.inline,
                    offset: f.offset,
                    part: 0,
                })
                .collect(),
            transactions: m.transactions,
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
    pub checkpoint_id: CheckpointId,
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
        let frame = envelope::decode_frame(MANIFEST_MAGIC, MANIFEST_VERSION, bytes)
            .map_err(|e| CheckpointError::corrupt(path, e))?;
        if frame.len != bytes.len() {
            let e = envelope::EnvelopeError::LengthMismatch {
                declared: frame.payload.len(),
                actual: bytes.len() - envelope::HEADER_LEN,
            };
            return Err(CheckpointError::corrupt(path, e));
        }
        let bad = |e: postcard::Error| CheckpointError::corrupt(path, format!("manifest payload does not decode: {e}"));
        let manifest = match frame.version {
            1 => ManifestV2::from(postcard::from_bytes::<ManifestV1>(frame.payload).map_err(bad)?).into(),
            2 => postcard::from_bytes::<ManifestV2>(frame.payload).map_err(bad)?.into(),
            _ => postcard::from_bytes::<Manifest>(frame.payload).map_err(bad)?,
        };
        for f in &manifest.state_files {
            if f.inline.is_some() && f.offset.is_some() {
                return Err(CheckpointError::corrupt(
                    path,
                    format!("state of {} is both inline and in the shared object", f.label()),
                ));
            }
        }
        if let Some(reason) = check_parts(&manifest.state_files) {
            return Err(CheckpointError::corrupt(path, reason));
        }
        Ok(manifest)
    }

    /// Total bytes of state.
    pub fn state_bytes(&self) -> u64 {
        self.state_files.iter().map(|f| f.size).sum()
    }
}

/// Every subtask's parts must be 0, 1, ..., each once; says what is wrong otherwise.
fn check_parts(files: &[StateFileRef]) -> Option<String> {
    let mut parts: std::collections::BTreeMap<(&str, u32), Vec<u32>> = Default::default();
    for f in files {
        parts.entry((f.operator.as_str(), f.subtask)).or_default().push(f.part);
    }
    for ((operator, subtask), mut have) in parts {
        have.sort_unstable();
        if have.iter().enumerate().any(|(i, p)| *p != i as u32) {
            return Some(format!(
                "the state of {operator}-{subtask} has parts {have:?}; it needs each of 0..{} once",
                have.len()
            ));
        }
    }
    None
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
                StateFileRef {
                    operator: "src".into(),
                    subtask: 0,
                    size: 10,
                    crc32c: 7,
                    inline: None,
                    offset: Some(0),
                    part: 0,
                },
                StateFileRef { part: 1, offset: None, ..StateFileRef::inline("src", 0, b"") },
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

    /// The version 1 layout, as an older build wrote it.
    #[derive(Serialize)]
    struct V1Ref<'a> {
        operator: &'a str,
        subtask: u32,
        size: u64,
        crc32c: u32,
        inline: Option<bytes::Bytes>,
    }

    #[derive(Serialize)]
    struct V1<'a> {
        job_id: &'a str,
        checkpoint_id: u64,
        created_at_ms: u64,
        state_files: Vec<V1Ref<'a>>,
        transactions: Vec<TransactionRecord>,
    }

    #[test]
    fn a_version_1_manifest_reads_with_every_state_file_on_its_own() {
        let v1 = V1 {
            job_id: "j",
            checkpoint_id: 3,
            created_at_ms: 1,
            state_files: vec![
                V1Ref { operator: "src", subtask: 0, size: 10, crc32c: 7, inline: None },
                V1Ref {
                    operator: "sink",
                    subtask: 1,
                    size: 5,
                    crc32c: 9,
                    inline: Some(bytes::Bytes::from_static(b"small")),
                },
            ],
            transactions: sample().transactions,
        };
        let bytes = envelope::encode(MANIFEST_MAGIC, 1, &postcard::to_allocvec(&v1).unwrap());
        let m = Manifest::decode("chk-3/_metadata", &bytes).unwrap();
        assert_eq!(m.state_files.len(), 2);
        assert!(m.state_files.iter().all(|f| f.offset.is_none()));
        assert_eq!((m.state_files[0].size, m.state_files[0].crc32c), (10, 7));
        assert_eq!(m.state_files[1].inline.as_deref(), Some(&b"small"[..]));
        assert_eq!(m.transactions, sample().transactions);
        // Its trailing bytes are refused as a version 2 manifest's are.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Manifest::decode("chk-3/_metadata", &longer).unwrap_err().to_string().contains("chk-3/_metadata"));
    }

    #[test]
    fn a_version_2_manifest_reads_with_every_state_in_one_part() {
        #[derive(Serialize)]
        struct V2Ref<'a> {
            operator: &'a str,
            subtask: u32,
            size: u64,
            crc32c: u32,
            inline: Option<bytes::Bytes>,
            offset: Option<u64>,
        }
        let v2 = (
            "j",
            3u64,
            1u64,
            vec![
                V2Ref { operator: "src", subtask: 0, size: 10, crc32c: 7, inline: None, offset: Some(4) },
                V2Ref { operator: "src", subtask: 1, size: 12, crc32c: 8, inline: None, offset: None },
            ],
            sample().transactions,
        );
        let bytes = envelope::encode(MANIFEST_MAGIC, 2, &postcard::to_allocvec(&v2).unwrap());
        let m = Manifest::decode("chk-3/_metadata", &bytes).unwrap();
        let got: Vec<_> = m.state_files.iter().map(|f| (f.subtask, f.offset, f.size, f.part)).collect();
        assert_eq!(got, vec![(0, Some(4), 10, 0), (1, None, 12, 0)]);
    }

    #[test]
    fn parts_missing_or_twice_are_corrupt_and_named() {
        for parts in [vec![0, 2], vec![1], vec![0, 1, 1]] {
            let mut m = sample();
            m.state_files.retain(|f| f.operator != "src");
            for part in &parts {
                m.state_files.push(StateFileRef { part: *part, ..StateFileRef::inline("agg", 4, b"x") });
            }
            let err = Manifest::decode("chk-3/_metadata", &m.encode().unwrap()).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Data);
            assert!(err.to_string().contains("agg-4 has parts"), "{parts:?}: {err}");
        }
    }

    #[test]
    fn a_state_both_inline_and_in_the_shared_object_is_corrupt() {
        let mut m = sample();
        m.state_files[2].offset = Some(0);
        let err = Manifest::decode("chk-3/_metadata", &m.encode().unwrap()).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Data);
        assert!(err.to_string().contains("sink-1 is both inline and in the shared object"), "{err}");
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
