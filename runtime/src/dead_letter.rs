//! Dead letters: records a job cannot process, written to a dead-letter topic in the
//! same transaction T(n) as the output and the acknowledgements of their checkpoint, so
//! each lands exactly once, read_committed, and the job goes on (decision 0040).
//!
//! Any subtask may dead-letter: a source whose decoder refuses a record, a SQL
//! transform that fails on some rows of a batch ([`isolate`] finds them), a sink that
//! refuses a row. The backend's [`DeadLetterWriter`] (a participant's) writes them; the
//! job's [`DeadLetters`] handle counts them by [`DeadLetterCause`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use shareflow_checkpoint::{CheckpointId, TransactionId};

use crate::error::{ErrorKind, Result, RuntimeError};
use crate::operator::TransactionTemplate;

/// Why a record became a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeadLetterCause {
    /// The source's decoder refused it.
    Decode,
    /// A SQL transform failed on its row.
    Sql,
    /// A sink refused its row as bad data (not as an outage).
    Sink,
    /// It reached the group's delivery limit and was archived.
    DeliveryLimit,
}

impl DeadLetterCause {
    /// Every cause, in the order of [`DeadLetters::counts`].
    pub const ALL: [DeadLetterCause; 4] = [Self::Decode, Self::Sql, Self::Sink, Self::DeliveryLimit];

    /// The cause as a header value and metric label: `decode`, `sql`, `sink`,
    /// `delivery-limit`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decode => "decode",
            Self::Sql => "sql",
            Self::Sink => "sink",
            Self::DeliveryLimit => "delivery-limit",
        }
    }

    /// Parses [`as_str`](Self::as_str).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == text)
    }
}

/// Where a dead letter came from: the input record, when the row still names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Input topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its delivery count when it failed.
    pub delivery_count: i16,
}

/// One record on its way to the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The record's key, or the failing row's `key` column.
    pub key: Option<Bytes>,
    /// The record's value, the failing row's `value` column, or the row as text.
    pub value: Option<Bytes>,
    /// The input record, when known.
    pub origin: Option<Origin>,
    /// Why.
    pub cause: DeadLetterCause,
    /// The error, in words: the query and what failed, or the decoder's reason.
    pub message: String,
    /// The task that gave up on it (`operator[subtask]`).
    pub task: String,
}

impl DeadLetter {
    /// The dead letter of row `row` of `batch`: `key` and `value` from columns of those
    /// names (binary or text) if present, else the whole row as text in the value; the
    /// origin from the `topic`, `partition`, `offset` and `delivery_count` columns of a
    /// source's batches, if present.
    pub fn from_row(batch: &RecordBatch, row: usize, cause: DeadLetterCause, message: String, task: &str) -> Self {
        let column = |name: &str| batch.column_by_name(name).filter(|c| !c.is_null(row));
        let key = column("key").and_then(|c| bytes_at(c.as_ref(), row));
        let value = match batch.column_by_name("value") {
            Some(c) => bytes_at(c.as_ref(), row),
            None => Some(Bytes::from(row_text(batch, row))),
        };
        let origin = (|| {
            let topic = column("topic")?;
            let topic = match topic.data_type() {
                DataType::Utf8 => topic.as_string::<i32>().value(row).to_string(),
                DataType::Utf8View => topic.as_string_view().value(row).to_string(),
                _ => return None,
            };
            let int = |name: &str| -> Option<i64> {
                // This row's cell only: a dead letter costs O(1), not a cast of the batch.
                let c = arrow::compute::cast(&column(name)?.slice(row, 1), &DataType::Int64).ok()?;
                Some(c.as_primitive::<arrow::datatypes::Int64Type>().value(0))
            };
            Some(Origin {
                topic,
                partition: i32::try_from(int("partition")?).ok()?,
                offset: int("offset")?,
                delivery_count: int("delivery_count").and_then(|d| i16::try_from(d).ok()).unwrap_or(1),
            })
        })();
        Self { key, value, origin, cause, message, task: task.to_string() }
    }
}

/// The bytes of a binary or text cell.
fn bytes_at(column: &dyn Array, row: usize) -> Option<Bytes> {
    if column.is_null(row) {
        return None;
    }
    let bytes: &[u8] = match column.data_type() {
        DataType::Binary => column.as_binary::<i32>().value(row),
        DataType::LargeBinary => column.as_binary::<i64>().value(row),
        DataType::BinaryView => column.as_binary_view().value(row),
        DataType::Utf8 => column.as_string::<i32>().value(row).as_bytes(),
        DataType::LargeUtf8 => column.as_string::<i64>().value(row).as_bytes(),
        DataType::Utf8View => column.as_string_view().value(row).as_bytes(),
        _ => {
            let formatter = arrow::util::display::ArrayFormatter::try_new(column, &Default::default()).ok()?;
            return Some(Bytes::from(formatter.value(row).to_string()));
        }
    };
    Some(Bytes::copy_from_slice(bytes))
}

/// `name=value, ...` of one row.
fn row_text(batch: &RecordBatch, row: usize) -> String {
    let schema = batch.schema();
    let mut out = String::new();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !out.is_empty() {
            out.push_str(", ");
        }
        let value = arrow::util::display::ArrayFormatter::try_new(column.as_ref(), &Default::default())
            .map_or_else(|_| "?".to_string(), |f| f.value(row).to_string());
        out.push_str(&format!("{}={value}", field.name()));
    }
    out
}

/// Writes dead letters into T(n) of a checkpoint: each backend has one
/// ([`crate::JobBuilder::dead_letters`]).
#[async_trait]
pub trait DeadLetterWriter: Send + Sync + 'static {
    /// Writes `letters` into `txn`, T(n) of the checkpoint they belong to: they become
    /// visible to read_committed readers when that checkpoint commits, and vanish with
    /// it if it aborts (their records then come back and fail again). A job without
    /// exactly-once writes them at once.
    async fn write(&self, txn: &TransactionId, letters: Vec<DeadLetter>) -> Result<()>;
}

/// The job's dead-letter handle, in every [`SubtaskContext`](crate::SubtaskContext) of a
/// job that has one: writes through the backend's writer and counts by cause.
#[derive(Clone)]
pub struct DeadLetters {
    writer: Arc<dyn DeadLetterWriter>,
    counts: Arc<[AtomicU64; 4]>,
    /// The job's T(n) template, set when the job makes its subtasks.
    template: Option<TransactionTemplate>,
}

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters").field("counts", &self.counts()).finish()
    }
}

impl DeadLetters {
    /// A handle over `writer`.
    pub fn new(writer: Arc<dyn DeadLetterWriter>) -> Self {
        Self { writer, counts: Arc::new(Default::default()), template: None }
    }

    /// The handle a job's subtasks get: it writes into the job's T(n).
    pub(crate) fn bound(&self, template: TransactionTemplate) -> Self {
        Self { template: Some(template), ..self.clone() }
    }

    /// Writes `letters` into T(`checkpoint_id`) and counts them. Written ones are counted
    /// once per attempt: a checkpoint that aborts and comes back counts its letters again.
    pub async fn write(&self, checkpoint_id: CheckpointId, letters: Vec<DeadLetter>) -> Result<()> {
        if letters.is_empty() {
            return Ok(());
        }
        let mut by_cause = [0u64; 4];
        for l in &letters {
            tracing::warn!(
                task = %l.task, cause = l.cause.as_str(), origin = ?l.origin, message = %l.message,
                "dead letter"
            );
            by_cause[l.cause as usize] += 1;
        }
        let template = self.template.as_ref().ok_or_else(|| {
            RuntimeError::Internal("dead letters written outside a job (no transaction template)".into())
        })?;
        self.writer.write(&template.transaction(checkpoint_id), letters).await?;
        for (count, n) in self.counts.iter().zip(by_cause) {
            count.fetch_add(n, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Dead letters written so far, by cause, in the order of [`DeadLetterCause::ALL`].
    pub fn counts(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }
}

/// What [`isolate`] found: the outputs of the parts that ran, in row order, and each row
/// that fails alone with its error.
pub type Isolated<T> = (Vec<T>, Vec<(usize, RuntimeError)>);

/// Runs `f` on `batch`; where it fails with a data error ([`ErrorKind::Invalid`]), runs
/// it on the halves, down to single rows (a bisection: k bad rows of n cost about
/// 2k·log2(n) more calls). Returns the outputs of the parts that ran, in row order, and
/// every row that fails alone with its error. Any other error fails the whole call.
/// An operator that sees poison batch after batch uses an [`Isolator`] instead.
pub fn isolate<T>(batch: &RecordBatch, f: &mut impl FnMut(&RecordBatch) -> Result<T>) -> Result<Isolated<T>> {
    Isolator::default().run(batch, f)
}

/// [`isolate`] that remembers how much poison the batches before held, and splits a
/// batch into that many parts before it runs `f` (Hwang's generalized binary
/// splitting): with d bad rows of n expected, parts of about n/d rows, each failing part
/// bisected. At 1 % poison in batches of 2,000 rows that is about 40 % of the rows and
/// calls of a bisection from the whole batch, which first runs on every row several
/// times over. A batch without poison after a poisoned one costs d calls instead of one,
/// on the same rows, and the estimate halves with each clean batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Isolator {
    /// Bad rows per row, averaged over the batches so far (each new batch weighs half).
    rate: f64,
}

impl Isolator {
    /// The bad rows expected in a batch of `rows` rows.
    pub fn expected_bad(&self, rows: usize) -> usize {
        (self.rate * rows as f64).round() as usize
    }

    /// Counts a batch of `rows` rows with `bad` bad ones into the estimate, for a caller
    /// that found them another way.
    pub fn observe(&mut self, bad: usize, rows: usize) {
        if rows > 0 {
            self.rate = (self.rate + bad as f64 / rows as f64) / 2.0;
        }
    }

    /// Isolates the bad rows of `batch` as [`isolate`] does, starting from parts the
    /// size the estimate gives, and updates the estimate.
    pub fn run<T>(
        &mut self,
        batch: &RecordBatch,
        f: &mut impl FnMut(&RecordBatch) -> Result<T>,
    ) -> Result<Isolated<T>> {
        let n = batch.num_rows();
        let part = part_rows(n, self.expected_bad(n));
        let mut outputs = Vec::new();
        let mut bad = Vec::new();
        // A stack: the parts are pushed last first, so they run in row order.
        let mut pending: Vec<(usize, usize)> =
            (0..n.div_ceil(part).max(1)).rev().map(|i| (i * part, part.min(n - i * part))).collect();
        while let Some((offset, len)) = pending.pop() {
            let slice = if offset == 0 && len == n { batch.clone() } else { batch.slice(offset, len) };
            match f(&slice) {
                Ok(out) => outputs.push((offset, out)),
                Err(e) if e.kind() != ErrorKind::Invalid => return Err(e),
                Err(e) if len <= 1 => bad.push((offset, e)),
                Err(_) => {
                    let half = len / 2;
                    // Popped first, so the left half runs first.
                    pending.push((offset + half, len - half));
                    pending.push((offset, half));
                }
            }
        }
        outputs.sort_by_key(|(offset, _)| *offset);
        bad.sort_by_key(|(row, _)| *row);
        self.observe(bad.len(), n);
        Ok((outputs.into_iter().map(|(_, out)| out).collect(), bad))
    }
}

/// The rows of each first part of a batch of `n` rows with `expected_bad` bad rows: the
/// power of two at or below n/d (the whole batch when none are expected).
fn part_rows(n: usize, expected_bad: usize) -> usize {
    match n.checked_div(expected_bad) {
        None => n.max(1),
        Some(0) => 1,
        Some(q) => 1 << q.ilog2(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow::array::{BinaryArray, Int16Array, Int32Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    fn records(values: &[&str]) -> RecordBatch {
        let n = values.len();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("topic", DataType::Utf8, false),
                Field::new("partition", DataType::Int32, false),
                Field::new("offset", DataType::Int64, false),
                Field::new("key", DataType::Binary, true),
                Field::new("value", DataType::Binary, true),
                Field::new("delivery_count", DataType::Int16, false),
            ])),
            vec![
                Arc::new(StringArray::from(vec!["in"; n])),
                Arc::new(Int32Array::from(vec![2; n])),
                Arc::new(Int64Array::from_iter_values(100..100 + n as i64)),
                Arc::new(BinaryArray::from(vec![None::<&[u8]>; n])),
                Arc::new(BinaryArray::from_iter_values(values.iter().map(|v| v.as_bytes()))),
                Arc::new(Int16Array::from(vec![3; n])),
            ],
        )
        .unwrap()
    }

    /// Parses every value as a number; a value that is not one fails the whole batch.
    fn parse(batch: &RecordBatch) -> Result<Vec<i64>> {
        let values = batch.column_by_name("value").unwrap().as_binary::<i32>();
        values
            .iter()
            .map(|v| {
                let v = std::str::from_utf8(v.unwrap()).unwrap();
                v.parse().map_err(|_| RuntimeError::task_message("t", ErrorKind::Invalid, format!("not a number: {v}")))
            })
            .collect()
    }

    /// Each row: the batch's values, the outputs that ran in order, the bad rows.
    #[test]
    fn isolate_finds_each_bad_row_and_keeps_the_rest_in_order() {
        let rows: &[(&[&str], &[i64], &[usize])] = &[
            (&["1", "2", "3"], &[1, 2, 3], &[]),
            (&["x"], &[], &[0]),
            (&["1", "x", "3", "4", "y"], &[1, 3, 4], &[1, 4]),
            (&["x", "y", "z"], &[], &[0, 1, 2]),
            (&[], &[], &[]),
        ];
        for (values, want, want_bad) in rows {
            let batch = records(values);
            let (outs, bad) = isolate(&batch, &mut parse).unwrap();
            let got: Vec<i64> = outs.into_iter().flatten().collect();
            assert_eq!(&got, want, "{values:?}");
            let bad_rows: Vec<usize> = bad.iter().map(|(r, _)| *r).collect();
            assert_eq!(&bad_rows, want_bad, "{values:?}");
            for (row, e) in bad {
                assert!(e.to_string().contains(values[row]), "{e}");
            }
        }
    }

    #[test]
    fn an_isolator_splits_by_the_poison_it_saw_and_finds_the_same_rows() {
        let values: Vec<String> = (0..200).map(|i| if i % 20 == 7 { format!("x{i}") } else { i.to_string() }).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let batch = records(&values);
        let (want, want_bad) = isolate(&batch, &mut parse).unwrap();
        let want: Vec<i64> = want.into_iter().flatten().collect();
        let mut isolator = Isolator::default();
        let mut calls_per_batch = Vec::new();
        for _ in 0..3 {
            let mut calls = 0;
            let (outs, bad) = isolator
                .run(&batch, &mut |b| {
                    calls += 1;
                    parse(b)
                })
                .unwrap();
            assert_eq!(outs.into_iter().flatten().collect::<Vec<_>>(), want);
            let rows = |b: &[(usize, RuntimeError)]| b.iter().map(|(r, _)| *r).collect::<Vec<_>>();
            assert_eq!(rows(&bad), rows(&want_bad));
            calls_per_batch.push(calls);
        }
        // The first batch bisects from the whole; the next ones start from parts.
        assert!(calls_per_batch[2] < calls_per_batch[0], "{calls_per_batch:?}");
        // Clean batches halve the estimate down to none: one call again.
        let clean = records(&["1"; 200]);
        let mut calls = 0;
        for _ in 0..20 {
            calls = 0;
            isolator
                .run(&clean, &mut |b| {
                    calls += 1;
                    parse(b)
                })
                .unwrap();
        }
        assert_eq!(calls, 1);
    }

    #[test]
    fn part_rows_is_a_power_of_two_at_or_below_rows_per_bad_row() {
        for (n, d, want) in
            [(2000, 0, 2000), (2000, 20, 64), (2000, 1, 1024), (5, 10, 1), (0, 0, 1), (0, 3, 1), (64, 2, 32)]
        {
            assert_eq!(part_rows(n, d), want, "n={n} d={d}");
        }
    }

    #[test]
    fn isolate_stops_at_an_error_that_is_not_about_the_data() {
        let batch = records(&["1", "x"]);
        let err = isolate(&batch, &mut |_: &RecordBatch| -> Result<()> {
            Err(RuntimeError::Internal("the disk is gone".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("the disk is gone"));
    }

    #[test]
    fn a_dead_letter_keeps_the_record_and_names_its_origin() {
        let batch = records(&["1", "oops"]);
        let l = DeadLetter::from_row(&batch, 1, DeadLetterCause::Sql, "bad cast".into(), "q[0]");
        assert_eq!(l.value.as_deref(), Some(&b"oops"[..]));
        assert_eq!(l.key, None);
        assert_eq!(l.origin, Some(Origin { topic: "in".into(), partition: 2, offset: 101, delivery_count: 3 }));
        // A row without the source's columns goes as text, without an origin.
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false), Field::new("s", DataType::Utf8, true)])),
            vec![Arc::new(Int64Array::from(vec![7])), Arc::new(StringArray::from(vec![Some("a")]))],
        )
        .unwrap();
        let l = DeadLetter::from_row(&other, 0, DeadLetterCause::Sink, "refused".into(), "sink[0]");
        assert_eq!((l.value.as_deref(), l.origin), (Some(&b"n=7, s=a"[..]), None));
    }

    #[test]
    fn causes_round_trip_through_their_names() {
        for c in DeadLetterCause::ALL {
            assert_eq!(DeadLetterCause::parse(c.as_str()), Some(c));
            assert_eq!(DeadLetterCause::ALL[c as usize], c);
        }
        assert_eq!(DeadLetterCause::parse("poison"), None);
    }
}
