//! The checkpoint-storage conformance suite on every backend: memory, local disk with
//! fsync, the fault-injecting wrapper, and the S3 server on loopback.

#![allow(clippy::unwrap_used)]

#[path = "support/s3.rs"]
mod s3;

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use shareflow::checkpoint::testing::conformance::{run_all, Target};
use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
use shareflow::checkpoint::DurableLocalStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_memory() {
    run_all(&Target::new(Arc::new(InMemory::new()), "checkpoints", "mem")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_local_disk_with_fsync() {
    let dir = tempfile::tempdir().unwrap();
    run_all(&Target::new(Arc::new(DurableLocalStore::new(dir.path()).unwrap()), "checkpoints", "disk")).await;
}

/// Faults the store layer must absorb: latency everywhere, a failed put and a put whose
/// response was lost (both retried), a failed get (retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_the_fault_injecting_store() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 7));
    faulty.inject(FaultRule {
        probability: 0.3,
        ..FaultRule::always(StoreOp::Any, "", Fault::Latency(Duration::from_millis(2)))
    });
    faulty.inject(FaultRule { probability: 0.03, ..FaultRule::always(StoreOp::Put, ".state", Fault::Error) });
    faulty.inject(FaultRule {
        probability: 0.05,
        ..FaultRule::always(StoreOp::Put, "_metadata", Fault::AppliedThenTimeout)
    });
    faulty.inject(FaultRule { probability: 0.05, ..FaultRule::always(StoreOp::Get, "", Fault::Error) });
    faulty.inject(FaultRule {
        probability: 0.3,
        ..FaultRule::always(StoreOp::Any, "", Fault::Latency(Duration::from_millis(2)))
    });
    run_all(&Target::new(faulty.clone() as Arc<dyn ObjectStore>, "checkpoints", "faulty")).await;
    let injected = faulty.injected();
    assert!(
        injected.iter().any(|l| l.contains("AppliedThenTimeout")),
        "the run exercised lost put responses: {injected:?}"
    );
    assert!(injected.iter().any(|l| l.starts_with("Put Error")), "{injected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_the_s3_server() {
    let Some((store, _)) = s3::s3_store() else { return };
    run_all(&Target::new(store, "conformance", &s3::run_tag())).await;
}
