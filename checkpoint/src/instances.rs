//! [`InstanceRegistry`]: which instances of a share group exist, whether they are alive,
//! retired or adopted, kept next to their checkpoints (decision 0007).
//!
//! ```text
//! {root}/_instances/{prefix}/incarnation-{n:020}   one per start; the highest is current
//! {root}/_instances/{prefix}/heartbeat             overwritten at every beat
//! {root}/_instances/{prefix}/retired-{n:020}       incarnation n stopped gracefully
//! {root}/_instances/{prefix}/adoption-claim        who adopts it (created once, never replaced)
//! {root}/_instances/{prefix}/adoption-plan         the checkpoint the adopter decided from
//! {root}/_instances/{prefix}/adoption-done         every transaction of it is decided
//! ```
//!
//! Every state change is a `PutMode::Create` of a new object, so two writers never both
//! win; only the heartbeat is overwritten. Liveness compares heartbeats over time on the
//! observer's own clock ([`SilenceTracker`]), never clocks of different machines.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::envelope::{self, Magic};
use crate::error::{CheckpointError, Result};
use crate::protocol::InstanceView;
use crate::CheckpointId;

/// The registry's directory under the checkpoint root. Job ids may not start with `_`,
/// so no job's checkpoints can land here.
pub(crate) const REGISTRY_DIR: &str = "_instances";

const MAGIC: Magic = Magic(*b"SFIN");
const VERSION: u16 = 1;

const HEARTBEAT: &str = "heartbeat";
const CLAIM: &str = "adoption-claim";
const PLAN: &str = "adoption-plan";
const DONE: &str = "adoption-done";
const KEYED: &str = "keyed-state";

/// What a heartbeat says; it changes at every beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The incarnation that wrote it.
    pub incarnation: u64,
    /// Beats of that incarnation so far.
    pub beat: u64,
    /// The newest checkpoint the instance completed, if any.
    pub checkpoint_id: Option<CheckpointId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Claim {
    by: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Plan {
    restored: Option<CheckpointId>,
}

/// Everything the registry holds about one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceRecord {
    /// The instance's prefix.
    pub prefix: String,
    /// Its current (highest) incarnation; 0 if it never registered.
    pub incarnation: u64,
    /// Its last heartbeat, if it wrote one.
    pub heartbeat: Option<Heartbeat>,
    /// Its current incarnation stopped gracefully.
    pub retired: bool,
    /// Who claimed its adoption.
    pub adopted_by: Option<String>,
    /// The checkpoint its adopter decided from (`Some(None)`: it had no complete
    /// checkpoint, so every transaction of it aborts).
    pub adoption_plan: Option<Option<CheckpointId>>,
    /// The adoption finished.
    pub adoption_done: bool,
    /// Its job keeps keyed state (stateful SQL): no other instance may run beside it.
    pub keyed_state: bool,
}

/// Where an instance stands in its life, as the registry shows it: an adoption claimed
/// outranks a retirement (the claimant decides its transactions either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing<'a> {
    /// Registered, neither retired nor adopted: live, or dead until someone adopts it.
    Registered,
    /// Its current incarnation stopped gracefully.
    Retired,
    /// `by` claimed its adoption and has not finished it.
    BeingAdopted {
        /// The claimant.
        by: &'a str,
    },
    /// `by` adopted it: every transaction of it is decided.
    Adopted {
        /// The adopter.
        by: &'a str,
    },
}

impl InstanceRecord {
    /// Where the instance stands (see [`Standing`]).
    pub fn standing(&self) -> Standing<'_> {
        match (self.adopted_by.as_deref(), self.adoption_done, self.retired) {
            (Some(by), true, _) => Standing::Adopted { by },
            (Some(by), false, _) => Standing::BeingAdopted { by },
            (None, _, true) => Standing::Retired,
            (None, _, false) => Standing::Registered,
        }
    }

    /// `Ok` while `incarnation` is this instance's current one and nobody claimed its
    /// adoption; otherwise [`CheckpointError::InstanceFenced`]: the caller must stop.
    pub fn ensure_current(&self, incarnation: u64) -> Result<()> {
        if let Some(by) = &self.adopted_by {
            return Err(CheckpointError::InstanceFenced {
                prefix: self.prefix.clone(),
                reason: format!("instance {by} adopted it after it was silent too long; stop this one"),
            });
        }
        if self.incarnation != incarnation {
            return Err(CheckpointError::InstanceFenced {
                prefix: self.prefix.clone(),
                reason: format!(
                    "incarnation {} started after this one ({incarnation}); two instances must not share a prefix",
                    self.incarnation
                ),
            });
        }
        Ok(())
    }
}

/// The instance registry of the instances whose checkpoints share one root.
#[derive(Debug, Clone)]
pub struct InstanceRegistry {
    store: Arc<dyn ObjectStore>,
    dir: Path,
}

fn encode<T: Serialize>(what: &str, value: &T) -> Result<Bytes> {
    let payload = postcard::to_allocvec(value)
        .map_err(|e| CheckpointError::corrupt(what, format!("cannot encode the instance record: {e}")))?;
    Ok(Bytes::from(envelope::encode(MAGIC, VERSION, &payload)))
}

fn decode<T: for<'de> Deserialize<'de>>(path: &Path, bytes: &[u8]) -> Result<T> {
    let payload = envelope::decode(MAGIC, VERSION, bytes).map_err(|e| CheckpointError::corrupt(path, e))?;
    postcard::from_bytes(payload).map_err(|e| CheckpointError::corrupt(path, format!("instance record: {e}")))
}

fn numbered(name: &str, kind: &str) -> Option<u64> {
    name.strip_prefix(kind)?.strip_prefix('-').filter(|n| n.len() == 20)?.parse().ok()
}

impl InstanceRegistry {
    /// The registry under `root` (the checkpoint root every instance shares) in `store`.
    pub fn new(store: Arc<dyn ObjectStore>, root: &Path) -> Self {
        Self { store, dir: root.clone().join(REGISTRY_DIR) }
    }

    fn path(&self, prefix: &str, name: &str) -> Path {
        self.dir.clone().join(prefix).join(name)
    }

    async fn create(&self, path: &Path, bytes: Bytes) -> Result<bool> {
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(path, PutPayload::from_bytes(bytes), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(CheckpointError::store("put", path, e)),
        }
    }

    async fn get(&self, path: &Path) -> Result<Option<Bytes>> {
        match self.store.get(path).await {
            Ok(r) => Ok(Some(r.bytes().await.map_err(|e| CheckpointError::store("get", path, e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(CheckpointError::store("get", path, e)),
        }
    }

    /// Everything about `prefix`.
    pub async fn record(&self, prefix: &str) -> Result<InstanceRecord> {
        let dir = self.dir.clone().join(prefix);
        let listed: Vec<object_store::ObjectMeta> =
            self.store.list(Some(&dir)).try_collect().await.map_err(|e| CheckpointError::store("list", &dir, e))?;
        let names: Vec<String> = listed.iter().map(|m| m.location.filename().unwrap_or_default().to_string()).collect();
        let mut r = InstanceRecord { prefix: prefix.to_string(), ..Default::default() };
        r.incarnation = names.iter().filter_map(|n| numbered(n, "incarnation")).max().unwrap_or(0);
        r.retired = names.iter().filter_map(|n| numbered(n, "retired")).any(|n| n == r.incarnation && n > 0);
        if names.iter().any(|n| n == HEARTBEAT) {
            let path = self.path(prefix, HEARTBEAT);
            r.heartbeat = self.get(&path).await?.map(|b| decode(&path, &b)).transpose()?;
        }
        if names.iter().any(|n| n == CLAIM) {
            let path = self.path(prefix, CLAIM);
            r.adopted_by = self.get(&path).await?.map(|b| decode::<Claim>(&path, &b)).transpose()?.map(|c| c.by);
        }
        if names.iter().any(|n| n == PLAN) {
            let path = self.path(prefix, PLAN);
            r.adoption_plan =
                self.get(&path).await?.map(|b| decode::<Plan>(&path, &b)).transpose()?.map(|p| p.restored);
        }
        r.adoption_done = names.iter().any(|n| n == DONE);
        r.keyed_state = names.iter().any(|n| n == KEYED);
        Ok(r)
    }

    /// Every instance that ever registered under this root, by prefix.
    pub async fn observe(&self) -> Result<Vec<InstanceRecord>> {
        let listed = self
            .store
            .list_with_delimiter(Some(&self.dir))
            .await
            .map_err(|e| CheckpointError::store("list", &self.dir, e))?;
        let mut out = Vec::new();
        for p in listed.common_prefixes {
            if let Some(prefix) = p.filename() {
                out.push(self.record(prefix).await?);
            }
        }
        Ok(out)
    }

    /// Records that `prefix`'s job keeps keyed state, so that every later start of an
    /// instance of the group sees it ([`InstanceRecord::keyed_state`]). Idempotent.
    pub async fn mark_keyed(&self, prefix: &str) -> Result<()> {
        self.create(&self.path(prefix, KEYED), encode("keyed-state", &true)?).await?;
        Ok(())
    }

    /// Starts a new incarnation of `prefix` and returns its number. Refused with
    /// [`CheckpointError::InstanceAdopted`] if another instance claimed its adoption.
    /// A live older incarnation is fenced: its next [`heartbeat`](Self::heartbeat)
    /// fails.
    pub async fn register(&self, prefix: &str) -> Result<u64> {
        for _ in 0..16 {
            let r = self.record(prefix).await?;
            let view = InstanceView {
                prefix: prefix.to_string(),
                silent_for: Duration::ZERO,
                retired: r.retired,
                adopted_by: r.adopted_by.clone(),
                adoption_done: r.adoption_done,
            };
            if let Err(by) = crate::protocol::check_instance_start(Some(&view)) {
                return Err(CheckpointError::InstanceAdopted { prefix: prefix.to_string(), by });
            }
            let n = r.incarnation + 1;
            let path = self.path(prefix, &format!("incarnation-{n:020}"));
            if self.create(&path, encode("incarnation", &n)?).await? {
                self.heartbeat(prefix, n, 0, None).await?;
                return Ok(n);
            }
            // Another start of the same prefix won this number: look again.
        }
        Err(CheckpointError::InstanceFenced {
            prefix: prefix.to_string(),
            reason: "16 other starts of the same prefix raced this one; start one instance per prefix".into(),
        })
    }

    /// Writes a heartbeat for `incarnation` of `prefix`. Fails with
    /// [`CheckpointError::InstanceFenced`] if a newer incarnation started or an adoption
    /// was claimed: the caller must stop.
    pub async fn heartbeat(
        &self,
        prefix: &str,
        incarnation: u64,
        beat: u64,
        checkpoint_id: Option<CheckpointId>,
    ) -> Result<()> {
        self.record(prefix).await?.ensure_current(incarnation)?;
        self.write_heartbeat(prefix, Heartbeat { incarnation, beat, checkpoint_id }).await
    }

    /// Writes `heartbeat` for `prefix` without looking first: for a caller that just
    /// checked the record with [`InstanceRecord::ensure_current`].
    pub async fn write_heartbeat(&self, prefix: &str, heartbeat: Heartbeat) -> Result<()> {
        let path = self.path(prefix, HEARTBEAT);
        let bytes = encode("heartbeat", &heartbeat)?;
        self.store
            .put(&path, PutPayload::from_bytes(bytes))
            .await
            .map_err(|e| CheckpointError::store("put", &path, e))?;
        Ok(())
    }

    /// Records that `incarnation` of `prefix` stopped gracefully: nobody adopts it.
    pub async fn retire(&self, prefix: &str, incarnation: u64) -> Result<()> {
        let path = self.path(prefix, &format!("retired-{incarnation:020}"));
        self.create(&path, encode("retired", &incarnation)?).await.map(drop)
    }

    /// Claims the adoption of `prefix` for `by`. Returns who holds the claim: `by` if
    /// this call won it (or won it before), someone else otherwise.
    pub async fn claim(&self, prefix: &str, by: &str) -> Result<String> {
        let path = self.path(prefix, CLAIM);
        if self.create(&path, encode("claim", &Claim { by: by.to_string() })?).await? {
            return Ok(by.to_string());
        }
        let bytes = self
            .get(&path)
            .await?
            .ok_or_else(|| CheckpointError::NotFound { what: "adoption claim", path: path.to_string() })?;
        Ok(decode::<Claim>(&path, &bytes)?.by)
    }

    /// Records the checkpoint the adoption of `prefix` decides from, unless one was
    /// recorded already; returns the recorded one. Decided once, so an adopter that
    /// resumes never decides from a manifest the adopted instance wrote later.
    pub async fn record_plan(&self, prefix: &str, restored: Option<CheckpointId>) -> Result<Option<CheckpointId>> {
        let path = self.path(prefix, PLAN);
        if self.create(&path, encode("plan", &Plan { restored })?).await? {
            return Ok(restored);
        }
        let bytes = self
            .get(&path)
            .await?
            .ok_or_else(|| CheckpointError::NotFound { what: "adoption plan", path: path.to_string() })?;
        Ok(decode::<Plan>(&path, &bytes)?.restored)
    }

    /// Records that every transaction of `prefix` is decided.
    pub async fn finish_adoption(&self, prefix: &str) -> Result<()> {
        let path = self.path(prefix, DONE);
        self.create(&path, Bytes::from_static(b"done")).await.map(drop)
    }
}

/// Turns registry snapshots into [`InstanceView`]s: an instance is silent for as long
/// as its heartbeat has not changed, measured on this process's monotonic clock.
#[derive(Debug, Default)]
pub struct SilenceTracker {
    seen: BTreeMap<String, (Option<Heartbeat>, std::time::Instant)>,
}

impl SilenceTracker {
    /// A tracker that has seen nothing: every instance starts silent for zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The views of `records` at `now`.
    pub fn views(&mut self, records: &[InstanceRecord], now: std::time::Instant) -> Vec<InstanceView> {
        records
            .iter()
            .map(|r| {
                let entry = self.seen.entry(r.prefix.clone()).or_insert((r.heartbeat, now));
                if entry.0 != r.heartbeat {
                    *entry = (r.heartbeat, now);
                }
                InstanceView {
                    prefix: r.prefix.clone(),
                    silent_for: now.saturating_duration_since(entry.1),
                    retired: r.retired,
                    adopted_by: r.adopted_by.clone(),
                    adoption_done: r.adoption_done,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;

    fn registry() -> InstanceRegistry {
        InstanceRegistry::new(Arc::new(InMemory::new()), &Path::from("chk"))
    }

    #[tokio::test]
    async fn a_new_incarnation_fences_the_old_one() {
        let reg = registry();
        let first = reg.register("a").await.unwrap();
        reg.heartbeat("a", first, 1, Some(3)).await.unwrap();
        let second = reg.register("a").await.unwrap();
        assert_eq!(second, first + 1);
        let err = reg.heartbeat("a", first, 2, Some(4)).await.unwrap_err();
        assert!(matches!(err, CheckpointError::InstanceFenced { .. }), "{err}");
        assert!(err.to_string().contains("must not share a prefix"), "{err}");
        reg.heartbeat("a", second, 1, None).await.unwrap();
    }

    #[tokio::test]
    async fn one_claim_wins_and_an_adopted_instance_cannot_start_or_beat() {
        let reg = registry();
        let a = reg.register("a").await.unwrap();
        assert_eq!(reg.claim("a", "b").await.unwrap(), "b");
        assert_eq!(reg.claim("a", "c").await.unwrap(), "b", "the first claim stays");
        assert_eq!(reg.claim("a", "b").await.unwrap(), "b", "claiming again is harmless");
        let err = reg.heartbeat("a", a, 1, None).await.unwrap_err();
        assert!(err.to_string().contains("instance b adopted it"), "{err}");
        let err = reg.register("a").await.unwrap_err();
        assert!(matches!(&err, CheckpointError::InstanceAdopted { prefix, by } if prefix == "a" && by == "b"), "{err}");
    }

    #[tokio::test]
    async fn the_plan_is_decided_once() {
        let reg = registry();
        reg.register("a").await.unwrap();
        assert_eq!(reg.record_plan("a", Some(7)).await.unwrap(), Some(7));
        assert_eq!(reg.record_plan("a", Some(9)).await.unwrap(), Some(7), "a resumed adopter keeps the first plan");
        reg.finish_adoption("a").await.unwrap();
        reg.finish_adoption("a").await.unwrap();
        let r = reg.record("a").await.unwrap();
        assert_eq!((r.adoption_plan, r.adoption_done), (Some(Some(7)), true));
    }

    #[tokio::test]
    async fn observe_lists_every_instance_with_its_state() {
        let reg = registry();
        let a = reg.register("a").await.unwrap();
        reg.register("b").await.unwrap();
        reg.retire("a", a).await.unwrap();
        let records = reg.observe().await.unwrap();
        let by: BTreeMap<&str, &InstanceRecord> = records.iter().map(|r| (r.prefix.as_str(), r)).collect();
        assert_eq!(by.len(), 2);
        assert!(by["a"].retired && !by["b"].retired);
        assert_eq!(by["b"].heartbeat, Some(Heartbeat { incarnation: 1, beat: 0, checkpoint_id: None }));
        // A restart after retiring is a new, live incarnation.
        reg.register("a").await.unwrap();
        assert!(!reg.record("a").await.unwrap().retired);
    }

    #[tokio::test]
    async fn a_corrupt_record_is_a_named_error() {
        let reg = registry();
        reg.register("a").await.unwrap();
        let path = reg.path("a", CLAIM);
        reg.store.put(&path, PutPayload::from_static(b"not an envelope")).await.unwrap();
        let err = reg.record("a").await.unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("adoption-claim"), "{err}");
    }

    #[test]
    fn silence_is_the_time_a_heartbeat_stays_the_same() {
        let t0 = std::time::Instant::now();
        let beat = |b| Some(Heartbeat { incarnation: 1, beat: b, checkpoint_id: None });
        let rec = |b| InstanceRecord { prefix: "a".into(), incarnation: 1, heartbeat: beat(b), ..Default::default() };
        let mut t = SilenceTracker::new();
        assert_eq!(t.views(&[rec(1)], t0)[0].silent_for, Duration::ZERO, "first sight: not silent yet");
        assert_eq!(t.views(&[rec(1)], t0 + Duration::from_secs(5))[0].silent_for, Duration::from_secs(5));
        assert_eq!(t.views(&[rec(2)], t0 + Duration::from_secs(6))[0].silent_for, Duration::ZERO, "a beat resets it");
        assert_eq!(t.views(&[rec(2)], t0 + Duration::from_secs(9))[0].silent_for, Duration::from_secs(3));
    }
}
