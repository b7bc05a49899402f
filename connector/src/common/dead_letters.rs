//! Dead letters as records: the KIP-1191 headers (so Kafka's tools and `shareflow dlq`
//! read a dead letter of the job and one of the broker the same way) and what of the
//! record a dead letter copies. Each backend writes them in its own room.

use bytes::Bytes;
use shareflow_runtime::DeadLetter;

/// The input record's topic (KIP-1191).
pub const HEADER_TOPIC: &str = "__dlq.errors.topic";
/// Its partition (KIP-1191).
pub const HEADER_PARTITION: &str = "__dlq.errors.partition";
/// Its offset (KIP-1191).
pub const HEADER_OFFSET: &str = "__dlq.errors.offset";
/// The share group (KIP-1191).
pub const HEADER_GROUP: &str = "__dlq.errors.group";
/// Its delivery count when it failed (KIP-1191).
pub const HEADER_DELIVERY_COUNT: &str = "__dlq.errors.delivery.count";
/// What failed, in words (KIP-1191).
pub const HEADER_MESSAGE: &str = "__dlq.errors.message";
/// Why: `decode`, `sql`, `sink` or `delivery-limit` (shareflow's own header).
pub const HEADER_CAUSE: &str = "shareflow.dlq.cause";
/// The task that gave up on it, `operator[subtask]` (shareflow's own header).
pub const HEADER_TASK: &str = "shareflow.dlq.task";

/// Where a job's dead letters go: `[dead_letters]` of a job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterSettings {
    /// The dead-letter topic.
    pub topic: String,
    /// Copy the record's key and value (the default), or send only the headers: for
    /// records that must not be copied (personal data, large values).
    pub copy_record: bool,
}

impl DeadLetterSettings {
    /// Dead letters to `topic`, copying each record.
    pub fn new(topic: &str) -> Self {
        Self { topic: topic.to_string(), copy_record: true }
    }

    /// The key, value and headers of `letter`'s record in group `group`.
    pub fn record(&self, letter: &DeadLetter, group: &str) -> (Option<Bytes>, Option<Bytes>, Vec<(String, Bytes)>) {
        let text = |s: String| Bytes::from(s);
        let mut headers = Vec::with_capacity(8);
        if let Some(o) = &letter.origin {
            headers.push((HEADER_TOPIC.to_string(), text(o.topic.clone())));
            headers.push((HEADER_PARTITION.to_string(), text(o.partition.to_string())));
            headers.push((HEADER_OFFSET.to_string(), text(o.offset.to_string())));
            headers.push((HEADER_DELIVERY_COUNT.to_string(), text(o.delivery_count.to_string())));
        }
        headers.push((HEADER_GROUP.to_string(), text(group.to_string())));
        headers.push((HEADER_MESSAGE.to_string(), text(letter.message.clone())));
        headers.push((HEADER_CAUSE.to_string(), Bytes::from_static(letter.cause.as_str().as_bytes())));
        headers.push((HEADER_TASK.to_string(), text(letter.task.clone())));
        if self.copy_record {
            (letter.key.clone(), letter.value.clone(), headers)
        } else {
            (None, None, headers)
        }
    }
}

/// A header's value as text, if the record has it.
pub fn header<'a>(headers: &'a [(String, Bytes)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// The dead letter of a record the decoder refused for `why`.
pub(crate) fn decode_letter(r: &shareflow_share::Record, why: String, task: &str) -> shareflow_runtime::DeadLetter {
    shareflow_runtime::DeadLetter {
        key: r.key.clone(),
        value: r.value.clone(),
        origin: Some(shareflow_runtime::Origin {
            topic: r.topic.to_string(),
            partition: r.partition,
            offset: r.offset,
            delivery_count: r.delivery_count,
        }),
        cause: shareflow_runtime::DeadLetterCause::Decode,
        message: why,
        task: task.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use shareflow_runtime::{DeadLetterCause, Origin};

    fn letter() -> DeadLetter {
        DeadLetter {
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"not a number")),
            origin: Some(Origin { topic: "in".into(), partition: 3, offset: 42, delivery_count: 2 }),
            cause: DeadLetterCause::Sql,
            message: "cast failed".into(),
            task: "q[1]".into(),
        }
    }

    #[test]
    fn a_dead_letter_carries_the_kip_1191_headers_and_copies_the_record_or_not() {
        let settings = DeadLetterSettings::new("dlq");
        let (key, value, headers) = settings.record(&letter(), "g");
        assert_eq!((key.as_deref(), value.as_deref()), (Some(&b"k"[..]), Some(&b"not a number"[..])));
        let want = [
            (HEADER_TOPIC, "in"),
            (HEADER_PARTITION, "3"),
            (HEADER_OFFSET, "42"),
            (HEADER_DELIVERY_COUNT, "2"),
            (HEADER_GROUP, "g"),
            (HEADER_MESSAGE, "cast failed"),
            (HEADER_CAUSE, "sql"),
            (HEADER_TASK, "q[1]"),
        ];
        for (name, value) in want {
            assert_eq!(header(&headers, name), Some(value), "{name}");
        }
        let metadata_only = DeadLetterSettings { copy_record: false, ..settings };
        let (key, value, headers_only) = metadata_only.record(&letter(), "g");
        assert_eq!((key, value), (None, None));
        assert_eq!(headers_only, headers);
    }
}
