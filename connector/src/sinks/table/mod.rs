//! [`TableSink`]: Parquet files on object storage, published exactly once, as plain
//! Parquet (optionally Hive-partitioned) or as a Delta Lake table (decision 0043).
//!
//! Layout under the table's root:
//! - `_staging/{T(n)}/[col=value/]part-{subtask}-{k}.parquet`: written while checkpoint
//!   n runs, a file rolled when it reaches its target size, the open ones at barrier n;
//!   `_staging/{T(n)}/_files-{subtask}.json` lists them (size, rows, partition);
//! - `_staging/{T(n)}/_prepared`, `_aborted`: as the Arrow IPC file sink's;
//! - `[col=value/]{T(n)}-part-{subtask}-{k}.parquet`: published by commit (copied, then
//!   the staged file deleted: repeating it is harmless);
//! - Delta only: `_delta_log/{version:020}.json`, one per committed checkpoint, with its
//!   `add` actions and a `txn` action (`appId` = `{group}-{prefix}`, `version` = n). A
//!   commit whose `txn` the log already holds is not written again, so recovery after a
//!   crash between the log and notify commits nothing twice.

mod delta;
mod writer;

use std::sync::Arc;

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{
    ErrorKind, PendingTransaction, PrepareOutcome, Result, RuntimeError, TransactionParticipant, TransactionTemplate,
};

pub use writer::TableSink;

const NAME: &str = "table-sink";

/// How the files are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// Parquet files under the root: a reader lists them (Hive-style directories when
    /// partitioned).
    Parquet,
    /// A Delta Lake table: the files and a commit of the log per checkpoint.
    Delta,
}

/// Where and how a job's rows go: `[sink] kind = "parquet"` or `"delta"` of a job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSettings {
    /// The table's root, an object-store URL (`file:///...`, `s3://bucket/path`, ...).
    pub url: String,
    /// Plain Parquet or Delta.
    pub format: TableFormat,
    /// A column whose value names each file's directory (`column=value/`), if any; it is
    /// not stored in the files, as Hive and Delta do.
    pub partition_by: Option<String>,
    /// A file is closed and a new one begun once it holds about this many bytes.
    pub target_file_bytes: usize,
}

impl TableSettings {
    /// A table at `url`, unpartitioned, with files of up to 128 MiB.
    pub fn new(url: &str, format: TableFormat) -> Self {
        Self { url: url.to_string(), format, partition_by: None, target_file_bytes: 128 << 20 }
    }
}

/// A file a subtask staged: its path under the transaction's staging directory, size,
/// rows, and partition directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StagedFile {
    pub(crate) relative: String,
    pub(crate) size: u64,
    pub(crate) rows: u64,
    pub(crate) partition: Option<String>,
    /// The file's columns as Delta's `schemaString`.
    pub(crate) schema: String,
}

fn store_error(
    op: &'static str,
    txn: &TransactionId,
    e: impl std::error::Error + Send + Sync + 'static,
) -> RuntimeError {
    RuntimeError::participant(NAME, op, txn, ErrorKind::Unavailable, e)
}

/// The job-level half of the table sink: prepare, commit (publish, and for Delta the
/// log), abort and recovery of staged files.
#[derive(Debug)]
pub struct TableCommitter {
    settings: TableSettings,
    store: Arc<dyn ObjectStore>,
    root: Path,
    /// Delta: the newest log version read, and the newest `txn` version of each app.
    log: tokio::sync::Mutex<Option<(u64, std::collections::HashMap<String, u64>)>>,
}

impl TableCommitter {
    /// A committer for `settings`; an error names a URL it cannot open.
    pub fn new(settings: TableSettings) -> Result<Arc<Self>> {
        let (store, root) = shareflow_checkpoint::open_url(&settings.url, &[])?;
        Ok(Self::on_store(settings, store, root.as_ref()))
    }

    /// A committer writing under `root` of `store` (the URL of `settings` names it in
    /// messages only): for a store opened with options of its own.
    pub fn on_store(settings: TableSettings, store: Arc<dyn ObjectStore>, root: &str) -> Arc<Self> {
        Arc::new(Self { settings, store, root: Path::from(root), log: tokio::sync::Mutex::new(None) })
    }

    fn staging(&self, txn: &TransactionId) -> Path {
        self.root.clone().join("_staging").join(txn.to_string())
    }

    fn under(&self, base: &Path, relative: &str) -> Path {
        relative.split('/').fold(base.clone(), |p, part| p.join(part))
    }

    /// Where a staged file is published: its directory, the transaction's id before
    /// its name.
    fn published(&self, txn: &TransactionId, file: &StagedFile) -> String {
        match file.relative.rsplit_once('/') {
            Some((dir, name)) => format!("{dir}/{txn}-{name}"),
            None => format!("{txn}-{}", file.relative),
        }
    }

    async fn list(&self, prefix: &Path) -> Result<Vec<Path>> {
        super::file::list_sorted(self.store.as_ref(), prefix, NAME).await
    }

    /// The files the subtasks staged in `txn`, from their lists.
    async fn staged_files(&self, txn: &TransactionId) -> Result<Vec<StagedFile>> {
        let mut out = Vec::new();
        for path in self.list(&self.staging(txn)).await? {
            if !path.filename().is_some_and(|f| f.starts_with("_files-")) {
                continue;
            }
            let bytes = self.store.get(&path).await.map_err(|e| store_error("commit", txn, e))?.bytes().await;
            let bytes = bytes.map_err(|e| store_error("commit", txn, e))?;
            let files: Vec<StagedFile> = serde_json::from_slice(&bytes)
                .map_err(|e| RuntimeError::participant(NAME, "commit", txn, ErrorKind::Data, e))?;
            out.extend(files);
        }
        Ok(out)
    }

    /// Copies each staged file to where it is published; one already moved is done.
    async fn publish(&self, txn: &TransactionId, files: &[StagedFile]) -> Result<()> {
        for f in files {
            let from = self.under(&self.staging(txn), &f.relative);
            let to = self.under(&self.root, &self.published(txn, f));
            match self.store.copy(&from, &to).await {
                Ok(()) => {}
                Err(object_store::Error::NotFound { .. }) if self.store.head(&to).await.is_ok() => {}
                Err(e) => return Err(store_error("commit", txn, e)),
            }
        }
        Ok(())
    }

    /// Deletes everything staged for `txn`.
    async fn clear_staging(&self, txn: &TransactionId) -> Result<()> {
        for path in self.list(&self.staging(txn)).await? {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error("clean up", txn, e)),
            }
        }
        Ok(())
    }

    /// Delta: the log's newest version, and the newest checkpoint `app` committed,
    /// reading only the commits written since the last look (all of them backwards,
    /// to `app`'s newest, the first time).
    async fn log_state(&self, app: &str, txn: &TransactionId) -> Result<(Option<u64>, Option<u64>)> {
        let dir = self.root.clone().join("_delta_log");
        let mut versions: Vec<u64> =
            self.list(&dir).await?.iter().filter_map(|p| p.filename()?.strip_suffix(".json")?.parse().ok()).collect();
        versions.sort_unstable();
        let latest = versions.last().copied();
        let mut cache = self.log.lock().await;
        let (seen, apps) = cache.get_or_insert_with(|| (0, Default::default()));
        let first_look = *seen == 0 && !apps.contains_key(app);
        let read = |v: u64| {
            let path = dir.clone().join(format!("{v:020}.json"));
            async move {
                let bytes = self.store.get(&path).await.map_err(|e| store_error("commit", txn, e))?.bytes().await;
                Ok::<_, RuntimeError>(
                    String::from_utf8_lossy(&bytes.map_err(|e| store_error("commit", txn, e))?).into_owned(),
                )
            }
        };
        if first_look {
            for &v in versions.iter().rev() {
                if let Some(n) = delta::txn_version(&read(v).await?, app) {
                    apps.insert(app.to_string(), n);
                    break;
                }
            }
        } else {
            for &v in versions.iter().filter(|&&v| v > *seen) {
                if let Some(n) = delta::txn_version(&read(v).await?, app) {
                    apps.insert(app.to_string(), n);
                }
            }
        }
        *seen = latest.unwrap_or(0);
        Ok((latest, apps.get(app).copied()))
    }

    /// Delta: the commit of checkpoint `txn` to the log, once.
    async fn commit_delta(&self, txn: &TransactionId, files: &[StagedFile]) -> Result<()> {
        let app = format!("{}-{}", txn.group_id(), txn.prefix());
        for _ in 0..16 {
            let (latest, committed) = self.log_state(&app, txn).await?;
            if committed.is_some_and(|c| c >= txn.checkpoint_id()) {
                return Ok(());
            }
            let now_ms =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            let id = format!("{:032x}", u128::from(now_ms) << 64 | u128::from(std::process::id()));
            let id = format!("{}-{}-{}-{}-{}", &id[..8], &id[8..12], &id[12..16], &id[16..20], &id[20..]);
            let published: Vec<String> = files.iter().map(|f| self.published(txn, f)).collect();
            let commit = delta::Commit {
                create: latest.is_none().then(|| (files[0].schema.as_str(), self.settings.partition_by.as_deref(), id)),
                app_id: &app,
                version: txn.checkpoint_id(),
                files: files.iter().zip(published).collect(),
                partition_by: self.settings.partition_by.as_deref(),
                now_ms,
            };
            let bytes = delta::commit_file(&commit);
            let next = latest.map_or(0, |v| v + 1);
            let path = self.root.clone().join("_delta_log").join(format!("{next:020}.json"));
            let put = self.store.put_opts(&path, PutPayload::from(bytes), PutOptions::from(PutMode::Create)).await;
            match put {
                Ok(_) => return Ok(()),
                // Another writer took the version: look again.
                Err(object_store::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(store_error("commit", txn, e)),
            }
        }
        Err(RuntimeError::participant(
            NAME,
            "commit",
            txn,
            ErrorKind::Unavailable,
            Message("16 tries to write the next version of the Delta log lost to other writers; try again".into()),
        ))
    }
}

#[derive(Debug)]
struct Message(String);

impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}

#[async_trait]
impl TransactionParticipant for TableCommitter {
    fn name(&self) -> &str {
        NAME
    }

    /// A committer on the same table: staged files and the log's `txn` are keyed by
    /// transaction id and prefix, so another instance's are decided from here.
    fn adopter(&self) -> Option<shareflow_runtime::Participant> {
        Some(TableCommitter::on_store(self.settings.clone(), self.store.clone(), self.root.as_ref()))
    }

    async fn begin(&self, _txn: &TransactionId) -> Result<()> {
        Ok(())
    }

    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        if self.store.head(&self.staging(txn).join("_aborted")).await.is_ok() {
            return Ok(PrepareOutcome::AlreadyAborted);
        }
        let marker = self.staging(txn).join("_prepared");
        self.store
            .put(&marker, PutPayload::from_static(b"prepared"))
            .await
            .map_err(|e| store_error("prepare", txn, e))?;
        Ok(PrepareOutcome::Prepared)
    }

    async fn commit(&self, txn: &TransactionId) -> Result<()> {
        let files = self.staged_files(txn).await?;
        self.publish(txn, &files).await?;
        if self.settings.format == TableFormat::Delta && !files.is_empty() {
            self.commit_delta(txn, &files).await?;
        }
        self.clear_staging(txn).await
    }

    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        let staged = self.list(&self.staging(txn)).await?;
        super::file::abort_staged(self.store.as_ref(), staged, &self.staging(txn), NAME, txn).await
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        let prefix = self.root.clone().join("_staging");
        Ok(super::file::staged_transactions(self.list(&prefix).await?, &prefix, template))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow::array::Int64Array;
    use arrow::record_batch::RecordBatch;

    /// Stages one file of `rows` ids for `txn`, as a subtask does at its barrier.
    async fn stage(c: &TableCommitter, txn: &TransactionId, rows: i64) {
        let batch = RecordBatch::try_from_iter(vec![(
            "id",
            Arc::new(Int64Array::from_iter_values(0..rows)) as arrow::array::ArrayRef,
        )])
        .unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(Vec::new(), batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        let bytes = writer.into_inner().unwrap();
        let file = StagedFile {
            relative: "part-0-00000.parquet".into(),
            size: bytes.len() as u64,
            rows: rows as u64,
            partition: None,
            schema: delta::schema_string(&batch.schema()).unwrap(),
        };
        let staging = c.staging(txn);
        c.store.put(&staging.clone().join("part-0-00000.parquet"), PutPayload::from(bytes)).await.unwrap();
        c.store
            .put(&staging.join("_files-0.json"), PutPayload::from(serde_json::to_vec(&[file]).unwrap()))
            .await
            .unwrap();
    }

    async fn log_versions(c: &TableCommitter) -> Vec<String> {
        let mut v: Vec<String> =
            c.list(&c.root.clone().join("_delta_log")).await.unwrap().iter().map(|p| p.to_string()).collect();
        v.sort();
        v
    }

    /// A commit repeated after a crash between the log and the end of the commit (the
    /// staged files still there, as they are until the commit ends) writes no second
    /// log entry: the log's `txn` says it is done, also for a committer that starts
    /// afresh, as after a restart.
    #[tokio::test]
    async fn a_repeated_delta_commit_writes_the_log_once() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let settings = TableSettings::new("memory:///t", TableFormat::Delta);
        let c = TableCommitter::on_store(settings.clone(), store.clone(), "t");
        let t1 = TransactionId::new("g", "job", 1).unwrap();
        stage(&c, &t1, 5).await;
        c.commit(&t1).await.unwrap();
        assert_eq!(log_versions(&c).await, vec!["t/_delta_log/00000000000000000000.json"]);
        for committer in [c.clone(), TableCommitter::on_store(settings.clone(), store.clone(), "t")] {
            stage(&committer, &t1, 5).await;
            committer.commit(&t1).await.unwrap();
            assert_eq!(log_versions(&committer).await.len(), 1, "committed once");
        }
        let t2 = TransactionId::new("g", "job", 2).unwrap();
        stage(&c, &t2, 3).await;
        c.commit(&t2).await.unwrap();
        assert_eq!(log_versions(&c).await.len(), 2, "the next checkpoint is a new version");
        let other = TransactionId::new("g", "other", 1).unwrap();
        stage(&c, &other, 2).await;
        c.commit(&other).await.unwrap();
        assert_eq!(log_versions(&c).await.len(), 3, "another prefix's checkpoint 1 is its own");
    }
}
