//! How batches move from one operator's subtasks to the next's.

use arrow::array::{ArrayRef, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::record_batch::RecordBatch;
use datafusion_common::hash_utils::{create_hashes, RandomState};

use crate::error::{Result, RuntimeError};

/// The connection pattern of an edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioning {
    /// Subtask i sends to subtask i. Needs equal parallelism on both sides.
    Forward,
    /// Whole batches in turn to each downstream subtask.
    RoundRobin,
    /// Rows by the hash of a key column: equal keys meet in one subtask.
    Hash(String),
}

/// A fixed hash state, so a key maps to the same subtask in every run and attempt.
fn random_state() -> RandomState {
    RandomState::with_seed(0x5348_4152_4546_4c4f)
}

/// Splits `batch` by the hash of `column` over `n` targets: (target, rows) pairs.
pub(crate) fn split_by_hash(
    batch: &RecordBatch,
    column: &str,
    n: usize,
    task: &str,
) -> Result<Vec<(usize, RecordBatch)>> {
    let index = batch.schema().index_of(column).map_err(|_| {
        RuntimeError::task_message(
            task,
            crate::ErrorKind::Invalid,
            format!("key column {column:?} is not in the batch schema"),
        )
    })?;
    let arrays: Vec<ArrayRef> = vec![batch.column(index).clone()];
    let mut hashes = vec![0u64; batch.num_rows()];
    create_hashes(&arrays, &random_state(), &mut hashes).map_err(|e| {
        RuntimeError::task_message(task, crate::ErrorKind::Invalid, format!("cannot hash key column {column}: {e}"))
    })?;
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (row, h) in hashes.iter().enumerate() {
        rows[(*h % n as u64) as usize].push(row as u32);
    }
    let mut out = Vec::new();
    for (target, indices) in rows.into_iter().enumerate() {
        if indices.is_empty() {
            continue;
        }
        let part = if indices.len() == batch.num_rows() {
            batch.clone()
        } else {
            take_record_batch(batch, &UInt32Array::from(indices)).map_err(|e| RuntimeError::arrow(task, e))?
        };
        out.push((target, part));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn equal_keys_go_to_one_target_and_no_row_is_lost() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let keys: Vec<String> = (0..1000).map(|i| format!("key{}", i % 37)).collect();
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(StringArray::from(keys)), Arc::new(Int64Array::from_iter_values(0..1000))],
        )
        .unwrap();
        let parts = split_by_hash(&batch, "k", 3, "t").unwrap();
        assert_eq!(parts.iter().map(|(_, b)| b.num_rows()).sum::<usize>(), 1000);
        let mut owner = std::collections::HashMap::new();
        for (target, part) in &parts {
            let k = part.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            for key in k.iter().flatten() {
                assert_eq!(*owner.entry(key.to_string()).or_insert(*target), *target, "{key} split over targets");
            }
        }
        // Deterministic across calls.
        let again = split_by_hash(&batch, "k", 3, "t").unwrap();
        assert_eq!(
            parts.iter().map(|(t, b)| (*t, b.num_rows())).collect::<Vec<_>>(),
            again.iter().map(|(t, b)| (*t, b.num_rows())).collect::<Vec<_>>()
        );
        assert!(split_by_hash(&batch, "missing", 3, "t").is_err());
    }
}
