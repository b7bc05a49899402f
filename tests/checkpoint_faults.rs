//! Store faults during checkpoint writes and restores: recovery never decides on a
//! partial view of the store, and a failed write never produces a usable checkpoint.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use proptest::prelude::*;
use shareflow::checkpoint::testing::conformance::complete_checkpoint;
use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
use shareflow::checkpoint::{CheckpointPaths, CheckpointStore, ErrorKind, Manifest, RetentionPolicy};

fn faulty() -> (Arc<FaultyStore>, CheckpointStore) {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 1));
    let store = CheckpointStore::new(faulty.clone() as Arc<dyn ObjectStore>, CheckpointPaths::new("c", "job").unwrap());
    (faulty, store)
}

#[tokio::test]
async fn list_failure_during_restore_is_unavailable_not_a_fresh_start() {
    let (faulty, store) = faulty();
    complete_checkpoint(&store, 1).await;
    faulty.inject(FaultRule::always(StoreOp::List, "", Fault::Error));
    let err = store.recover(&RetentionPolicy::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("list"), "{err}");
    faulty.clear();
    assert_eq!(store.recover(&RetentionPolicy::default()).await.unwrap().plan.restored_id(), Some(1));
}

#[tokio::test]
async fn get_failure_during_restore_is_unavailable_not_a_fallback() {
    let (faulty, store) = faulty();
    complete_checkpoint(&store, 1).await;
    complete_checkpoint(&store, 2).await;
    for pattern in ["chk-00000000000000000002/_metadata", "chk-00000000000000000002/sink-0.state"] {
        faulty.inject(FaultRule::always(StoreOp::Get, pattern, Fault::Error));
        let err = store.recover(&RetentionPolicy::default()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{pattern}: {err}");
        faulty.clear();
    }
    assert_eq!(store.recover(&RetentionPolicy::default()).await.unwrap().plan.restored_id(), Some(2));
}

#[tokio::test]
async fn a_transient_get_failure_is_retried() {
    let (faulty, store) = faulty();
    complete_checkpoint(&store, 1).await;
    faulty.inject(FaultRule::once(StoreOp::Get, "_metadata", Fault::Error));
    assert_eq!(store.recover(&RetentionPolicy::default()).await.unwrap().plan.restored_id(), Some(1));
    assert_eq!(faulty.injected().len(), 1);
}

#[tokio::test]
async fn a_torn_state_write_is_retried_whole() {
    let (faulty, store) = faulty();
    faulty.inject(FaultRule::once(StoreOp::Put, ".state", Fault::Torn { keep: 0.5 }));
    let m = complete_checkpoint(&store, 1).await;
    let restored = store.recover(&RetentionPolicy::default()).await.unwrap().restored.unwrap();
    assert_eq!(restored.manifest, m);
}

#[tokio::test]
async fn a_state_write_that_keeps_failing_leaves_no_usable_checkpoint() {
    let (faulty, store) = faulty();
    complete_checkpoint(&store, 1).await;
    faulty.inject(FaultRule::always(StoreOp::Put, "chk-00000000000000000002/", Fault::Torn { keep: 0.3 }));
    let err = store.write_state(2, "source", 0, b"state").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    // The coordinator aborts the checkpoint: no manifest, so recovery ignores it.
    faulty.clear();
    let recovery = store.recover(&RetentionPolicy::default()).await.unwrap();
    assert_eq!(recovery.plan.restored_id(), Some(1));
    assert!(recovery.plan.skipped.is_empty());
}

#[tokio::test]
async fn manifest_put_applied_then_timed_out_is_published_once() {
    let (faulty, store) = faulty();
    faulty.inject(FaultRule::once(StoreOp::Put, "_metadata", Fault::AppliedThenTimeout));
    complete_checkpoint(&store, 1).await;
    assert_eq!(faulty.injected().len(), 1);
    assert_eq!(store.read_manifest(1).await.unwrap().checkpoint_id, 1);
}

#[tokio::test]
async fn manifest_put_error_publishes_nothing() {
    let (faulty, store) = faulty();
    let file = store.write_state(1, "source", 0, b"s").await.unwrap();
    faulty.inject(FaultRule::always(StoreOp::Put, "_metadata", Fault::Error));
    let m = Manifest {
        job_id: "job".into(),
        checkpoint_id: 1,
        created_at_ms: 0,
        state_files: vec![file],
        transactions: vec![],
    };
    assert_eq!(store.publish_manifest(&m).await.unwrap_err().kind(), ErrorKind::Unavailable);
    faulty.clear();
    assert_eq!(store.recover(&RetentionPolicy::default()).await.unwrap().plan.restored_id(), None);
}

#[tokio::test]
async fn the_same_seed_injects_the_same_faults() {
    async fn run(seed: u64) -> Vec<String> {
        let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), seed));
        faulty.inject(FaultRule { probability: 0.5, ..FaultRule::always(StoreOp::Put, "", Fault::AppliedThenTimeout) });
        let store =
            CheckpointStore::new(faulty.clone() as Arc<dyn ObjectStore>, CheckpointPaths::new("c", "j").unwrap());
        for id in 1..=5 {
            let _ = store.write_state(id, "op", 0, b"x").await;
        }
        faulty.injected()
    }
    assert_eq!(run(42).await, run(42).await);
    assert_ne!(run(42).await, run(43).await);
}

proptest! {
    #[test]
    fn arbitrary_manifest_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Err(e) = Manifest::decode("x/_metadata", &bytes) {
            prop_assert_eq!(e.kind(), ErrorKind::Data);
        }
    }
}

/// Three states: under a 16 KiB inline limit, two go to the shared object and one inline.
fn three_states(id: u64) -> Vec<(String, u32, bytes::Bytes)> {
    vec![
        ("agg".to_string(), 0, bytes::Bytes::from(vec![id as u8; 20_000])),
        ("agg".to_string(), 1, bytes::Bytes::from(vec![id as u8 + 100; 30_000])),
        ("src".to_string(), 0, bytes::Bytes::from_static(b"small")),
    ]
}

/// A savepoint's name is never taken twice: a second savepoint of that name (of another
/// checkpoint) is refused before any of its files is copied, so the first still reads
/// back whole; a copy that crashed before its manifest is taken again.
#[tokio::test]
async fn a_savepoint_is_never_overwritten() {
    let (_, store) = faulty();
    store.commit_checkpoint(1, &three_states(1), vec![], 1024).await.unwrap();
    store.commit_checkpoint(2, &three_states(2), vec![], 1024).await.unwrap();
    store.create_savepoint("sp", 1).await.unwrap();
    let err = store.create_savepoint("sp", 2).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("savepoint \"sp\" already exists at c/job/savepoints/sp/"), "{err}");
    let sp = store.read_savepoint("sp").await.unwrap();
    assert_eq!(
        (sp.manifest.checkpoint_id, sp.states[&("agg".to_string(), 1)].clone()),
        (1, three_states(1)[1].2.clone())
    );
    // State copied, no manifest (a crash between the two): the name is free.
    store.copy_savepoint_state("half", 1).await.unwrap();
    assert!(store.read_savepoint("half").await.is_err());
    store.create_savepoint("half", 2).await.unwrap();
    assert_eq!(store.read_savepoint("half").await.unwrap().states[&("agg".to_string(), 0)], three_states(2)[0].2);
}

async fn keys_of(store: &dyn ObjectStore, checkpoint: u64) -> Vec<String> {
    use futures::TryStreamExt;
    let dir = object_store::path::Path::from(format!("c/job/chk-{checkpoint:020}"));
    let mut keys: Vec<String> =
        store.list(Some(&dir)).map_ok(|m| m.location.filename().unwrap().to_string()).try_collect().await.unwrap();
    keys.sort();
    keys
}

/// Every state past the inline limit goes into one object per checkpoint, each in its
/// own envelope at the offset its manifest entry names, and restores byte for byte.
#[tokio::test]
async fn states_past_the_inline_limit_share_one_object_per_checkpoint() {
    let (faulty, store) = faulty();
    let m = store.commit_checkpoint(1, &three_states(1), vec![], 16 * 1024).await.unwrap();
    assert_eq!(keys_of(faulty.as_ref(), 1).await, vec!["_metadata".to_string(), "_shared.state".to_string()]);
    let (a0, a1, s0) = (&m.state_files[0], &m.state_files[1], &m.state_files[2]);
    assert_eq!((a0.offset, a1.offset), (Some(0), Some(a0.size)), "sections one after another");
    assert!(a0.size > 20_000 && a1.size > 30_000, "each section carries its envelope");
    assert!(s0.inline.is_some() && s0.offset.is_none());
    let restored = store.recover(&RetentionPolicy::default()).await.unwrap().restored.unwrap();
    for (operator, subtask, payload) in three_states(1) {
        assert_eq!(restored.states[&(operator.clone(), subtask)], payload, "{operator}-{subtask}");
    }
    // A savepoint copies the shared object and reads back the same.
    store.create_savepoint("keep", 1).await.unwrap();
    assert_eq!(store.read_savepoint("keep").await.unwrap().states, restored.states);
}

/// A checkpoint whose states all together fit the inline limit is one object, the
/// manifest, and restores byte for byte; a limit that fits only the smaller states
/// inlines those and puts the rest in the shared object.
#[tokio::test]
async fn a_checkpoint_within_the_inline_limit_is_one_object() {
    let (faulty, store) = faulty();
    let total: usize = three_states(1).iter().map(|(_, _, p)| p.len()).sum();
    let m = store.commit_checkpoint(1, &three_states(1), vec![], total).await.unwrap();
    assert_eq!(keys_of(faulty.as_ref(), 1).await, vec!["_metadata".to_string()]);
    assert!(m.state_files.iter().all(|f| f.inline.is_some() && f.offset.is_none()));
    let restored = store.recover(&RetentionPolicy::default()).await.unwrap().restored.unwrap();
    assert_eq!(restored.manifest.checkpoint_id, 1);
    for (operator, subtask, payload) in three_states(1) {
        assert_eq!(restored.states[&(operator.clone(), subtask)], payload, "{operator}-{subtask}");
    }
    let m = store.commit_checkpoint(2, &three_states(2), vec![], total - 1).await.unwrap();
    assert_eq!(keys_of(faulty.as_ref(), 2).await, vec!["_metadata".to_string(), "_shared.state".to_string()]);
    let inlined: Vec<bool> = m.state_files.iter().map(|f| f.inline.is_some()).collect();
    assert_eq!(inlined, vec![true, false, true], "the two smaller states inline, the largest shared");
    let restored = store.recover(&RetentionPolicy::default()).await.unwrap().restored.unwrap();
    assert_eq!(restored.manifest.checkpoint_id, 2);
    for (operator, subtask, payload) in three_states(2) {
        assert_eq!(restored.states[&(operator.clone(), subtask)], payload, "{operator}-{subtask}");
    }
    // The default limit takes four 64 KiB states, the shape of `checkpoint_commit`.
    let four: Vec<(String, u32, bytes::Bytes)> =
        (0..4).map(|i| ("op".to_string(), i, bytes::Bytes::from(vec![i as u8; 64 * 1024]))).collect();
    store.commit_checkpoint(3, &four, vec![], shareflow::checkpoint::DEFAULT_INLINE_LIMIT).await.unwrap();
    assert_eq!(keys_of(faulty.as_ref(), 3).await, vec!["_metadata".to_string()]);
    let restored = store.recover(&RetentionPolicy::default()).await.unwrap().restored.unwrap();
    assert_eq!(restored.manifest.checkpoint_id, 3);
    for (operator, subtask, payload) in four {
        assert_eq!(restored.states[&(operator.clone(), subtask)], payload, "{operator}-{subtask}");
    }
}

/// A shared object's limit: what would take it past the limit gets a file of its own.
#[tokio::test]
async fn a_state_past_the_shared_limit_gets_a_file_of_its_own() {
    let (faulty, store) = faulty();
    let store = store.with_shared_state_limit(25_000);
    let m = store.commit_checkpoint(1, &three_states(1), vec![], 16 * 1024).await.unwrap();
    assert_eq!(
        keys_of(faulty.as_ref(), 1).await,
        vec!["_metadata".to_string(), "_shared.state".to_string(), "agg-1.state".to_string()]
    );
    assert_eq!((m.state_files[0].offset, m.state_files[1].offset), (Some(0), None));
    let restored = store.recover(&RetentionPolicy::default()).await.unwrap().restored.unwrap();
    assert_eq!(restored.states[&("agg".to_string(), 1)], three_states(1)[1].2);
}

/// A state larger than the part limit is written in parts, no object larger than the
/// limits allow; it restores byte for byte, savepoints copy every part, and a lost part
/// fails only its checkpoint, naming the part.
#[tokio::test]
async fn a_state_past_the_part_limit_is_split_into_bounded_objects() {
    use object_store::ObjectStoreExt;
    let (faulty, store) = faulty();
    let (shared_limit, part_limit) = (25_000, 8_000);
    let store = store.with_shared_state_limit(shared_limit).with_state_part_limit(part_limit);
    // Varied bytes, so a part restored in the wrong order would not compare equal.
    let big: bytes::Bytes = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>().into();
    let states = vec![("agg".to_string(), 0, big.clone()), ("src".to_string(), 0, bytes::Bytes::from_static(b"small"))];
    store.commit_checkpoint(1, &states, vec![], 1024).await.unwrap();
    let m = store.commit_checkpoint(2, &states, vec![], 1024).await.unwrap();
    let agg: Vec<_> = m.state_files.iter().filter(|f| f.operator == "agg").collect();
    assert_eq!(agg.len(), 50_000usize.div_ceil(part_limit), "parts of at most {part_limit} bytes");
    assert!(agg.iter().enumerate().all(|(i, f)| f.part == i as u32));
    for key in keys_of(faulty.as_ref(), 2).await {
        let path = object_store::path::Path::from(format!("c/job/chk-{:020}/{key}", 2));
        let size = faulty.head(&path).await.unwrap().size as usize;
        assert!(size <= shared_limit.max(part_limit + 64), "{key}: {size} bytes");
    }
    let restored = store.recover(&RetentionPolicy::default()).await.unwrap().restored.unwrap();
    assert_eq!(restored.manifest.checkpoint_id, 2);
    assert_eq!(restored.states[&("agg".to_string(), 0)], big);
    assert_eq!(restored.states[&("src".to_string(), 0)].as_ref(), b"small");
    store.create_savepoint("sp", 2).await.unwrap();
    assert_eq!(store.read_savepoint("sp").await.unwrap().states[&("agg".to_string(), 0)], big);
    // Lose the last part, which has an object of its own: checkpoint 2 is corrupt, 1 restores.
    let last = agg.last().unwrap();
    assert_eq!(last.offset, None, "the last part does not fit the shared object");
    let name = format!("agg-0.p{}.state", last.part);
    faulty.delete(&object_store::path::Path::from(format!("c/job/chk-{:020}/{name}", 2))).await.unwrap();
    let recovery = store.recover(&RetentionPolicy::default()).await.unwrap();
    assert_eq!(recovery.plan.restored_id(), Some(1));
    assert_eq!(recovery.restored.unwrap().states[&("agg".to_string(), 0)], big);
    let listed = store.list_checkpoints().await.unwrap();
    let two = listed.iter().find(|c| c.checkpoint_id == 2).unwrap();
    assert!(format!("{:?}", two.status).contains(&name), "{:?}", two.status);
}

/// A flipped byte in one section fails that checkpoint's verification, naming the
/// shared object and the state; a truncated shared object is corrupt before any read.
/// Either way recovery falls back to the checkpoint before, and keeps the damaged one.
#[tokio::test]
async fn a_damaged_shared_object_fails_only_its_checkpoint() {
    use object_store::{ObjectStoreExt, PutPayload};
    for damage in ["flip", "truncate"] {
        let (faulty, store) = faulty();
        store.commit_checkpoint(1, &three_states(1), vec![], 16 * 1024).await.unwrap();
        let m = store.commit_checkpoint(2, &three_states(2), vec![], 16 * 1024).await.unwrap();
        let path = object_store::path::Path::from(format!("c/job/chk-{:020}/_shared.state", 2));
        let mut bytes = faulty.get(&path).await.unwrap().bytes().await.unwrap().to_vec();
        let a1 = &m.state_files[1];
        match damage {
            "flip" => bytes[(a1.offset.unwrap() + a1.size / 2) as usize] ^= 1,
            _ => bytes.truncate(bytes.len() - 1),
        }
        faulty.put(&path, PutPayload::from(bytes)).await.unwrap();
        let recovery = store.recover(&RetentionPolicy::default()).await.unwrap();
        assert_eq!(recovery.plan.restored_id(), Some(1), "{damage}");
        let listed = store.list_checkpoints().await.unwrap();
        assert!(listed.iter().any(|c| c.checkpoint_id == 2), "{damage}: the damaged checkpoint is kept");
        if damage == "truncate" {
            let (id, reason) = &recovery.plan.skipped[0];
            assert_eq!(*id, 2);
            assert!(reason.contains("_shared.state has") && reason.contains("agg-1 needs bytes"), "{reason}");
        } else {
            // Verified while restoring: the restore of 2 fails, and names the section.
            let err = store
                .read_state(&store.paths().checkpoint_dir(2), a1)
                .await
                .expect_err("the flipped section fails its checksum");
            assert_eq!(err.kind(), ErrorKind::Data, "{err}");
            assert!(err.to_string().contains("_shared.state@") && err.to_string().contains("(agg-1)"), "{err}");
            // Its neighbour in the same object still verifies.
            let a0 = &m.state_files[0];
            assert_eq!(store.read_state(&store.paths().checkpoint_dir(2), a0).await.unwrap(), three_states(2)[0].2);
        }
    }
}
