//! One subtask of the PostgreSQL sink: a connection, the open checkpoint's database
//! transaction, and its `PREPARE TRANSACTION` at the barrier.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use futures::SinkExt;
use shareflow_runtime::{
    CheckpointId, Collector, DeadLetter, DeadLetterCause, DeadLetters, ErrorKind, Failpoints, Operator, Result,
    RuntimeError, StateItems, SubtaskContext, TransactionTemplate,
};
use tokio_postgres::Client;

use super::rows::{copy_text, last_per_key, map_columns, quote, text_columns, TableColumn};
use super::{connect, db_error, is_row_error, table_columns, PostgresSettings, WriteMode};

/// One subtask of the sink. Register a [`super::PostgresCommitter`] with the same
/// settings as the job's participant.
pub struct PostgresSink {
    settings: PostgresSettings,
    client: Option<Client>,
    columns: Vec<TableColumn>,
    /// The last batch schema seen, and the table column of each of its columns.
    mapping: Option<(SchemaRef, Vec<usize>)>,
    /// The checkpoint whose database transaction is open.
    open: Option<CheckpointId>,
    template: TransactionTemplate,
    subtask: u32,
    task: String,
    dead_letters: Option<DeadLetters>,
    failpoints: Failpoints,
}

impl PostgresSink {
    /// A factory for the job builder.
    pub fn factory(settings: PostgresSettings) -> impl Fn(&SubtaskContext) -> PostgresSink + Send + Sync {
        move |ctx| PostgresSink {
            settings: settings.clone(),
            client: None,
            columns: Vec::new(),
            mapping: None,
            open: None,
            template: ctx.transactions.clone(),
            subtask: ctx.subtask,
            task: ctx.task_name(),
            dead_letters: ctx.dead_letters.clone(),
            failpoints: ctx.failpoints.clone(),
        }
    }

    fn client(&self) -> Result<&Client> {
        self.client.as_ref().ok_or_else(|| RuntimeError::Internal(format!("{}: no connection before open", self.task)))
    }

    async fn execute(&self, statement: &str, what: &str) -> Result<()> {
        self.client()?.batch_execute(statement).await.map_err(|e| db_error(&self.task, what, &e))
    }

    /// The table columns of `batch`'s columns, worked out once per schema.
    fn mapping(&mut self, batch: &RecordBatch) -> Result<Vec<usize>> {
        if let Some((schema, m)) = &self.mapping {
            if *schema == batch.schema() {
                return Ok(m.clone());
            }
        }
        let m = map_columns(&batch.schema(), &self.settings.table, &self.columns)
            .map_err(|e| RuntimeError::task(&self.task, ErrorKind::Invalid, e))?;
        if let WriteMode::Upsert { key } = &self.settings.mode {
            if let Some(k) = key.iter().find(|k| batch.schema().field_with_name(k).is_err()) {
                return Err(RuntimeError::task_message(
                    &self.task,
                    ErrorKind::Invalid,
                    format!(
                        "the query's output has no column {k:?}, a key of the upsert into {}: select it",
                        self.settings.table
                    ),
                ));
            }
        }
        self.mapping = Some((batch.schema(), m.clone()));
        Ok(m)
    }

    /// Writes `rows` (row numbers of `text`) in one statement.
    async fn write(
        &self,
        client: &Client,
        mapping: &[usize],
        text: &[Vec<Option<String>>],
        rows: &[usize],
    ) -> std::result::Result<(), tokio_postgres::Error> {
        let table = quote(&self.settings.table);
        let names: Vec<String> = mapping.iter().map(|&c| quote(&self.columns[c].name)).collect();
        match &self.settings.mode {
            WriteMode::Insert => {
                let statement = format!("COPY {table} ({}) FROM STDIN", names.join(", "));
                let sink = client.copy_in::<_, Bytes>(statement.as_str()).await?;
                futures::pin_mut!(sink);
                sink.send(Bytes::from(copy_text(text, rows))).await?;
                sink.finish().await.map(|_| ())
            }
            WriteMode::Upsert { key } => {
                let key_columns: Vec<usize> =
                    key.iter().filter_map(|k| mapping.iter().position(|&c| self.columns[c].name == *k)).collect();
                let rows = last_per_key(text, &key_columns, rows);
                let params: Vec<Vec<Option<&str>>> =
                    text.iter().map(|col| rows.iter().map(|&r| col[r].as_deref()).collect()).collect();
                let unnest: Vec<String> = (1..=params.len()).map(|i| format!("${i}::text[]")).collect();
                let aliases: Vec<String> = (0..params.len()).map(|i| format!("c{i}")).collect();
                let casts: Vec<String> =
                    mapping.iter().enumerate().map(|(i, &c)| format!("u.c{i}::{}", self.columns[c].cast)).collect();
                let updates: Vec<String> = names
                    .iter()
                    .zip(mapping)
                    .filter(|(_, &c)| !key.contains(&self.columns[c].name))
                    .map(|(n, _)| format!("{n} = EXCLUDED.{n}"))
                    .collect();
                let on_conflict = if updates.is_empty() {
                    "DO NOTHING".to_string()
                } else {
                    format!("DO UPDATE SET {}", updates.join(", "))
                };
                let statement = format!(
                    "INSERT INTO {table} ({}) SELECT {} FROM UNNEST({}) AS u({}) ON CONFLICT ({}) {on_conflict}",
                    names.join(", "),
                    casts.join(", "),
                    unnest.join(", "),
                    aliases.join(", "),
                    key.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", "),
                );
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
                client.execute(statement.as_str(), &refs).await.map(|_| ())
            }
        }
    }

    /// Writes `rows`; with dead letters, a row PostgreSQL refuses (a value its column
    /// cannot parse, a constraint it violates) is found by halving under savepoints and
    /// becomes a dead letter of checkpoint `checkpoint_id`, and the rest are written.
    /// Without, the first refusal fails the attempt, naming the row (`COPY`'s line).
    async fn write_all(
        &self,
        mapping: &[usize],
        text: &[Vec<Option<String>>],
        checkpoint_id: CheckpointId,
    ) -> Result<()> {
        let all: Vec<usize> = (0..text.first().map_or(0, Vec::len)).collect();
        let client = self.client()?;
        let Some(letters) = &self.dead_letters else {
            return self.write(client, mapping, text, &all).await.map_err(|e| db_error(&self.task, "writing rows", &e));
        };
        let mut bad = Vec::new();
        let mut parts = vec![all];
        while let Some(part) = parts.pop() {
            self.execute("SAVEPOINT shareflow_rows", "a savepoint").await?;
            match self.write(client, mapping, text, &part).await {
                Ok(()) => self.execute("RELEASE SAVEPOINT shareflow_rows", "a savepoint").await?,
                Err(e) if is_row_error(&e) => {
                    self.execute("ROLLBACK TO SAVEPOINT shareflow_rows", "a savepoint").await?;
                    if part.len() == 1 {
                        bad.push((part[0], db_error(&self.task, "row refused", &e).to_string()));
                    } else {
                        let (left, right) = part.split_at(part.len() / 2);
                        parts.push(right.to_vec());
                        parts.push(left.to_vec());
                    }
                }
                Err(e) => return Err(db_error(&self.task, "writing rows", &e)),
            }
        }
        if bad.is_empty() {
            return Ok(());
        }
        let letters_out = bad
            .into_iter()
            .map(|(row, message)| DeadLetter {
                key: None,
                value: Some(Bytes::from(copy_text(text, &[row]))),
                origin: None,
                cause: DeadLetterCause::Sink,
                message,
                task: self.task.clone(),
            })
            .collect();
        letters.write(checkpoint_id, letters_out).await
    }
}

#[async_trait]
impl Operator for PostgresSink {
    async fn open(&mut self, _ctx: &SubtaskContext, _restored: StateItems) -> Result<()> {
        let client = connect(&self.settings.url, &self.task).await?;
        self.columns = table_columns(&client, &self.settings.table, &self.task).await?;
        self.client = Some(client);
        Ok(())
    }

    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let mapping = self.mapping(&batch)?;
        let checkpoint_id = out.checkpoint_id();
        if self.open != Some(checkpoint_id) {
            if let Some(open) = self.open {
                return Err(RuntimeError::Internal(format!(
                    "{}: rows of checkpoint {checkpoint_id} while the transaction of {open} is open",
                    self.task
                )));
            }
            self.execute("BEGIN", "beginning a transaction").await?;
            self.open = Some(checkpoint_id);
        }
        let text = text_columns(&batch).map_err(|e| RuntimeError::task(&self.task, ErrorKind::Invalid, e))?;
        self.write_all(&mapping, &text, checkpoint_id).await?;
        self.failpoints.hit(crate::common::points::SINK_AFTER_WRITE)
    }

    /// Prepares the open checkpoint's transaction, durably, before the barrier goes on.
    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId, _out: &mut Collector) -> Result<StateItems> {
        if self.open == Some(checkpoint_id) {
            let gid = format!("{}-s{}", self.template.transaction(checkpoint_id), self.subtask);
            self.execute(&format!("PREPARE TRANSACTION '{}'", gid.replace('\'', "''")), "preparing").await?;
            self.open = None;
        }
        Ok(Vec::new())
    }
}
