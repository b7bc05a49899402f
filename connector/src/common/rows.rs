//! Rows: the schema of the batches both sources emit, and how both sinks read keys and
//! values out of a batch.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, BinaryViewArray, Int16Array, Int32Array, Int64Array, LargeBinaryArray,
    LargeStringArray, StringArray, StringViewArray, TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use shareflow_runtime::{ErrorKind, Result, RuntimeError};

use crate::share::Record;

/// The schema of the batches a share source emits (DESIGN.md §2).
pub fn record_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        Field::new("delivery_count", DataType::Int16, false),
    ]))
}

/// Builds a batch of the [`record_schema`] from records.
pub fn records_to_batch(records: &[Record]) -> std::result::Result<RecordBatch, arrow::error::ArrowError> {
    let mut keys = BinaryBuilder::new();
    let mut values = BinaryBuilder::new();
    for r in records {
        keys.append_option(r.key.as_deref());
        values.append_option(r.value.as_deref());
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(records.iter().map(|r| r.topic.as_ref()))),
        Arc::new(Int32Array::from_iter_values(records.iter().map(|r| r.partition))),
        Arc::new(Int64Array::from_iter_values(records.iter().map(|r| r.offset))),
        Arc::new(keys.finish()),
        Arc::new(values.finish()),
        Arc::new(TimestampMillisecondArray::from_iter_values(records.iter().map(|r| r.timestamp_ms))),
        Arc::new(Int16Array::from_iter_values(records.iter().map(|r| r.delivery_count))),
    ];
    RecordBatch::try_new(record_schema(), columns)
}

/// Reads a column of a batch as bytes per row (Binary, LargeBinary, Utf8, LargeUtf8).
fn bytes_column(batch: &RecordBatch, name: &str, task: &str) -> Result<Option<Vec<Option<Bytes>>>> {
    let Ok(index) = batch.schema().index_of(name) else { return Ok(None) };
    let col = batch.column(index);
    let get = |i: usize| -> Option<Bytes> {
        if col.is_null(i) {
            return None;
        }
        if let Some(a) = col.as_any().downcast_ref::<BinaryArray>() {
            return Some(Bytes::copy_from_slice(a.value(i)));
        }
        if let Some(a) = col.as_any().downcast_ref::<StringArray>() {
            return Some(Bytes::copy_from_slice(a.value(i).as_bytes()));
        }
        if let Some(a) = col.as_any().downcast_ref::<LargeBinaryArray>() {
            return Some(Bytes::copy_from_slice(a.value(i)));
        }
        if let Some(a) = col.as_any().downcast_ref::<LargeStringArray>() {
            return Some(Bytes::copy_from_slice(a.value(i).as_bytes()));
        }
        if let Some(a) = col.as_any().downcast_ref::<StringViewArray>() {
            return Some(Bytes::copy_from_slice(a.value(i).as_bytes()));
        }
        if let Some(a) = col.as_any().downcast_ref::<BinaryViewArray>() {
            return Some(Bytes::copy_from_slice(a.value(i)));
        }
        None
    };
    match col.data_type() {
        DataType::Binary
        | DataType::Utf8
        | DataType::LargeBinary
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::BinaryView => Ok(Some((0..batch.num_rows()).map(get).collect())),
        other => Err(RuntimeError::task_message(
            task,
            ErrorKind::Invalid,
            format!("column {name} is {other}; the topic sink needs a string or binary column (cast it in SQL)"),
        )),
    }
}

/// Each row's `(key, value)`: the `value` column is required, `key` optional, both
/// string or binary. `sink` names the operator kind in the error.
pub(crate) fn key_values(batch: &RecordBatch, task: &str, sink: &str) -> Result<Vec<(Option<Bytes>, Option<Bytes>)>> {
    let values = bytes_column(batch, "value", task)?.ok_or_else(|| {
        RuntimeError::task_message(task, ErrorKind::Invalid, format!("the {sink} needs a column named value"))
    })?;
    let keys = bytes_column(batch, "key", task)?;
    Ok(values.into_iter().enumerate().map(|(i, v)| (keys.as_ref().and_then(|k| k[i].clone()), v)).collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int32Array, StringArray};
    use arrow::record_batch::RecordBatch;

    use super::*;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).expect("batch")
    }

    #[test]
    fn rows_become_key_value_pairs_and_bad_columns_are_named() {
        let values: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None]));
        let keys: ArrayRef = Arc::new(StringArray::from(vec![None, Some("k")]));
        let rows = key_values(&batch(vec![("value", values.clone()), ("key", keys)]), "t", "kafka sink").expect("rows");
        assert_eq!(rows, vec![(None, Some(Bytes::from_static(b"a"))), (Some(Bytes::from_static(b"k")), None)]);
        let rows = key_values(&batch(vec![("value", values)]), "t", "kafka sink").expect("keyless rows");
        assert!(rows.iter().all(|(k, _)| k.is_none()));
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1]));
        let err = key_values(&batch(vec![("other", ints.clone())]), "t", "kafka sink").expect_err("no value");
        assert!(err.to_string().contains("the kafka sink needs a column named value"), "{err}");
        let err = key_values(&batch(vec![("value", ints)]), "t", "topic sink").expect_err("int value");
        assert!(err.to_string().contains("column value is Int32"), "{err}");
    }
}
