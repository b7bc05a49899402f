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
