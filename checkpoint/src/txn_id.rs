//! Transaction ids of the form `{groupId}-{prefix}-{checkpointId}`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{CheckpointError as Error, Result};

/// The id of the one transaction that commits checkpoint `checkpoint_id` of a job
/// instance: `{group_id}-{prefix}-{checkpoint_id}`.
///
/// The group id may contain `-`; the prefix may not, and is limited to
/// `[A-Za-z0-9._]+`. So the id parses from the right without ambiguity, and a
/// known group id is checked against it.
///
/// ```
/// use shareflow_checkpoint::TransactionId;
///
/// let id = TransactionId::new("orders-eu", "job.a", 42).unwrap();
/// assert_eq!(id.to_string(), "orders-eu-job.a-42");
/// assert_eq!(TransactionId::parse("orders-eu-job.a-42", "orders-eu").unwrap(), id);
/// assert!(TransactionId::new("orders", "job-a", 1).is_err()); // '-' in the prefix
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TransactionId {
    group_id: String,
    prefix: String,
    checkpoint_id: u64,
}

impl TransactionId {
    /// Builds and validates an id.
    pub fn new(group_id: impl Into<String>, prefix: impl Into<String>, checkpoint_id: u64) -> Result<Self> {
        let group_id = group_id.into();
        let prefix = prefix.into();
        validate_group_id(&group_id)?;
        validate_prefix(&prefix)?;
        Ok(Self { group_id, prefix, checkpoint_id })
    }

    /// Parses `text`, which must belong to `group_id`.
    pub fn parse(text: &str, group_id: &str) -> Result<Self> {
        let id: TransactionId = text.parse()?;
        if id.group_id != group_id {
            return Err(Error::InvalidTransactionId {
                part: "group id",
                input: text.to_string(),
                reason: format!("expected group id {group_id:?}, found {:?}", id.group_id),
            });
        }
        Ok(id)
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
    pub fn checkpoint_id(&self) -> u64 {
        self.checkpoint_id
    }

    /// The id of checkpoint `checkpoint_id` of the same group and prefix.
    pub fn with_checkpoint(&self, checkpoint_id: u64) -> Self {
        Self { checkpoint_id, ..self.clone() }
    }
}

impl fmt::Display for TransactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.group_id, self.prefix, self.checkpoint_id)
    }
}

impl FromStr for TransactionId {
    type Err = Error;

    /// Parses from the right: the last `-` ends the prefix, the one before it ends the
    /// group id.
    fn from_str(text: &str) -> Result<Self> {
        let bad = |part, reason: &str| Error::InvalidTransactionId {
            part,
            input: text.to_string(),
            reason: format!("{reason}; expected {{groupId}}-{{prefix}}-{{checkpointId}}"),
        };
        let (rest, checkpoint) = text.rsplit_once('-').ok_or_else(|| bad("checkpoint id", "no '-' found"))?;
        let checkpoint_id = checkpoint
            .parse::<u64>()
            .map_err(|_| bad("checkpoint id", &format!("{checkpoint:?} is not a non-negative integer")))?;
        let (group_id, prefix) = rest.rsplit_once('-').ok_or_else(|| bad("prefix", "no group id before the prefix"))?;
        Self::new(group_id, prefix, checkpoint_id)
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

/// Checks a transactional prefix: non-empty, `[A-Za-z0-9._]+`, so no `-`.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let reason = if prefix.is_empty() {
        Some("must not be empty".to_string())
    } else if prefix.len() > 128 {
        Some(format!("is {} bytes long, at most 128 are allowed", prefix.len()))
    } else {
        prefix
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '.' || *c == '_'))
            .map(|c| format!("contains {c:?}; only [A-Za-z0-9._] is allowed (no '-', so the id parses unambiguously)"))
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
            ("g", "a-b", "prefix"),
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
        for (text, part) in
            [("nodash", "checkpoint id"), ("g-p-x", "checkpoint id"), ("p-1", "prefix"), ("g-p--1", "prefix")]
        {
            match text.parse::<TransactionId>() {
                Err(Error::InvalidTransactionId { part: got, .. }) => assert_eq!(got, part, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn parse_checks_the_group() {
        assert!(TransactionId::parse("a-b-p-1", "a-b").is_ok());
        let err = TransactionId::parse("a-b-p-1", "a").unwrap_err();
        assert!(err.to_string().contains("expected group id \"a\""), "{err}");
    }

    proptest! {
        #[test]
        fn round_trips(group in "[a-z][a-z0-9.-]{0,20}", prefix in "[A-Za-z0-9._]{1,10}", n in any::<u64>()) {
            let id = TransactionId::new(group.clone(), prefix, n).unwrap();
            prop_assert_eq!(TransactionId::parse(&id.to_string(), &group).unwrap(), id.clone());
            prop_assert_eq!(id.to_string().parse::<TransactionId>().unwrap(), id);
        }
    }
}
