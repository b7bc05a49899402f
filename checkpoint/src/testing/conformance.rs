//! The checkpoint-storage conformance suite: one set of async checks that every backend
//! (memory, local disk, the S3 server, the fault-injecting wrapper) must pass.
//!
//! Each check takes a store and a root prefix and uses its own job id, so the checks can
//! share a bucket. A failed check panics with what differed.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::manifest::{Manifest, ParticipantState, TransactionRecord};
use crate::protocol::{CheckpointStatus, CollectReason, RetentionPolicy};
use crate::{envelope, CheckpointId, CheckpointPaths, CheckpointStore, ErrorKind, Published};

/// A backend under test.
#[derive(Debug, Clone)]
pub struct Target {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// A prefix inside it that the suite may use.
    pub root: Path,
    /// Tag that keeps job ids of different runs apart on a shared server.
    pub run: String,
}

impl Target {
    /// A target; `run` should be unique per test run when the store is shared.
    pub fn new(store: Arc<dyn ObjectStore>, root: &str, run: &str) -> Self {
        Self { store, root: Path::from(root), run: run.to_string() }
    }

    fn job(&self, name: &str) -> CheckpointStore {
        let job = format!("{name}-{}", self.run);
        CheckpointStore::new(self.store.clone(), CheckpointPaths::new(self.root.clone(), &job).expect("valid job id"))
    }
}

/// Every check, in order.
pub async fn run_all(t: &Target) {
    state_round_trip(t).await;
    manifest_is_create_only(t).await;
    concurrent_manifest_creators_one_wins(t).await;
    list_order_is_numeric(t).await;
    recovery_picks_the_newest_complete(t).await;
    corrupt_manifest_falls_back_and_is_kept(t).await;
    wrong_version_manifest_falls_back(t).await;
    corrupt_state_file_falls_back(t).await;
    truncated_state_file_falls_back(t).await;
    garbage_collection_keeps_what_is_needed(t).await;
    savepoints_survive_and_restore(t).await;
    inline_and_file_state_restore_together(t).await;
}

/// Small state rides in the manifest, large state in the checkpoint's shared object
/// (read back by ranged GETs); all of it restores and verifies. A flipped byte in one
/// section of the shared object makes recovery fall back, naming the section.
pub async fn inline_and_file_state_restore_together(t: &Target) {
    let store = t.job("inline");
    let small = Bytes::from(vec![1u8; 100]);
    let large = Bytes::from(vec![2u8; 40_000]);
    let larger = Bytes::from(vec![3u8; 50_000]);
    let states = vec![
        ("source".to_string(), 0, small.clone()),
        ("sink".to_string(), 0, large.clone()),
        ("sink".to_string(), 1, larger.clone()),
    ];
    // A 16 KiB inline limit takes the small state only.
    let manifest = store.commit_checkpoint(1, &states, vec![], 16 * 1024).await.expect("commit");
    let f = &manifest.state_files;
    assert!(f[0].inline.is_some() && f[1].inline.is_none() && f[2].inline.is_none());
    assert_eq!((f[1].offset, f[2].offset), (Some(0), Some(f[1].size)), "two sections of one object");
    let listed = store.list_checkpoints().await.expect("list");
    assert_eq!(listed[0].state_files, 1, "one shared object holds both large states");
    let restored = store.recover(&RetentionPolicy::default()).await.expect("recover").restored.expect("restored");
    assert_eq!(restored.states[&("source".to_string(), 0)], small);
    assert_eq!(restored.states[&("sink".to_string(), 0)], large);
    assert_eq!(restored.states[&("sink".to_string(), 1)], larger);
    // Checkpoint 2, then a flipped byte in its second section.
    let second = store.commit_checkpoint(2, &states, vec![], 16 * 1024).await.expect("commit");
    let path = store.paths().shared_state(2);
    let mut bytes = raw_get(t, &path).await.to_vec();
    let at = second.state_files[2].offset.expect("shared") as usize + 100;
    bytes[at] ^= 1;
    overwrite(t, &path, bytes).await;
    let recovery = store.recover(&RetentionPolicy::default()).await.expect("recover");
    assert_eq!(recovery.plan.restored_id(), Some(1));
    let reason = recovery.plan.skipped.iter().find(|(id, _)| *id == 2).map(|(_, why)| why.clone());
    assert!(reason.as_deref().is_some_and(|r| r.contains("_shared.state@") && r.contains("(sink-1)")), "{reason:?}");
}

/// Writes a complete checkpoint with two state files.
pub async fn complete_checkpoint(store: &CheckpointStore, checkpoint_id: CheckpointId) -> Manifest {
    let source = format!("source-{checkpoint_id}");
    let sink = format!("sink-{checkpoint_id}");
    let a = store.write_state(checkpoint_id, "source", 0, source.as_bytes()).await.expect("write state");
    let b = store.write_state(checkpoint_id, "sink", 0, sink.as_bytes()).await.expect("write state");
    let manifest = Manifest {
        job_id: store.paths().job_id().to_string(),
        checkpoint_id,
        created_at_ms: 1_000 + checkpoint_id,
        state_files: vec![a, b],
        transactions: vec![TransactionRecord {
            participant: "share-source".into(),
            transaction_id: format!("g-p-{checkpoint_id}"),
            state: ParticipantState::Prepared,
        }],
    };
    // AlreadyPublished happens when a put landed but its response was lost.
    store.publish_manifest(&manifest).await.expect("publish");
    manifest
}

async fn restored_id(store: &CheckpointStore) -> Option<CheckpointId> {
    store.recover(&RetentionPolicy::default()).await.expect("recover").plan.restored_id()
}

/// A state file reads back as written, with its size and checksum recorded.
pub async fn state_round_trip(t: &Target) {
    let store = t.job("round-trip");
    let payload = vec![42u8; 100_000];
    let file = store.write_state(1, "op", 3, &payload).await.expect("write");
    assert_eq!(file.size, payload.len() as u64 + envelope::HEADER_LEN as u64);
    let read = store.read_state(&store.paths().checkpoint_dir(1), &file).await.expect("read");
    assert_eq!(read.as_ref(), &payload[..]);
}

/// Publishing is create-only: the same bytes again succeed, different bytes are fenced.
pub async fn manifest_is_create_only(t: &Target) {
    let store = t.job("create-only");
    let manifest = complete_checkpoint(&store, 1).await;
    assert_eq!(store.publish_manifest(&manifest).await.expect("republish"), Published::AlreadyPublished);
    assert_eq!(store.publish_manifest(&manifest).await.expect("republish"), Published::AlreadyPublished);
    let other = Manifest { created_at_ms: 999_999, ..manifest.clone() };
    let err = store.publish_manifest(&other).await.expect_err("different bytes must not overwrite");
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    assert_eq!(store.read_manifest(1).await.expect("read"), manifest, "the first manifest stays");
}

/// Many writers race to create the same manifest: exactly one wins and its bytes stay.
pub async fn concurrent_manifest_creators_one_wins(t: &Target) {
    let store = t.job("race");
    let file = store.write_state(1, "op", 0, b"x").await.expect("write");
    let writers = (0..8u64).map(|i| {
        let store = store.clone();
        let manifest = Manifest {
            job_id: store.paths().job_id().to_string(),
            checkpoint_id: 1,
            created_at_ms: i,
            state_files: vec![file.clone()],
            transactions: vec![],
        };
        tokio::spawn(async move { (i, store.publish_manifest(&manifest).await) })
    });
    let mut winners = Vec::new();
    for w in writers {
        let (i, result) = w.await.expect("join");
        match result {
            // AlreadyPublished: this writer's put landed but its response was lost.
            Ok(Published::Created | Published::AlreadyPublished) => winners.push(i),
            Err(e) => assert_eq!(e.kind(), ErrorKind::Fenced, "writer {i}: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one creator wins, got {winners:?}");
    assert_eq!(store.read_manifest(1).await.expect("read").created_at_ms, winners[0]);
}

/// LIST order and recovery agree with numeric order of checkpoint ids.
pub async fn list_order_is_numeric(t: &Target) {
    let store = t.job("order");
    for id in [9, 10, 100, 2] {
        complete_checkpoint(&store, id).await;
    }
    let ids: Vec<u64> = store.list_checkpoints().await.expect("list").iter().map(|c| c.checkpoint_id).collect();
    assert_eq!(ids, vec![2, 9, 10, 100]);
    assert_eq!(restored_id(&store).await, Some(100));
}

/// The newest complete checkpoint is restored; a newer incomplete one is ignored.
pub async fn recovery_picks_the_newest_complete(t: &Target) {
    let store = t.job("newest");
    assert_eq!(restored_id(&store).await, None, "nothing yet: fresh start");
    complete_checkpoint(&store, 1).await;
    complete_checkpoint(&store, 2).await;
    store.write_state(3, "source", 0, b"in progress").await.expect("write");
    let recovery = store.recover(&RetentionPolicy::default()).await.expect("recover");
    let restored = recovery.restored.expect("restored");
    assert_eq!(restored.manifest.checkpoint_id, 2);
    assert_eq!(restored.states[&("source".to_string(), 0)].as_ref(), b"source-2");
    assert_eq!(recovery.plan.next_checkpoint_id, 4);
}

/// Damages the store directly, retrying through injected faults.
async fn overwrite(t: &Target, path: &Path, bytes: Vec<u8>) {
    for _ in 0..20 {
        if t.store.put(path, PutPayload::from(bytes.clone())).await.is_ok() {
            return;
        }
    }
    panic!("cannot overwrite {path}");
}

async fn raw_get(t: &Target, path: &Path) -> Bytes {
    for _ in 0..20 {
        if let Ok(r) = t.store.get(path).await {
            if let Ok(bytes) = r.bytes().await {
                return bytes;
            }
        }
    }
    panic!("cannot read {path}");
}

/// A corrupt newest manifest falls back to the previous checkpoint and is never deleted.
pub async fn corrupt_manifest_falls_back_and_is_kept(t: &Target) {
    let store = t.job("corrupt-manifest");
    complete_checkpoint(&store, 1).await;
    complete_checkpoint(&store, 2).await;
    let path = store.paths().manifest(2);
    let mut bytes = raw_get(t, &path).await.to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    overwrite(t, &path, bytes).await;
    let recovery = store.recover(&RetentionPolicy { retain: 1, protected: BTreeSet::new() }).await.expect("recover");
    assert_eq!(recovery.plan.restored_id(), Some(1));
    assert_eq!(recovery.plan.skipped.len(), 1);
    assert!(recovery.plan.skipped[0].1.contains("_metadata"), "{:?}", recovery.plan.skipped);
    store.collect_garbage(&recovery.plan).await.expect("gc");
    let listed = store.list_checkpoints().await.expect("list");
    assert!(matches!(listed[1].status, CheckpointStatus::Corrupt { .. }), "{listed:?}");
    assert_eq!(listed.len(), 2, "the corrupt checkpoint is kept for inspection");
}

/// A manifest written by a newer format version is skipped, not misread.
pub async fn wrong_version_manifest_falls_back(t: &Target) {
    let store = t.job("version");
    complete_checkpoint(&store, 1).await;
    let m = complete_checkpoint(&store, 2).await;
    let payload = postcard::to_allocvec(&m).expect("encode");
    let newer = crate::manifest::MANIFEST_VERSION + 1;
    overwrite(t, &store.paths().manifest(2), envelope::encode(crate::manifest::MANIFEST_MAGIC, newer, &payload)).await;
    let recovery = store.recover(&RetentionPolicy::default()).await.expect("recover");
    assert_eq!(recovery.plan.restored_id(), Some(1));
    let expected = format!("unknown format version {newer}");
    assert!(recovery.plan.skipped[0].1.contains(&expected), "{:?}", recovery.plan.skipped);
}

/// A state file with a flipped byte (same size) fails its checksum on restore.
pub async fn corrupt_state_file_falls_back(t: &Target) {
    let store = t.job("corrupt-state");
    complete_checkpoint(&store, 1).await;
    complete_checkpoint(&store, 2).await;
    let path = store.paths().state_file(2, "sink", 0).expect("path");
    let mut bytes = raw_get(t, &path).await.to_vec();
    bytes[20] ^= 1;
    overwrite(t, &path, bytes).await;
    let recovery = store.recover(&RetentionPolicy::default()).await.expect("recover");
    assert_eq!(recovery.plan.restored_id(), Some(1));
    assert!(
        recovery.plan.skipped.iter().any(|(id, why)| *id == 2 && why.contains("sink-0.state")),
        "{:?}",
        recovery.plan.skipped
    );
}

/// A torn (truncated) state file is detected by its size.
pub async fn truncated_state_file_falls_back(t: &Target) {
    let store = t.job("torn-state");
    complete_checkpoint(&store, 1).await;
    complete_checkpoint(&store, 2).await;
    let path = store.paths().state_file(2, "source", 0).expect("path");
    let bytes = raw_get(t, &path).await;
    overwrite(t, &path, bytes.slice(..bytes.len() / 2).to_vec()).await;
    assert_eq!(restored_id(&store).await, Some(1));
}

/// Retention keeps the last K complete, what a PREPARE transaction needs, the restore
/// point, incomplete checkpoints newer than it, and every corrupt one.
pub async fn garbage_collection_keeps_what_is_needed(t: &Target) {
    let store = t.job("gc");
    for id in 1..=5 {
        complete_checkpoint(&store, id).await;
    }
    store.write_state(6, "source", 0, b"in progress").await.expect("write");
    // An abandoned incomplete checkpoint below the newest complete one.
    store.write_state(0, "source", 0, b"abandoned").await.expect("write");
    let policy = RetentionPolicy { retain: 2, protected: BTreeSet::from([2]) };
    let recovery = store.recover(&policy).await.expect("recover");
    assert_eq!(
        recovery.plan.collect,
        vec![(0, CollectReason::Incomplete), (1, CollectReason::Superseded), (3, CollectReason::Superseded)]
    );
    store.collect_garbage(&recovery.plan).await.expect("gc");
    let ids: Vec<u64> = store.list_checkpoints().await.expect("list").iter().map(|c| c.checkpoint_id).collect();
    assert_eq!(ids, vec![2, 4, 5, 6]);
    assert_eq!(restored_id(&store).await, Some(5));
}

/// Savepoints are copies that garbage collection never touches.
pub async fn savepoints_survive_and_restore(t: &Target) {
    let store = t.job("savepoint");
    complete_checkpoint(&store, 1).await;
    store.create_savepoint("before-upgrade", 1).await.expect("savepoint");
    complete_checkpoint(&store, 2).await;
    let recovery = store.recover(&RetentionPolicy { retain: 1, protected: BTreeSet::new() }).await.expect("recover");
    store.collect_garbage(&recovery.plan).await.expect("gc");
    assert_eq!(store.list_savepoints().await.expect("list"), vec!["before-upgrade".to_string()]);
    let sp = store.read_savepoint("before-upgrade").await.expect("read savepoint");
    assert_eq!(sp.manifest.checkpoint_id, 1);
    assert_eq!(sp.states[&("sink".to_string(), 0)], Bytes::from("sink-1"));
    let err = store.read_savepoint("missing").await.expect_err("no such savepoint");
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
}
