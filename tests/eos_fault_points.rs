//! One test per named fault point (docs/design.md §4), with checkpoints on the local file
//! system and on the S3 server: crash there, restart, run to quiescence, check I1-I7.

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;
#[path = "support/s3.rs"]
mod s3;

use std::sync::Arc;

use eos::*;
use shareflow::checkpoint::{protocol::CheckpointStatus, DurableLocalStore};
use shareflow::connector::share::TransactionState;

const RECORDS: u64 = 3_000;

async fn crash_at(point: &str, storage: shareflow::checkpoint::CheckpointStore) {
    let broker = broker_with_input(RECORDS, 3, &share_config()).await;
    let mut run = Run::new(broker.clone(), storage.clone());
    run.interval = std::time::Duration::from_millis(5);
    // The recovery points: in the recovery after a crash that left decided work.
    use shareflow::runtime::failpoint::points::{AFTER_RECOVERY, COMMIT_BEFORE, RECOVERY_MID};
    let crashes = if point == RECOVERY_MID {
        vec![(COMMIT_BEFORE.to_string(), 0), (point.to_string(), 0)]
    } else if point == AFTER_RECOVERY {
        // The recovery after a crash that left decided work (the first start's passes).
        vec![(COMMIT_BEFORE.to_string(), 0), (point.to_string(), 1)]
    } else {
        // Source and sink points are hit per batch: let a few pass first.
        let skip = if point.starts_with("source.") || point.starts_with("sink.") { 3 } else { 0 };
        vec![(point.to_string(), skip)]
    };
    let (result, fired) = run.run(crashes).await;
    let report = result.unwrap_or_else(|e| panic!("{point}: the job did not recover: {e}"));
    assert!(fired.contains(&point.to_string()), "{point} was reached: fired {fired:?}");
    assert!(report.attempts >= 2, "{point}: restarted");
    assert_exactly_once(&run.check().await, RECORDS, point);
    // I6: manifests are create-only, ids increase, and the newest restores.
    let listed = storage.list_checkpoints().await.unwrap();
    let complete: Vec<u64> =
        listed.iter().filter(|c| c.status == CheckpointStatus::Complete).map(|c| c.checkpoint_id).collect();
    assert!(!complete.is_empty() && complete.windows(2).all(|w| w[0] < w[1]), "{point}: {complete:?}");
    // No transaction is left undecided (I8 at quiescence).
    assert!(broker
        .transactions()
        .await
        .unwrap()
        .iter()
        .all(|t| !t.state.is_pending() || t.state == TransactionState::Empty));
}

async fn on_disk(point: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(DurableLocalStore::new(dir.path()).unwrap());
    crash_at(point, storage_on(store, "checkpoints")).await;
}

async fn on_s3(point: &str) {
    let Some((store, _)) = s3::s3_store() else { return };
    crash_at(point, storage_on(store, &format!("eos-{}", s3::run_tag()))).await;
}

macro_rules! fault_point {
    ($name:ident, $point:expr) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn file() {
                super::on_disk($point).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn s3() {
                super::on_s3($point).await;
            }
        }
    };
}

fault_point!(source_after_poll, "source.after_poll");
fault_point!(source_after_lock, "source.after_lock");
fault_point!(sink_after_write, "sink.after_write");
fault_point!(checkpoint_after_state_before_manifest, "checkpoint.after_state_before_manifest");
fault_point!(checkpoint_after_manifest, "checkpoint.after_manifest");
fault_point!(commit_before, "commit.before");
fault_point!(commit_mid, "commit.mid");
fault_point!(commit_after_broker_before_notify, "commit.after_broker_before_notify");
fault_point!(recovery_mid, "recovery.mid");
fault_point!(recovery_after, "recovery.after");
