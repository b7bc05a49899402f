//! The SQL operators, planned once by DataFusion against the input schema.
//!
//! A stateless query (`SELECT` with projections, scalar functions, casts, `CASE`,
//! `WHERE`) runs on every batch with Arrow kernels ([`SqlPlan`], [`SqlOperator`]). A
//! query with `GROUP BY` or aggregates is stateful ([`AggregatePlan`]): keyed
//! aggregates, optionally over an event-time window, with the state in the
//! checkpoints (`stateful.rs`). Joins, ordering, limits and `OVER` windows are refused
//! at build time. docs/sql.md lists every form.

mod aggregate;
mod groups;
mod probe;
mod stateful;
mod window;

pub use aggregate::{AggregatePlan, SqlOptions};
pub use stateful::{AggregateOperator, KeyStage, LateRows};
pub use window::WindowSpec;

use std::sync::Arc;

use arrow::array::{Array, BooleanArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use std::collections::HashMap;

use datafusion_common::config::ConfigOptions;
use datafusion_common::{DFSchema, DataFusionError, TableReference};
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::logical_plan::builder::LogicalTableSource;
use datafusion_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion_expr::planner::{ContextProvider, ExprPlanner};
use datafusion_expr::{AggregateUDF, Expr, HigherOrderUDF, LogicalPlan, ScalarUDF, TableSource, WindowUDF};
use datafusion_optimizer::{Analyzer, Optimizer, OptimizerContext};
use datafusion_physical_expr::PhysicalExpr;
use datafusion_sql::parser::DFParserBuilder;
use datafusion_sql::planner::{ParserOptions, SqlToRel};

use crate::channel::Collector;
use crate::error::{Result, RuntimeError};
use crate::operator::Operator;

/// One per-batch step of a planned query, bottom-up.
#[derive(Debug)]
pub(crate) enum Step {
    /// Keep these columns (a projection pushed into the scan).
    Columns(Vec<usize>),
    /// Keep rows where the predicate is true; its CASTs checked, if it has any.
    Filter(Arc<dyn PhysicalExpr>, Option<probe::CastProbe>),
    /// Compute these expressions into a batch of `SchemaRef`; their CASTs checked, if
    /// they have any.
    Project(Vec<Arc<dyn PhysicalExpr>>, SchemaRef, Option<probe::CastProbe>),
}

/// A query planned once: stateless, or stateful (aggregates).
#[derive(Debug)]
pub enum QueryPlan {
    /// Runs on each batch alone.
    Stateless(SqlPlan),
    /// Keeps groups across batches and checkpoints.
    Stateful(AggregatePlan),
}

/// Plans `query` against `input` (the table is called `input`): stateless if it has no
/// `GROUP BY` and no aggregate, stateful otherwise.
pub fn plan_query(query: &str, input: SchemaRef, options: SqlOptions) -> Result<QueryPlan> {
    let ctx = Planner::new(input);
    let analyzed = ctx.analyzed_plan(query).map_err(|e| sql_error(query, e))?;
    let mut post: Vec<&LogicalPlan> = Vec::new();
    let mut node = &analyzed;
    loop {
        match node {
            LogicalPlan::Aggregate(a) => {
                return AggregatePlan::plan(&ctx, query, &post, a, options).map(QueryPlan::Stateful);
            }
            LogicalPlan::Projection(p) => {
                post.push(node);
                node = &p.input;
            }
            LogicalPlan::Filter(f) => {
                post.push(node);
                node = &f.input;
            }
            LogicalPlan::SubqueryAlias(a) => {
                post.push(node);
                node = &a.input;
            }
            LogicalPlan::TableScan(_) => break,
            other => return Err(sql_error(query, refusal(other))),
        }
    }
    if let Some(f) = aggregate::window_call(&analyzed) {
        return Err(sql_error(query, format!("{f}() names an event-time window and belongs in GROUP BY")));
    }
    let plan = ctx.optimize(analyzed).map_err(|e| sql_error(query, e))?;
    let steps = plan_steps(&ctx, query, &plan)?;
    let output: Schema = plan.schema().as_ref().as_arrow().clone();
    Ok(QueryPlan::Stateless(SqlPlan { query: query.to_string(), steps, output: Arc::new(output) }))
}

/// Why a node of a plan is refused, in the user's words.
fn refusal(node: &LogicalPlan) -> String {
    let what = match node {
        LogicalPlan::Sort(_) => "ORDER BY".to_string(),
        LogicalPlan::Limit(_) => "LIMIT".to_string(),
        LogicalPlan::Join(_) => "a join".to_string(),
        LogicalPlan::Window(_) => "a window function with OVER (group by tumble, hop or session instead)".to_string(),
        LogicalPlan::Distinct(_) => "SELECT DISTINCT (write GROUP BY instead)".to_string(),
        LogicalPlan::Union(_) => "UNION".to_string(),
        LogicalPlan::Unnest(_) => "UNNEST".to_string(),
        other => other.display().to_string(),
    };
    format!("{what} is not supported: a query is SELECT ... FROM input [WHERE ...] [GROUP BY ...] [HAVING ...] (docs/sql.md)")
}

/// The per-batch steps of a stateless chain of nodes from `top` down to the scan.
fn plan_steps(ctx: &Planner, query: &str, top: &LogicalPlan) -> Result<Vec<Step>> {
    let mut nodes = Vec::new();
    let mut node = top;
    loop {
        nodes.push(node);
        match node {
            LogicalPlan::Projection(p) => node = &p.input,
            LogicalPlan::Filter(f) => node = &f.input,
            LogicalPlan::SubqueryAlias(a) => node = &a.input,
            LogicalPlan::TableScan(_) => break,
            other => return Err(sql_error(query, refusal(other))),
        }
    }
    let mut steps = Vec::new();
    for node in nodes.into_iter().rev() {
        steps.extend(node_step(ctx, query, node)?);
    }
    Ok(steps)
}

/// The steps of one node: a scan's column pick and filters, a filter, a projection.
fn node_step(ctx: &Planner, query: &str, node: &LogicalPlan) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    match node {
        LogicalPlan::TableScan(scan) => {
            if scan.fetch.is_some() {
                return Err(sql_error(query, "LIMIT is not supported per batch"));
            }
            // Filters pushed into the scan may name columns the projection drops
            // (`SELECT key FROM input WHERE partition = 0`): they run on the whole row,
            // before the columns are picked.
            let table = DFSchema::try_from_qualified_schema(scan.table_name.clone(), &scan.source.schema())
                .map_err(|e| sql_error(query, e))?;
            for f in &scan.filters {
                let e = ctx.physical_expr(f, &table).map_err(|e| sql_error(query, e))?;
                let probe = probe::CastProbe::plan(std::slice::from_ref(&e));
                steps.push(Step::Filter(e, probe));
            }
            if let Some(cols) = &scan.projection {
                steps.push(Step::Columns(cols.clone()));
            }
        }
        LogicalPlan::Filter(f) => {
            let e = ctx.physical_expr(&f.predicate, f.input.schema()).map_err(|e| sql_error(query, e))?;
            let probe = probe::CastProbe::plan(std::slice::from_ref(&e));
            steps.push(Step::Filter(e, probe));
        }
        LogicalPlan::Projection(p) => {
            let exprs = p
                .expr
                .iter()
                .map(|e| ctx.physical_expr(e, p.input.schema()))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| sql_error(query, e))?;
            let schema: Schema = p.schema.as_ref().as_arrow().clone();
            let probe = probe::CastProbe::plan(&exprs);
            steps.push(Step::Project(exprs, Arc::new(schema), probe));
        }
        LogicalPlan::SubqueryAlias(_) => {}
        other => return Err(sql_error(query, refusal(other))),
    }
    Ok(steps)
}

/// Runs `steps` on `batch`; errors name `query` and `task`.
pub(crate) fn run_steps(steps: &[Step], query: &str, batch: RecordBatch, task: &str) -> Result<RecordBatch> {
    let err = |e: DataFusionError| {
        RuntimeError::task_message(task, crate::ErrorKind::Invalid, format!("query {query:?} failed on a batch: {e}"))
    };
    let mut batch = batch;
    for step in steps {
        batch = match step {
            Step::Columns(cols) => batch.project(cols).map_err(|e| RuntimeError::arrow(task, e))?,
            Step::Filter(predicate, _) => {
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
            Step::Project(exprs, schema, _) => {
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

/// A stateless query planned once.
#[derive(Debug)]
pub struct SqlPlan {
    query: String,
    steps: Vec<Step>,
    output: SchemaRef,
}

pub(crate) fn sql_error(query: &str, message: impl ToString) -> RuntimeError {
    RuntimeError::Sql { query: query.to_string(), message: message.to_string() }
}

impl SqlPlan {
    /// Plans a stateless `query` against `input` (the table is called `input`).
    pub fn plan(query: &str, input: SchemaRef) -> Result<Self> {
        match plan_query(query, input, SqlOptions::default())? {
            QueryPlan::Stateless(plan) => Ok(plan),
            QueryPlan::Stateful(_) => Err(sql_error(
                query,
                "GROUP BY and aggregates keep state across batches: plan with plan_query (JobBuilder's .sql does)",
            )),
        }
    }

    /// The schema of the query's output.
    pub fn output_schema(&self) -> SchemaRef {
        self.output.clone()
    }

    /// Runs the query on one batch.
    pub fn execute(&self, batch: RecordBatch, task: &str) -> Result<RecordBatch> {
        run_steps(&self.steps, &self.query, batch, task)
    }
}

/// What DataFusion's SQL planner asks of a session, for the one table `input`: the
/// scalar and aggregate functions DataFusion ships, and its default analyzer and
/// optimizer rules. Planning needs no execution engine, so the runtime depends on
/// DataFusion's planning crates only (decision 0009).
pub(crate) struct Planner {
    table: Arc<dyn TableSource>,
    scalars: HashMap<String, Arc<ScalarUDF>>,
    aggregates: HashMap<String, Arc<AggregateUDF>>,
    expr_planners: Vec<Arc<dyn ExprPlanner>>,
    options: ConfigOptions,
    props: ExecutionProps,
}

impl Planner {
    fn new(input: SchemaRef) -> Self {
        let mut scalars = HashMap::new();
        for f in datafusion_functions::all_default_functions().into_iter().chain(window::window_functions()) {
            for name in std::iter::once(f.name()).chain(f.aliases().iter().map(String::as_str)) {
                scalars.insert(name.to_lowercase(), f.clone());
            }
        }
        let mut aggregates = HashMap::new();
        for f in datafusion_functions_aggregate::all_default_aggregate_functions() {
            for name in std::iter::once(f.name()).chain(f.aliases().iter().map(String::as_str)) {
                aggregates.insert(name.to_lowercase(), f.clone());
            }
        }
        let expr_planners: Vec<Arc<dyn ExprPlanner>> = vec![
            Arc::new(datafusion_functions::core::planner::CoreFunctionPlanner::default()),
            Arc::new(datafusion_functions::datetime::planner::DatetimeFunctionPlanner),
            Arc::new(datafusion_functions::unicode::planner::UnicodeFunctionPlanner),
            Arc::new(datafusion_functions_aggregate::planner::AggregateFunctionPlanner),
        ];
        Self {
            table: Arc::new(LogicalTableSource::new(input)),
            scalars,
            aggregates,
            expr_planners,
            options: ConfigOptions::default(),
            props: ExecutionProps::new(),
        }
    }

    /// Parses, plans and analyzes (type coercion) `query`.
    fn analyzed_plan(&self, query: &str) -> std::result::Result<LogicalPlan, DataFusionError> {
        let mut statements = DFParserBuilder::new(query).build()?.parse_statements()?;
        if statements.len() != 1 {
            return Err(DataFusionError::Plan(format!("one SQL statement expected, found {}", statements.len())));
        }
        let statement = statements.pop_front().ok_or_else(|| DataFusionError::Plan("no statement".into()))?;
        let options = ParserOptions::from(&self.options.sql_parser);
        let plan = SqlToRel::new_with_options(self, options).statement_to_plan(statement)?;
        Analyzer::new().execute_and_check(plan, &self.options, |_, _| {})
    }

    /// DataFusion's default logical optimisations (for stateless plans).
    fn optimize(&self, plan: LogicalPlan) -> std::result::Result<LogicalPlan, DataFusionError> {
        Optimizer::new().optimize(plan, &OptimizerContext::new(), |_, _| {})
    }

    /// The physical form of `expr` over `schema`.
    pub(crate) fn physical_expr(
        &self,
        expr: &Expr,
        schema: &DFSchema,
    ) -> std::result::Result<Arc<dyn PhysicalExpr>, DataFusionError> {
        datafusion_physical_expr::create_physical_expr(expr, schema, &self.props, &PhysicalPlanningContext::default())
    }
}

impl ContextProvider for Planner {
    fn get_table_source(&self, name: TableReference) -> std::result::Result<Arc<dyn TableSource>, DataFusionError> {
        if name.table() == "input" && name.schema().is_none() {
            Ok(self.table.clone())
        } else {
            Err(DataFusionError::Plan(format!("table '{name}' not found: the SQL operator reads the table `input`")))
        }
    }

    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        &self.expr_planners
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.scalars.get(name).cloned()
    }

    fn get_higher_order_meta(&self, _name: &str) -> Option<Arc<HigherOrderUDF>> {
        None
    }

    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.aggregates.get(name).cloned()
    }

    fn get_window_meta(&self, _name: &str) -> Option<Arc<WindowUDF>> {
        None
    }

    fn get_variable_type(&self, _variable_names: &[String]) -> Option<arrow::datatypes::DataType> {
        None
    }

    fn options(&self) -> &ConfigOptions {
        &self.options
    }

    fn udf_names(&self) -> Vec<String> {
        self.scalars.keys().cloned().collect()
    }

    fn udaf_names(&self) -> Vec<String> {
        self.aggregates.keys().cloned().collect()
    }

    fn udwf_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn higher_order_function_names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Runs a [`SqlPlan`] on every batch.
#[derive(Debug)]
pub struct SqlOperator {
    plan: Arc<SqlPlan>,
    task: String,
    dead_letters: Option<crate::DeadLetters>,
    /// Dead letters of the open checkpoint, written at its barrier (or once many).
    pending: Vec<crate::DeadLetter>,
    isolator: crate::Isolator,
}

impl SqlOperator {
    /// An operator running `plan` for the subtask `ctx`. With the job's dead letters, a
    /// batch the query fails on is split to find the rows it fails on; they are
    /// dead-lettered and the rest go on. Without, the batch fails the attempt.
    pub fn new(plan: Arc<SqlPlan>, ctx: &crate::SubtaskContext) -> Self {
        Self {
            plan,
            task: ctx.task_name(),
            dead_letters: ctx.dead_letters.clone(),
            pending: Vec::new(),
            isolator: crate::Isolator::default(),
        }
    }
}

#[async_trait]
impl Operator for SqlOperator {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let Some(letters) = &self.dead_letters else {
            let result = self.plan.execute(batch, &self.task)?;
            return out.emit(result).await;
        };
        let (plan, task) = (&self.plan, &self.task);
        let (outputs, bad) = plan.isolate(&batch, &mut self.isolator, task)?;
        dead_letter_rows(letters, &mut self.pending, &batch, bad, task, out.checkpoint_id()).await?;
        // One batch downstream, as without poison: a sink writes once per batch.
        let mut outputs = outputs;
        let joined = match outputs.len() {
            1 => outputs.pop().unwrap_or_else(|| RecordBatch::new_empty(plan.output.clone())),
            _ => arrow::compute::concat_batches(&plan.output, &outputs).map_err(|e| RuntimeError::arrow(task, e))?,
        };
        out.emit(joined).await
    }

    async fn snapshot_state(
        &mut self,
        checkpoint_id: shareflow_checkpoint::CheckpointId,
        _out: &mut Collector,
    ) -> Result<crate::StateItems> {
        flush_dead_letters(self.dead_letters.as_ref(), &mut self.pending, checkpoint_id).await?;
        Ok(Vec::new())
    }
}

/// Dead letters an operator holds at most before it writes them ahead of its barrier.
const DEAD_LETTERS_HELD: usize = 1_000;

/// Adds the dead letters of the rows of `batch` a query failed on to `pending`, the
/// operator's for checkpoint `checkpoint_id`: written at the barrier, one write per
/// checkpoint (a journaled append each), or at once past [`DEAD_LETTERS_HELD`].
pub(crate) async fn dead_letter_rows(
    letters: &crate::DeadLetters,
    pending: &mut Vec<crate::DeadLetter>,
    batch: &RecordBatch,
    bad: Vec<(usize, RuntimeError)>,
    task: &str,
    checkpoint_id: shareflow_checkpoint::CheckpointId,
) -> Result<()> {
    let cause = crate::DeadLetterCause::Sql;
    pending.extend(bad.into_iter().map(|(row, e)| crate::DeadLetter::from_row(batch, row, cause, e.to_string(), task)));
    if pending.len() >= DEAD_LETTERS_HELD {
        letters.write(checkpoint_id, std::mem::take(pending)).await?;
    }
    Ok(())
}

/// Writes `pending` into T(`checkpoint_id`): at barrier n, what checkpoint n held.
pub(crate) async fn flush_dead_letters(
    letters: Option<&crate::DeadLetters>,
    pending: &mut Vec<crate::DeadLetter>,
    checkpoint_id: shareflow_checkpoint::CheckpointId,
) -> Result<()> {
    match letters {
        Some(letters) if !pending.is_empty() => letters.write(checkpoint_id, std::mem::take(pending)).await,
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};

    use super::window::WindowSpec;
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
    fn where_on_a_column_the_select_drops() {
        let (schema, batch) = input();
        for query in [
            "SELECT name FROM input WHERE id % 2 = 0",
            "SELECT upper(name) AS up FROM input WHERE id > 1 AND name IS NOT NULL",
        ] {
            let plan = SqlPlan::plan(query, schema.clone()).unwrap();
            let out = plan.execute(batch.clone(), "t").unwrap();
            let names: Vec<Option<&str>> =
                out.column(0).as_any().downcast_ref::<StringArray>().unwrap().iter().collect();
            let want = if query.contains("upper") { vec![Some("C"), Some("D")] } else { vec![None, Some("d")] };
            assert_eq!(names, want, "{query}");
        }
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
            ("SELECT id FROM input ORDER BY id", "not supported"),
            ("SELEC id FROM input", "SELEC"),
        ] {
            let err = SqlPlan::plan(query, schema.clone()).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Invalid);
            let msg = err.to_string();
            assert!(msg.contains(needle) && msg.contains(query), "{query}: {msg}");
        }
    }

    fn events() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("raw", DataType::Binary, true),
            Field::new("timestamp", DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, None), false),
        ]))
    }

    #[test]
    fn stateful_queries_plan_with_their_window_and_keys() {
        let cases = [
            ("SELECT name, count(*) FROM input GROUP BY name", None, 1),
            (
                "SELECT name, tumble(timestamp, INTERVAL '10 seconds') AS w, sum(id) FROM input GROUP BY 1, 2",
                Some(WindowSpec::Tumble { size: 10_000 }),
                1,
            ),
            (
                "SELECT hop(timestamp, INTERVAL '5 seconds', INTERVAL '1 minute'), avg(id) FROM input \
                 GROUP BY hop(timestamp, INTERVAL '5 seconds', INTERVAL '1 minute')",
                Some(WindowSpec::Hop { slide: 5_000, size: 60_000 }),
                0,
            ),
            (
                "SELECT name, id % 3, count(DISTINCT id) FROM input WHERE id > 0 \
                 GROUP BY name, id % 3, session(id, INTERVAL '30 seconds') HAVING count(*) > 1",
                Some(WindowSpec::Session { gap: 30_000 }),
                2,
            ),
        ];
        for (query, window, keys) in cases {
            match plan_query(query, events(), SqlOptions::default()) {
                Ok(QueryPlan::Stateful(p)) => {
                    assert_eq!((p.window(), p.key_columns().len()), (window, keys), "{query}");
                }
                Ok(QueryPlan::Stateless(_)) => panic!("{query}: planned stateless"),
                Err(e) => panic!("{query}: {e}"),
            }
        }
    }

    #[test]
    fn refused_stateful_queries_name_the_query_and_the_clause() {
        for (query, needle) in [
            ("SELECT a.id FROM input a JOIN input b ON a.id = b.id", "join"),
            ("SELECT name, count(*) FROM input GROUP BY name ORDER BY name", "ORDER BY"),
            ("SELECT name, count(*) FROM input GROUP BY name LIMIT 3", "LIMIT"),
            ("SELECT id, row_number() OVER (ORDER BY id) FROM input", "OVER"),
            ("SELECT DISTINCT name FROM input", "DISTINCT"),
            ("SELECT count(*) FROM input GROUP BY tumble(INTERVAL '1 second')", "without event time"),
            ("SELECT count(*) FROM input GROUP BY tumble(name, INTERVAL '1 second')", "event time"),
            ("SELECT count(*) FROM input GROUP BY tumble(timestamp, INTERVAL '1 month')", "months"),
            (
                "SELECT count(*) FROM input GROUP BY hop(timestamp, INTERVAL '1 minute', INTERVAL '5 seconds')",
                "slide",
            ),
            ("SELECT nope, count(*) FROM input GROUP BY nope", "nope"),
            ("SELECT name, sum(raw) FROM input GROUP BY name", "sum"),
            ("SELECT tumble(timestamp, INTERVAL '1 second') FROM input", "GROUP BY"),
            (
                "SELECT count(*) FROM input GROUP BY tumble(timestamp, INTERVAL '1 second'), session(timestamp, INTERVAL '1 second')",
                "two windows",
            ),
        ] {
            let err = match plan_query(query, events(), SqlOptions::default()) {
                Err(e) => e,
                Ok(_) => panic!("{query}: planned"),
            };
            assert_eq!(err.kind(), crate::ErrorKind::Invalid, "{query}");
            let msg = err.to_string();
            assert!(msg.contains(needle) && msg.contains(query), "{query}: {msg}");
        }
    }
}
