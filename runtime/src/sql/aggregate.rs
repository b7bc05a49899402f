//! Plans a stateful query: `SELECT ... FROM input [WHERE ...] GROUP BY ... [HAVING ...]`
//! with DataFusion's aggregate functions, optionally over an event-time window
//! (`tumble`, `hop`, `session` in `GROUP BY`). docs/sql.md has every supported and every
//! refused form.
//!
//! The plan runs as two operators: the key stage (stateless, before the exchange)
//! evaluates the group keys, the event time and the aggregates' arguments into the
//! exchange schema (`__k0..`, `__t`, `__a0..`); rows are exchanged by the hash of the
//! keys; the aggregate operator (`stateful.rs`) keeps the groups.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_common::DataFusionError;
use datafusion_expr::{Expr, LogicalPlan};
use datafusion_physical_expr::aggregate::{AggregateExprBuilder, AggregateFunctionExpr};
use datafusion_physical_expr::expressions::Column;
use datafusion_physical_expr::PhysicalExpr;

use super::window::{interval_ms, WindowSpec, WINDOW_FUNCTIONS};
use super::{plan_steps, sql_error, Planner, Step};
use crate::error::Result;

/// Options of a stateful query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlOptions {
    /// How far behind the newest event time a row may be and still count: the
    /// watermark is the minimum over the inputs of (the newest event time seen minus
    /// this). A window is emitted once the watermark passes its end; a row whose
    /// windows were all emitted is late, counted and dropped.
    pub allowed_lateness: std::time::Duration,
    /// How long (processing time) an input of the aggregate may send no rows before it
    /// is idle and stops holding the watermark back (Flink's `withIdleness`). Until
    /// then it holds the watermark at its last value, however briefly it paused; one
    /// with no rows yet since it started holds it where it is.
    pub idle_timeout: std::time::Duration,
    /// The input column whose values name independent streams of event time: a share
    /// source's `partition` (the default). A subtask of the key stage holds the
    /// watermark at the slowest stream it had rows of within the idle timeout, not at
    /// its newest row: a share group hands one subtask the records of several
    /// partitions, one of them possibly far behind the others (after a restart, say).
    /// An input without the column is one stream.
    pub stream_column: &'static str,
}

impl Default for SqlOptions {
    fn default() -> Self {
        Self {
            allowed_lateness: std::time::Duration::from_secs(5),
            idle_timeout: std::time::Duration::from_secs(10),
            stream_column: "partition",
        }
    }
}

/// A planned stateful query.
#[derive(Debug)]
pub struct AggregatePlan {
    pub(crate) query: String,
    /// Stateless steps below the aggregate (WHERE, projections), over `input`.
    pub(crate) pre: Vec<Step>,
    /// Group keys other than the window, over the aggregate's input.
    pub(crate) keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The event time (ms or a timestamp), for a window.
    pub(crate) time: Option<Arc<dyn PhysicalExpr>>,
    /// Every aggregate's arguments, in order, over the aggregate's input.
    pub(crate) args: Vec<Arc<dyn PhysicalExpr>>,
    /// What the key stage sends to the aggregate operator.
    pub(crate) exchange: SchemaRef,
    pub(crate) window: Option<WindowSpec>,
    /// The window's position among the group expressions.
    pub(crate) window_position: usize,
    /// The aggregates, their arguments being columns of `exchange`.
    pub(crate) aggregates: Vec<Arc<AggregateFunctionExpr>>,
    /// The aggregate's output: group expressions, then aggregates.
    pub(crate) aggregate_schema: SchemaRef,
    /// Stateless steps above the aggregate (HAVING, the SELECT list).
    pub(crate) post: Vec<Step>,
    pub(crate) output: SchemaRef,
    pub(crate) lateness_ms: i64,
    pub(crate) idle_timeout: std::time::Duration,
    pub(crate) stream_column: &'static str,
}

/// The name of the exchange's i-th key column.
pub(crate) fn key_column(i: usize) -> String {
    format!("__k{i}")
}

/// The exchange's event-time column.
pub(crate) const TIME_COLUMN: &str = "__t";

impl AggregatePlan {
    /// The schema of the query's output.
    pub fn output_schema(&self) -> SchemaRef {
        self.output.clone()
    }

    /// The exchange's key column names (the hash of these routes a row).
    pub fn key_columns(&self) -> Vec<String> {
        (0..self.keys.len()).map(key_column).collect()
    }

    /// The window, if the query has one.
    pub fn window(&self) -> Option<WindowSpec> {
        self.window
    }

    /// What a snapshot of this query's state holds: the window, the keys' types, the
    /// aggregates and their state fields. A restore refuses state of another layout.
    pub fn state_layout(&self) -> String {
        let keys: Vec<String> = self.keys_types().iter().map(|t| t.to_string()).collect();
        let aggs: Vec<String> = self
            .aggregates
            .iter()
            .map(|a| {
                let fields = a.state_fields().map(|f| f.iter().map(|f| f.data_type().to_string()).collect::<Vec<_>>());
                format!(
                    "{}{} {:?}",
                    a.fun().name(),
                    if a.is_distinct() { " distinct" } else { "" },
                    fields.unwrap_or_default()
                )
            })
            .collect();
        format!(
            "window {}; keys [{}]; aggregates [{}]",
            self.window.map_or("none".to_string(), |w| w.describe()),
            keys.join(", "),
            aggs.join(", ")
        )
    }

    pub(crate) fn keys_types(&self) -> Vec<DataType> {
        (0..self.keys.len()).map(|i| self.exchange.field(i).data_type().clone()).collect()
    }

    /// Plans `aggregate` (with `post` the nodes above it, top first) of `query`.
    pub(crate) fn plan(
        ctx: &Planner,
        query: &str,
        post_nodes: &[&LogicalPlan],
        aggregate: &datafusion_expr::logical_plan::Aggregate,
        options: SqlOptions,
    ) -> Result<Self> {
        let err = |m: String| sql_error(query, m);
        let df = |e: DataFusionError| sql_error(query, e);
        let pre = plan_steps(ctx, query, &aggregate.input)?;
        let input = aggregate.input.schema();
        let Groups { keys, key_fields, window, window_position, time } = plan_groups(ctx, query, aggregate)?;
        let mut fields = key_fields;
        if time.is_some() {
            fields.push(Field::new(TIME_COLUMN, DataType::Int64, true));
        }
        let mut args = Vec::new();
        let mut arg_columns: Vec<Vec<(String, usize)>> = Vec::new();
        for expr in &aggregate.aggr_expr {
            let (f, _) = aggregate_function(expr).map_err(err)?;
            let mut mine = Vec::new();
            for a in &f.params.args {
                if contains_window(a) {
                    return Err(err(format!("{a}: window functions belong in GROUP BY, not in an aggregate")));
                }
                let e = ctx.physical_expr(a, input).map_err(df)?;
                let name = format!("__a{}", args.len());
                let ty = e.data_type(input.as_arrow()).map_err(df)?;
                fields.push(Field::new(&name, ty, e.nullable(input.as_arrow()).map_err(df)?));
                mine.push((name, fields.len() - 1));
                args.push(e);
            }
            arg_columns.push(mine);
        }
        let exchange = Arc::new(Schema::new(fields));
        let aggregate_schema: SchemaRef = Arc::new(aggregate.schema.as_ref().as_arrow().clone());
        let mut aggregates = Vec::new();
        for (i, (expr, columns)) in aggregate.aggr_expr.iter().zip(arg_columns).enumerate() {
            let (f, _) = aggregate_function(expr).map_err(err)?;
            let args: Vec<Arc<dyn PhysicalExpr>> =
                columns.into_iter().map(|(n, i)| Arc::new(Column::new(&n, i)) as Arc<dyn PhysicalExpr>).collect();
            let name = aggregate_schema.field(aggregate.group_expr.len() + i).name().clone();
            let built = AggregateExprBuilder::new(f.func.clone(), args)
                .schema(exchange.clone())
                .alias(name)
                .with_distinct(f.params.distinct)
                .build()
                .map_err(df)?;
            aggregates.push(Arc::new(built));
        }
        let mut post = Vec::new();
        for node in post_nodes.iter().rev() {
            post.extend(plan_steps_of_node(ctx, query, node)?);
        }
        let output =
            Arc::new(post_nodes.first().map_or(aggregate_schema.as_ref().clone(), |n| n.schema().as_arrow().clone()));
        let lateness_ms = i64::try_from(options.allowed_lateness.as_millis()).unwrap_or(i64::MAX);
        Ok(Self {
            query: query.to_string(),
            pre,
            keys,
            time,
            args,
            exchange,
            window,
            window_position,
            aggregates,
            aggregate_schema,
            post,
            output,
            lateness_ms,
            idle_timeout: options.idle_timeout,
            stream_column: options.stream_column,
        })
    }
}

/// What `GROUP BY` holds: the keys, and the window with its event time, if any.
struct Groups {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    key_fields: Vec<Field>,
    window: Option<WindowSpec>,
    window_position: usize,
    time: Option<Arc<dyn PhysicalExpr>>,
}

fn plan_groups(ctx: &Planner, query: &str, aggregate: &datafusion_expr::logical_plan::Aggregate) -> Result<Groups> {
    let err = |m: String| sql_error(query, m);
    let df = |e: DataFusionError| sql_error(query, e);
    let input = aggregate.input.schema();
    let mut keys = Vec::new();
    let mut key_fields = Vec::new();
    let mut window = None;
    let mut window_position = 0;
    let mut time = None;
    for (position, expr) in aggregate.group_expr.iter().enumerate() {
        let inner = match expr {
            Expr::Alias(a) => a.expr.as_ref(),
            e => e,
        };
        match inner {
            Expr::ScalarFunction(f) if WINDOW_FUNCTIONS.contains(&f.func.name()) => {
                if window.is_some() {
                    return Err(err("GROUP BY names two windows; a query groups by at most one".into()));
                }
                let (spec, time_expr) = window_of(f.func.name(), &f.args).map_err(err)?;
                let t = ctx.physical_expr(time_expr, input).map_err(df)?;
                let ty = t.data_type(input.as_arrow()).map_err(df)?;
                if !matches!(ty, DataType::Timestamp(_, _) | DataType::Int64 | DataType::Date32 | DataType::Date64) {
                    return Err(err(format!(
                        "{}(): the event time {time_expr} is {ty}; give a timestamp column (such as `timestamp`) or \
                         BIGINT milliseconds since the Unix epoch",
                        f.func.name()
                    )));
                }
                window = Some(spec);
                window_position = position;
                time = Some(t);
            }
            other => {
                if contains_window(other) {
                    return Err(err(format!("{other}: a window function must be a GROUP BY item of its own")));
                }
                let e = ctx.physical_expr(other, input).map_err(df)?;
                let ty = e.data_type(input.as_arrow()).map_err(df)?;
                let nullable = e.nullable(input.as_arrow()).map_err(df)?;
                key_fields.push(Field::new(key_column(keys.len()), ty, nullable));
                keys.push(e);
            }
        }
    }
    Ok(Groups { keys, key_fields, window, window_position, time })
}

/// The steps of one node above the aggregate (a projection or HAVING).
fn plan_steps_of_node(ctx: &Planner, query: &str, node: &LogicalPlan) -> Result<Vec<Step>> {
    super::node_step(ctx, query, node).map(|s| s.into_iter().collect())
}

fn aggregate_function(expr: &Expr) -> std::result::Result<(&datafusion_expr::expr::AggregateFunction, String), String> {
    match expr {
        Expr::Alias(a) => aggregate_function(&a.expr).map(|(f, _)| (f, a.name.clone())),
        Expr::AggregateFunction(f) => {
            if f.params.filter.is_some() {
                return Err(format!("{expr}: FILTER (WHERE ...) on an aggregate is not supported; use WHERE"));
            }
            if !f.params.order_by.is_empty() {
                return Err(format!("{expr}: ORDER BY inside an aggregate is not supported"));
            }
            Ok((f, expr.schema_name().to_string()))
        }
        other => Err(format!("{other} is not an aggregate function call")),
    }
}

/// The name of a window function that `plan` calls anywhere, if any.
pub(crate) fn window_call(plan: &LogicalPlan) -> Option<String> {
    let mut found = None;
    let _ = plan.apply(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if WINDOW_FUNCTIONS.contains(&f.func.name()) {
                        found = Some(f.func.name().to_string());
                    }
                }
                Ok(datafusion_common::tree_node::TreeNodeRecursion::Continue)
            })
        })
    });
    found
}

fn contains_window(expr: &Expr) -> bool {
    let mut found = false;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e {
            if WINDOW_FUNCTIONS.contains(&f.func.name()) {
                found = true;
            }
        }
        Ok(datafusion_common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

/// The window of `tumble(time, size)`, `hop(time, slide, size)` or `session(time, gap)`.
fn window_of<'a>(name: &str, args: &'a [Expr]) -> std::result::Result<(WindowSpec, &'a Expr), String> {
    let usage = match name {
        "tumble" => "tumble(time, INTERVAL '10 seconds')",
        "hop" => "hop(time, INTERVAL '5 seconds' (slide), INTERVAL '1 minute' (size))",
        _ => "session(time, INTERVAL '30 seconds' (gap))",
    };
    let expected = if name == "hop" { 3 } else { 2 };
    if args.len() != expected || matches!(args.first(), Some(Expr::Literal(..))) {
        return Err(format!(
            "{name}() needs an event time and {} interval(s): {usage}; a window without event time is refused",
            expected - 1
        ));
    }
    let spec = match name {
        "tumble" => WindowSpec::Tumble { size: interval_ms(&args[1], name)? },
        "hop" => {
            let (slide, size) = (interval_ms(&args[1], name)?, interval_ms(&args[2], name)?);
            if slide > size {
                return Err(format!("hop(): the slide ({slide} ms) is longer than the size ({size} ms); rows would fall between windows"));
            }
            WindowSpec::Hop { slide, size }
        }
        _ => WindowSpec::Session { gap: interval_ms(&args[1], name)? },
    };
    Ok((spec, &args[0]))
}

use datafusion_common::tree_node::TreeNode;
