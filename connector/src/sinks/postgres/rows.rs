//! Rows for PostgreSQL: which of a batch's columns go to which of the table's, whether
//! a column's type can take them, and the batch in `COPY`'s text format or as text
//! arrays for an upsert. Pure: no connection here.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;

/// A column of the table: its name and its type as `information_schema` spells it
/// (`bigint`, `text`, `timestamp without time zone`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableColumn {
    /// The column's name.
    pub name: String,
    /// Its type, `information_schema.columns.data_type`.
    pub data_type: String,
    /// Its type as a cast names it, quoted: `"pg_catalog"."int8"`, an enum's
    /// `"public"."mood"`.
    pub cast: String,
}

/// Why a batch's columns cannot go into the table: the message names the table, the
/// column and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MappingError(pub String);

/// For each column of `batch`, in order, its table column's position: every output
/// column must be a column of `table`, of a type it can take. Columns of the table the
/// query does not give get their default.
pub(super) fn map_columns(
    batch: &arrow::datatypes::Schema,
    table: &str,
    columns: &[TableColumn],
) -> Result<Vec<usize>, MappingError> {
    let mut out = Vec::with_capacity(batch.fields().len());
    for field in batch.fields() {
        let Some(i) = columns.iter().position(|c| c.name == *field.name()) else {
            let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            return Err(MappingError(format!(
                "table {table} has no column {:?} for the query's output column of that name (it has {names:?}): \
                 rename the column in the SELECT, or add it to the table",
                field.name()
            )));
        };
        if !can_take(&columns[i].data_type, field.data_type()) {
            return Err(MappingError(format!(
                "column {:?} of table {table} is {}, which cannot take the query's {} values: cast it in the SELECT \
                 (CAST(... AS ...)), or change the column's type",
                field.name(),
                columns[i].data_type,
                field.data_type()
            )));
        }
        out.push(i);
    }
    Ok(out)
}

/// Whether a PostgreSQL column of `pg` type can take Arrow values of `arrow` type, as
/// their text (PostgreSQL parses each; a value it cannot parse is a bad row).
fn can_take(pg: &str, arrow: &DataType) -> bool {
    let pg = pg.to_ascii_lowercase();
    let texty = matches!(pg.as_str(), "text" | "character varying" | "character" | "json" | "jsonb" | "uuid");
    match arrow {
        DataType::Null => true,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => pg == "bytea",
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => pg != "bytea",
        DataType::Boolean => texty || pg == "boolean",
        t if t.is_integer() || t.is_floating() || matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..)) => {
            texty || matches!(pg.as_str(), "smallint" | "integer" | "bigint" | "numeric" | "real" | "double precision")
        }
        DataType::Timestamp(..) | DataType::Date32 | DataType::Date64 => {
            texty || pg.starts_with("timestamp") || pg == "date"
        }
        _ => texty,
    }
}

/// Each column of `batch` as text, `None` for NULL: what `COPY` and the upsert's text
/// arrays carry. Binary values are `\x`-hex, as `bytea` reads them.
pub(super) fn text_columns(batch: &RecordBatch) -> Result<Vec<Vec<Option<String>>>, arrow::error::ArrowError> {
    batch.columns().iter().map(text_column).collect()
}

fn text_column(array: &ArrayRef) -> Result<Vec<Option<String>>, arrow::error::ArrowError> {
    let n = array.len();
    let hex = |v: &[u8]| {
        let mut s = String::with_capacity(2 + 2 * v.len());
        s.push_str("\\x");
        for b in v {
            s.push_str(&format!("{b:02x}"));
        }
        s
    };
    Ok(match array.data_type() {
        DataType::Binary => array.as_binary::<i32>().iter().map(|v| v.map(hex)).collect(),
        DataType::LargeBinary => array.as_binary::<i64>().iter().map(|v| v.map(hex)).collect(),
        DataType::BinaryView => array.as_binary_view().iter().map(|v| v.map(hex)).collect(),
        DataType::Null => vec![None; n],
        _ => {
            let text = arrow::compute::cast(array, &DataType::Utf8)?;
            text.as_string::<i32>().iter().map(|v| v.map(str::to_string)).collect()
        }
    })
}

/// Rows `rows` of `columns` in `COPY ... FROM STDIN`'s text format: tab between
/// columns, `\N` for NULL, backslash, tab, newline and carriage return escaped.
pub(super) fn copy_text(columns: &[Vec<Option<String>>], rows: &[usize]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 16 * columns.len().max(1));
    for &row in rows {
        for (c, column) in columns.iter().enumerate() {
            if c > 0 {
                out.push(b'\t');
            }
            match &column[row] {
                None => out.extend_from_slice(b"\\N"),
                Some(v) => {
                    for &b in v.as_bytes() {
                        match b {
                            b'\\' => out.extend_from_slice(b"\\\\"),
                            b'\t' => out.extend_from_slice(b"\\t"),
                            b'\n' => out.extend_from_slice(b"\\n"),
                            b'\r' => out.extend_from_slice(b"\\r"),
                            _ => out.push(b),
                        }
                    }
                }
            }
        }
        out.push(b'\n');
    }
    out
}

/// The rows of `rows` to upsert: of rows with equal `key` columns, the last (one
/// statement may not update a row twice), in row order. A row with a NULL key column
/// conflicts with none, in PostgreSQL as here: each is kept.
pub(super) fn last_per_key(columns: &[Vec<Option<String>>], key: &[usize], rows: &[usize]) -> Vec<usize> {
    let mut last = std::collections::HashMap::new();
    let mut keep = Vec::new();
    for &row in rows {
        let k: Option<Vec<&String>> = key.iter().map(|&c| columns[c][row].as_ref()).collect();
        match k {
            Some(k) => {
                last.insert(k, row);
            }
            None => keep.push(row),
        }
    }
    keep.extend(last.into_values());
    keep.sort_unstable();
    keep
}

/// `"name"`, a PostgreSQL identifier quoted; `schema.table` quotes each part.
pub(super) fn quote(name: &str) -> String {
    name.split('.').map(|part| format!("\"{}\"", part.replace('"', "\"\""))).collect::<Vec<_>>().join(".")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use arrow::array::{BinaryArray, BooleanArray, Int64Array, StringArray, TimestampMillisecondArray};
    use arrow::datatypes::{Field, Schema, TimeUnit};

    use super::*;

    fn col(name: &str, t: &str) -> TableColumn {
        TableColumn { name: name.into(), data_type: t.into(), cast: String::new() }
    }

    #[test]
    fn columns_map_by_name_and_type_and_errors_name_the_column() {
        let table =
            [col("id", "bigint"), col("body", "text"), col("raw", "bytea"), col("at", "timestamp without time zone")];
        let schema = |fields: Vec<Field>| Schema::new(fields);
        let ok = schema(vec![
            Field::new("body", DataType::Utf8, true),
            Field::new("id", DataType::Int64, false),
            Field::new("at", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        ]);
        assert_eq!(map_columns(&ok, "t", &table).unwrap(), vec![1, 0, 3]);
        let missing = schema(vec![Field::new("nope", DataType::Utf8, true)]);
        let e = map_columns(&missing, "public.t", &table).unwrap_err().0;
        assert!(e.contains("public.t") && e.contains("\"nope\"") && e.contains("rename"), "{e}");
        let wrong = schema(vec![Field::new("raw", DataType::Int64, true)]);
        let e = map_columns(&wrong, "t", &table).unwrap_err().0;
        assert!(e.contains("\"raw\"") && e.contains("bytea") && e.contains("Int64"), "{e}");
        let binary_into_int = schema(vec![Field::new("id", DataType::Binary, true)]);
        assert!(map_columns(&binary_into_int, "t", &table).is_err());
    }

    #[test]
    fn copy_text_escapes_and_writes_nulls() {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("s", DataType::Utf8, true),
                Field::new("b", DataType::Binary, true),
                Field::new("n", DataType::Int64, true),
                Field::new("f", DataType::Boolean, true),
                Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            ])),
            vec![
                Arc::new(StringArray::from(vec![Some("a\tb\\c\nd"), None])),
                Arc::new(BinaryArray::from(vec![Some(&[0u8, 255][..]), None])),
                Arc::new(Int64Array::from(vec![Some(-7), None])),
                Arc::new(BooleanArray::from(vec![Some(true), None])),
                Arc::new(TimestampMillisecondArray::from(vec![Some(1_500), None])),
            ],
        )
        .unwrap();
        let columns = text_columns(&batch).unwrap();
        let text = String::from_utf8(copy_text(&columns, &[0, 1])).unwrap();
        // bytea's `\x00ff`, its backslash escaped as COPY's text format escapes every one.
        assert_eq!(text, "a\\tb\\\\c\\nd\t\\\\x00ff\t-7\ttrue\t1970-01-01T00:00:01.500\n\\N\t\\N\t\\N\t\\N\t\\N\n");
        assert_eq!(copy_text(&columns, &[]), b"");
    }

    #[test]
    fn an_upsert_keeps_the_last_row_of_each_key() {
        let columns = vec![
            vec![Some("a".to_string()), Some("b".into()), Some("a".into()), None, None],
            vec![Some("1".to_string()), Some("2".into()), Some("3".into()), Some("4".into()), Some("5".into())],
        ];
        let all = [0, 1, 2, 3, 4];
        assert_eq!(last_per_key(&columns, &[0], &all), vec![1, 2, 3, 4]);
        assert_eq!(last_per_key(&columns, &[0], &[0, 1]), vec![0, 1]);
        assert_eq!(last_per_key(&columns, &[0, 1], &all), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn identifiers_are_quoted_part_by_part() {
        assert_eq!(quote("orders"), "\"orders\"");
        assert_eq!(quote("sales.orders"), "\"sales\".\"orders\"");
        assert_eq!(quote("we\"ird"), "\"we\"\"ird\"");
    }
}
