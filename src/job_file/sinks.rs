//! The `[sink]` kinds with settings of their own: tables on object storage and
//! PostgreSQL. Each needs its feature (`tables`, `postgres`: decision 0046); a build
//! without it refuses the kind, naming the build that has it.

#[cfg(any(feature = "tables", feature = "postgres"))]
use super::SinkSpec;
use super::{Checker, JobFileError, RawSink};
use toml::Spanned;

impl Checker<'_> {
    /// `[sink] kind = "parquet"` or `"delta"`: url, and optionally `partition_by` and
    /// `target_file_mb`.
    #[cfg(feature = "tables")]
    pub(super) fn table_sink(&self, raw: &Spanned<RawSink>) -> Result<SinkSpec, JobFileError> {
        use shareflow::connector::table::{TableFormat, TableSettings};
        let sink = raw.get_ref();
        let format = if sink.kind.get_ref() == "delta" { TableFormat::Delta } else { TableFormat::Parquet };
        let url = sink.url.as_ref().ok_or_else(|| {
            self.err(raw.span(), "sink.url", "a table sink needs url = \"file:///...\" or \"s3://bucket/path\"".into())
        })?;
        let u = self.non_empty(url, "sink.url")?;
        shareflow::checkpoint::open_url(&u, &[]).map_err(|e| self.err(url.span(), "sink.url", e.to_string()))?;
        let mut settings = TableSettings::new(&u, format);
        if let Some(p) = &sink.partition_by {
            settings.partition_by = Some(self.non_empty(p, "sink.partition_by")?);
        }
        if let Some(mb) = &sink.target_file_mb {
            if !(1..=4096).contains(mb.get_ref()) {
                return Err(self.err(mb.span(), "sink.target_file_mb", "out of range: give 1 to 4096".into()));
            }
            settings.target_file_bytes = (*mb.get_ref() as usize) << 20;
        }
        Ok(SinkSpec::Table(settings))
    }

    /// `[sink] kind = "postgres"`: url, table, and `mode` with its `key`.
    #[cfg(feature = "postgres")]
    pub(super) fn postgres_sink(&self, raw: &Spanned<RawSink>) -> Result<SinkSpec, JobFileError> {
        use shareflow::connector::postgres::{PostgresSettings, WriteMode};
        let sink = raw.get_ref();
        let url = sink.url.as_ref().ok_or_else(|| {
            self.err(
                raw.span(),
                "sink.url",
                "a postgres sink needs url = \"postgres://user@host:port/database\"".into(),
            )
        })?;
        let u = self.non_empty(url, "sink.url")?;
        if !u.starts_with("postgres://") && !u.starts_with("postgresql://") {
            return Err(self.err(url.span(), "sink.url", format!("{u:?}: give postgres://user@host:port/database")));
        }
        let table = sink
            .table
            .as_ref()
            .ok_or_else(|| self.err(raw.span(), "sink.table", "a postgres sink needs table = \"...\"".into()))?;
        let table = self.non_empty(table, "sink.table")?;
        let mode = match (sink.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())), &sink.key) {
            (None | Some(("insert", _)), None) => WriteMode::Insert,
            (None | Some(("insert", _)), Some(key)) => {
                return Err(self.err(
                    key.span(),
                    "sink.key",
                    "a key is for mode = \"upsert\"; add it, or drop the key".into(),
                ))
            }
            (Some(("upsert", span)), None) => {
                return Err(self.err(
                    span,
                    "sink.key",
                    "an upsert needs key = [\"column\", ...]: its unique key".into(),
                ))
            }
            (Some(("upsert", _)), Some(key)) if key.get_ref().is_empty() => {
                return Err(self.err(key.span(), "sink.key", "name at least one key column".into()))
            }
            (Some(("upsert", _)), Some(key)) => WriteMode::Upsert { key: key.get_ref().clone() },
            (Some((other, span)), _) => {
                return Err(self.err(span, "sink.mode", format!("{other:?}: give \"insert\" or \"upsert\"")))
            }
        };
        Ok(SinkSpec::Postgres(PostgresSettings { url: u, table, mode }))
    }

    /// A sink kind this build leaves out: refused, naming the feature that has it.
    #[cfg(not(all(feature = "tables", feature = "postgres")))]
    pub(super) fn sink_not_built(&self, raw: &Spanned<RawSink>, feature: &str) -> JobFileError {
        let kind = raw.get_ref().kind.get_ref();
        self.err(
            raw.get_ref().kind.span(),
            "sink.kind",
            format!(
                "{kind:?}: this shareflow was built without the `{feature}` feature; build it with \
                 `cargo build --release --features {feature}` (or `cargo run --release --features {feature} -- run ...`)"
            ),
        )
    }
}
