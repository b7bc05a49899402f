//! The SQL operator: a stateless query planned once by DataFusion against the input
//! schema, then run on every batch with Arrow kernels.
//!
//! Supported: `SELECT` with projections, scalar functions, casts, `CASE`, and `WHERE`.
//! Aggregations, joins, ordering, limits and windows need state across batches and are
//! refused at build time.

use std::sync::Arc;

use arrow::array::{Array, BooleanArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;

use crate::channel::Collector;
use crate::error::{Result, RuntimeError};
use crate::operator::Operator;

/// One per-batch step of a planned query, bottom-up.
#[derive(Debug)]
enum Step {
    /// Keep these columns (a projection pushed into the scan).
    Columns(Vec<usize>),
    /// Keep rows where the predicate is true.
    Filter(Arc<dyn PhysicalExpr>),
    /// Compute these expressions into a batch of `SchemaRef`.
    Project(Vec<Arc<dyn PhysicalExpr>>, SchemaRef),
}

/// A query planned once.
#[derive(Debug)]
pub struct SqlPlan {
    query: String,
    steps: Vec<Step>,
    output: SchemaRef,
}

fn sql_error(query: &str, message: impl ToString) -> RuntimeError {
    RuntimeError::Sql { query: query.to_string(), message: message.to_string() }
}

impl SqlPlan {
    /// Plans `query` against `input` (the table is called `input`).
    pub fn plan(query: &str, input: SchemaRef) -> Result<Self> {
        let ctx = SessionContext::new();
        let table = MemTable::try_new(input.clone(), vec![vec![]]).map_err(|e| sql_error(query, e))?;
        ctx.register_table("input", Arc::new(table)).map_err(|e| sql_error(query, e))?;
        let plan = futures::executor::block_on(async {
            let df = ctx.sql(query).await?;
            df.into_optimized_plan()
        })
        .map_err(|e| sql_error(query, e))?;
        let mut nodes = Vec::new();
        let mut node = &plan;
        loop {
            nodes.push(node);
            match node {
                LogicalPlan::Projection(p) => node = &p.input,
                LogicalPlan::Filter(f) => node = &f.input,
                LogicalPlan::SubqueryAlias(a) => node = &a.input,
                LogicalPlan::TableScan(_) => break,
                other => {
                    return Err(sql_error(
                        query,
                        format!(
                            "{} is not supported: the SQL operator runs stateless SELECT ... WHERE per batch",
                            other.display()
                        ),
                    ))
                }
            }
        }
        let mut steps = Vec::new();
        for node in nodes.into_iter().rev() {
            match node {
                LogicalPlan::TableScan(scan) => {
                    if scan.fetch.is_some() {
                        return Err(sql_error(query, "LIMIT is not supported per batch"));
                    }
                    if let Some(cols) = &scan.projection {
                        steps.push(Step::Columns(cols.clone()));
                    }
                    for f in &scan.filters {
                        let e = ctx
                            .create_physical_expr(f.clone(), scan.projected_schema.as_ref())
                            .map_err(|e| sql_error(query, e))?;
                        steps.push(Step::Filter(e));
                    }
                }
                LogicalPlan::Filter(f) => {
                    let e = ctx
                        .create_physical_expr(f.predicate.clone(), f.input.schema())
                        .map_err(|e| sql_error(query, e))?;
                    steps.push(Step::Filter(e));
                }
                LogicalPlan::Projection(p) => {
                    let exprs = p
                        .expr
                        .iter()
                        .map(|e| ctx.create_physical_expr(e.clone(), p.input.schema()))
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(|e| sql_error(query, e))?;
                    let schema: Schema = p.schema.as_ref().as_arrow().clone();
                    steps.push(Step::Project(exprs, Arc::new(schema)));
                }
                _ => {}
            }
        }
        let output: Schema = plan.schema().as_ref().as_arrow().clone();
        Ok(Self { query: query.to_string(), steps, output: Arc::new(output) })
    }

    /// The schema of the query's output.
    pub fn output_schema(&self) -> SchemaRef {
        self.output.clone()
    }

    /// Runs the query on one batch.
    pub fn execute(&self, batch: RecordBatch, task: &str) -> Result<RecordBatch> {
        let err = |e: datafusion::error::DataFusionError| {
            RuntimeError::task_message(
                task,
                crate::ErrorKind::Invalid,
                format!("query {:?} failed on a batch: {e}", self.query),
            )
        };
        let mut batch = batch;
        for step in &self.steps {
            batch = match step {
                Step::Columns(cols) => batch.project(cols).map_err(|e| RuntimeError::arrow(task, e))?,
                Step::Filter(predicate) => {
                    let mask = predicate.evaluate(&batch).map_err(err)?.into_array(batch.num_rows()).map_err(err)?;
                    let mask = mask.as_any().downcast_ref::<BooleanArray>().ok_or_else(|| {
                        RuntimeError::task_message(task, crate::ErrorKind::Invalid, "WHERE did not give a boolean")
                    })?;
                    if mask.null_count() == 0 && mask.true_count() == batch.num_rows() {
                        batch
                    } else {
                        filter_record_batch(&batch, mask).map_err(|e| RuntimeError::arrow(task, e))?
                    }
                }
                Step::Project(exprs, schema) => {
                    let columns = exprs
                        .iter()
                        .map(|e| e.evaluate(&batch).and_then(|v| v.into_array(batch.num_rows())))
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(err)?;
                    RecordBatch::try_new(schema.clone(), columns).map_err(|e| RuntimeError::arrow(task, e))?
                }
            };
        }
        Ok(batch)
    }
}

/// Runs a [`SqlPlan`] on every batch.
#[derive(Debug)]
pub struct SqlOperator {
    plan: Arc<SqlPlan>,
    task: String,
}

impl SqlOperator {
    /// An operator running `plan`.
    pub fn new(plan: Arc<SqlPlan>, task: String) -> Self {
        Self { plan, task }
    }
}

#[async_trait]
impl Operator for SqlOperator {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let result = self.plan.execute(batch, &self.task)?;
        out.emit(result).await
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field};

    use super::*;

    fn input() -> (SchemaRef, RecordBatch) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c"), Some("d")])),
            ],
        )
        .unwrap();
        (schema, batch)
    }

    #[test]
    fn select_where_with_functions() {
        let (schema, batch) = input();
        let plan =
            SqlPlan::plan("SELECT id * 10 AS big, upper(name) AS up FROM input WHERE id % 2 = 0", schema).unwrap();
        assert_eq!(plan.output_schema().field(0).name(), "big");
        let out = plan.execute(batch, "t").unwrap();
        assert_eq!(out.num_rows(), 2);
        let big = out.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(big.values(), &[20, 40]);
        let up = out.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((up.is_null(0), up.value(1)), (true, "D"));
    }

    #[test]
    fn errors_carry_datafusion_message_and_query() {
        let (schema, _) = input();
        for (query, needle) in [
            ("SELECT nope FROM input", "nope"),
            ("SELECT id + 'x' FROM input", "SELECT id + 'x' FROM input"),
            ("SELECT count(*) FROM input", "not supported"),
            ("SELECT id FROM input ORDER BY id", "not supported"),
            ("SELEC id FROM input", "SELEC"),
        ] {
            let err = SqlPlan::plan(query, schema.clone()).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Invalid);
            let msg = err.to_string();
            assert!(msg.contains(needle) && msg.contains(query), "{query}: {msg}");
        }
    }
}
