//! `shareflow consume`: the records of a topic of an embedded broker directory, as JSON
//! lines or raw values. It opens the directory read-only, so it works beside a job that
//! runs on it; `--follow` opens it again every poll to see what the job wrote since.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use shareflow_connector::broker::{BrokerOptions, EmbeddedBroker, FetchedRecord};
use shareflow_connector::share::{IsolationLevel, TopicPartition};
use tokio::runtime::Runtime;

use super::exit::admin_exit;
use super::line::{ConsumeArgs, Format, Position};
use crate::embedded_run::BoxError;

/// How long `--follow` waits between looks at the directory.
const POLL: Duration = Duration::from_millis(200);

/// Records per fetch.
const BATCH: usize = 10_000;

/// `shareflow consume --dir DIR --topic T ...`.
pub(crate) fn command(args: ConsumeArgs, runtime: &Runtime) -> ExitCode {
    admin_exit("consume", runtime.block_on(consume(&args, &mut std::io::stdout().lock())))
}

/// One record as `--format json` prints it. Keys, values and header values are text
/// (bytes that are not UTF-8 are replaced with U+FFFD).
#[derive(Debug, serde::Serialize)]
struct Line<'a> {
    partition: i32,
    offset: i64,
    timestamp: i64,
    key: Option<std::borrow::Cow<'a, str>>,
    value: Option<std::borrow::Cow<'a, str>>,
    headers: Vec<(&'a str, std::borrow::Cow<'a, str>)>,
}

/// Writes one record in `format`.
fn write_record(out: &mut impl Write, partition: i32, r: &FetchedRecord, format: Format) -> Result<(), BoxError> {
    let text = |b: &'_ bytes::Bytes| String::from_utf8_lossy(b).into_owned();
    match format {
        Format::Raw => {
            out.write_all(r.value.as_deref().unwrap_or_default())?;
            out.write_all(b"\n")?;
        }
        Format::Json => {
            let line = Line {
                partition,
                offset: r.offset,
                timestamp: r.timestamp_ms,
                key: r.key.as_ref().map(|k| text(k).into()),
                value: r.value.as_ref().map(|v| text(v).into()),
                headers: r.headers.iter().map(|(k, v)| (k.as_str(), text(v).into())).collect(),
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
    }
    Ok(())
}

/// Prints the topic's records to `out` until it has `--count` of them, or (without
/// `--follow`) until it reaches the end of every partition.
pub(crate) async fn consume(args: &ConsumeArgs, out: &mut impl Write) -> Result<(), BoxError> {
    let dir = Path::new(&args.dir);
    if !dir.is_dir() {
        return Err(
            format!("consume: {} is not a directory: give --dir the job's broker directory", dir.display()).into()
        );
    }
    let isolation = if args.read_uncommitted { IsolationLevel::ReadUncommitted } else { IsolationLevel::ReadCommitted };
    let mut next: Vec<i64> = Vec::new();
    let mut printed = 0u64;
    let wanted = args.count.unwrap_or(u64::MAX);
    loop {
        let broker = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir)?).await?;
        let partitions = broker.partition_count(&args.topic).map_err(|e| {
            format!("{e}: topic {:?} is not in {} (the job's topics are in its job file)", args.topic, dir.display())
        })?;
        while next.len() < partitions {
            let tp = TopicPartition::new(args.topic.as_str(), next.len() as i32);
            next.push(match args.from {
                Position::Start => broker.start_offset(&tp).await?,
                Position::End => broker.end_offset(&tp).await?,
            });
        }
        let mut progressed = true;
        while progressed && printed < wanted {
            progressed = false;
            for (p, at) in next.iter_mut().enumerate() {
                let tp = TopicPartition::new(args.topic.as_str(), p as i32);
                let left = (wanted - printed).min(BATCH as u64) as usize;
                let records = broker.fetch(&tp, *at, left, isolation).await?;
                for r in &records {
                    write_record(out, p as i32, r, args.format)?;
                    *at = r.offset + 1;
                    printed += 1;
                }
                progressed |= !records.is_empty();
                if printed >= wanted {
                    break;
                }
            }
        }
        out.flush()?;
        broker.close();
        if printed >= wanted || !args.follow {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}
