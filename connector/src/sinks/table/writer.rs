//! One subtask of the table sink: Parquet files rolled by size, one open file per
//! partition value, staged under the checkpoint's transaction at the barrier (or when
//! a file reaches its size).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use shareflow_runtime::{
    CheckpointId, Collector, ErrorKind, Failpoints, Operator, Result, RuntimeError, StateItems, SubtaskContext,
    TransactionTemplate,
};

use super::{StagedFile, TableCommitter};

/// One open Parquet file of a partition.
struct OpenFile {
    writer: ArrowWriter<Vec<u8>>,
    rows: u64,
}

/// One subtask of the table sink. Register its [`TableCommitter`] as the job's
/// participant.
pub struct TableSink {
    committer: Arc<TableCommitter>,
    template: TransactionTemplate,
    subtask: u32,
    task: String,
    failpoints: Failpoints,
    /// The open files of the open checkpoint, by partition directory (`""` unpartitioned).
    open: BTreeMap<String, OpenFile>,
    /// Files staged for the open checkpoint so far.
    staged: Vec<StagedFile>,
    /// Files written by this subtask in the open checkpoint: the next file's number.
    next_file: u32,
    /// The table's schema (the partition column included), as the last batch had it.
    schema: Option<SchemaRef>,
}

impl TableSink {
    /// A factory for the job builder; register `committer` as the job's participant.
    pub fn factory(committer: Arc<TableCommitter>) -> impl Fn(&SubtaskContext) -> TableSink + Send + Sync {
        move |ctx| TableSink {
            committer: committer.clone(),
            template: ctx.transactions.clone(),
            subtask: ctx.subtask,
            task: ctx.task_name(),
            failpoints: ctx.failpoints.clone(),
            open: BTreeMap::new(),
            staged: Vec::new(),
            next_file: 0,
            schema: None,
        }
    }

    fn err(&self, kind: ErrorKind, e: impl std::error::Error + Send + Sync + 'static) -> RuntimeError {
        RuntimeError::task(&self.task, kind, e)
    }

    /// The rows of `batch` by partition directory (`col=value`, or `""` unpartitioned).
    fn split(&self, batch: &RecordBatch) -> Result<Vec<(String, RecordBatch)>> {
        let Some(column) = &self.committer.settings.partition_by else {
            return Ok(vec![(String::new(), batch.clone())]);
        };
        let array = batch.column_by_name(column).ok_or_else(|| {
            RuntimeError::task_message(
                &self.task,
                ErrorKind::Invalid,
                format!("the table is partitioned by {column:?}, and the query's output has no such column: select it"),
            )
        })?;
        let text = arrow::compute::cast(array, &DataType::Utf8).map_err(|e| self.err(ErrorKind::Invalid, e))?;
        let text = text.as_string::<i32>();
        let mut rows: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for i in 0..text.len() {
            let value = if text.is_null(i) { "__HIVE_DEFAULT_PARTITION__".to_string() } else { escape(text.value(i)) };
            rows.entry(format!("{column}={value}")).or_default().push(i as u32);
        }
        // The partition column lives in the directory's name, not in the files.
        let keep: Vec<usize> = (0..batch.num_columns()).filter(|&i| batch.schema().field(i).name() != column).collect();
        let batch = batch.project(&keep).map_err(|e| self.err(ErrorKind::Internal, e))?;
        rows.into_iter()
            .map(|(dir, idx)| {
                let idx = arrow::array::UInt32Array::from(idx);
                let part =
                    arrow::compute::take_record_batch(&batch, &idx).map_err(|e| self.err(ErrorKind::Internal, e))?;
                Ok((dir, part))
            })
            .collect()
    }

    /// Closes the file of `dir` and stages it under checkpoint `checkpoint_id`'s
    /// transaction.
    async fn stage(&mut self, dir: &str, checkpoint_id: CheckpointId) -> Result<()> {
        let Some(file) = self.open.remove(dir) else { return Ok(()) };
        let bytes = file.writer.into_inner().map_err(|e| self.err(ErrorKind::Internal, e))?;
        let name = format!("part-{}-{:05}.parquet", self.subtask, self.next_file);
        self.next_file += 1;
        let relative = if dir.is_empty() { name } else { format!("{dir}/{name}") };
        let txn = self.template.transaction(checkpoint_id);
        let path = self.committer.under(&self.committer.staging(&txn), &relative);
        let size = bytes.len() as u64;
        let schema = match &self.schema {
            Some(s) => super::delta::schema_string(s)
                .map_err(|e| RuntimeError::task_message(&self.task, ErrorKind::Invalid, e))?,
            None => String::new(),
        };
        self.committer
            .store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| self.err(ErrorKind::Unavailable, e))?;
        let partition = (!dir.is_empty()).then(|| dir.to_string());
        self.staged.push(StagedFile { relative, size, rows: file.rows, partition, schema });
        Ok(())
    }
}

/// A partition value as a directory name: characters a path cannot hold are `%XX`, as
/// Hive writes them.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' ') {
            out.push(c);
        } else {
            for b in c.to_string().bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

#[async_trait]
impl Operator for TableSink {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = super::delta::table_batch(&batch).map_err(|e| self.err(ErrorKind::Invalid, e))?;

        let checkpoint_id = out.checkpoint_id();
        let target = self.committer.settings.target_file_bytes;
        // The table's schema names the partition column too; its files do not hold it.
        self.schema = Some(batch.schema());
        for (dir, part) in self.split(&batch)? {
            if !self.open.contains_key(&dir) {
                let props = parquet::file::properties::WriterProperties::builder()
                    .set_compression(parquet::basic::Compression::SNAPPY)
                    .build();
                let writer = ArrowWriter::try_new(Vec::new(), part.schema(), Some(props))
                    .map_err(|e| self.err(ErrorKind::Internal, e))?;
                self.open.insert(dir.clone(), OpenFile { writer, rows: 0 });
            }
            let full = {
                let file = self.open.get_mut(&dir).ok_or_else(|| RuntimeError::Internal("no open file".into()))?;
                file.writer.write(&part).map_err(|e| RuntimeError::task(&self.task, ErrorKind::Internal, e))?;
                file.rows += part.num_rows() as u64;
                file.writer.in_progress_size() + file.writer.bytes_written() >= target
            };
            if full {
                self.stage(&dir, checkpoint_id).await?;
            }
        }
        self.failpoints.hit(crate::common::points::SINK_AFTER_WRITE)
    }

    /// Stages every open file of checkpoint `checkpoint_id`, and the list of what this
    /// subtask staged in it.
    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId, _out: &mut Collector) -> Result<StateItems> {
        let dirs: Vec<String> = self.open.keys().cloned().collect();
        for dir in dirs {
            self.stage(&dir, checkpoint_id).await?;
        }
        self.next_file = 0;
        let staged = std::mem::take(&mut self.staged);
        if !staged.is_empty() {
            let txn = self.template.transaction(checkpoint_id);
            let list = serde_json::to_vec(&staged).map_err(|e| self.err(ErrorKind::Internal, e))?;
            let path = self.committer.staging(&txn).join(format!("_files-{}.json", self.subtask));
            self.committer
                .store
                .put(&path, PutPayload::from(list))
                .await
                .map_err(|e| self.err(ErrorKind::Unavailable, e))?;
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn partition_values_are_escaped_as_hive_writes_them() {
        assert_eq!(escape("eu-west_1.a b"), "eu-west_1.a b");
        assert_eq!(escape("a/b=c"), "a%2Fb%3Dc");
        assert_eq!(escape("é"), "%C3%A9");
    }
}
