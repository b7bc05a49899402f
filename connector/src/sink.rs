//! Sinks: the transactional topic sink on the embedded broker, and a print sink.

use std::sync::Arc;

use arrow::array::{
    Array, BinaryArray, BinaryViewArray, LargeBinaryArray, LargeStringArray, StringArray, StringViewArray,
};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use shareflow_runtime::failpoint::Failpoints;
use shareflow_runtime::{
    Collector, ErrorKind, Operator, Result, RuntimeError, StateItems, SubtaskContext, TransactionTemplate,
};

use crate::broker::EmbeddedBroker;
use crate::participant::{runtime_error, BrokerTransactions};
use crate::share::{ProducerRecord, ShareTransactionalProducer};

/// Failpoints of the sinks.
pub mod points {
    /// Output of the epoch is written into T(n), the barrier not yet reached.
    pub const AFTER_WRITE: &str = "sink.after_write";
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
        arrow::datatypes::DataType::Binary
        | arrow::datatypes::DataType::Utf8
        | arrow::datatypes::DataType::LargeBinary
        | arrow::datatypes::DataType::LargeUtf8
        | arrow::datatypes::DataType::Utf8View
        | arrow::datatypes::DataType::BinaryView => Ok(Some((0..batch.num_rows()).map(get).collect())),
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

/// Writes each row's `value` (and `key`, if present) to a topic of the embedded broker.
/// With a [`BrokerTransactions`] participant the output of epoch n goes into T(n) and is
/// visible to read_committed readers only once checkpoint n commits; without, it is
/// produced at once (at-least-once pipelines).
pub struct TopicSink {
    broker: EmbeddedBroker,
    txns: Option<Arc<BrokerTransactions>>,
    topic: Arc<str>,
    template: TransactionTemplate,
    failpoints: Failpoints,
    task: String,
}

impl TopicSink {
    /// A factory for the job builder.
    pub fn factory(
        broker: EmbeddedBroker,
        txns: Option<Arc<BrokerTransactions>>,
        topic: &str,
    ) -> impl Fn(&SubtaskContext) -> TopicSink + Send + Sync {
        let topic: Arc<str> = topic.into();
        move |ctx| TopicSink {
            broker: broker.clone(),
            txns: txns.clone(),
            topic: topic.clone(),
            template: ctx.transactions.clone(),
            failpoints: ctx.failpoints.clone(),
            task: ctx.task_name(),
        }
    }
}

#[async_trait]
impl Operator for TopicSink {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let records: Vec<ProducerRecord> = key_values(&batch, &self.task, "topic sink")?
            .into_iter()
            .map(|(key, value)| ProducerRecord {
                topic: self.topic.clone(),
                partition: None,
                key,
                value,
                timestamp_ms: 0,
            })
            .collect();
        match &self.txns {
            Some(txns) => {
                let handle = txns.handle(self.template.transaction(out.epoch()))?;
                txns.coordinator()?.send(&handle, records).await.map_err(|e| runtime_error(&self.task, e))?;
            }
            None => {
                self.broker.produce(records).await.map_err(|e| runtime_error(&self.task, e))?;
            }
        }
        self.failpoints.hit(points::AFTER_WRITE)
    }

    async fn snapshot_state(&mut self, _checkpoint_id: u64, _out: &mut Collector) -> Result<StateItems> {
        // Every send already returned durable: nothing to flush for T(n).
        Ok(Vec::new())
    }
}

/// Prints every row, for examples.
pub struct PrintSink {
    prefix: String,
}

impl PrintSink {
    /// A factory for the job builder.
    pub fn factory(prefix: &str) -> impl Fn(&SubtaskContext) -> PrintSink + Send + Sync {
        let prefix = prefix.to_string();
        move |ctx| PrintSink { prefix: format!("{prefix}[{}]", ctx.subtask) }
    }
}

#[async_trait]
impl Operator for PrintSink {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, _out: &mut Collector) -> Result<()> {
        let options = arrow::util::display::FormatOptions::default();
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| RuntimeError::task("print", ErrorKind::Invalid, e))?;
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters.iter().map(|f| f.value(row).to_string()).collect();
            println!("{} {}", self.prefix, cells.join(" | "));
        }
        Ok(())
    }
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
