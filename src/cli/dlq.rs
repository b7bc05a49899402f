//! `shareflow dlq list|redrive`: a job's dead letters ([`crate::dlq`]), on an embedded
//! broker directory (`--dir`) or on Kafka (`--kafka`).

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::{fail, Args};
use super::exit::{admin_exit, report};
use crate::job_file::Backend;

/// `shareflow dlq list ...` or `shareflow dlq redrive ...`.
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let what = if args.0.is_empty() { String::new() } else { args.0.remove(0) };
    let parsed = (|| {
        let topic = args.value("--topic")?.ok_or("dlq: give --topic, the dead-letter topic")?;
        let backend = match (args.value("--dir")?, args.value("--kafka")?) {
            (Some(dir), None) => Backend::Embedded(dir),
            (None, Some(kafka)) => Backend::Kafka(kafka),
            _ => return Err("dlq: give --dir DIR (an embedded broker) or --kafka HOST:PORT, one of them".to_string()),
        };
        Ok::<_, String>((topic, backend, args.flag("--json")))
    })();
    let (topic, backend, json) = match parsed {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match what.as_str() {
        "list" => match args.finish() {
            Ok(()) => list(runtime, &backend, &topic, json),
            Err(e) => fail(e),
        },
        "redrive" => redrive(args, runtime, backend, &topic, json),
        other => fail(format!("dlq {other:?}: give list or redrive")),
    }
}

fn list(runtime: &Runtime, backend: &Backend, topic: &str, json: bool) -> ExitCode {
    let records = runtime.block_on(async {
        match backend {
            Backend::Embedded(dir) => crate::dlq::read_embedded(std::path::Path::new(dir), topic).await,
            Backend::Kafka(bootstrap) => read_kafka(bootstrap, topic).await,
        }
    });
    admin_exit(
        "dlq list",
        records.map(|records| {
            for r in &records {
                if json {
                    println!("{}", crate::dlq::list_json(r));
                } else {
                    println!("{}", crate::dlq::list_line(r));
                }
            }
            if !json {
                println!("{} dead letters in {topic}", records.len());
            }
        }),
    )
}

#[cfg(feature = "kafka")]
async fn read_kafka(
    bootstrap: &str,
    topic: &str,
) -> Result<Vec<shareflow_connector::share::Record>, crate::embedded_run::BoxError> {
    let cluster = shareflow_connector::kafka::KafkaCluster::connect(bootstrap).await?;
    Ok(cluster.read_committed_records_from(topic, &[]).await?.0)
}

#[cfg(not(feature = "kafka"))]
async fn read_kafka(
    _: &str,
    _: &str,
) -> Result<Vec<shareflow_connector::share::Record>, crate::embedded_run::BoxError> {
    Err(super::WITHOUT_KAFKA.into())
}

fn redrive(args: &mut Args, runtime: &Runtime, backend: Backend, topic: &str, json: bool) -> ExitCode {
    let parsed = (|| {
        let to = args.value("--to")?.ok_or("dlq redrive: give --to, the input topic to put the records back into")?;
        let filter = args.value("--filter")?;
        let max_rate = args.number::<u64>("--max-rate")?;
        if max_rate == Some(0) {
            return Err("--max-rate must be at least 1".to_string());
        }
        let checkpoints = match (args.value("--checkpoints")?, &backend) {
            (Some(c), _) => c,
            (None, Backend::Embedded(dir)) => format!("file://{}/redrive-checkpoints", absolute(dir)),
            (None, Backend::Kafka(_)) => format!("file://{}/target/shareflow-redrive/checkpoints", absolute(".")),
        };
        args.finish()?;
        crate::dlq::redrive_job(backend.clone(), &checkpoints, topic, &to, filter.as_deref(), max_rate)
    })();
    let job = match parsed {
        Ok(j) => j,
        Err(e) => return fail(e),
    };
    match &backend {
        Backend::Embedded(dir) => {
            let outcome = runtime.block_on(crate::embedded_run::run(
                &job,
                std::path::Path::new(dir),
                &job.checkpoints,
                "redrive",
            ));
            report("dlq redrive", outcome, json, |s| s.to_json(), |s| s.to_text(), |_| true)
        }
        Backend::Kafka(bootstrap) => kafka_redrive(runtime, bootstrap, job, json),
    }
}

#[cfg(feature = "kafka")]
fn kafka_redrive(runtime: &Runtime, bootstrap: &str, job: crate::job_file::JobFile, json: bool) -> ExitCode {
    let mut options = crate::kafka_run::RunOptions::new(bootstrap, &job.group, "redrive", &job.checkpoints);
    options.parallelism = 1;
    options.max_rate = job.max_rate;
    options.interval = job.interval;
    options.job = Some(job);
    report(
        "dlq redrive",
        runtime.block_on(crate::kafka_run::run(&options)),
        json,
        |s| s.to_json(),
        |s| s.to_text(),
        |_| true,
    )
}

#[cfg(not(feature = "kafka"))]
fn kafka_redrive(_: &Runtime, _: &str, _: crate::job_file::JobFile, _: bool) -> ExitCode {
    fail(super::WITHOUT_KAFKA.to_string())
}

/// `dir` made absolute against the working directory, for a `file://` URL.
fn absolute(dir: &str) -> String {
    let path = std::path::Path::new(dir);
    let full =
        if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(path) };
    full.display().to_string()
}
