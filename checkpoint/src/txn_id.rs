//! Checkpoint ids, and transaction ids of the form `{groupId}-{prefix}-{checkpointId}`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{CheckpointError as Error, Result};

/// The id of a checkpoint, one name and one type from the coordinator's trigger to the
/// sinks' commits.
///
/// Checkpoint n commits in one transaction per job instance, T(n) =
/// `{group}-{prefix}-{n}` ([`TransactionId`]). Ids start at 1 and only grow within an
/// instance (a restart continues above every id seen). In code the one name is
/// `checkpoint_id` (or `CheckpointId` as a type); "n" appears only in prose and in
/// formulas such as T(n). It is never called an epoch: in shareflow an epoch is one of
/// Kafka's (the producer, member, share-fetch session or coordinator epoch).
///
/// A type alias rather than a newtype, so code outside the repository that implements
/// the runtime's operator traits with `u64` keeps compiling.
pub type CheckpointId = u64;

/// The id of the one transaction that commits checkpoint `checkpoint_id` of a job
/// instance: `{group_id}-{prefix}-{checkpoint_id}`.
///
/// Both the group id and the prefix may contain `-` (the seed's own example,
/// `my-share-group-flink-job-42`, has group `my-share-group` and prefix `flink-job`).
/// The id is parsed *given the group id*: the group and its `-` come first, the
/// checkpoint id is the last `-` field, and the prefix is everything between. A prefix
/// is `[A-Za-z0-9._-]+` and neither starts nor ends with `-`, so that split is unique.
///
/// ```
/// use shareflow_checkpoint::TransactionId;
///
/// let id = TransactionId::new("my-share-group", "flink-job", 42).unwrap();
/// assert_eq!(id.to_string(), "my-share-group-flink-job-42");
/// assert_eq!(TransactionId::parse("my-share-group-flink-job-42", "my-share-group").unwrap(), id);
/// assert!(TransactionId::new("orders", "-job", 1).is_err()); // a prefix cannot start with '-'
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TransactionId {
    group_id: String,
    prefix: String,
    checkpoint_id: CheckpointId,
}

impl TransactionId {
    /// Builds and validates an id.
    pub fn new(group_id: impl Into<String>, prefix: impl Into<String>, checkpoint_id: CheckpointId) -> Result<Self> {
        let group_id = group_id.into();
        let prefix = prefix.into();
        validate_group_id(&group_id)?;
        validate_prefix(&prefix)?;
        Ok(Self { group_id, prefix, checkpoint_id })
    }

    /// Parses `text`, which must belong to `group_id`: `{group_id}-{prefix}-{checkpoint_id}`,
    /// where the checkpoint id is the last `-` field and the prefix is everything between.
    pub fn parse(text: &str, group_id: &str) -> Result<Self> {
        let bad = |part, reason: String| Error::InvalidTransactionId {
            part,
            input: text.to_string(),
            reason: format!("{reason}; expected {{groupId}}-{{prefix}}-{{checkpointId}}"),
        };
        let rest = text
            .strip_prefix(group_id)
            .and_then(|r| r.strip_prefix('-'))
            .ok_or_else(|| bad("group id", format!("does not start with group id {group_id:?} and '-'")))?;
        let (prefix, checkpoint) =
            rest.rsplit_once('-').ok_or_else(|| bad("prefix", "no '-' between prefix and checkpoint id".into()))?;
        let checkpoint_id = checkpoint
            .parse::<CheckpointId>()
            .map_err(|_| bad("checkpoint id", format!("{checkpoint:?} is not a non-negative integer")))?;
        Self::new(group_id, prefix, checkpoint_id)
    }

    /// The share group.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    /// The transactional prefix of the job instance.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The checkpoint this transaction commits.
    pub fn checkpoint_id(&self) -> CheckpointId {
        self.checkpoint_id
    }

    /// The id of checkpoint `checkpoint_id` of the same group and prefix.
    pub fn with_checkpoint(&self, checkpoint_id: CheckpointId) -> Self {
        Self { checkpoint_id, ..self.clone() }
    }
}

impl fmt::Display for TransactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.group_id, self.prefix, self.checkpoint_id)
    }
}

/// Checks a share group id: non-empty, at most 249 characters (as Kafka), printable,
/// no whitespace.
pub fn validate_group_id(group_id: &str) -> Result<()> {
    let reason = if group_id.is_empty() {
        Some("must not be empty".to_string())
    } else if group_id.len() > 249 {
        Some(format!("is {} bytes long, at most 249 are allowed", group_id.len()))
    } else {
        group_id
            .chars()
            .find(|c| c.is_whitespace() || c.is_control())
            .map(|c| format!("contains {c:?}; whitespace and control characters are not allowed"))
    };
    match reason {
        Some(reason) => Err(Error::InvalidTransactionId { part: "group id", input: group_id.to_string(), reason }),
        None => Ok(()),
    }
}

/// Checks a transactional prefix: non-empty, at most 128 bytes of `[A-Za-z0-9._-]`,
/// neither starting nor ending with `-` (so `{group}-{prefix}-{n}` splits one way only
/// once the group is known).
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let reason = if prefix.is_empty() {
        Some("must not be empty".to_string())
    } else if prefix.len() > 128 {
        Some(format!("is {} bytes long, at most 128 are allowed", prefix.len()))
    } else if prefix.starts_with('-') || prefix.ends_with('-') {
        Some("starts or ends with '-'; a '-' is allowed only inside the prefix".to_string())
    } else {
        prefix
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
            .map(|c| format!("contains {c:?}; only [A-Za-z0-9._-] is allowed"))
    };
    match reason {
        Some(reason) => Err(Error::InvalidTransactionId { part: "prefix", input: prefix.to_string(), reason }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn display_is_the_seed_format() {
        assert_eq!(TransactionId::new("my-share-group", "flink", 42).unwrap().to_string(), "my-share-group-flink-42");
    }

    #[test]
    fn errors_name_the_part() {
        let cases = [
            ("g", "", "prefix"),
            ("g", "-ab", "prefix"),
            ("g", "ab-", "prefix"),
            ("g", "a b", "prefix"),
            ("", "p", "group id"),
            ("g h", "p", "group id"),
        ];
        for (g, p, part) in cases {
            match TransactionId::new(g, p, 1) {
                Err(Error::InvalidTransactionId { part: got, .. }) => assert_eq!(got, part, "{g:?} {p:?}"),
                other => panic!("{g:?} {p:?}: {other:?}"),
            }
        }
        for (text, part) in [
            ("nodash", "group id"),
            ("g-p-x", "checkpoint id"),
            ("g-1", "prefix"),
            ("g-p--1", "prefix"),
            ("h-p-1", "group id"),
        ] {
            match TransactionId::parse(text, "g") {
                Err(Error::InvalidTransactionId { part: got, .. }) => assert_eq!(got, part, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn parses_the_seed_example() {
        let id = TransactionId::parse("my-share-group-flink-job-42", "my-share-group").unwrap();
        assert_eq!((id.group_id(), id.prefix(), id.checkpoint_id()), ("my-share-group", "flink-job", 42));
        // The same text read with a shorter group id gives another, still valid, split.
        let other = TransactionId::parse("my-share-group-flink-job-42", "my-share").unwrap();
        assert_eq!(other.prefix(), "group-flink-job");
    }

    #[test]
    fn parse_checks_the_group() {
        assert_eq!(TransactionId::parse("a-b-p-1", "a-b").unwrap().prefix(), "p");
        let err = TransactionId::parse("x-b-p-1", "a").unwrap_err();
        assert!(err.to_string().contains("does not start with group id \"a\""), "{err}");
    }

    proptest! {
        #[test]
        fn round_trips(group in "[a-z][a-z0-9.-]{0,20}", prefix in "[A-Za-z0-9._]([A-Za-z0-9._-]{0,8}[A-Za-z0-9._])?", n in any::<u64>()) {
            let id = TransactionId::new(group.clone(), prefix, n).unwrap();
            prop_assert_eq!(TransactionId::parse(&id.to_string(), &group).unwrap(), id);
        }
    }
}
