//! [`PostgresSink`]: rows into a PostgreSQL table, exactly once, by two-phase commit
//! (decision 0042).
//!
//! Each subtask writes the rows of checkpoint n inside a database transaction of its
//! own connection (`COPY`, or a multi-row `INSERT ... ON CONFLICT DO UPDATE` for an
//! upsert) and, at barrier n, prepares it: `PREPARE TRANSACTION '{T(n)}-s{subtask}'`.
//! [`PostgresCommitter`], the job's participant, commits each of T(n)'s prepared
//! transactions with `COMMIT PREPARED` once checkpoint n is decided, aborts them with
//! `ROLLBACK PREPARED`, and lists them from `pg_prepared_xacts` for recovery, which
//! decides them by the rules of every participant. It touches only transactions whose
//! id starts with its own group and prefix.

mod rows;
mod sink;

use std::sync::Arc;

use async_trait::async_trait;
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{
    ErrorKind, JobSettings, PendingTransaction, PrepareOutcome, Result, RuntimeError, TransactionParticipant,
    TransactionTemplate,
};
use tokio_postgres::{Client, NoTls};

pub use rows::{MappingError, TableColumn};
pub use sink::PostgresSink;

const NAME: &str = "postgres-sink";

/// How rows go into the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteMode {
    /// Every row is a new row (`COPY`).
    Insert,
    /// A row whose key columns match an existing row's replaces its other columns
    /// (`INSERT ... ON CONFLICT (key) DO UPDATE`); the table needs a unique index on
    /// exactly these columns.
    Upsert {
        /// The key columns.
        key: Vec<String>,
    },
}

/// Where and how a job's rows go: `[sink] kind = "postgres"` of a job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSettings {
    /// A connection URL, `postgres://user[:password]@host[:port]/database`.
    pub url: String,
    /// The table, `name` or `schema.name`; it must exist.
    pub table: String,
    /// Insert or upsert.
    pub mode: WriteMode,
}

/// Connects to `url`; the connection runs on a task of its own until the client drops.
pub(crate) async fn connect(url: &str, what: &str) -> std::result::Result<Client, RuntimeError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(|e| {
        RuntimeError::task_message(
            what,
            ErrorKind::Unavailable,
            format!("cannot connect to PostgreSQL at {}: {e}; is it running, and is the URL right?", redact(url)),
        )
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "a PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// `url` without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = &url[scheme + 3..at];
            let user = user.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// Whether PostgreSQL refused a row's data (SQLSTATE class 22, data exception, or 23,
/// integrity constraint violation): a bad row, not an outage or a wrong table.
pub(crate) fn is_row_error(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| c.code().starts_with("22") || c.code().starts_with("23"))
}

/// A PostgreSQL error as the runtime's: a refused row or statement (SQLSTATE classes
/// 22, 23, 42) is [`ErrorKind::Invalid`], anything else (a connection lost)
/// [`ErrorKind::Unavailable`]. The message carries PostgreSQL's, with where it happened
/// (for a `COPY`, the line: the row).
pub(crate) fn db_error(task: &str, what: &str, e: &tokio_postgres::Error) -> RuntimeError {
    let kind = match e.code().map(|c| c.code()) {
        Some(c) if c.starts_with("22") || c.starts_with("23") || c.starts_with("42") => ErrorKind::Invalid,
        _ => ErrorKind::Unavailable,
    };
    let detail = e.as_db_error().map_or_else(
        || e.to_string(),
        |d| {
            let mut s = format!("{}: {}", d.severity(), d.message());
            for extra in [d.detail(), d.where_()].into_iter().flatten() {
                s.push_str(&format!(" ({extra})"));
            }
            s
        },
    );
    RuntimeError::task_message(task, kind, format!("{what}: {detail}"))
}

/// The columns of `table`, in order; an error naming it when it does not exist.
pub(crate) async fn table_columns(client: &Client, table: &str, task: &str) -> Result<Vec<TableColumn>> {
    let (schema, name) = match table.split_once('.') {
        Some((s, n)) => (Some(s), n),
        None => (None, table),
    };
    let rows = client
        .query(
            "SELECT column_name::text, data_type::text, quote_ident(udt_schema::text) || '.' || quote_ident(udt_name::text) \
             FROM information_schema.columns \
             WHERE table_name = $1 AND ($2::text IS NULL AND table_schema = ANY (current_schemas(false)) OR table_schema = $2) \
             ORDER BY ordinal_position",
            &[&name, &schema],
        )
        .await
        .map_err(|e| db_error(task, &format!("reading the columns of table {table}"), &e))?;
    if rows.is_empty() {
        return Err(RuntimeError::task_message(
            task,
            ErrorKind::Invalid,
            format!("PostgreSQL has no table {table} (or it has no columns): create it before the job starts"),
        ));
    }
    Ok(rows.iter().map(|r| TableColumn { name: r.get(0), data_type: r.get(1), cast: r.get(2) }).collect())
}

/// The job-level half of the PostgreSQL sink: validation before the first attempt, and
/// commit, abort and listing of the prepared transactions of its group and prefix.
pub struct PostgresCommitter {
    settings: PostgresSettings,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl std::fmt::Debug for PostgresCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCommitter")
            .field("url", &redact(&self.settings.url))
            .field("table", &self.settings.table)
            .finish()
    }
}

impl PostgresCommitter {
    /// A committer for `settings`; register it as the job's participant, and give the
    /// same settings to [`PostgresSink::factory`].
    pub fn new(settings: PostgresSettings) -> Arc<Self> {
        Arc::new(Self { settings, client: tokio::sync::Mutex::new(None) })
    }

    /// Runs `f` with a connection, connecting first if there is none; a failed call
    /// drops the connection, so that the next one connects again.
    async fn with_client<T>(
        &self,
        f: impl for<'c> FnOnce(&'c Client) -> futures::future::BoxFuture<'c, std::result::Result<T, tokio_postgres::Error>>,
    ) -> std::result::Result<T, RuntimeError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            *guard = Some(connect(&self.settings.url, NAME).await?);
        }
        let client = guard.as_ref().ok_or_else(|| RuntimeError::Internal("no PostgreSQL client".into()))?;
        match f(client).await {
            Ok(v) => Ok(v),
            Err(e) => {
                let err = db_error(NAME, "a participant's statement", &e);
                if err.kind() == ErrorKind::Unavailable {
                    *guard = None;
                }
                Err(err)
            }
        }
    }

    /// The prepared transactions (global ids) of `txn`, one per subtask that wrote.
    async fn prepared_of(&self, txn: &TransactionId) -> Result<Vec<String>> {
        let prefix = format!("{txn}-s");
        let gids = self.prepared_gids().await?;
        Ok(gids.into_iter().filter(|g| g.strip_prefix(&prefix).is_some_and(|s| s.parse::<u32>().is_ok())).collect())
    }

    /// Every prepared transaction of this database.
    async fn prepared_gids(&self) -> Result<Vec<String>> {
        self.with_client(|c| {
            Box::pin(async move {
                let rows =
                    c.query("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()", &[]).await?;
                Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
            })
        })
        .await
    }

    /// Ends each prepared transaction of `txn` with `verb` (`COMMIT` or `ROLLBACK`).
    /// One another process ended meanwhile is done already.
    async fn finish(&self, txn: &TransactionId, verb: &'static str, op: &'static str) -> Result<()> {
        for gid in self.prepared_of(txn).await? {
            let statement = format!("{verb} PREPARED '{}'", gid.replace('\'', "''"));
            let result = self.with_client(|c| Box::pin(async move { c.batch_execute(&statement).await })).await;
            match result {
                Ok(()) => {}
                // 42704: no prepared transaction of that id (ended meanwhile).
                Err(e) if e.to_string().contains("does not exist") => {}
                Err(e) => return Err(RuntimeError::participant(NAME, op, txn, e.kind(), e)),
            }
        }
        Ok(())
    }
}

/// Refuses a server whose `max_prepared_transactions` (as `SHOW` gives it) is 0: it
/// cannot prepare the transactions the sink commits in two phases.
fn refuse_no_prepared_transactions(max: &str, url: &str) -> Result<()> {
    if max.trim() != "0" {
        return Ok(());
    }
    Err(RuntimeError::InvalidConfig {
        key: "max_prepared_transactions".into(),
        value: "0".into(),
        rule: format!(
            "PostgreSQL at {} cannot prepare transactions, and the exactly-once sink prepares one per subtask and \
             checkpoint: set max_prepared_transactions in postgresql.conf to at least the sink's parallelism times \
             the checkpoints in flight (e.g. 64) and restart the server",
            redact(url)
        ),
    })
}

#[async_trait]
impl TransactionParticipant for PostgresCommitter {
    fn name(&self) -> &str {
        NAME
    }

    /// Refuses, before the first attempt, a database that cannot prepare transactions
    /// (`max_prepared_transactions = 0`) and a table that does not exist.
    async fn validate_job(&self, _job: &JobSettings) -> Result<()> {
        let max: String = self
            .with_client(|c| {
                Box::pin(async move { Ok(c.query_one("SHOW max_prepared_transactions", &[]).await?.get(0)) })
            })
            .await?;
        refuse_no_prepared_transactions(&max, &self.settings.url)?;
        let guard = self.client.lock().await;
        let client = guard.as_ref().ok_or_else(|| RuntimeError::Internal("no PostgreSQL client".into()))?;
        let columns = table_columns(client, &self.settings.table, NAME).await?;
        if let WriteMode::Upsert { key } = &self.settings.mode {
            for k in key {
                if !columns.iter().any(|c| c.name == *k) {
                    return Err(RuntimeError::InvalidConfig {
                        key: "sink.key".into(),
                        value: k.clone(),
                        rule: format!("table {} has no column {k:?} to upsert on", self.settings.table),
                    });
                }
            }
        }
        Ok(())
    }

    /// Another committer on the same database: prepared transactions are named by
    /// transaction id, so another instance's are decided from here.
    fn adopter(&self) -> Option<shareflow_runtime::Participant> {
        Some(PostgresCommitter::new(self.settings.clone()))
    }

    async fn begin(&self, _txn: &TransactionId) -> Result<()> {
        Ok(())
    }

    /// The subtasks prepared their transactions at the barrier, before they acknowledged
    /// it: nothing is left to do.
    async fn prepare(&self, _txn: &TransactionId) -> Result<PrepareOutcome> {
        Ok(PrepareOutcome::Prepared)
    }

    async fn commit(&self, txn: &TransactionId) -> Result<()> {
        self.finish(txn, "COMMIT", "commit").await
    }

    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        self.finish(txn, "ROLLBACK", "abort").await
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        let mut out: Vec<PendingTransaction> = Vec::new();
        for gid in self.prepared_gids().await? {
            let Some((id, subtask)) = gid.rsplit_once("-s") else { continue };
            if subtask.parse::<u32>().is_err() {
                continue;
            }
            let Ok(id) = TransactionId::parse(id, template.group_id()) else { continue };
            if id.prefix() != template.prefix() || out.iter().any(|p| p.id == id) {
                continue;
            }
            out.push(PendingTransaction { id, prepared: true });
        }
        Ok(out)
    }

    async fn close(&self) -> Result<()> {
        *self.client.lock().await = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_prepared_transactions_is_refused_naming_the_setting() {
        for (max, refused) in [("0", true), (" 0 ", true), ("64", false), ("200", false)] {
            let result = refuse_no_prepared_transactions(max, "postgres://u:pw@h/db");
            assert_eq!(result.is_err(), refused, "{max}");
            if let Err(e) = result {
                let e = e.to_string();
                assert!(e.contains("max_prepared_transactions") && e.contains("postgres://u@h/db"), "{e}");
                assert!(!e.contains("pw"), "{e}");
            }
        }
    }

    #[test]
    fn a_url_in_a_message_has_no_password() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("host=h user=u"), "host=h user=u");
    }
}
