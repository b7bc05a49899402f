//! `shareflow dlq list|redrive`: what a job's dead-letter topic holds, and putting its
//! records back into an input topic after a fix.
//!
//! A redrive is itself an exactly-once job: a share group on the dead-letter topic, a SQL
//! transform (`SELECT key, value FROM input WHERE value IS NOT NULL [AND filter]`), and the
//! input topic as its sink, each dead letter ACCEPTed in the transaction that writes its
//! copy. A redrive killed part way and started again with the same arguments goes on in
//! the same group: no record is redriven twice. Records written with
//! `copy_record = false` (headers only) have nothing to put back and are skipped.

use std::time::Duration;

use shareflow_connector::dead_letters::{
    header, HEADER_CAUSE, HEADER_DELIVERY_COUNT, HEADER_MESSAGE, HEADER_OFFSET, HEADER_PARTITION, HEADER_TOPIC,
};
use shareflow_connector::share::Record;

use crate::job_file::{Backend, JobFile, SinkSpec};

/// The share group a redrive from `dlq` to `to` with `filter` reads as: the same for the
/// same arguments (a restarted redrive goes on), another for another filter.
pub(crate) fn redrive_group(dlq: &str, to: &str, filter: Option<&str>) -> String {
    let base = format!("shareflow-redrive-{dlq}-to-{to}");
    match filter {
        None => base,
        // FNV-1a: stable across builds, unlike the standard library's hasher.
        Some(f) => {
            let hash =
                f.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
            format!("{base}-{hash:016x}")
        }
    }
}

/// The job of `shareflow dlq redrive`: `dlq` into `to` on `backend`, ending once the
/// dead letters are drained.
pub(crate) fn redrive_job(
    backend: Backend,
    checkpoints: &str,
    dlq: &str,
    to: &str,
    filter: Option<&str>,
    max_rate: Option<u64>,
) -> Result<JobFile, String> {
    if dlq == to {
        return Err(format!("--to {to:?} is the dead-letter topic itself: give the input topic to redrive into"));
    }
    let filter_sql = filter.map(|f| format!(" AND ({f})")).unwrap_or_default();
    let sql = format!("SELECT key, value FROM input WHERE value IS NOT NULL{filter_sql}");
    shareflow::runtime::sql::plan_query(&sql, shareflow_connector::record_schema(), Default::default())
        .map_err(|e| format!("--filter {:?} does not plan: {e}", filter.unwrap_or_default()))?;
    Ok(JobFile {
        backend,
        checkpoints: checkpoints.to_string(),
        instance: Some("redrive".into()),
        group: redrive_group(dlq, to, filter),
        topics: vec![dlq.to_string()],
        exactly_once: true,
        from_earliest: true,
        max_rate,
        transforms: vec![("redrive".into(), sql, Default::default())],
        sink: SinkSpec::Topic { topic: to.to_string() },
        dead_letters: None,
        parallelism: 1,
        partitions: 1,
        interval: Duration::from_millis(200),
        checkpoint_timeout: Duration::from_secs(10),
        adoption_timeout: Duration::from_secs(30),
        restarts: 3,
        stop_when_drained: true,
    })
}

/// One line of `dlq list`: where the dead letter is, why, and where its record came from.
pub(crate) fn list_line(r: &Record) -> String {
    let h = |name| header(&r.headers, name).unwrap_or("-");
    let value = r.value.as_deref().map_or("(headers only)".to_string(), |v| {
        let text = String::from_utf8_lossy(v);
        if text.chars().count() > 40 {
            format!("{}...", text.chars().take(40).collect::<String>())
        } else {
            text.into()
        }
    });
    format!(
        "{}@{}  {:<14} from {}-{}@{} (delivery {})  {}  value: {value}",
        r.partition,
        r.offset,
        h(HEADER_CAUSE),
        h(HEADER_TOPIC),
        h(HEADER_PARTITION),
        h(HEADER_OFFSET),
        h(HEADER_DELIVERY_COUNT),
        h(HEADER_MESSAGE)
    )
}

/// `dlq list --json`: one object per dead letter, its bytes read as UTF-8 (lossily).
#[derive(serde::Serialize)]
pub(crate) struct DeadLetterJson {
    partition: i32,
    offset: i64,
    key: Option<String>,
    value: Option<String>,
    headers: std::collections::BTreeMap<String, String>,
}

/// The JSON form of dead letter `r`.
pub(crate) fn list_json(r: &Record) -> DeadLetterJson {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    DeadLetterJson {
        partition: r.partition,
        offset: r.offset,
        key: r.key.as_deref().map(text),
        value: r.value.as_deref().map(text),
        headers: r.headers.iter().map(|(k, v)| (k.clone(), text(v))).collect(),
    }
}

/// Every record of `topic` read_committed on the embedded broker in `dir`.
pub(crate) async fn read_embedded(
    dir: &std::path::Path,
    topic: &str,
) -> Result<Vec<Record>, crate::embedded_run::BoxError> {
    use shareflow_connector::broker::{BrokerOptions, EmbeddedBroker};
    use shareflow_connector::share::{IsolationLevel, TopicPartition};
    let broker = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir)?).await?;
    let partitions = broker.partition_count(topic).map_err(|e| format!("{e}: is {topic:?} the dead-letter topic?"))?;
    let mut out = Vec::new();
    for p in 0..partitions as i32 {
        let tp = TopicPartition::new(topic, p);
        out.extend(broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await?.into_iter().map(|r| r.into_record(&tp)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_group_is_the_same_for_the_same_arguments_only() {
        let a = redrive_group("dlq", "in", None);
        assert_eq!(a, "shareflow-redrive-dlq-to-in");
        assert_eq!(redrive_group("dlq", "in", Some("offset > 5")), redrive_group("dlq", "in", Some("offset > 5")));
        assert_ne!(redrive_group("dlq", "in", Some("offset > 5")), redrive_group("dlq", "in", Some("offset > 6")));
        // The hash is FNV-1a, fixed: a redrive started by another build goes on.
        assert_eq!(redrive_group("d", "i", Some("")), "shareflow-redrive-d-to-i-cbf29ce484222325");
    }

    #[test]
    fn a_redrive_refuses_its_own_topic_and_a_filter_that_does_not_plan() {
        let backend = Backend::Embedded("/tmp/b".into());
        assert!(redrive_job(backend.clone(), "memory://", "dlq", "dlq", None, None).unwrap_err().contains("itself"));
        let e = redrive_job(backend.clone(), "memory://", "dlq", "in", Some("nosuchcolumn = 1"), None).unwrap_err();
        assert!(e.contains("--filter") && e.contains("nosuchcolumn"), "{e}");
        let job = redrive_job(backend, "memory://", "dlq", "in", Some("partition = 0"), Some(100)).unwrap();
        assert!(job.stop_when_drained && job.exactly_once);
        assert_eq!(job.transforms[0].1, "SELECT key, value FROM input WHERE value IS NOT NULL AND (partition = 0)");
    }
}
