//! Dead letters as records: the KIP-1191 headers (so Kafka's tools and `shareflow dlq`
//! read a dead letter of the job and one of the broker the same way) and what of the
//! record a dead letter copies. Each backend writes them in its own room.

use bytes::Bytes;
use shareflow_runtime::DeadLetter;

pub use shareflow_share::dead_letter::{
    HEADER_CAUSE, HEADER_DELIVERY_COUNT, HEADER_GROUP, HEADER_MESSAGE, HEADER_OFFSET, HEADER_PARTITION, HEADER_TASK,
    HEADER_TOPIC,
};

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

/// The most bytes of key and value one record of a topic sink may hold, on both
/// backends: Kafka's producer default (`max.request.size`), so that a job moved from the
/// embedded broker to Kafka refuses the same rows.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// The largest key a dead letter of a refused row copies: a larger one would make the
/// dead letter itself too large.
const MAX_KEY_COPIED: usize = 64 << 10;

/// The rows of a topic sink's batch that a topic takes. A row a topic refuses as bad
/// data (key and value over [`MAX_RECORD_BYTES`]) is taken out: dead-lettered (cause
/// `sink`, the key copied, not the value) into checkpoint `checkpoint_id`'s transaction
/// when the job has dead letters, else an error naming the row.
pub(crate) async fn sink_rows(
    rows: Vec<(Option<Bytes>, Option<Bytes>)>,
    letters: Option<&shareflow_runtime::DeadLetters>,
    task: &str,
    checkpoint_id: shareflow_runtime::CheckpointId,
) -> shareflow_runtime::Result<Vec<(Option<Bytes>, Option<Bytes>)>> {
    let size =
        |(k, v): &(Option<Bytes>, Option<Bytes>)| k.as_ref().map_or(0, Bytes::len) + v.as_ref().map_or(0, Bytes::len);
    if rows.iter().all(|r| size(r) <= MAX_RECORD_BYTES) {
        return Ok(rows);
    }
    let mut kept = Vec::with_capacity(rows.len());
    let mut refused = Vec::new();
    for (i, row) in rows.into_iter().enumerate() {
        let bytes = size(&row);
        if bytes <= MAX_RECORD_BYTES {
            kept.push(row);
            continue;
        }
        let message = format!(
            "row {i} of a batch holds {bytes} bytes of key and value, over the {MAX_RECORD_BYTES} bytes one record of \
             a topic sink may hold"
        );
        if letters.is_none() {
            return Err(shareflow_runtime::RuntimeError::task_message(
                task,
                shareflow_runtime::ErrorKind::Invalid,
                format!("{message}; make the query's rows smaller, or set such rows aside with [dead_letters]"),
            ));
        }
        refused.push(DeadLetter {
            key: row.0.filter(|k| k.len() <= MAX_KEY_COPIED),
            value: None,
            origin: None,
            cause: shareflow_runtime::DeadLetterCause::Sink,
            message,
            task: task.to_string(),
        });
    }
    if let Some(letters) = letters {
        letters.write(checkpoint_id, refused).await?;
    }
    Ok(kept)
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

    #[test]
    fn the_broker_names_the_delivery_limit_cause_as_the_runtime_does() {
        assert_eq!(DeadLetterCause::DeliveryLimit.as_str(), shareflow_share::dead_letter::CAUSE_DELIVERY_LIMIT);
    }
}
