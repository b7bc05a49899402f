//! [`FileSink`]: Arrow IPC files on object storage, staged under the checkpoint's
//! transaction and published by its commit.
//!
//! Layout under the sink's root:
//! - `_staging/{T(n)}/part-{subtask}.arrow`: written at barrier n, invisible to readers;
//! - `_staging/{T(n)}/_prepared`: written by prepare;
//! - `data/{T(n)}-part-{subtask}.arrow`: published by commit (copy, then delete the
//!   staged file: repeating it is harmless). Readers list `data/` only.

use std::sync::Arc;

use arrow::ipc::writer::FileWriter;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{
    CheckpointId, Collector, ErrorKind, Operator, PendingTransaction, PrepareOutcome, Result, RuntimeError, StateItems,
    SubtaskContext, TransactionParticipant, TransactionTemplate,
};

fn store_error(op: &'static str, txn: &TransactionId, e: object_store::Error) -> RuntimeError {
    RuntimeError::participant("file-sink", op, txn, ErrorKind::Unavailable, e)
}

/// The job-level half of the file sink: prepare, commit, abort and recovery of staged
/// files.
#[derive(Debug)]
pub struct FileCommitter {
    store: Arc<dyn ObjectStore>,
    root: Path,
}

impl FileCommitter {
    /// Files go under `root` in `store`.
    pub fn new(store: Arc<dyn ObjectStore>, root: &str) -> Arc<Self> {
        Arc::new(Self { store, root: Path::from(root) })
    }

    fn staging(&self, txn: &TransactionId) -> Path {
        self.root.clone().join("_staging").join(txn.to_string())
    }

    async fn list(&self, prefix: &Path) -> Result<Vec<Path>> {
        list_sorted(self.store.as_ref(), prefix, "file-sink").await
    }

    /// The published data files, sorted.
    pub async fn published(&self) -> Result<Vec<Path>> {
        self.list(&self.root.clone().join("data")).await
    }

    /// Reads every published batch.
    pub async fn read_published(&self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for path in self.published().await? {
            let data = self
                .store
                .get(&path)
                .await
                .map_err(|e| RuntimeError::task("file-sink", ErrorKind::Unavailable, e))?
                .bytes()
                .await
                .map_err(|e| RuntimeError::task("file-sink", ErrorKind::Unavailable, e))?;
            let reader = arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(data), None)
                .map_err(|e| RuntimeError::task("file-sink", ErrorKind::Data, e))?;
            for batch in reader {
                out.push(batch.map_err(|e| RuntimeError::task("file-sink", ErrorKind::Data, e))?);
            }
        }
        Ok(out)
    }

    async fn staged(&self, txn: &TransactionId) -> Result<Vec<Path>> {
        let dir = self.staging(txn);
        self.store.list(Some(&dir)).map_ok(|m| m.location).try_collect().await.map_err(|e| store_error("list", txn, e))
    }
}

#[async_trait]
impl TransactionParticipant for FileCommitter {
    fn name(&self) -> &str {
        "file-sink"
    }

    /// A committer on the same store and root: staged files are keyed by transaction id,
    /// so another instance's are published or discarded from here. Files need no
    /// fencing: a stale instance's late commit publishes only what its decided
    /// transaction staged.
    fn adopter(&self) -> Option<shareflow_runtime::Participant> {
        Some(FileCommitter::new(self.store.clone(), self.root.as_ref()))
    }

    async fn begin(&self, _txn: &TransactionId) -> Result<()> {
        Ok(())
    }

    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        prepare_staged(self.store.as_ref(), &self.staging(txn), "file-sink", txn).await
    }

    async fn commit(&self, txn: &TransactionId) -> Result<()> {
        for staged in self.staged(txn).await? {
            let Some(name) = staged.filename() else { continue };
            if name == "_prepared" || name == "_aborted" {
                continue;
            }
            let target = self.root.clone().join("data").join(format!("{txn}-{name}"));
            self.store.copy(&staged, &target).await.map_err(|e| store_error("commit", txn, e))?;
            self.store.delete(&staged).await.map_err(|e| store_error("commit", txn, e))?;
        }
        let marker = self.staging(txn).join("_prepared");
        match self.store.delete(&marker).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error("commit", txn, e)),
        }
    }

    /// Discards the staged files and leaves an `_aborted` tombstone, so that a late
    /// prepare answers "already aborted" instead of preparing an empty transaction.
    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        abort_staged(self.store.as_ref(), self.staged(txn).await?, &self.staging(txn), "file-sink", txn).await
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        let prefix = self.root.clone().join("_staging");
        Ok(staged_transactions(self.list(&prefix).await?, &prefix, template))
    }
}

/// Every object under `prefix` of `store`, sorted; `task` names who failed to list.
pub(crate) async fn list_sorted(store: &dyn ObjectStore, prefix: &Path, task: &str) -> Result<Vec<Path>> {
    let mut files: Vec<Path> = store
        .list(Some(prefix))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(|e| RuntimeError::task(task, ErrorKind::Unavailable, e))?;
    files.sort();
    Ok(files)
}

/// Prepare of a transaction whose files are staged in `dir`: "already aborted" if its
/// `_aborted` tombstone is there, else a `_prepared` marker, durably.
pub(crate) async fn prepare_staged(
    store: &dyn ObjectStore,
    dir: &Path,
    participant: &'static str,
    txn: &TransactionId,
) -> Result<PrepareOutcome> {
    let failed = |e| RuntimeError::participant(participant, "prepare", txn, ErrorKind::Unavailable, e);
    match store.head(&dir.clone().join("_aborted")).await {
        Ok(_) => return Ok(PrepareOutcome::AlreadyAborted),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(failed(e)),
    }
    store.put(&dir.clone().join("_prepared"), PutPayload::from_static(b"prepared")).await.map_err(failed)?;
    Ok(PrepareOutcome::Prepared)
}

/// Abort of a transaction whose files `staged` are in `dir`: deletes them and leaves an
/// `_aborted` tombstone, so that a late prepare answers "already aborted" instead of
/// preparing an empty transaction.
pub(crate) async fn abort_staged(
    store: &dyn ObjectStore,
    staged: Vec<Path>,
    dir: &Path,
    participant: &'static str,
    txn: &TransactionId,
) -> Result<()> {
    let failed = |e| RuntimeError::participant(participant, "abort", txn, ErrorKind::Unavailable, e);
    for path in staged {
        if path.filename() == Some("_aborted") {
            continue;
        }
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    store.put(&dir.clone().join("_aborted"), PutPayload::from_static(b"aborted")).await.map_err(failed)?;
    Ok(())
}

/// The transactions of `template`'s group and prefix with files staged under `prefix`
/// (`{prefix}/{T(n)}/...`): prepared when a `_prepared` marker is there, left out when
/// an `_aborted` tombstone is. `files` sorted, as a listing gives them.
pub(crate) fn staged_transactions(
    files: Vec<Path>,
    prefix: &Path,
    template: &TransactionTemplate,
) -> Vec<PendingTransaction> {
    let mut out: Vec<PendingTransaction> = Vec::new();
    // An aborted transaction's tombstone sorts after its other files, or before.
    let mut aborted: Vec<TransactionId> = Vec::new();
    for f in files {
        let Some(dir) = f.prefix_match(prefix).and_then(|mut p| p.next()) else { continue };
        let Ok(id) = TransactionId::parse(dir.as_ref(), template.group_id()) else { continue };
        if id.prefix() != template.prefix() || aborted.contains(&id) {
            continue;
        }
        if f.filename() == Some("_aborted") {
            aborted.push(id.clone());
            out.retain(|p| p.id != id);
            continue;
        }
        let prepared = f.filename() == Some("_prepared");
        match out.iter_mut().find(|p| p.id == id) {
            Some(p) => p.prepared |= prepared,
            None => out.push(PendingTransaction { id, prepared }),
        }
    }
    out
}

/// One subtask of the file sink: buffers the batches of the open checkpoint and stages
/// them as one Arrow IPC file at the barrier.
pub struct FileSink {
    committer: Arc<FileCommitter>,
    template: TransactionTemplate,
    subtask: u32,
    buffered: Vec<RecordBatch>,
    failpoints: shareflow_runtime::Failpoints,
    task: String,
}

impl FileSink {
    /// A factory for the job builder; register `committer` as the job's participant.
    pub fn factory(committer: Arc<FileCommitter>) -> impl Fn(&SubtaskContext) -> FileSink + Send + Sync {
        move |ctx| FileSink {
            committer: committer.clone(),
            template: ctx.transactions.clone(),
            subtask: ctx.subtask,
            buffered: Vec::new(),
            failpoints: ctx.failpoints.clone(),
            task: ctx.task_name(),
        }
    }
}

#[async_trait]
impl Operator for FileSink {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, _out: &mut Collector) -> Result<()> {
        self.buffered.push(batch);
        self.failpoints.hit(crate::common::points::SINK_AFTER_WRITE)
    }

    /// pre_commit: stage the rows of checkpoint n under T(n).
    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId, _out: &mut Collector) -> Result<StateItems> {
        let batches = std::mem::take(&mut self.buffered);
        let Some(first) = batches.first() else { return Ok(Vec::new()) };
        let mut bytes = Vec::new();
        {
            let mut writer = FileWriter::try_new(&mut bytes, &first.schema())
                .map_err(|e| RuntimeError::task(&self.task, ErrorKind::Internal, e))?;
            for b in &batches {
                writer.write(b).map_err(|e| RuntimeError::task(&self.task, ErrorKind::Internal, e))?;
            }
            writer.finish().map_err(|e| RuntimeError::task(&self.task, ErrorKind::Internal, e))?;
        }
        let txn = self.template.transaction(checkpoint_id);
        let path = self.committer.staging(&txn).join(format!("part-{}.arrow", self.subtask));
        self.committer
            .store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| RuntimeError::task(&self.task, ErrorKind::Unavailable, e))?;
        Ok(Vec::new())
    }
}
