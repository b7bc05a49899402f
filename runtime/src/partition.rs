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
    /// Rows by the hash of these key columns together (none: every row to subtask 0):
    /// equal keys meet in one subtask. The stateful SQL operator's input edge.
    Keys(Vec<String>),
}

/// The number of key groups: the most subtasks a keyed operator can have, and the unit
/// in which keyed state moves when the parallelism changes (Flink's maximum
/// parallelism). Fixed: a checkpoint's keyed state is laid out by it.
pub const KEY_GROUPS: u16 = 128;

/// The key group of a key's hash.
pub fn key_group_of(hash: u64) -> u16 {
    (hash % u64::from(KEY_GROUPS)) as u16
}

/// The subtask of `parallelism` that owns `key_group` (Flink's range assignment: each
/// subtask owns one contiguous range of key groups).
pub fn subtask_of_key_group(key_group: u16, parallelism: u32) -> u32 {
    (u32::from(key_group) * parallelism.max(1) / u32::from(KEY_GROUPS)).min(parallelism.max(1) - 1)
}

/// The key groups `subtask` of `parallelism` owns: `first..=last`, or `None` if it owns
/// none (more subtasks than key groups).
pub fn key_groups_of_subtask(subtask: u32, parallelism: u32) -> Option<(u16, u16)> {
    let owned: Vec<u16> = (0..KEY_GROUPS).filter(|kg| subtask_of_key_group(*kg, parallelism) == subtask).collect();
    Some((*owned.first()?, *owned.last()?))
}

/// The hashes of the rows of `columns` (all rows hash alike when there are none), with
/// the hash every run and attempt uses.
pub(crate) fn hash_rows(columns: &[ArrayRef], rows: usize) -> std::result::Result<Vec<u64>, String> {
    let mut hashes = vec![0u64; rows];
    if !columns.is_empty() {
        create_hashes(columns, &random_state(), &mut hashes).map_err(|e| e.to_string())?;
    }
    Ok(hashes)
}

/// A fixed hash state, so a key maps to the same subtask in every run and attempt.
fn random_state() -> RandomState {
    RandomState::with_seed(0x5348_4152_4546_4c4f)
}

/// Splits `batch` by the hash of `columns` over `n` targets: (target, rows) pairs. A
/// row goes to the subtask that owns its key group.
pub(crate) fn split_by_hash(
    batch: &RecordBatch,
    columns: &[String],
    n: usize,
    task: &str,
) -> Result<Vec<(usize, RecordBatch)>> {
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for column in columns {
        let index = batch.schema().index_of(column).map_err(|_| {
            RuntimeError::task_message(
                task,
                crate::ErrorKind::Invalid,
                format!("key column {column:?} is not in the batch schema"),
            )
        })?;
        arrays.push(batch.column(index).clone());
    }
    let hashes = hash_rows(&arrays, batch.num_rows()).map_err(|e| {
        RuntimeError::task_message(task, crate::ErrorKind::Invalid, format!("cannot hash key columns {columns:?}: {e}"))
    })?;
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (row, h) in hashes.iter().enumerate() {
        rows[subtask_of_key_group(key_group_of(*h), n as u32) as usize].push(row as u32);
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
        let parts = split_by_hash(&batch, &["k".to_string()], 3, "t").unwrap();
        assert_eq!(parts.iter().map(|(_, b)| b.num_rows()).sum::<usize>(), 1000);
        let mut owner = std::collections::HashMap::new();
        for (target, part) in &parts {
            let k = part.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            for key in k.iter().flatten() {
                assert_eq!(*owner.entry(key.to_string()).or_insert(*target), *target, "{key} split over targets");
            }
        }
        // Deterministic across calls.
        let again = split_by_hash(&batch, &["k".to_string()], 3, "t").unwrap();
        assert_eq!(
            parts.iter().map(|(t, b)| (*t, b.num_rows())).collect::<Vec<_>>(),
            again.iter().map(|(t, b)| (*t, b.num_rows())).collect::<Vec<_>>()
        );
        assert!(split_by_hash(&batch, &["missing".to_string()], 3, "t").is_err());
    }

    #[test]
    fn key_groups_are_dealt_in_contiguous_ranges_covering_every_group_once() {
        for parallelism in [1u32, 2, 3, 7, 128, 200] {
            let mut seen = vec![0u32; KEY_GROUPS as usize];
            for subtask in 0..parallelism {
                if let Some((first, last)) = key_groups_of_subtask(subtask, parallelism) {
                    for kg in first..=last {
                        assert_eq!(subtask_of_key_group(kg, parallelism), subtask, "p {parallelism}");
                        seen[kg as usize] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|n| *n == 1), "p {parallelism}: {seen:?}");
        }
        assert_eq!(key_groups_of_subtask(0, 1), Some((0, KEY_GROUPS - 1)));
        assert_eq!(key_groups_of_subtask(1, 2), Some((64, 127)));
        assert_eq!(key_groups_of_subtask(198, 200), Some((127, 127)));
        assert_eq!(key_groups_of_subtask(199, 200), None, "more subtasks than key groups: some own none");
    }
}
