//! `shareflow dlq list|redrive`: a job's dead letters ([`crate::dlq`]), on an embedded
//! broker directory (`--dir`) or on Kafka (`--kafka`).

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::fail;
use super::exit::{admin_exit, report};
use super::line::{DlqBroker, DlqCommand};
use crate::job_file::Backend;

/// `shareflow dlq list ...` or `shareflow dlq redrive ...`.
pub(crate) fn command(command: DlqCommand, runtime: &Runtime) -> ExitCode {
    let backend = |b: DlqBroker| match (b.dir, b.kafka) {
        (Some(dir), _) => Backend::Embedded(dir),
        (None, kafka) => Backend::Kafka(kafka.unwrap_or_default()),
    };
    match command {
        DlqCommand::List { topic, broker, json } => list(runtime, &backend(broker), &topic, json),
        DlqCommand::Redrive { topic, to, broker, filter, max_rate, checkpoints, json } => {
            let backend = backend(broker);
            let checkpoints = match (checkpoints, &backend) {
                (Some(c), _) => c,
                (None, Backend::Embedded(dir)) => format!("file://{}/redrive-checkpoints", absolute(dir)),
                (None, Backend::Kafka(_)) => format!("file://{}/target/shareflow-redrive/checkpoints", absolute(".")),
            };
            match crate::dlq::redrive_job(backend.clone(), &checkpoints, &topic, &to, filter.as_deref(), max_rate) {
                Ok(job) => redrive(runtime, backend, job, json),
                Err(e) => fail(e),
            }
        }
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
        records.and_then(|records| {
            for r in &records {
                if json {
                    println!("{}", serde_json::to_string(&crate::dlq::list_json(r))?);
                } else {
                    println!("{}", crate::dlq::list_line(r));
                }
            }
            if !json {
                println!("{} dead letters in {topic}", records.len());
            }
            Ok(())
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

fn redrive(runtime: &Runtime, backend: Backend, job: crate::job_file::JobFile, json: bool) -> ExitCode {
    match &backend {
        Backend::Embedded(dir) => {
            let on = crate::embedded_run::RunOn {
                checkpoints: &job.checkpoints,
                instance: "redrive",
                metrics_addr: None,
                crashes: &[],
                savepoint: None,
            };
            let outcome = runtime.block_on(crate::embedded_run::run(&job, std::path::Path::new(dir), &on));
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
