//! The two operators of a stateful query ([`AggregatePlan`]): the key stage before the
//! exchange, and the aggregate operator that keeps the groups, emits windows once the
//! watermark passes them (and upsert rows of changed keys), at each barrier, into the
//! checkpoint's transaction, and snapshots its groups as keyed state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, TimestampMillisecondArray};
use arrow::compute::{cast, filter_record_batch, sort_to_indices, take_record_batch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit, UInt16Type};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use async_trait::async_trait;
use bytes::Bytes;
use datafusion_expr::GroupsAccumulator;
use datafusion_physical_expr::GroupsAccumulatorAdapter;
use shareflow_checkpoint::CheckpointId;

use super::aggregate::{AggregatePlan, TIME_COLUMN};
use super::groups::{repeat_rows, sort_fields, Emitted, Kept, NewAccumulators, Store};
use super::run_steps;
use super::window::WindowSpec;
use crate::channel::Collector;
use crate::error::{ErrorKind, Result, RuntimeError};
use crate::keyed::KeyedItem;
use crate::operator::{Operator, StateItems, SubtaskContext};
use crate::partition::{hash_rows, key_groups_of_subtask};

/// Rows per keyed state item at most: a snapshot of many groups is split into items
/// (and so restored) in bounded pieces.
const ROWS_PER_ITEM: usize = 65_536;
const LAYOUT_KEY: &str = "shareflow.state.layout";
const WATERMARK_KEY: &str = "shareflow.state.watermark";

/// Rows dropped as late by a stateful query's operators, over all subtasks and
/// attempts.
#[derive(Debug, Default)]
pub struct LateRows(AtomicU64);

impl LateRows {
    /// Late rows counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Evaluates a stateful query's keys, event time and aggregate arguments before the
/// exchange, and sends its watermark before each barrier.
pub struct KeyStage {
    plan: Arc<AggregatePlan>,
    task: String,
    /// Per stream (a value of the plan's stream column): its newest event time, and
    /// when it last had rows.
    streams: HashMap<i64, (i64, std::time::Instant)>,
    /// When this subtask started, and whether it has had rows since: until its first
    /// rows or the idle timeout, it holds the watermark back.
    started: std::time::Instant,
    had_rows: bool,
    dead_letters: Option<crate::DeadLetters>,
    /// Dead letters of the open checkpoint, written at its barrier (or once many).
    pending: Vec<crate::DeadLetter>,
    isolator: crate::Isolator,
}

impl KeyStage {
    /// The key stage of `plan` for subtask `ctx`. With the job's dead letters, rows the
    /// query fails on are dead-lettered and the rest go on.
    pub fn new(plan: Arc<AggregatePlan>, ctx: &SubtaskContext) -> Self {
        Self {
            plan,
            task: ctx.task_name(),
            streams: HashMap::new(),
            started: std::time::Instant::now(),
            had_rows: false,
            dead_letters: ctx.dead_letters.clone(),
            pending: Vec::new(),
            isolator: crate::Isolator::default(),
        }
    }

    /// The exchange batch of `batch` (keys, event time, the aggregates' arguments) and
    /// its newest event time.
    fn exchange(&self, batch: &RecordBatch) -> Result<(RecordBatch, Option<i64>)> {
        let plan = &self.plan;
        let batch = run_steps(&plan.pre, &plan.query, batch.clone(), &self.task)?;
        let rows = batch.num_rows();
        let failed = |e: &dyn std::fmt::Display| {
            RuntimeError::task_message(&self.task, ErrorKind::Invalid, format!("query {:?}: {e}", plan.query))
        };
        let eval = |e: &Arc<dyn datafusion_physical_expr::PhysicalExpr>| {
            e.evaluate(&batch).and_then(|v| v.into_array(rows)).map_err(|e| failed(&e))
        };
        let mut columns = Vec::with_capacity(plan.exchange.fields().len());
        let mut newest = None;
        for k in &plan.keys {
            columns.push(eval(k)?);
        }
        if let Some(t) = &plan.time {
            let times = event_times(&eval(t)?).map_err(|e| failed(&e))?;
            newest = arrow::compute::max(times.as_primitive::<Int64Type>());
            columns.push(times);
        }
        for a in &plan.args {
            columns.push(eval(a)?);
        }
        let exchange = RecordBatch::try_new(plan.exchange.clone(), columns).map_err(|e| failed(&e))?;
        Ok((exchange, newest))
    }

    /// `batch` split by the values of the plan's stream column (the partition), each
    /// part with its stream. The whole batch is one part when every row has one value
    /// (found without a copy), and stream 0 without that column or with a null in it.
    fn streams_of(&self, batch: RecordBatch) -> Result<Vec<(i64, RecordBatch)>> {
        let Ok(column) = batch.schema().index_of(self.plan.stream_column) else { return Ok(vec![(0, batch)]) };
        let arrow_err = |e| RuntimeError::arrow(&self.task, e);
        let ids = cast(batch.column(column), &DataType::Int64).map_err(arrow_err)?;
        let ids = ids.as_primitive::<Int64Type>();
        let (Some(low), Some(high)) = (arrow::compute::min(ids), arrow::compute::max(ids)) else {
            return Ok(vec![(0, batch)]); // no rows
        };
        if ids.null_count() > 0 {
            return Ok(vec![(0, batch)]);
        }
        if low == high {
            return Ok(vec![(low, batch)]);
        }
        let values: std::collections::BTreeSet<i64> = ids.values().iter().copied().collect();
        values
            .into_iter()
            .map(|v| {
                let mask = arrow::compute::kernels::cmp::eq(ids, &arrow::array::Int64Array::new_scalar(v))
                    .map_err(arrow_err)?;
                Ok((v, filter_record_batch(&batch, &mask).map_err(arrow_err)?))
            })
            .collect()
    }
}

/// Event times in ms since the Unix epoch from a timestamp, date or BIGINT column.
fn event_times(array: &ArrayRef) -> std::result::Result<ArrayRef, arrow::error::ArrowError> {
    match array.data_type() {
        DataType::Int64 => Ok(array.clone()),
        _ => cast(&cast(array, &DataType::Timestamp(TimeUnit::Millisecond, None))?, &DataType::Int64),
    }
}

#[async_trait]
impl Operator for KeyStage {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let mut parts = Vec::new();
        for (stream, batch) in self.streams_of(batch)? {
            let stream_parts = match &self.dead_letters {
                None => vec![self.exchange(&batch)?],
                Some(letters) => {
                    let mut isolator = self.isolator;
                    let (parts, bad) = isolator.run(&batch, &mut |b| self.exchange(b))?;
                    self.isolator = isolator;
                    let id = out.checkpoint_id();
                    crate::sql::dead_letter_rows(letters, &mut self.pending, &batch, bad, &self.task, id).await?;
                    parts
                }
            };
            let rows = stream_parts.iter().any(|(b, _)| b.num_rows() > 0);
            if let (true, Some(max)) = (rows, stream_parts.iter().filter_map(|(_, n)| *n).max()) {
                let now = std::time::Instant::now();
                let seen = self.streams.entry(stream).or_insert((max, now));
                *seen = (seen.0.max(max), now);
                self.had_rows = true;
            }
            parts.extend(stream_parts);
        }
        // One batch downstream, as without poison.
        let exchange = match parts.len() {
            1 => parts.pop().map(|(b, _)| b).unwrap_or_else(|| RecordBatch::new_empty(self.plan.exchange.clone())),
            _ => arrow::compute::concat_batches(&self.plan.exchange, parts.iter().map(|(b, _)| b))
                .map_err(|e| RuntimeError::arrow(&self.task, e))?,
        };
        out.emit(exchange).await
    }

    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId, out: &mut Collector) -> Result<StateItems> {
        crate::sql::flush_dead_letters(self.dead_letters.as_ref(), &mut self.pending, checkpoint_id).await?;
        if self.plan.time.is_some() {
            // A subtask holds the watermark at the slowest stream (partition) it had
            // rows of within the idle timeout: a share group may give it the older
            // records of one partition beside the newer ones of another, or while
            // another subtask runs ahead. Streams idle longer hold nothing back. When
            // the last ones go idle together (the input ended), the newest row of any
            // counts once (the aggregate keeps the highest watermark), then nothing.
            let timeout = self.plan.idle_timeout;
            // A subtask with no rows yet since it started holds the watermark at its
            // lowest until the idle timeout: the share group may still hand it records
            // older than the other subtasks' (after a restart, on a slow machine),
            // as a Flink split without a watermark holds its operator back.
            if !self.had_rows && self.started.elapsed() < timeout {
                out.watermark(Some(crate::channel::HOLD_WATERMARK)).await?;
                return Ok(Vec::new());
            }
            let newest = self.streams.values().map(|(newest, _)| *newest).max();
            self.streams.retain(|_, (_, at)| at.elapsed() < timeout);
            let slowest = self.streams.values().map(|(newest, _)| *newest).min();
            let watermark = slowest.or(newest);
            out.watermark(watermark.map(|n| n.saturating_sub(self.plan.lateness_ms))).await?;
        }
        Ok(Vec::new())
    }
}

/// Keeps a stateful query's groups; see the module.
pub struct AggregateOperator {
    plan: Arc<AggregatePlan>,
    task: String,
    operator: String,
    store: Store,
    watermark: Option<i64>,
    /// The key groups this subtask owns.
    key_groups: (u16, u16),
    late: Arc<LateRows>,
    late_in_checkpoint: u64,
}

/// A fresh accumulator of each of `plan`'s aggregates.
fn accumulators(plan: &Arc<AggregatePlan>) -> NewAccumulators {
    let aggregates = plan.aggregates.clone();
    Arc::new(move || {
        aggregates
            .iter()
            .map(|a| {
                if a.groups_accumulator_supported() {
                    a.create_groups_accumulator()
                } else {
                    let a = a.clone();
                    Ok(Box::new(GroupsAccumulatorAdapter::new(move || a.create_accumulator()))
                        as Box<dyn GroupsAccumulator>)
                }
            })
            .collect()
    })
}

impl AggregateOperator {
    /// The aggregate operator of `plan` for subtask `ctx`; `late` counts late rows.
    pub fn new(plan: Arc<AggregatePlan>, ctx: &SubtaskContext, late: Arc<LateRows>) -> Result<Self> {
        let sessions = matches!(plan.window, Some(WindowSpec::Session { .. }));
        let store = Store::new(sort_fields(&plan.keys_types()), sessions, accumulators(&plan))
            .map_err(|e| RuntimeError::task_message(ctx.task_name(), ErrorKind::Invalid, e.to_string()))?;
        Ok(Self {
            plan,
            task: ctx.task_name(),
            operator: ctx.operator.clone(),
            store,
            watermark: None,
            key_groups: key_groups_of_subtask(ctx.subtask, ctx.parallelism).unwrap_or((1, 0)),
            late,
            late_in_checkpoint: 0,
        })
    }

    fn failed(&self, e: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::task_message(&self.task, ErrorKind::Invalid, format!("query {:?}: {e}", self.plan.query))
    }

    fn closed(&self, end: i64) -> bool {
        self.watermark.is_some_and(|w| end <= w)
    }

    /// The group of each row kept (with its row index, repeated for hopping windows).
    fn assign(&mut self, batch: &RecordBatch) -> Result<(Vec<usize>, Option<Vec<u32>>)> {
        let nk = self.plan.keys.len();
        let keys: Vec<ArrayRef> = batch.columns()[..nk].to_vec();
        let rows = self.store.rows(&keys).map_err(|e| self.failed(e))?;
        let hashes = hash_rows(&keys, batch.num_rows()).map_err(|e| self.failed(e))?;
        let mut groups = Vec::with_capacity(batch.num_rows());
        let Some(window) = self.plan.window else {
            for (i, h) in hashes.iter().enumerate() {
                groups.push(self.store.window_group(rows.row(i), *h, 0, i64::MAX) as usize);
            }
            return Ok((groups, None));
        };
        let times = batch.column_by_name(TIME_COLUMN).map(|c| c.as_primitive::<Int64Type>().clone());
        let times = times.ok_or_else(|| self.failed("the exchange has no event time"))?;
        let mut picked = Vec::with_capacity(batch.num_rows());
        let mut dropped = 0u64;
        for (i, h) in hashes.iter().enumerate() {
            if times.is_null(i) {
                dropped += 1;
                continue;
            }
            let t = times.value(i);
            match window {
                WindowSpec::Session { gap } => {
                    if self.closed(t.saturating_add(gap)) {
                        dropped += 1;
                        continue;
                    }
                    groups.push(self.store.session_group(rows.row(i), *h, t, gap) as usize);
                    picked.push(i as u32);
                }
                spec => {
                    let mut any = false;
                    for start in spec.starts(t) {
                        let end = spec.end_of(start);
                        if self.closed(end) {
                            continue;
                        }
                        any = true;
                        groups.push(self.store.window_group(rows.row(i), *h, start, end) as usize);
                        picked.push(i as u32);
                    }
                    dropped += u64::from(!any);
                }
            }
        }
        self.late_in_checkpoint += dropped;
        let identity = picked.len() == batch.num_rows();
        Ok((groups, (!identity).then_some(picked)))
    }

    /// The aggregate's output rows of `emitted`, through HAVING and the SELECT list.
    fn output(&self, emitted: Emitted) -> Result<RecordBatch> {
        let plan = &self.plan;
        let groups = plan.aggregate_schema.fields().len() - plan.aggregates.len();
        let mut keys = emitted.keys.into_iter();
        let mut start = Some(emitted.start);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(plan.aggregate_schema.fields().len());
        for position in 0..groups {
            if plan.window.is_some() && position == plan.window_position {
                columns.push(Arc::new(TimestampMillisecondArray::from(start.take().unwrap_or_default())));
            } else {
                columns.push(keys.next().ok_or_else(|| self.failed("a group key column is missing"))?);
            }
        }
        columns.extend(emitted.values);
        let batch = RecordBatch::try_new(plan.aggregate_schema.clone(), columns).map_err(|e| self.failed(e))?;
        run_steps(&plan.post, &plan.query, batch, &self.task)
    }

    fn state_schema(&self) -> Result<SchemaRef> {
        let mut fields = vec![
            Field::new("__kg", DataType::UInt16, false),
            Field::new("__start", DataType::Int64, false),
            Field::new("__end", DataType::Int64, false),
        ];
        for (i, t) in self.plan.keys_types().into_iter().enumerate() {
            fields.push(Field::new(format!("__k{i}"), t, true));
        }
        for (i, a) in self.plan.aggregates.iter().enumerate() {
            for (j, f) in a.state_fields().map_err(|e| self.failed(e))?.iter().enumerate() {
                fields.push(Field::new(format!("__s{i}_{j}"), f.data_type().clone(), true));
            }
        }
        let metadata = HashMap::from([
            (LAYOUT_KEY.to_string(), self.plan.state_layout()),
            (WATERMARK_KEY.to_string(), self.watermark.map_or(String::new(), |w| w.to_string())),
        ]);
        Ok(Arc::new(Schema::new(fields).with_metadata(metadata)))
    }

    /// The kept rows as keyed items, sorted by key group, at most [`ROWS_PER_ITEM`]
    /// rows each; one empty item carries the watermark when nothing is kept.
    fn encode(&self, kept: Kept) -> Result<StateItems> {
        let schema = self.state_schema()?;
        let mut columns: Vec<ArrayRef> = vec![Arc::new(kept.key_group), Arc::new(kept.start), Arc::new(kept.end)];
        columns.extend(kept.keys);
        columns.extend(kept.states.into_iter().flatten());
        let batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| self.failed(e))?;
        let order = sort_to_indices(batch.column(0), None, None).map_err(|e| self.failed(e))?;
        let batch = take_record_batch(&batch, &order).map_err(|e| self.failed(e))?;
        let mut items = Vec::new();
        let mut offset = 0;
        loop {
            let len = ROWS_PER_ITEM.min(batch.num_rows() - offset);
            let part = batch.slice(offset, len);
            let kgs = part.column(0).as_primitive::<UInt16Type>();
            let (first, last) = if len == 0 { self.key_groups } else { (kgs.value(0), kgs.value(len - 1)) };
            let mut bytes = Vec::new();
            {
                let mut w = StreamWriter::try_new(&mut bytes, &schema).map_err(|e| self.failed(e))?;
                w.write(&part).map_err(|e| self.failed(e))?;
                w.finish().map_err(|e| self.failed(e))?;
            }
            items.push(KeyedItem { first, last, payload: Bytes::from(bytes) }.encode());
            offset += len;
            if offset >= batch.num_rows() {
                return Ok(items);
            }
        }
    }

    /// Restores one keyed item: its rows of this subtask's key groups.
    fn restore_item(&mut self, item: &Bytes, watermark: &mut Option<Option<i64>>) -> Result<()> {
        let keyed = KeyedItem::decode(item, &self.operator)?;
        let corrupt = |e: &dyn std::fmt::Display| {
            RuntimeError::Internal(format!(
                "the restored state of operator {} does not decode: {e}; start from another checkpoint",
                self.operator
            ))
        };
        let reader = StreamReader::try_new(std::io::Cursor::new(keyed.payload), None).map_err(|e| corrupt(&e))?;
        let layout = reader.schema().metadata().get(LAYOUT_KEY).cloned().unwrap_or_default();
        if layout != self.plan.state_layout() {
            return Err(RuntimeError::task_message(
                &self.task,
                ErrorKind::Invalid,
                format!(
                    "the restored state of operator {} does not match its query {:?}: the checkpoint holds {layout:?}, \
                     the query needs {:?}. The query changed between runs: run the old query, or start the changed \
                     one under a new prefix or checkpoint root (its state starts empty)",
                    self.operator,
                    self.plan.query,
                    self.plan.state_layout()
                ),
            ));
        }
        let item_watermark = reader.schema().metadata().get(WATERMARK_KEY).and_then(|w| w.parse::<i64>().ok());
        *watermark = Some(match *watermark {
            None => item_watermark,
            Some(w) => match (w, item_watermark) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        });
        let (first, last) = self.key_groups;
        for batch in reader {
            let batch = batch.map_err(|e| corrupt(&e))?;
            let kgs = batch.column(0).as_primitive::<UInt16Type>();
            let mine: arrow::array::BooleanArray = kgs.iter().map(|k| k.map(|k| first <= k && k <= last)).collect();
            let batch = filter_record_batch(&batch, &mine).map_err(|e| corrupt(&e))?;
            if batch.num_rows() == 0 {
                continue;
            }
            let nk = self.plan.keys.len();
            let keys: Vec<ArrayRef> = batch.columns()[3..3 + nk].to_vec();
            let mut states = Vec::new();
            let mut at = 3 + nk;
            for a in &self.plan.aggregates {
                let n = a.state_fields().map_err(|e| self.failed(e))?.len();
                states.push(batch.columns()[at..at + n].to_vec());
                at += n;
            }
            let start = batch.column(1).as_primitive::<Int64Type>().clone();
            let end = batch.column(2).as_primitive::<Int64Type>().clone();
            self.store.restore(&keys, &start, &end, &states).map_err(|e| corrupt(&e))?;
        }
        Ok(())
    }
}

#[async_trait]
impl Operator for AggregateOperator {
    async fn open(&mut self, _ctx: &SubtaskContext, restored: StateItems) -> Result<()> {
        let started = std::time::Instant::now();
        let mut watermark = None;
        for item in &restored {
            self.restore_item(item, &mut watermark)?;
        }
        self.watermark = watermark.flatten();
        if !restored.is_empty() {
            tracing::info!(
                task = %self.task,
                groups = self.store.len(),
                bytes = self.store.size(),
                watermark = ?self.watermark,
                seconds = started.elapsed().as_secs_f64(),
                "restored keyed state"
            );
        }
        Ok(())
    }

    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, _out: &mut Collector) -> Result<()> {
        let (groups, picked) = self.assign(&batch)?;
        let mut args = Vec::with_capacity(self.plan.aggregates.len());
        for a in &self.plan.aggregates {
            let mut values = Vec::new();
            for e in a.expressions() {
                values
                    .push(e.evaluate(&batch).and_then(|v| v.into_array(batch.num_rows())).map_err(|e| self.failed(e))?);
            }
            if let Some(picked) = &picked {
                values = repeat_rows(&values, picked).map_err(|e| self.failed(e))?;
            }
            args.push(values);
        }
        self.store.update(&args, &groups).map_err(|e| self.failed(e))
    }

    async fn on_watermark(&mut self, watermark: i64) -> Result<()> {
        self.watermark = Some(self.watermark.map_or(watermark, |w| w.max(watermark)));
        Ok(())
    }

    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId, out: &mut Collector) -> Result<StateItems> {
        let windowed = self.plan.window.is_some();
        let watermark = self.watermark;
        let closed = move |end: i64| watermark.is_some_and(|w| end <= w);
        let emit = move |end: i64, changed: bool| if windowed { closed(end) } else { changed };
        let keep = move |end: i64| !(windowed && closed(end));
        let (emitted, kept) = self.store.checkpoint(&emit, &keep).map_err(|e| self.failed(e))?;
        tracing::debug!(task = %self.task, checkpoint = checkpoint_id, groups = self.store.len(), bytes = self.store.size(), "state");
        if let Some(emitted) = emitted {
            let batch = self.output(emitted)?;
            out.emit(batch).await?;
        }
        if self.late_in_checkpoint > 0 {
            self.late.0.fetch_add(self.late_in_checkpoint, Ordering::Relaxed);
            tracing::warn!(
                task = %self.task,
                checkpoint = checkpoint_id,
                late = self.late_in_checkpoint,
                watermark = ?self.watermark,
                "rows arrived after their windows were emitted: counted and dropped"
            );
            self.late_in_checkpoint = 0;
        }
        self.encode(kept)
    }
}
