//! Keyed state in key groups, as Flink keeps it: a key's hash picks one of
//! [`KEY_GROUPS`](crate::partition::KEY_GROUPS) groups, each subtask owns a contiguous
//! range of them, and a state item says which range it covers, so that a restore at
//! another parallelism hands each item to the subtasks that own part of it.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Result, RuntimeError};
use crate::operator::StateItems;
use crate::partition::{key_groups_of_subtask, KEY_GROUPS};

/// One item of keyed state: the key groups `first..=last` it holds rows of, and its
/// bytes (the operator's own format). Items of one operator may overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedItem {
    /// The first key group it covers.
    pub first: u16,
    /// The last key group it covers.
    pub last: u16,
    /// The operator's bytes.
    pub payload: Bytes,
}

/// The first byte of an encoded [`KeyedItem`]: the layout's version.
const KEYED_ITEM_V1: u8 = 1;

impl KeyedItem {
    /// The item as one state item.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(5 + self.payload.len());
        b.put_u8(KEYED_ITEM_V1);
        b.put_u16_le(self.first);
        b.put_u16_le(self.last);
        b.put_slice(&self.payload);
        b.freeze()
    }

    /// Reads an item that [`encode`](Self::encode) wrote; `operator` names it in errors.
    pub fn decode(item: &Bytes, operator: &str) -> Result<Self> {
        let bad = |why: &str| {
            RuntimeError::Internal(format!(
                "the restored state of operator {operator} is not keyed state ({why}); was the checkpoint written \
                 by another job or version? Start from another checkpoint, or without state"
            ))
        };
        if item.len() < 5 {
            return Err(bad("shorter than its header"));
        }
        if item[0] != KEYED_ITEM_V1 {
            return Err(bad(&format!("layout version {}", item[0])));
        }
        let first = u16::from_le_bytes([item[1], item[2]]);
        let last = u16::from_le_bytes([item[3], item[4]]);
        if first > last || last >= KEY_GROUPS {
            return Err(bad(&format!("key groups {first}..={last}")));
        }
        Ok(Self { first, last, payload: item.slice(5..) })
    }
}

/// The restored items of a keyed `operator` for each of `parallelism` subtasks: every
/// item goes to each subtask whose key-group range it overlaps.
pub(crate) fn redistribute(
    states: &BTreeMap<String, BTreeMap<u32, StateItems>>,
    operator: &str,
    parallelism: u32,
) -> Result<Vec<StateItems>> {
    let mut out = vec![Vec::new(); parallelism as usize];
    for item in states.get(operator).into_iter().flat_map(|m| m.values()).flatten() {
        let keyed = KeyedItem::decode(item, operator)?;
        for (subtask, items) in out.iter_mut().enumerate() {
            if let Some((first, last)) = key_groups_of_subtask(subtask as u32, parallelism) {
                if keyed.first <= last && first <= keyed.last {
                    items.push(item.clone());
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(items: &[(u16, u16)]) -> BTreeMap<String, BTreeMap<u32, StateItems>> {
        let items = items
            .iter()
            .map(|(f, l)| KeyedItem { first: *f, last: *l, payload: Bytes::from(format!("{f}-{l}")) }.encode())
            .collect();
        BTreeMap::from([("agg".to_string(), BTreeMap::from([(0, items)]))])
    }

    #[test]
    fn items_go_to_every_subtask_whose_range_they_overlap() {
        let s = states(&[(0, 63), (64, 127), (60, 70), (127, 127)]);
        let names =
            |items: &StateItems| items.iter().map(|i| KeyedItem::decode(i, "agg").unwrap().payload).collect::<Vec<_>>();
        let one = redistribute(&s, "agg", 1).unwrap();
        assert_eq!(one[0].len(), 4);
        let two = redistribute(&s, "agg", 2).unwrap();
        assert_eq!(names(&two[0]), vec![Bytes::from("0-63"), Bytes::from("60-70")]);
        assert_eq!(names(&two[1]), vec![Bytes::from("64-127"), Bytes::from("60-70"), Bytes::from("127-127")]);
        let three = redistribute(&s, "agg", 3).unwrap();
        assert_eq!(three.iter().map(Vec::len).sum::<usize>(), 6);
        assert!(redistribute(&s, "other", 2).unwrap().iter().all(Vec::is_empty));
    }

    #[test]
    fn an_item_that_is_not_keyed_is_an_error_naming_the_operator() {
        let s = BTreeMap::from([("agg".to_string(), BTreeMap::from([(0, vec![Bytes::from_static(b"\x07abcdef")])]))]);
        let e = redistribute(&s, "agg", 2).unwrap_err().to_string();
        assert!(e.contains("agg") && e.contains("not keyed"), "{e}");
        let short = KeyedItem::decode(&Bytes::from_static(b"\x01\x00"), "agg").unwrap_err().to_string();
        assert!(short.contains("shorter"), "{short}");
        let range = KeyedItem { first: 5, last: 200, payload: Bytes::new() }.encode();
        assert!(KeyedItem::decode(&range, "agg").is_err());
    }
}
