//! Finding the rows a query's CASTs fail on in one pass, instead of by bisection.
//!
//! A failing CAST is the common poison of a stateless query (a value that is not a
//! number, a date that is not a date). Bisection finds k bad rows of n in about
//! 2k·log2(n) runs of the query, and a run costs microseconds however few its rows, so
//! at 1 % poison it costs ten times the query. Here each step of the plan has a second
//! form, planned once, in which every CAST runs as TRY_CAST and notes the rows where it
//! failed (its input is not NULL and its result is). One run of that form over the
//! batch flags the rows and computes every other row's output, which is the strict
//! form's: the two differ only where a CAST fails. Each flagged row then runs alone in
//! the strict form, for its error. Whenever the flags are not the whole story (a CAST
//! evaluated on part of the rows, as in a CASE branch; a flagged row that does not
//! fail; anything else that fails, as a division by zero), the caller falls back to
//! bisection, so the answer is always the one bisection gives.

use std::cell::RefCell;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, BooleanArray, UInt32Array};
use arrow::buffer::BooleanBuffer;
use arrow::compute::{filter, filter_record_batch, CastOptions};
use arrow::datatypes::{DataType, FieldRef, Schema};
use arrow::record_batch::RecordBatch;
use arrow::util::display::FormatOptions;
use datafusion_common::tree_node::{Transformed, TreeNode};
use datafusion_common::DataFusionError;
use datafusion_expr::ColumnarValue;
use datafusion_physical_expr::expressions::CastExpr;
use datafusion_physical_expr::PhysicalExpr;

use super::{SqlPlan, Step};
use crate::dead_letter::{Isolated, Isolator};
use crate::error::{ErrorKind, Result, RuntimeError};

type DfResult<T> = std::result::Result<T, DataFusionError>;

/// A step's expressions with each CAST checked ([`CheckedCast`]).
#[derive(Debug)]
pub(crate) struct CastProbe {
    checked: Vec<Arc<dyn PhysicalExpr>>,
}

impl CastProbe {
    /// The probe of a step's `exprs`; `None` when they hold no CAST.
    pub(crate) fn plan(exprs: &[Arc<dyn PhysicalExpr>]) -> Option<CastProbe> {
        let mut casts = 0;
        let checked = exprs
            .iter()
            .map(|e| {
                e.clone()
                    .transform_up(|node| match node.downcast_ref::<CastExpr>() {
                        Some(cast) => {
                            casts += 1;
                            let checked =
                                CheckedCast { expr: cast.expr().clone(), cast_type: cast.cast_type().clone() };
                            Ok(Transformed::yes(Arc::new(checked) as Arc<dyn PhysicalExpr>))
                        }
                        None => Ok(Transformed::no(node)),
                    })
                    .map(|t| t.data)
            })
            .collect::<DfResult<Vec<_>>>()
            .ok()?;
        (casts > 0).then_some(CastProbe { checked })
    }
}

thread_local! {
    /// The rows of the step being probed on this thread where a CAST failed; `None`
    /// outside a probe. Evaluation is synchronous, so a step's CASTs all run here.
    static FAILED: RefCell<Option<Failed>> = const { RefCell::new(None) };
}

/// What the CASTs of one step noted.
struct Failed {
    rows: usize,
    /// Set where a CAST failed.
    mask: BooleanBuffer,
    /// A CAST ran on another number of rows (inside a CASE): the mask cannot say which.
    partial: bool,
}

/// CAST as TRY_CAST, noting in [`FAILED`] the rows where it failed.
#[derive(Debug, Clone, Eq)]
struct CheckedCast {
    expr: Arc<dyn PhysicalExpr>,
    cast_type: DataType,
}

impl PartialEq for CheckedCast {
    fn eq(&self, other: &Self) -> bool {
        self.expr.eq(&other.expr) && self.cast_type == other.cast_type
    }
}

impl Hash for CheckedCast {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.expr.hash(state);
        self.cast_type.hash(state);
    }
}

impl fmt::Display for CheckedCast {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CHECKED_CAST({} AS {})", self.expr, self.cast_type)
    }
}

impl PhysicalExpr for CheckedCast {
    fn data_type(&self, _input_schema: &Schema) -> DfResult<DataType> {
        Ok(self.cast_type.clone())
    }

    fn nullable(&self, _input_schema: &Schema) -> DfResult<bool> {
        Ok(true)
    }

    fn return_field(&self, input_schema: &Schema) -> DfResult<FieldRef> {
        let source = self.expr.return_field(input_schema)?;
        Ok(Arc::new(source.as_ref().clone().with_data_type(self.cast_type.clone()).with_nullable(true)))
    }

    fn evaluate(&self, batch: &RecordBatch) -> DfResult<ColumnarValue> {
        let value = self.expr.evaluate(batch)?;
        let options = CastOptions { safe: true, format_options: FormatOptions::default() };
        let out = value.cast_to(&self.cast_type, Some(&options))?;
        note_failures(&value, &out, batch.num_rows());
        Ok(out)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.expr]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> DfResult<Arc<dyn PhysicalExpr>> {
        let expr =
            children.into_iter().next().ok_or_else(|| DataFusionError::Internal("a cast needs its input".into()))?;
        Ok(Arc::new(CheckedCast { expr, cast_type: self.cast_type.clone() }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TRY_CAST(")?;
        self.expr.fmt_sql(f)?;
        write!(f, " AS {})", self.cast_type)
    }
}

/// Notes where `input` was not NULL and `output` is: the rows a CAST failed on.
fn note_failures(input: &ColumnarValue, output: &ColumnarValue, rows: usize) {
    FAILED.with_borrow_mut(|failed| {
        let Some(f) = failed.as_mut() else { return };
        let valid = |v: &ColumnarValue, n: usize| match v {
            ColumnarValue::Array(a) => {
                a.logical_nulls().map_or_else(|| BooleanBuffer::new_set(n), |nulls| nulls.inner().clone())
            }
            ColumnarValue::Scalar(s) if s.is_null() => BooleanBuffer::new_unset(n),
            ColumnarValue::Scalar(_) => BooleanBuffer::new_set(n),
        };
        if rows != f.rows {
            f.partial = true;
            return;
        }
        let failed_here = &valid(input, rows) & &!&valid(output, rows);
        f.mask = &f.mask | &failed_here;
    });
}

/// Runs `exprs` of one step on `batch` in the checked form; the results and the rows a
/// CAST failed on (`None`: some CAST ran on part of the rows, so the rows are unknown).
fn checked<T>(batch: &RecordBatch, run: impl FnOnce() -> DfResult<T>) -> DfResult<(T, Option<BooleanBuffer>)> {
    let rows = batch.num_rows();
    FAILED.set(Some(Failed { rows, mask: BooleanBuffer::new_unset(rows), partial: false }));
    let result = run();
    let failed = FAILED.take();
    let out = result?;
    Ok((out, failed.filter(|f| !f.partial).map(|f| f.mask)))
}

/// Runs `steps` on `batch` with their CASTs checked: the output (the strict form's on
/// every row not flagged), the input row of each output row, and the rows (ascending)
/// a CAST failed on. An error when something else fails or a CAST ran on part of a
/// step's rows.
fn run_checked(steps: &[Step], batch: &RecordBatch) -> DfResult<(RecordBatch, UInt32Array, Vec<u32>)> {
    let mut rows = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    let mut batch = batch.clone();
    let mut flagged = Vec::new();
    let mut note = |mask: Option<BooleanBuffer>, rows: &UInt32Array| -> DfResult<()> {
        let mask = mask.ok_or_else(|| DataFusionError::Internal("a CAST ran on part of the rows".into()))?;
        flagged.extend(mask.set_indices().map(|i| rows.value(i)));
        Ok(())
    };
    for step in steps {
        match step {
            Step::Columns(cols) => batch = batch.project(cols)?,
            Step::Filter(strict, probe) => {
                let predicate = probe.as_ref().map_or(strict, |p| &p.checked[0]);
                let (keep, mask) = checked(&batch, || predicate.evaluate(&batch)?.into_array(batch.num_rows()))?;
                note(mask, &rows)?;
                let keep = keep
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .cloned()
                    .ok_or_else(|| DataFusionError::Internal("WHERE did not give booleans".into()))?;
                batch = filter_record_batch(&batch, &keep)?;
                rows = filter(&rows, &keep)?
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .cloned()
                    .ok_or_else(|| DataFusionError::Internal("filtered row numbers are not u32".into()))?;
            }
            Step::Project(strict, schema, probe) => {
                let exprs = probe.as_ref().map_or(strict, |p| &p.checked);
                let (columns, mask) = checked(&batch, || {
                    exprs
                        .iter()
                        .map(|e| e.evaluate(&batch).and_then(|v| v.into_array(batch.num_rows())))
                        .collect::<DfResult<Vec<_>>>()
                })?;
                note(mask, &rows)?;
                batch = RecordBatch::try_new(schema.clone(), columns)?;
            }
        }
    }
    flagged.sort_unstable();
    flagged.dedup();
    Ok((batch, rows, flagged))
}

impl SqlPlan {
    /// Runs the query on `batch`, setting aside the rows it fails on: the outputs in row
    /// order and each bad row with its error, as [`crate::isolate`] gives them. Failing
    /// CASTs are found in one pass (this module); anything else by `isolator`'s
    /// bisection. An error that is not about the data fails the call.
    pub fn isolate(&self, batch: &RecordBatch, isolator: &mut Isolator, task: &str) -> Result<Isolated<RecordBatch>> {
        let n = batch.num_rows();
        if isolator.expected_bad(n) == 0 || !self.has_cast_probe() {
            match self.execute(batch.clone(), task) {
                Ok(out) => {
                    isolator.observe(0, n);
                    return Ok((vec![out], Vec::new()));
                }
                Err(e) if e.kind() != ErrorKind::Invalid => return Err(e),
                Err(_) => {}
            }
        }
        if let Some(found) = self.isolate_casts(batch, task)? {
            isolator.observe(found.1.len(), n);
            return Ok(found);
        }
        isolator.run(batch, &mut |b| self.execute(b.clone(), task))
    }

    fn has_cast_probe(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Filter(_, Some(_)) | Step::Project(_, _, Some(_))))
    }

    /// The bad rows by the cast probe; `None` when it cannot tell them all.
    fn isolate_casts(&self, batch: &RecordBatch, task: &str) -> Result<Option<Isolated<RecordBatch>>> {
        if !self.has_cast_probe() {
            return Ok(None);
        }
        let Ok((out, rows, flagged)) = run_checked(&self.steps, batch) else { return Ok(None) };
        let mut bad = Vec::with_capacity(flagged.len());
        for &row in &flagged {
            match self.execute(batch.slice(row as usize, 1), task) {
                // A false alarm: bisection keeps the row's output in its place.
                Ok(_) => return Ok(None),
                Err(e) if e.kind() != ErrorKind::Invalid => return Err(e),
                Err(e) => bad.push((row as usize, e)),
            }
        }
        if flagged.is_empty() {
            return Ok(Some((vec![out], bad)));
        }
        let keep: BooleanArray = rows.values().iter().map(|r| Some(flagged.binary_search(r).is_err())).collect();
        let out = filter_record_batch(&out, &keep).map_err(|e| RuntimeError::arrow(task, e))?;
        Ok(Some((vec![out], bad)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow::array::{BinaryArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};

    fn batch(values: &[Option<&str>]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("offset", DataType::Int64, false),
            Field::new("value", DataType::Binary, true),
        ]));
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(0..values.len() as i64)),
            Arc::new(values.iter().map(|v| v.map(str::as_bytes)).collect::<BinaryArray>()),
        ];
        RecordBatch::try_new(schema, columns).unwrap()
    }

    fn rows(isolated: Isolated<RecordBatch>, schema: arrow::datatypes::SchemaRef) -> (RecordBatch, Vec<usize>) {
        let (outs, bad) = isolated;
        (arrow::compute::concat_batches(&schema, &outs).unwrap(), bad.into_iter().map(|(r, _)| r).collect())
    }

    /// The probe's answer is bisection's, for CASTs in projections and filters, a CAST
    /// in a branch not taken (a false alarm), a failure that is no CAST (division by
    /// zero), NULLs, and batches without poison; whether the isolator expects poison or
    /// not.
    #[test]
    fn the_cast_probe_finds_what_bisection_finds() {
        let n = "CAST(CAST(value AS VARCHAR) AS BIGINT)";
        let queries = [
            format!("SELECT offset, {n} * 2 AS v FROM input"),
            format!("SELECT offset FROM input WHERE {n} % 2 = 0"),
            format!("SELECT offset, {n} AS v FROM input WHERE offset > 1"),
            format!("SELECT CASE WHEN CAST(value AS VARCHAR) LIKE 'x%' THEN 0 ELSE {n} END AS v FROM input"),
            format!("SELECT 12 / {n} AS v FROM input"),
            "SELECT offset FROM input".to_string(),
        ];
        let batches = [
            batch(&[Some("1"), Some("x2"), Some("3"), None, Some("y"), Some("6")]),
            batch(&[Some("1"), Some("2"), Some("0"), Some("4")]),
            batch(&[Some("x"), Some("y")]),
            batch(&[Some("5")]),
            batch(&[]),
        ];
        let first = SqlPlan::plan(&queries[0], batches[0].schema()).unwrap();
        let (_, bad) = first.isolate_casts(&batches[0], "t").unwrap().expect("found by the probe alone");
        assert_eq!(bad.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![1, 4]);
        for q in &queries {
            let plan = SqlPlan::plan(q, batches[0].schema()).unwrap();
            for b in &batches {
                let want =
                    rows(crate::isolate(b, &mut |p| plan.execute(p.clone(), "t")).unwrap(), plan.output_schema());
                for expected in [0.0, 0.5] {
                    let mut isolator = Isolator::default();
                    isolator.observe((expected * 10.0) as usize, 10);
                    let got = rows(plan.isolate(b, &mut isolator, "t").unwrap(), plan.output_schema());
                    assert_eq!(got, want, "{q} on {b:?}, expecting {expected}");
                }
            }
        }
    }

    #[test]
    fn only_a_step_with_a_cast_gets_a_probe() {
        let schema = batch(&[]).schema();
        let with =
            SqlPlan::plan("SELECT CAST(CAST(value AS VARCHAR) AS BIGINT) AS v FROM input", schema.clone()).unwrap();
        let without = SqlPlan::plan("SELECT offset + 1 AS o FROM input", schema).unwrap();
        assert!(with.has_cast_probe());
        assert!(!without.has_cast_probe());
        let (out, rows, flagged) =
            run_checked(&with.steps, &batch(&[Some("1"), Some("x"), None, Some("4"), Some("")])).unwrap();
        assert_eq!(flagged, vec![1, 4]);
        assert_eq!((out.num_rows(), rows.values().to_vec()), (5, vec![0, 1, 2, 3, 4]));
    }
}
