//! Event-time windows of the stateful SQL operator: the functions a query names in its
//! `GROUP BY` (`tumble`, `hop`, `session`), and the pure rules that assign an event
//! time to windows. Times are milliseconds since the Unix epoch.

use std::sync::Arc;

use arrow::datatypes::{DataType, TimeUnit};
use datafusion_common::{DataFusionError, ScalarValue};
use datafusion_expr::{ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

/// The window a stateful query groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSpec {
    /// `tumble(time, size)`: windows `[k*size, (k+1)*size)`; a row is in one.
    Tumble {
        /// Window length, ms.
        size: i64,
    },
    /// `hop(time, slide, size)`: windows of `size` starting every `slide`; a row is in
    /// about `size / slide` of them.
    Hop {
        /// Distance between window starts, ms.
        slide: i64,
        /// Window length, ms.
        size: i64,
    },
    /// `session(time, gap)`: per key, rows closer than `gap` to each other share a
    /// window `[first, last + gap)`.
    Session {
        /// The inactivity gap that ends a session, ms.
        gap: i64,
    },
}

impl WindowSpec {
    /// The starts of the tumbling or hopping windows holding `t`, newest first (empty
    /// for sessions, which are assigned per key).
    pub fn starts(&self, t: i64) -> Vec<i64> {
        match *self {
            WindowSpec::Tumble { size } => vec![t - t.rem_euclid(size)],
            WindowSpec::Hop { slide, size } => {
                let mut out = Vec::with_capacity((size / slide + 1) as usize);
                let mut start = t - t.rem_euclid(slide);
                while start > t - size {
                    out.push(start);
                    start -= slide;
                }
                out
            }
            WindowSpec::Session { .. } => Vec::new(),
        }
    }

    /// The end (exclusive) of the tumbling or hopping window starting at `start`.
    pub fn end_of(&self, start: i64) -> i64 {
        match *self {
            WindowSpec::Tumble { size } | WindowSpec::Hop { size, .. } => start.saturating_add(size),
            WindowSpec::Session { gap } => start.saturating_add(gap),
        }
    }

    /// A short description for the state's layout and for errors.
    pub fn describe(&self) -> String {
        match self {
            WindowSpec::Tumble { size } => format!("tumble({size} ms)"),
            WindowSpec::Hop { slide, size } => format!("hop({slide} ms, {size} ms)"),
            WindowSpec::Session { gap } => format!("session({gap} ms)"),
        }
    }
}

/// One session of a key: `[start, end)`, where `end` is the last event time + gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Session {
    /// The first event time.
    pub(crate) start: i64,
    /// The last event time plus the gap.
    pub(crate) end: i64,
}

/// What happens to a key's sessions when a row at time `t` arrives (gap `gap`): which
/// existing sessions (by position in `open`) it joins. None: a new session; one: that
/// session grows; several: they merge into the first. Pure, for table tests.
pub(crate) fn sessions_touched(open: &[Session], t: i64, gap: i64) -> Vec<usize> {
    let (lo, hi) = (t, t.saturating_add(gap));
    open.iter().enumerate().filter(|(_, s)| lo < s.end && s.start < hi).map(|(i, _)| i).collect()
}

/// The window functions' names, for the planner.
pub(crate) const WINDOW_FUNCTIONS: [&str; 3] = ["tumble", "hop", "session"];

/// `tumble`, `hop` and `session` as DataFusion sees them while it plans: functions of an
/// event time and interval literals returning the window's start as a timestamp (ms).
/// They only mark the window in `GROUP BY`; the operator assigns windows itself, and
/// calling one anywhere else is an error.
#[derive(Debug, PartialEq, Eq, Hash)]
struct WindowFunction {
    name: &'static str,
    signature: Signature,
}

impl ScalarUDFImpl for WindowFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> datafusion_common::Result<DataType> {
        Ok(DataType::Timestamp(TimeUnit::Millisecond, None))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> datafusion_common::Result<ColumnarValue> {
        Err(DataFusionError::Plan(format!(
            "{}() names an event-time window and is allowed only in the GROUP BY of an aggregate",
            self.name
        )))
    }
}

/// The three window functions.
pub(crate) fn window_functions() -> Vec<Arc<ScalarUDF>> {
    ["tumble", "hop", "session"]
        .into_iter()
        .map(|name| {
            Arc::new(ScalarUDF::new_from_impl(WindowFunction {
                name,
                // Any count: the planner checks the arguments and says what they must be.
                signature: Signature::variadic_any(Volatility::Immutable),
            }))
        })
        .collect()
}

/// An interval literal in milliseconds: `INTERVAL '10 seconds'`. Months and years are
/// refused (their length in ms is not fixed), as is a length <= 0.
pub(crate) fn interval_ms(expr: &Expr, function: &str) -> Result<i64, String> {
    let expr = match expr {
        Expr::Alias(a) => a.expr.as_ref(),
        e => e,
    };
    let ms = match expr {
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(v)), _) if v.months == 0 => {
            i64::from(v.days) * 86_400_000 + v.nanoseconds / 1_000_000
        }
        Expr::Literal(ScalarValue::IntervalDayTime(Some(v)), _) => {
            i64::from(v.days) * 86_400_000 + i64::from(v.milliseconds)
        }
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(_)) | ScalarValue::IntervalYearMonth(Some(_)), _) => {
            return Err(format!(
                "{function}(): months and years have no fixed length; give days, hours, minutes or seconds"
            ))
        }
        other => {
            return Err(format!(
                "{function}(): an interval literal such as INTERVAL '10 seconds' is expected, found {other}"
            ))
        }
    };
    if ms <= 0 {
        return Err(format!("{function}(): the interval must be at least 1 ms, found {ms} ms"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tumbling_and_hopping_windows_hold_the_times_inside_them() {
        let tumble = WindowSpec::Tumble { size: 10 };
        let hop = WindowSpec::Hop { slide: 5, size: 15 };
        // (spec, time, starts)
        let table: [(WindowSpec, i64, Vec<i64>); 8] = [
            (tumble, 0, vec![0]),
            (tumble, 9, vec![0]),
            (tumble, 10, vec![10]),
            (tumble, -1, vec![-10]),
            (hop, 0, vec![0, -5, -10]),
            (hop, 14, vec![10, 5, 0]),
            (hop, 15, vec![15, 10, 5]),
            (WindowSpec::Hop { slide: 10, size: 15 }, 12, vec![10, 0]),
        ];
        for (spec, t, starts) in table {
            assert_eq!(spec.starts(t), starts, "{spec:?} at {t}");
            for s in spec.starts(t) {
                assert!(s <= t && t < spec.end_of(s), "{spec:?}: {t} not in [{s}, {})", spec.end_of(s));
            }
        }
    }

    #[test]
    fn a_row_joins_the_sessions_it_falls_within_a_gap_of() {
        // Gap 10: a session with events at 0 is [0, 10); one with events 18..=20 is [18, 30).
        let open = [Session { start: 0, end: 10 }, Session { start: 18, end: 30 }];
        // (time, sessions touched)
        let table: [(i64, Vec<usize>); 8] = [
            (5, vec![0]),    // inside the first
            (-9, vec![0]),   // before it, within a gap: it grows back
            (-10, vec![]),   // a gap away: a new session
            (9, vec![0, 1]), // within a gap of both: they merge
            (12, vec![1]),   // extends the second back
            (25, vec![1]),   // inside the second
            (29, vec![1]),   // extends it
            (30, vec![]),    // a gap after its last event: a new session
        ];
        for (t, touched) in table {
            assert_eq!(sessions_touched(&open, t, 10), touched, "t {t}");
        }
    }

    #[test]
    fn intervals_are_literal_fixed_lengths() {
        let ten_s = Expr::Literal(
            ScalarValue::IntervalMonthDayNano(Some(arrow::datatypes::IntervalMonthDayNano::new(0, 0, 10_000_000_000))),
            None,
        );
        assert_eq!(interval_ms(&ten_s, "tumble"), Ok(10_000));
        let month = Expr::Literal(
            ScalarValue::IntervalMonthDayNano(Some(arrow::datatypes::IntervalMonthDayNano::new(1, 0, 0))),
            None,
        );
        assert!(interval_ms(&month, "tumble").unwrap_err().contains("months"));
        let zero = Expr::Literal(
            ScalarValue::IntervalMonthDayNano(Some(arrow::datatypes::IntervalMonthDayNano::new(0, 0, 0))),
            None,
        );
        assert!(interval_ms(&zero, "hop").unwrap_err().contains("at least 1 ms"));
        let column = Expr::Column(datafusion_common::Column::from_name("x"));
        assert!(interval_ms(&column, "session").unwrap_err().contains("interval literal"));
    }
}
