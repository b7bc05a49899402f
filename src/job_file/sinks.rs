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

#[cfg(test)]
mod tests {
    use super::super::tests::GOOD;
    use super::super::JobFile;
    #[cfg(any(feature = "postgres", feature = "tables"))]
    use super::super::SinkSpec;

    /// A build without a sink's feature refuses its kind by name, saying how to build
    /// one that has it.
    #[cfg(not(all(feature = "tables", feature = "postgres")))]
    #[test]
    fn a_sink_kind_this_build_leaves_out_is_refused_with_its_feature() {
        let sink = |s: &str| GOOD.replace("kind = \"kafka\"\ntopic = \"orders-upper\"", s);
        let mut kinds = Vec::new();
        if cfg!(not(feature = "postgres")) {
            kinds.push(("kind = \"postgres\"\nurl = \"postgres://a@h/d\"\ntable = \"t\"", "postgres"));
        }
        if cfg!(not(feature = "tables")) {
            kinds.push(("kind = \"delta\"\nurl = \"memory://lake/t\"", "tables"));
            kinds.push(("kind = \"parquet\"\nurl = \"memory://lake/t\"", "tables"));
        }
        for (s, feature) in kinds {
            let e = JobFile::parse("job.toml", &sink(s)).unwrap_err().to_string();
            assert!(e.contains("sink.kind") && e.contains(&format!("--features {feature}")), "{s}: {e}");
        }
    }

    /// `kind = "postgres"`: insert by default, upsert with its key; each missing or
    /// wrong setting named.
    #[cfg(feature = "postgres")]
    #[test]
    fn a_postgres_sink_takes_url_table_mode_and_key() {
        use shareflow::connector::postgres::{PostgresSettings, WriteMode};
        let pg = |sink: &str| GOOD.replace("kind = \"kafka\"\ntopic = \"orders-upper\"", sink);
        let url = "postgres://app@127.0.0.1:5432/shop";
        let insert = pg(&format!("kind = \"postgres\"\nurl = \"{url}\"\ntable = \"sales.orders\""));
        let want = PostgresSettings { url: url.into(), table: "sales.orders".into(), mode: WriteMode::Insert };
        assert_eq!(JobFile::parse("job.toml", &insert).unwrap().sink, SinkSpec::Postgres(want.clone()));
        let upsert = pg(&format!(
            "kind = \"postgres\"\nurl = \"{url}\"\ntable = \"sales.orders\"\nmode = \"upsert\"\nkey = [\"id\"]"
        ));
        let want = PostgresSettings { mode: WriteMode::Upsert { key: vec!["id".into()] }, ..want };
        assert_eq!(JobFile::parse("job.toml", &upsert).unwrap().sink, SinkSpec::Postgres(want));
        let bad = [
            ("kind = \"postgres\"\ntable = \"t\"".to_string(), "sink.url", "postgres://"),
            ("kind = \"postgres\"\nurl = \"mysql://x/y\"\ntable = \"t\"".to_string(), "sink.url", "postgres://"),
            (format!("kind = \"postgres\"\nurl = \"{url}\""), "sink.table", "table ="),
            (format!("kind = \"postgres\"\nurl = \"{url}\"\ntable = \"t\"\nmode = \"upsert\""), "sink.key", "key ="),
            (format!("kind = \"postgres\"\nurl = \"{url}\"\ntable = \"t\"\nkey = [\"id\"]"), "sink.key", "upsert"),
            (
                format!("kind = \"postgres\"\nurl = \"{url}\"\ntable = \"t\"\nmode = \"merge\""),
                "sink.mode",
                "\"insert\"",
            ),
        ];
        for (sink, key, word) in bad {
            let e = JobFile::parse("job.toml", &pg(&sink)).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(word), "{sink}: {e}");
        }
    }

    /// `kind = "delta"` and `"parquet"`: url, partition column and file size; a size out
    /// of range and a URL that does not open are named.
    #[cfg(feature = "tables")]
    #[test]
    fn a_table_sink_takes_url_partition_and_file_size() {
        use shareflow::connector::table::{TableFormat, TableSettings};
        let sink = |s: &str| GOOD.replace("kind = \"kafka\"\ntopic = \"orders-upper\"", s);
        let delta =
            sink("kind = \"delta\"\nurl = \"memory://lake/orders\"\npartition_by = \"key\"\ntarget_file_mb = 16");
        let want = TableSettings {
            partition_by: Some("key".into()),
            target_file_bytes: 16 << 20,
            ..TableSettings::new("memory://lake/orders", TableFormat::Delta)
        };
        assert_eq!(JobFile::parse("job.toml", &delta).unwrap().sink, SinkSpec::Table(want));
        let parquet = sink("kind = \"parquet\"\nurl = \"memory://lake/orders\"");
        let want = TableSettings::new("memory://lake/orders", TableFormat::Parquet);
        assert_eq!(JobFile::parse("job.toml", &parquet).unwrap().sink, SinkSpec::Table(want));
        for (s, key) in [
            ("kind = \"delta\"", "sink.url"),
            ("kind = \"delta\"\nurl = \"ftp://x/y\"", "sink.url"),
            ("kind = \"parquet\"\nurl = \"memory://x\"\ntarget_file_mb = 0", "sink.target_file_mb"),
        ] {
            let e = JobFile::parse("job.toml", &sink(s)).unwrap_err().to_string();
            assert!(e.contains(key), "{s}: {e}");
        }
    }
}
