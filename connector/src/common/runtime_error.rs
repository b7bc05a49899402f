//! The connector's errors as the runtime's.

use shareflow_share::Error;

/// Converts a connector error into a runtime error of `task` with the same kind.
pub(crate) fn runtime_error(task: &str, e: Error) -> shareflow_runtime::RuntimeError {
    shareflow_runtime::RuntimeError::task(task, e.kind(), e)
}
