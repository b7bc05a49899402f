//! Rows: the schema of the batches both sources emit, and how both sinks read keys and
//! values out of a batch.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, BinaryViewArray, ByteView, Int16Array, Int32Array, Int64Array,
    LargeBinaryArray, LargeStringArray, StringArray, StringViewArray, TimestampMillisecondArray, MAX_INLINE_VIEW_LEN,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use shareflow_runtime::{ErrorKind, Result, RuntimeError};

use shareflow_share::Record;

/// The schema of the batches a share source emits (docs/design.md §2).
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
    // Sized up front: the values are copied once, never again by a growing buffer.
    let bytes = |f: fn(&Record) -> Option<&Bytes>| records.iter().filter_map(f).map(Bytes::len).sum::<usize>();
    let mut keys = BinaryBuilder::with_capacity(records.len(), bytes(|r| r.key.as_ref()));
    let mut values = BinaryBuilder::with_capacity(records.len(), bytes(|r| r.value.as_ref()));
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

/// An Arrow buffer as the owner of a [`Bytes`]: rows become slices of the batch's
/// buffer instead of copies of it.
struct ArrowBytes(arrow::buffer::Buffer);

impl AsRef<[u8]> for ArrowBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Each row of an offset-based bytes array as a slice of one shared [`Bytes`] over
/// its values buffer: no copy per row.
fn shared_rows<O: arrow::array::OffsetSizeTrait>(
    col: &dyn Array,
    values: &arrow::buffer::Buffer,
    offsets: &[O],
) -> Vec<Option<Bytes>> {
    let shared = Bytes::from_owner(ArrowBytes(values.clone()));
    (0..col.len())
        .map(|i| (!col.is_null(i)).then(|| shared.slice(offsets[i].as_usize()..offsets[i + 1].as_usize())))
        .collect()
}

/// Each row of a view array. A value longer than 12 bytes is a slice of one shared
/// [`Bytes`] over the data buffer its view points into: no copy. A shorter one lives
/// inside its view and is copied (at most 12 bytes).
fn view_rows<T: arrow::datatypes::ByteViewType + ?Sized>(
    a: &arrow::array::GenericByteViewArray<T>,
) -> Vec<Option<Bytes>> {
    let shared: Vec<Bytes> = a.data_buffers().iter().map(|b| Bytes::from_owner(ArrowBytes(b.clone()))).collect();
    a.views()
        .iter()
        .enumerate()
        .map(|(i, &view)| {
            if a.is_null(i) {
                return None;
            }
            let view = ByteView::from(view);
            let (len, buffer, offset) = (view.length as usize, view.buffer_index as usize, view.offset as usize);
            let out_of_line = (view.length > MAX_INLINE_VIEW_LEN)
                .then(|| shared.get(buffer).filter(|b| offset + len <= b.len()))
                .flatten();
            Some(match out_of_line {
                Some(data) => data.slice(offset..offset + len),
                None => Bytes::copy_from_slice(a.value(i).as_ref()),
            })
        })
        .collect()
}

/// Reads a column of a batch as bytes per row (Binary, LargeBinary, Utf8, LargeUtf8,
/// Utf8View and BinaryView), without copying the values.
fn bytes_column(batch: &RecordBatch, name: &str, task: &str) -> Result<Option<Vec<Option<Bytes>>>> {
    let Ok(index) = batch.schema().index_of(name) else { return Ok(None) };
    let col = batch.column(index).as_ref();
    let any = col.as_any();
    if let Some(a) = any.downcast_ref::<BinaryArray>() {
        return Ok(Some(shared_rows(col, a.values(), a.value_offsets())));
    }
    if let Some(a) = any.downcast_ref::<StringArray>() {
        return Ok(Some(shared_rows(col, a.values(), a.value_offsets())));
    }
    if let Some(a) = any.downcast_ref::<LargeBinaryArray>() {
        return Ok(Some(shared_rows(col, a.values(), a.value_offsets())));
    }
    if let Some(a) = any.downcast_ref::<LargeStringArray>() {
        return Ok(Some(shared_rows(col, a.values(), a.value_offsets())));
    }
    if let Some(a) = any.downcast_ref::<StringViewArray>() {
        return Ok(Some(view_rows(a)));
    }
    if let Some(a) = any.downcast_ref::<BinaryViewArray>() {
        return Ok(Some(view_rows(a)));
    }
    Err(RuntimeError::task_message(
        task,
        ErrorKind::Invalid,
        format!(
            "column {name} is {}; the topic sink needs a string or binary column (cast it in SQL)",
            col.data_type()
        ),
    ))
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
    fn every_bytes_type_reads_the_same_rows_and_offset_types_share_the_batch_buffer() {
        use arrow::array::{LargeBinaryArray, LargeStringArray, StringViewArray};
        let rows: Vec<Option<&str>> = vec![Some("alpha"), None, Some(""), Some("a value past twelve bytes")];
        let expected: Vec<Option<Bytes>> =
            rows.iter().map(|r| r.map(|v| Bytes::copy_from_slice(v.as_bytes()))).collect();
        let bin: Vec<Option<&[u8]>> = rows.iter().map(|r| r.map(str::as_bytes)).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(rows.clone())),
            Arc::new(LargeStringArray::from(rows.clone())),
            Arc::new(BinaryArray::from(bin.clone())),
            Arc::new(LargeBinaryArray::from(bin.clone())),
            Arc::new(StringViewArray::from(rows.clone())),
            Arc::new(BinaryViewArray::from(bin.clone())),
        ];
        for col in columns {
            let kind = col.data_type().clone();
            let got = key_values(&batch(vec![("value", col.clone())]), "t", "kafka sink").expect("rows");
            assert_eq!(got.into_iter().map(|(_, v)| v).collect::<Vec<_>>(), expected, "{kind}");
            // A slice of the batch reads its own rows.
            let sliced = batch(vec![("value", col.slice(1, 3))]);
            let got = key_values(&sliced, "t", "kafka sink").expect("sliced rows");
            assert_eq!(got.into_iter().map(|(_, v)| v).collect::<Vec<_>>(), expected[1..], "{kind} sliced");
        }
        // Offset-based arrays are not copied: the row points into the batch's buffer.
        let col = StringArray::from(rows.clone());
        let start = col.values().as_ptr() as usize;
        let got =
            key_values(&batch(vec![("value", Arc::new(col.clone()) as ArrayRef)]), "t", "kafka sink").expect("rows");
        let first = got[0].1.as_ref().expect("a value");
        assert_eq!(first.as_ptr() as usize, start, "the first row is the buffer's first bytes, not a copy");
        // Nor are the long values of view arrays: the row points into the data buffer.
        for col in [
            Arc::new(StringViewArray::from(rows.clone())) as ArrayRef,
            Arc::new(BinaryViewArray::from(bin.clone())) as ArrayRef,
        ] {
            let data = col.to_data();
            let buffer = data.buffers()[1].as_slice().as_ptr_range();
            let got = key_values(&batch(vec![("value", col.clone())]), "t", "kafka sink").expect("rows");
            let long = got[3].1.as_ref().expect("a long value");
            assert!(buffer.contains(&long.as_ptr()), "{}: the long value is in the data buffer", col.data_type());
            let short = got[0].1.as_ref().expect("a short value");
            assert!(!buffer.contains(&short.as_ptr()), "{}: a short value lives in its view", col.data_type());
        }
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
