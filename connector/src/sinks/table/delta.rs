//! The Delta Lake side of the table sink, written by hand (decision 0043): the batch in
//! the types Delta has, its schema string, and one commit file of the log with its
//! `txn` action, and the lookup of that action that makes a commit idempotent.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use serde_json::{json, Value};

use super::StagedFile;

/// `batch` in the types a Delta table has: strings and binaries of every width as
/// `Utf8`/`Binary`, unsigned integers widened to the next signed type, timestamps as
/// microseconds in UTC.
pub(super) fn table_batch(batch: &RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let to = match field.data_type() {
            DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
            DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
            DataType::UInt8 => DataType::Int16,
            DataType::UInt16 => DataType::Int32,
            DataType::UInt32 => DataType::Int64,
            DataType::UInt64 => DataType::Decimal128(20, 0),
            DataType::Timestamp(..) | DataType::Date64 => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            }
            other => other.clone(),
        };
        let column = if &to == field.data_type() { column.clone() } else { arrow::compute::cast(column, &to)? };
        fields.push(Field::new(field.name(), to, true));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// The Delta type of an Arrow type of [`table_batch`]'s output.
fn delta_type(t: &DataType) -> Result<String, String> {
    Ok(match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int8 => "byte".into(),
        DataType::Int16 => "short".into(),
        DataType::Int32 => "integer".into(),
        DataType::Int64 => "long".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Utf8 => "string".into(),
        DataType::Binary => "binary".into(),
        DataType::Date32 => "date".into(),
        DataType::Timestamp(..) => "timestamp".into(),
        DataType::Decimal128(p, s) => format!("decimal({p},{s})"),
        other => return Err(format!("a Delta table has no type for {other}: cast the column in the SELECT")),
    })
}

/// The table's schema as Delta's `schemaString`.
pub(super) fn schema_string(schema: &Schema) -> Result<String, String> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| Ok(json!({"name": f.name(), "type": delta_type(f.data_type())?, "nullable": true, "metadata": {}})))
        .collect::<Result<Vec<Value>, String>>()?;
    Ok(json!({"type": "struct", "fields": fields}).to_string())
}

/// A relative path as a Delta `add.path`: a URI, every byte but unreserved ones and
/// `/` and `=` percent-encoded.
fn uri_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/' | b'=') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A partition directory's value, `col=value` back to `value` (Hive's `%XX` decoded;
/// `None` for the default partition of NULL).
fn partition_value(dir: &str) -> Option<String> {
    let value = dir.split_once('=').map_or(dir, |(_, v)| v);
    if value == "__HIVE_DEFAULT_PARTITION__" {
        return None;
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (
            bytes[i],
            bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()),
        ) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// What one commit of the log says.
pub(super) struct Commit<'a> {
    /// The table's first commit: protocol and metadata come with it (the schema string,
    /// the partition column, the table's id).
    pub(super) create: Option<(&'a str, Option<&'a str>, String)>,
    /// `{group}-{prefix}`: the writer whose checkpoints `txn` counts.
    pub(super) app_id: &'a str,
    /// The checkpoint.
    pub(super) version: u64,
    /// Each file and its path in the table.
    pub(super) files: Vec<(&'a StagedFile, String)>,
    pub(super) partition_by: Option<&'a str>,
    pub(super) now_ms: u64,
}

/// The commit file's lines (newline-delimited JSON actions).
pub(super) fn commit_file(c: &Commit<'_>) -> Vec<u8> {
    let mut lines = vec![json!({"commitInfo": {
        "timestamp": c.now_ms, "operation": "STREAMING UPDATE",
        "operationParameters": {"outputMode": "Append", "queryId": c.app_id, "epochId": c.version.to_string()},
        "engineInfo": concat!("shareflow/", env!("CARGO_PKG_VERSION")),
    }})];
    if let Some((schema, partition, id)) = &c.create {
        lines.push(json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}));
        lines.push(json!({"metaData": {
            "id": id, "format": {"provider": "parquet", "options": {}},
            "schemaString": schema, "partitionColumns": partition.iter().collect::<Vec<_>>(),
            "configuration": {}, "createdTime": c.now_ms,
        }}));
    }
    lines.push(json!({"txn": {"appId": c.app_id, "version": c.version, "lastUpdated": c.now_ms}}));
    for (file, path) in &c.files {
        let mut values = serde_json::Map::new();
        if let (Some(column), Some(dir)) = (c.partition_by, &file.partition) {
            values.insert(column.to_string(), partition_value(dir).map_or(Value::Null, Value::String));
        }
        lines.push(json!({"add": {
            "path": uri_path(path), "partitionValues": values, "size": file.size,
            "modificationTime": c.now_ms, "dataChange": true,
            "stats": json!({"numRecords": file.rows}).to_string(),
        }}));
    }
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// The `txn` version `app_id` wrote in a commit file's `text`, if it did.
pub(super) fn txn_version(text: &str, app_id: &str) -> Option<u64> {
    text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find_map(|v| {
        let txn = v.get("txn")?;
        (txn.get("appId")?.as_str()? == app_id).then(|| txn.get("version")?.as_u64()).flatten()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow::array::{StringViewArray, TimestampMillisecondArray, UInt32Array};

    #[test]
    fn a_batch_takes_delta_types_and_the_schema_string_names_them() {
        let batch = RecordBatch::try_from_iter(vec![
            ("s", Arc::new(StringViewArray::from(vec!["a"])) as arrow::array::ArrayRef),
            ("n", Arc::new(UInt32Array::from(vec![7]))),
            ("t", Arc::new(TimestampMillisecondArray::from(vec![1_500]))),
        ])
        .unwrap();
        let out = table_batch(&batch).unwrap();
        let types: Vec<DataType> = out.schema().fields().iter().map(|f| f.data_type().clone()).collect();
        assert_eq!(
            types,
            vec![DataType::Utf8, DataType::Int64, DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))]
        );
        let s: Value = serde_json::from_str(&schema_string(&out.schema()).unwrap()).unwrap();
        let names: Vec<&str> = s["fields"].as_array().unwrap().iter().map(|f| f["type"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["string", "long", "timestamp"]);
        let e = schema_string(&Schema::new(vec![Field::new("x", DataType::Float16, true)])).unwrap_err();
        assert!(e.contains("Float16") && e.contains("cast"), "{e}");
    }

    #[test]
    fn a_commit_carries_its_txn_and_the_lookup_finds_only_its_own() {
        let schema = schema_string(&Schema::new(vec![Field::new("id", DataType::Int64, true)])).unwrap();
        let file = StagedFile {
            relative: "region=eu%2Fw/part-0-00000.parquet".into(),
            size: 10,
            rows: 3,
            partition: Some("region=eu%2Fw".into()),
            schema: schema.clone(),
        };
        let c = Commit {
            create: Some((&schema, Some("region"), "id-1".into())),
            app_id: "g-job",
            version: 42,
            files: vec![(&file, "region=eu%2Fw/g-job-42-part-0-00000.parquet".into())],
            partition_by: Some("region"),
            now_ms: 5,
        };
        let text = String::from_utf8(commit_file(&c)).unwrap();
        assert_eq!(txn_version(&text, "g-job"), Some(42));
        assert_eq!(txn_version(&text, "g-other"), None);
        let add: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(add["add"]["path"], "region=eu%252Fw/g-job-42-part-0-00000.parquet");
        assert_eq!(add["add"]["partitionValues"]["region"], "eu/w");
        assert_eq!(add["add"]["stats"], "{\"numRecords\":3}");
        assert!(
            text.contains("\"minReaderVersion\":1") && text.contains("\"partitionColumns\":[\"region\"]"),
            "{text}"
        );
        assert_eq!(partition_value("region=__HIVE_DEFAULT_PARTITION__"), None);
    }
}
