//! `--crash-at POINT[:N]` of the demos: a crash schedule named on the command line,
//! each fault point checked against the connector's and the runtime's.

/// A bad `--crash-at` value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CrashAtError {
    /// The point is not one of the fault points.
    UnknownPoint {
        /// The name given.
        point: String,
    },
    /// The hit count after `:` is not a number.
    BadSkip {
        /// The whole value given.
        value: String,
    },
    /// The same point named twice.
    Repeated {
        /// The point.
        point: String,
    },
    /// `--crash-at` given with `--crashes` or `--seed`.
    WithSeededCrashes,
}

impl std::fmt::Display for CrashAtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CrashAtError::UnknownPoint { point } => {
                write!(f, "--crash-at {point:?} is not a fault point; use one of: {}", fault_point_names().join(", "))
            }
            CrashAtError::BadSkip { value } => {
                write!(f, "--crash-at {value:?}: the part after ':' must be a number of hits to let pass (POINT[:N])")
            }
            CrashAtError::Repeated { point } => {
                write!(f, "--crash-at names {point:?} twice: give each fault point at most once")
            }
            CrashAtError::WithSeededCrashes => {
                write!(f, "--crash-at gives the crash schedule itself: drop --crashes and --seed")
            }
        }
    }
}

impl std::error::Error for CrashAtError {}

/// Every fault point a `--crash-at` may name: the connector's and the runtime's.
fn fault_point_names() -> Vec<&'static str> {
    shareflow::connector::points::ALL.iter().chain(shareflow::runtime::failpoint::points::ALL).copied().collect()
}

/// Parses one `--crash-at POINT[:N]` value into `(point, skip)`.
fn parse_crash_at(value: &str) -> Result<(String, u32), CrashAtError> {
    let (point, skip) = match value.split_once(':') {
        Some((p, n)) => (p, n.parse().map_err(|_| CrashAtError::BadSkip { value: value.to_string() })?),
        None => (value, 0),
    };
    if !fault_point_names().contains(&point) {
        return Err(CrashAtError::UnknownPoint { point: point.to_string() });
    }
    Ok((point.to_string(), skip))
}

/// Every `--crash-at` of the command line, in order; `None` if there is none.
pub(crate) fn crash_at(values: &[String], seeded: bool) -> Result<Option<Vec<(String, u32)>>, String> {
    let mut schedule: Vec<(String, u32)> = Vec::new();
    for v in values {
        let (point, skip) = parse_crash_at(v).map_err(|e| e.to_string())?;
        if schedule.iter().any(|(p, _)| *p == point) {
            return Err(CrashAtError::Repeated { point }.to_string());
        }
        schedule.push((point, skip));
    }
    if schedule.is_empty() {
        return Ok(None);
    }
    if seeded {
        return Err(CrashAtError::WithSeededCrashes.to_string());
    }
    Ok(Some(schedule))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn crash_at_reads_points_and_hits_in_order() {
        let schedule = crash_at(&args(&["sink.after_write:1", "checkpoint.after_manifest"]), false);
        assert_eq!(
            schedule,
            Ok(Some(vec![("sink.after_write".to_string(), 1), ("checkpoint.after_manifest".to_string(), 0)]))
        );
        assert_eq!(crash_at(&args(&[]), true), Ok(None));
    }

    #[test]
    fn crash_at_refuses_bad_values_by_name() {
        assert_eq!(
            parse_crash_at("sink.after_nothing"),
            Err(CrashAtError::UnknownPoint { point: "sink.after_nothing".into() })
        );
        assert!(CrashAtError::UnknownPoint { point: "x".into() }.to_string().contains("recovery.mid"));
        assert_eq!(parse_crash_at("commit.before:x"), Err(CrashAtError::BadSkip { value: "commit.before:x".into() }));
        assert_eq!(parse_crash_at("commit.before:-1"), Err(CrashAtError::BadSkip { value: "commit.before:-1".into() }));
        let e = crash_at(&args(&["commit.before", "commit.before:2"]), false);
        assert_eq!(e, Err(CrashAtError::Repeated { point: "commit.before".into() }.to_string()));
        let e = crash_at(&args(&["commit.before"]), true);
        assert_eq!(e, Err(CrashAtError::WithSeededCrashes.to_string()));
    }
}
