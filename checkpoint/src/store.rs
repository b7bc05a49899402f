//! [`CheckpointStore`]: checkpoint I/O on an `object_store`, at the edge of the pure
//! [`protocol`](crate::protocol).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::envelope;
use crate::error::{CheckpointError, Result};
use crate::manifest::{Manifest, StateFileRef, STATE_MAGIC, STATE_VERSION};
use crate::paths::{CheckpointKey, CheckpointPaths, MANIFEST_NAME, SHARED_STATE_NAME};
use crate::protocol::{
    classify, resolve, CheckpointStatus, ManifestStatus, Observed, ObservedCheckpoint, RecoveryDecision, RecoveryPlan,
    RetentionPolicy,
};
use crate::CheckpointId;

/// How a manifest publication ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// This call created the manifest.
    Created,
    /// The same bytes were already there (a retry after a lost response): success.
    AlreadyPublished,
}

/// A restored checkpoint: its manifest and every state file, verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredCheckpoint {
    /// The manifest.
    pub manifest: Manifest,
    /// (operator, subtask) -> state payload.
    pub states: BTreeMap<(String, u32), Bytes>,
}

/// The outcome of [`CheckpointStore::recover`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The plan the protocol chose (after any checksum fallbacks).
    pub plan: RecoveryPlan,
    /// The restored checkpoint, or `None` for a fresh start.
    pub restored: Option<RestoredCheckpoint>,
}

/// One checkpoint as listed for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Checkpoint id.
    pub checkpoint_id: CheckpointId,
    /// Complete, incomplete or corrupt.
    pub status: CheckpointStatus,
    /// State files present.
    pub state_files: usize,
    /// Their total size.
    pub state_bytes: u64,
    /// The manifest, when it decodes.
    pub manifest: Option<Manifest>,
}

/// Reads and writes one job's checkpoints.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use shareflow_checkpoint::{CheckpointPaths, CheckpointStore, Manifest, RetentionPolicy};
///
/// let store = CheckpointStore::new(Arc::new(object_store::memory::InMemory::new()), CheckpointPaths::new("", "job")?);
/// let file = store.write_state(1, "source", 0, b"offsets").await?;
/// let manifest = Manifest { job_id: "job".into(), checkpoint_id: 1, created_at_ms: 0, state_files: vec![file], transactions: vec![] };
/// store.publish_manifest(&manifest).await?;
/// let recovery = store.recover(&RetentionPolicy::default()).await?;
/// assert_eq!(recovery.restored.unwrap().states[&("source".to_string(), 0)].as_ref(), b"offsets");
/// # Ok::<(), shareflow_checkpoint::CheckpointError>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    paths: CheckpointPaths,
    /// The largest shared state object a checkpoint writes.
    shared_limit: usize,
    /// The most payload bytes of one part of a state.
    part_limit: usize,
}

/// How much state a checkpoint inlines into its manifest by default (1 MiB, Flink's
/// largest `state.storage.fs.memory-threshold`): a checkpoint whose state all together
/// stays within it is one object, the manifest. States are inlined smallest first while
/// the inlined total stays within the limit; the rest go to the shared state object.
pub const DEFAULT_INLINE_LIMIT: usize = 1024 * 1024;

/// The largest inline limit a job may set (16 MiB). Recovery, adoption and the admin CLI
/// read every manifest a job has in storage (the retained checkpoints, and any that
/// failed verification, which are kept) and hold them together, so their memory is a
/// few times this limit.
pub const MAX_INLINE_LIMIT: usize = 16 * 1024 * 1024;

/// The largest shared state object a checkpoint writes (256 MiB): one PUT stays well
/// within what every store accepts in one request. States past it get files of their
/// own.
pub const SHARED_STATE_LIMIT: usize = 256 * 1024 * 1024;

/// The most payload bytes in one part of a state (256 MiB). A larger state (the keyed
/// state of one subtask holding millions of keys) is split into parts of at most this
/// size, each an object or section of its own, so no object a checkpoint writes exceeds
/// this limit or [`SHARED_STATE_LIMIT`] by more than an envelope header.
pub const STATE_PART_LIMIT: usize = 256 * 1024 * 1024;

/// Attempts for a store call that failed transiently. Every write here is idempotent.
const ATTEMPTS: u32 = 3;

async fn with_retry<T, F, Fut>(op: &'static str, path: &Path, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    let mut attempt = 1;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e @ (object_store::Error::NotFound { .. } | object_store::Error::AlreadyExists { .. })) => {
                return Err(CheckpointError::store(op, path, e))
            }
            Err(e) if attempt >= ATTEMPTS => return Err(CheckpointError::store(op, path, e)),
            Err(e) => {
                tracing::warn!(%path, op, attempt, error = %e, "checkpoint store call failed; retrying");
                tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                attempt += 1;
            }
        }
    }
}

/// Which states of a checkpoint go into its manifest: the smallest first, while the
/// inlined total stays within `limit` bytes (ties keep their order). A checkpoint whose
/// states all together fit is then one object. `sizes` are the states' payload sizes;
/// the answer is in their order.
pub fn inline_choice(sizes: impl IntoIterator<Item = usize>, limit: usize) -> Vec<bool> {
    let sizes: Vec<usize> = sizes.into_iter().collect();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| sizes[i]);
    let mut inlined = vec![false; sizes.len()];
    let mut total = 0usize;
    for i in order {
        match total.checked_add(sizes[i]) {
            Some(t) if t <= limit => {
                total = t;
                inlined[i] = true;
            }
            _ => break,
        }
    }
    inlined
}

impl CheckpointStore {
    /// A store for the job `paths` describes.
    pub fn new(store: Arc<dyn ObjectStore>, paths: CheckpointPaths) -> Self {
        Self { store, paths, shared_limit: SHARED_STATE_LIMIT, part_limit: STATE_PART_LIMIT }
    }

    /// Sets the most payload bytes of one part of a state (default
    /// [`STATE_PART_LIMIT`], at least 1): a larger state is written in parts.
    pub fn with_state_part_limit(mut self, bytes: usize) -> Self {
        self.part_limit = bytes.max(1);
        self
    }

    /// Sets the largest shared state object a checkpoint writes (default
    /// [`SHARED_STATE_LIMIT`]); a state that would take it past this gets a file of its
    /// own. 0 writes every state the manifest does not inline to a file of its own.
    pub fn with_shared_state_limit(mut self, bytes: usize) -> Self {
        self.shared_limit = bytes;
        self
    }

    /// Opens `url` (see [`crate::open_url`]) for `job_id`.
    pub fn from_url(url: &str, options: &[(&str, &str)], job_id: &str) -> Result<Self> {
        let (store, root) = crate::url::open_url(url, options)?;
        Ok(Self::new(store, CheckpointPaths::new(root, job_id)?))
    }

    /// The paths of this job.
    pub fn paths(&self) -> &CheckpointPaths {
        &self.paths
    }

    /// Tombstones checkpoint `checkpoint_id` before recovery aborts its transactions, so
    /// that a manifest a fenced, paused incarnation writes later is never restored (the
    /// model's finding 1, docs/model.md). Create-only and idempotent.
    pub async fn mark_aborted(&self, checkpoint_id: CheckpointId) -> Result<()> {
        let path = self.paths.aborted_marker(checkpoint_id);
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        let put = || self.store.put_opts(&path, PutPayload::from_static(b"aborted by recovery"), opts.clone());
        match with_retry("put", &path, put).await {
            Ok(_) => Ok(()),
            Err(CheckpointError::Store { source, .. })
                if matches!(source.as_ref(), object_store::Error::AlreadyExists { .. }) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The store of another job (instance) under the same root, for adoption.
    pub fn sibling(&self, job_id: &str) -> Result<Self> {
        Ok(Self { paths: self.paths.sibling(job_id)?, ..self.clone() })
    }

    /// The registry of the instances that share this store's root.
    pub fn registry(&self) -> crate::instances::InstanceRegistry {
        crate::instances::InstanceRegistry::new(self.store.clone(), self.paths.root())
    }

    /// The underlying object store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Writes one operator subtask's state for checkpoint `n`, in its envelope, as one
    /// object whatever its size (see [`stage_states`](Self::stage_states) for parts).
    /// Safe to retry: the same bytes land at the same key.
    pub async fn write_state(
        &self,
        checkpoint_id: CheckpointId,
        operator: &str,
        subtask: u32,
        payload: &[u8],
    ) -> Result<StateFileRef> {
        self.write_part(checkpoint_id, operator, subtask, 0, payload).await
    }

    async fn write_part(
        &self,
        checkpoint_id: CheckpointId,
        operator: &str,
        subtask: u32,
        part: u32,
        payload: &[u8],
    ) -> Result<StateFileRef> {
        let path = self.paths.state_part(checkpoint_id, operator, subtask, part)?;
        let bytes = Bytes::from(envelope::encode(STATE_MAGIC, STATE_VERSION, payload));
        let file = StateFileRef {
            operator: operator.to_string(),
            subtask,
            size: bytes.len() as u64,
            crc32c: crc32c::crc32c(&bytes),
            inline: None,
            offset: None,
            part,
        };
        with_retry("put", &path, || self.store.put(&path, PutPayload::from_bytes(bytes.clone()))).await?;
        Ok(file)
    }

    /// Reads and verifies a state file (or inline state) against its manifest entry.
    pub async fn read_state(&self, dir: &Path, file: &StateFileRef) -> Result<Bytes> {
        if let Some(inline) = &file.inline {
            let crc = crc32c::crc32c(inline);
            if inline.len() as u64 != file.size || crc != file.crc32c {
                return Err(CheckpointError::corrupt(
                    dir.clone().join(MANIFEST_NAME),
                    format!("inline state of {} fails its checksum", file.label()),
                ));
            }
            return Ok(inline.clone());
        }
        let (path, bytes) = match file.offset {
            Some(offset) => {
                let path = dir.clone().join(SHARED_STATE_NAME);
                let end = offset.checked_add(file.size).ok_or_else(|| {
                    CheckpointError::corrupt(
                        dir.clone().join(MANIFEST_NAME),
                        format!("state of {} ends past 2^64 bytes", file.label()),
                    )
                })?;
                let range = offset..end;
                let bytes = with_retry("get", &path, || self.store.get_range(&path, range.clone())).await?;
                // Name the section, so an operator sees which state of the shared object fails.
                (Path::from(format!("{path}@{offset}+{} ({})", file.size, file.label())), bytes)
            }
            None => {
                let path = dir.clone().join(CheckpointPaths::state_part_name(&file.operator, file.subtask, file.part)?);
                let bytes = self.get(&path).await?;
                (path, bytes)
            }
        };
        if bytes.len() as u64 != file.size {
            return Err(CheckpointError::corrupt(
                &path,
                format!("{} bytes, the manifest says {}", bytes.len(), file.size),
            ));
        }
        let crc = crc32c::crc32c(&bytes);
        if crc != file.crc32c {
            return Err(CheckpointError::corrupt(
                &path,
                format!("checksum mismatch: file {crc:#010x}, manifest {:#010x}", file.crc32c),
            ));
        }
        let payload =
            envelope::decode(STATE_MAGIC, STATE_VERSION, &bytes).map_err(|e| CheckpointError::corrupt(&path, e))?;
        Ok(bytes.slice_ref(payload))
    }

    async fn get(&self, path: &Path) -> Result<Bytes> {
        with_retry("get", path, || async { self.store.get(path).await?.bytes().await }).await.map_err(|e| match e {
            CheckpointError::Store { source, .. }
                if matches!(source.as_ref(), object_store::Error::NotFound { .. }) =>
            {
                CheckpointError::NotFound { what: "object", path: path.to_string() }
            }
            other => other,
        })
    }

    async fn put_create(&self, path: &Path, bytes: Bytes, checkpoint_id: CheckpointId) -> Result<Published> {
        let mut attempt = 1;
        loop {
            let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
            match self.store.put_opts(path, PutPayload::from_bytes(bytes.clone()), opts).await {
                Ok(_) => return Ok(Published::Created),
                Err(object_store::Error::AlreadyExists { .. }) => {
                    // Ours from an earlier attempt whose response was lost, or someone else's.
                    let existing = self.get(path).await?;
                    return if existing == bytes {
                        Ok(Published::AlreadyPublished)
                    } else {
                        Err(CheckpointError::ManifestConflict { path: path.to_string(), checkpoint_id })
                    };
                }
                Err(e) if attempt >= ATTEMPTS => return Err(CheckpointError::store("put", path, e)),
                Err(e) => {
                    tracing::warn!(%path, attempt, error = %e, "manifest put failed; retrying");
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Writes a whole checkpoint: up to `inline_limit` bytes of state, smallest states
    /// first, go into the manifest, the rest into the shared state object (see
    /// [`stage_states`](Self::stage_states)); then the manifest is published. Returns the
    /// manifest.
    pub async fn commit_checkpoint(
        &self,
        checkpoint_id: CheckpointId,
        states: &[(String, u32, Bytes)],
        transactions: Vec<crate::manifest::TransactionRecord>,
        inline_limit: usize,
    ) -> Result<Manifest> {
        let files = self.stage_states(checkpoint_id, states, inline_limit).await?;
        let manifest = Manifest {
            job_id: self.paths.job_id().to_string(),
            checkpoint_id,
            created_at_ms: now_ms(),
            state_files: files,
            transactions,
        };
        self.publish_manifest(&manifest).await?;
        Ok(manifest)
    }

    /// The first half of [`commit_checkpoint`](Self::commit_checkpoint). A state larger
    /// than the part limit ([`with_state_part_limit`](Self::with_state_part_limit)) is
    /// first split into parts of at most that many bytes; each part is then placed as a
    /// state is: the smallest are inlined into the manifest while their total stays
    /// within `inline_limit` bytes ([`inline_choice`]), the rest written as one shared
    /// object per checkpoint ([`SHARED_STATE_NAME`]), each in its own envelope at an
    /// offset the manifest records. A part that would take the shared object past its
    /// limit ([`with_shared_state_limit`](Self::with_shared_state_limit)) gets a file of
    /// its own, written in parallel. Returns the manifest entries, in the order of
    /// `states` and of their parts.
    pub async fn stage_states(
        &self,
        checkpoint_id: CheckpointId,
        states: &[(String, u32, Bytes)],
        inline_limit: usize,
    ) -> Result<Vec<StateFileRef>> {
        let mut parts: Vec<(&str, u32, u32, Bytes)> = Vec::with_capacity(states.len());
        for (operator, subtask, payload) in states {
            CheckpointPaths::state_file_name(operator, *subtask)?;
            let count = payload.len().div_ceil(self.part_limit).max(1);
            for k in 0..count {
                let end = payload.len().min((k + 1) * self.part_limit);
                let part = u32::try_from(k).map_err(|_| {
                    CheckpointError::Internal(format!("the state of {operator}-{subtask} needs more than 2^32 parts"))
                })?;
                parts.push((operator.as_str(), *subtask, part, payload.slice(k * self.part_limit..end)));
            }
        }
        let inlined = inline_choice(parts.iter().map(|p| p.3.len()), inline_limit);
        let mut refs: Vec<Option<StateFileRef>> = Vec::with_capacity(parts.len());
        let mut shared: Vec<u8> = Vec::new();
        let mut own = Vec::new();
        for (i, (operator, subtask, part, payload)) in parts.iter().enumerate() {
            if inlined[i] {
                refs.push(Some(StateFileRef {
                    part: *part,
                    ..StateFileRef::inline_bytes(operator, *subtask, payload.clone())
                }));
            } else if shared.len() + payload.len() + envelope::HEADER_LEN <= self.shared_limit {
                let offset = shared.len();
                envelope::encode_into(&mut shared, STATE_MAGIC, STATE_VERSION, payload);
                let section = &shared[offset..];
                refs.push(Some(StateFileRef {
                    operator: operator.to_string(),
                    subtask: *subtask,
                    size: section.len() as u64,
                    crc32c: crc32c::crc32c(section),
                    inline: None,
                    offset: Some(offset as u64),
                    part: *part,
                }));
            } else {
                refs.push(None);
                own.push(i);
            }
        }
        let put_shared = async {
            if shared.is_empty() {
                return Ok(());
            }
            let path = self.paths.shared_state(checkpoint_id);
            let bytes = Bytes::from(shared);
            with_retry("put", &path, || self.store.put(&path, PutPayload::from_bytes(bytes.clone()))).await.map(|_| ())
        };
        let parts = &parts;
        let put_own = futures::stream::iter(own)
            .map(|i| async move {
                let (operator, subtask, part, payload) = &parts[i];
                Ok::<_, CheckpointError>((i, self.write_part(checkpoint_id, operator, *subtask, *part, payload).await?))
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>();
        let ((), written) = futures::try_join!(put_shared, put_own)?;
        for (i, file) in written {
            refs[i] = Some(file);
        }
        Ok(refs.into_iter().flatten().collect())
    }

    /// Publishes the manifest of a checkpoint: the commit decision. Written with
    /// `PutMode::Create`, never overwritten; publishing the same bytes again succeeds,
    /// different bytes are [`CheckpointError::ManifestConflict`].
    pub async fn publish_manifest(&self, manifest: &Manifest) -> Result<Published> {
        if manifest.job_id != self.paths.job_id() {
            return Err(CheckpointError::InvalidName {
                what: "job id",
                name: manifest.job_id.clone(),
                reason: format!("this store writes job {}", self.paths.job_id()),
            });
        }
        let path = self.paths.manifest(manifest.checkpoint_id);
        self.put_create(&path, Bytes::from(manifest.encode()?), manifest.checkpoint_id).await
    }

    /// Reads and decodes the manifest of checkpoint `n`.
    pub async fn read_manifest(&self, checkpoint_id: CheckpointId) -> Result<Manifest> {
        let path = self.paths.manifest(checkpoint_id);
        Manifest::decode(path.as_ref(), &self.get(&path).await?)
    }

    /// Lists the job's checkpoints and reads their manifests.
    pub async fn observe(&self) -> Result<Observed> {
        let prefix = self.paths.job_prefix().clone();
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| CheckpointError::store("list", &prefix, e))?;
        let mut by_id: BTreeMap<CheckpointId, ObservedCheckpoint> = BTreeMap::new();
        let mut manifests = Vec::new();
        let mut aborted = Vec::new();
        for meta in metas {
            let entry = |id| ObservedCheckpoint {
                checkpoint_id: id,
                manifest: ManifestStatus::Missing,
                files: BTreeMap::new(),
            };
            match self.paths.parse(&meta.location) {
                CheckpointKey::Manifest { checkpoint_id } => {
                    by_id.entry(checkpoint_id).or_insert_with(|| entry(checkpoint_id));
                    manifests.push(checkpoint_id);
                }
                CheckpointKey::State { checkpoint_id, operator, subtask, part } => {
                    let name = CheckpointPaths::state_part_name(&operator, subtask, part).unwrap_or_default();
                    by_id.entry(checkpoint_id).or_insert_with(|| entry(checkpoint_id)).files.insert(name, meta.size);
                }
                CheckpointKey::SharedState { checkpoint_id } => {
                    let files = &mut by_id.entry(checkpoint_id).or_insert_with(|| entry(checkpoint_id)).files;
                    files.insert(SHARED_STATE_NAME.to_string(), meta.size);
                }
                CheckpointKey::Aborted { checkpoint_id } => {
                    by_id.entry(checkpoint_id).or_insert_with(|| entry(checkpoint_id));
                    aborted.push(checkpoint_id);
                }
                CheckpointKey::Savepoint { .. } | CheckpointKey::Unknown => {}
            }
        }
        let read: Vec<(CheckpointId, ManifestStatus)> = futures::stream::iter(manifests)
            .map(|id| async move {
                let path = self.paths.manifest(id);
                let status = match self.get(&path).await {
                    Ok(bytes) => match Manifest::decode(path.as_ref(), &bytes) {
                        Ok(m) => ManifestStatus::Valid(m),
                        Err(e) => ManifestStatus::Corrupt { reason: e.to_string() },
                    },
                    Err(e) if e.kind() == crate::ErrorKind::Unavailable => return Err(e),
                    Err(e) => ManifestStatus::Corrupt { reason: e.to_string() },
                };
                Ok((id, status))
            })
            .buffer_unordered(16)
            .try_collect()
            .await?;
        for (id, status) in read {
            if let Some(c) = by_id.get_mut(&id) {
                c.manifest = status;
            }
        }
        // The tombstone decides, whatever manifest appeared after it.
        for id in aborted {
            if let Some(c) = by_id.get_mut(&id) {
                c.manifest = ManifestStatus::Aborted;
            }
        }
        Ok(Observed { checkpoints: by_id.into_values().collect(), failed_verification: BTreeMap::new() })
    }

    async fn restore(&self, manifest: &Manifest, dir: &Path) -> Result<RestoredCheckpoint> {
        let read: Vec<_> = futures::stream::iter(&manifest.state_files)
            .map(|f| async move {
                Ok::<_, CheckpointError>(((f.operator.clone(), f.subtask, f.part), self.read_state(dir, f).await?))
            })
            .buffer_unordered(16)
            .try_collect()
            .await?;
        // Manifest::decode checked that each state's parts are 0, 1, ... once each.
        let mut parts: BTreeMap<(String, u32), BTreeMap<u32, Bytes>> = BTreeMap::new();
        for ((operator, subtask, part), bytes) in read {
            parts.entry((operator, subtask)).or_default().insert(part, bytes);
        }
        let states = parts
            .into_iter()
            .map(|(key, mut parts)| {
                let payload = if parts.len() == 1 {
                    parts.pop_first().map(|(_, b)| b).unwrap_or_default()
                } else {
                    let mut joined = Vec::with_capacity(parts.values().map(Bytes::len).sum());
                    parts.values().for_each(|b| joined.extend_from_slice(b));
                    Bytes::from(joined)
                };
                (key, payload)
            })
            .collect();
        Ok(RestoredCheckpoint { manifest: manifest.clone(), states })
    }

    /// Finds the newest complete checkpoint whose every state file verifies and reads it.
    /// A checkpoint that fails verification is skipped with a warning naming the file;
    /// it is never deleted. Does not delete anything; see
    /// [`collect_garbage`](Self::collect_garbage).
    pub async fn recover(&self, policy: &RetentionPolicy) -> Result<Recovery> {
        let mut observed = self.observe().await?;
        loop {
            let plan = resolve(&observed, policy);
            for (id, reason) in &plan.skipped {
                tracing::warn!(checkpoint = id, %reason, "skipping a corrupt checkpoint; it is kept for inspection");
            }
            let RecoveryDecision::Restore(manifest) = &plan.decision else {
                return Ok(Recovery { plan, restored: None });
            };
            let dir = self.paths.checkpoint_dir(manifest.checkpoint_id);
            match self.restore(manifest, &dir).await {
                Ok(restored) => return Ok(Recovery { plan, restored: Some(restored) }),
                Err(e) if matches!(e.kind(), crate::ErrorKind::Data | crate::ErrorKind::Invalid) => {
                    observed.failed_verification.insert(manifest.checkpoint_id, e.to_string());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Deletes the checkpoints the plan collects: the manifest first, so an interrupted
    /// deletion leaves an incomplete checkpoint, never a manifest without its state.
    pub async fn collect_garbage(&self, plan: &RecoveryPlan) -> Result<usize> {
        let mut deleted = 0;
        for (id, reason) in &plan.collect {
            let dir = self.paths.checkpoint_dir(*id);
            tracing::debug!(checkpoint = id, ?reason, "deleting checkpoint");
            let manifest = self.paths.manifest(*id);
            match self.store.delete(&manifest).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(CheckpointError::store("delete", &manifest, e)),
            }
            let files: Vec<Path> = self
                .store
                .list(Some(&dir))
                .map_ok(|m| m.location)
                .try_collect()
                .await
                .map_err(|e| CheckpointError::store("list", &dir, e))?;
            for f in files {
                match self.store.delete(&f).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
                    Err(e) => return Err(CheckpointError::store("delete", &f, e)),
                }
            }
        }
        Ok(deleted)
    }

    /// The jobs (instances) with anything stored under this store's root, by name; names
    /// starting with `_` are shareflow's own (the instance registry) and left out.
    pub async fn list_jobs(&self) -> Result<Vec<String>> {
        let root = self.paths.root();
        let list = || self.store.list_with_delimiter(Some(root));
        let listed = with_retry("list", root, list).await?;
        let mut jobs: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .filter(|name| !name.starts_with('_'))
            .collect();
        jobs.sort();
        Ok(jobs)
    }

    /// Every checkpoint of the job with its status, oldest first.
    pub async fn list_checkpoints(&self) -> Result<Vec<CheckpointInfo>> {
        let observed = self.observe().await?;
        Ok(observed
            .checkpoints
            .iter()
            .map(|c| CheckpointInfo {
                checkpoint_id: c.checkpoint_id,
                status: classify(c, &observed.failed_verification),
                state_files: c.files.len(),
                state_bytes: c.files.values().sum(),
                manifest: match &c.manifest {
                    ManifestStatus::Valid(m) => Some(m.clone()),
                    _ => None,
                },
            })
            .collect())
    }

    /// Copies complete checkpoint `n` to the savepoint `name`: its state files, then
    /// its manifest. Savepoints are never deleted automatically, nor overwritten.
    pub async fn create_savepoint(&self, name: &str, checkpoint_id: CheckpointId) -> Result<Manifest> {
        let manifest = self.copy_savepoint_state(name, checkpoint_id).await?;
        self.publish_savepoint(name, &manifest).await?;
        Ok(manifest)
    }

    /// The first step of [`create_savepoint`](Self::create_savepoint): copies the state
    /// files of complete checkpoint `n` into savepoint `name`'s directory, and returns
    /// the manifest to publish. Refuses a name a savepoint already has (its files would
    /// be overwritten); the files of a copy that never got its manifest are replaced.
    pub async fn copy_savepoint_state(&self, name: &str, checkpoint_id: CheckpointId) -> Result<Manifest> {
        let dir = self.paths.savepoint_dir(name)?;
        let published = dir.clone().join(MANIFEST_NAME);
        match self.store.head(&published).await {
            Ok(_) => return Err(CheckpointError::SavepointExists { name: name.into(), path: published.to_string() }),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(CheckpointError::store("head", &published, e)),
        }
        let manifest = self.read_manifest(checkpoint_id).await?;
        let from = self.paths.checkpoint_dir(checkpoint_id);
        let mut files: Vec<String> = Vec::new();
        for f in manifest.state_files.iter().filter(|f| f.inline.is_none()) {
            let file = match f.offset {
                Some(_) => SHARED_STATE_NAME.to_string(),
                None => CheckpointPaths::state_part_name(&f.operator, f.subtask, f.part)?,
            };
            if !files.contains(&file) {
                files.push(file);
            }
        }
        for file in files {
            let (src, dst) = (from.clone().join(file.as_str()), dir.clone().join(file.as_str()));
            with_retry("copy", &src, || self.store.copy(&src, &dst)).await?;
        }
        Ok(manifest)
    }

    /// The last step of [`create_savepoint`](Self::create_savepoint): writes savepoint
    /// `name`'s manifest, which makes it complete.
    pub async fn publish_savepoint(&self, name: &str, manifest: &Manifest) -> Result<()> {
        let path = self.paths.savepoint_dir(name)?.join(MANIFEST_NAME);
        self.put_create(&path, Bytes::from(manifest.encode()?), manifest.checkpoint_id).await?;
        Ok(())
    }

    /// Names of the job's savepoints.
    pub async fn list_savepoints(&self) -> Result<Vec<String>> {
        let prefix = self.paths.savepoints();
        let listing = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| CheckpointError::store("list", &prefix, e))?;
        let mut names: Vec<String> =
            listing.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect();
        names.sort();
        Ok(names)
    }

    /// Reads and verifies savepoint `name`.
    pub async fn read_savepoint(&self, name: &str) -> Result<RestoredCheckpoint> {
        self.read_savepoint_in(self.paths.savepoint_dir(name)?).await
    }

    /// Where savepoint `name` of this job is, under the store's root.
    pub fn savepoint_path(&self, name: &str) -> Result<Path> {
        self.paths.savepoint_dir(name)
    }

    /// Reads and verifies the savepoint at `url`: a directory holding its manifest and
    /// its state files, wherever it was copied (a savepoint names its files relative to
    /// its own directory, so a copy to another bucket or directory restores too).
    pub async fn read_savepoint_url(url: &str, options: &[(&str, &str)]) -> Result<RestoredCheckpoint> {
        let (store, dir) = crate::url::open_url(url, options)?;
        // The job id only names paths this reader never uses.
        let reader = Self::new(store, CheckpointPaths::new(dir.clone(), "savepoint")?);
        reader.read_savepoint_in(dir).await
    }

    async fn read_savepoint_in(&self, dir: Path) -> Result<RestoredCheckpoint> {
        let path = dir.clone().join(MANIFEST_NAME);
        let manifest = Manifest::decode(path.as_ref(), &self.get(&path).await?)?;
        self.restore(&manifest, &dir).await
    }
}

/// Milliseconds since the Unix epoch, for manifests.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod inline_tests {
    use super::inline_choice;

    /// Each row: state sizes, the limit, which states the manifest inlines.
    #[test]
    fn the_smallest_states_are_inlined_while_the_total_fits() {
        let rows: &[(&[usize], usize, &[bool])] = &[
            // Everything fits: the checkpoint is one object.
            (&[65_536, 65_536, 65_536, 65_536], 1 << 20, &[true, true, true, true]),
            // Exactly at the limit still fits.
            (&[10, 20, 30], 60, &[true, true, true]),
            (&[10, 20, 30], 59, &[true, true, false]),
            // Smallest first, answered in the states' own order.
            (&[30_000, 5, 20_000], 20_005, &[false, true, true]),
            // Once one does not fit, larger ones do not either.
            (&[5, 40, 40], 50, &[true, true, false]),
            // Ties keep their order.
            (&[7, 7, 7], 14, &[true, true, false]),
            // A limit of 0 inlines only empty states.
            (&[0, 1], 0, &[true, false]),
            (&[], 100, &[]),
            // Sizes near usize::MAX do not overflow.
            (&[usize::MAX, 1], usize::MAX, &[false, true]),
        ];
        for (sizes, limit, want) in rows {
            assert_eq!(&inline_choice(sizes.iter().copied(), *limit), want, "sizes {sizes:?}, limit {limit}");
        }
    }
}
