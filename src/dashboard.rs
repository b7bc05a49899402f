//! The web dashboard of a running job, served beside `/metrics` by a
//! [`MetricsServer`]: `/` is one HTML page (shipped in the binary, no build step, no
//! CDN) that polls the JSON endpoints under `/api/` every second; scripts read the same
//! endpoints.
//!
//! | endpoint | what |
//! |---|---|
//! | `/api/job` | the job graph, each operator's rows in and out and backpressure time, restarts |
//! | `/api/checkpoints` | counts, and the newest checkpoints: id, duration, size, transaction, outcome |
//! | `/api/partitions` | each input partition: records by state (embedded broker), start offset and lag (Kafka) |
//! | `/api/transactions` | pending transactions (on Kafka: the instance's open ones, without counts) |
//! | `/api/instances` | the instances under the job's checkpoint root and their standing |
//! | `/api/dead-letters` | dead letters by cause |
//!
//! ```no_run
//! # async fn example(job: &shareflow::runtime::Job) -> Result<(), shareflow::prometheus::MetricsError> {
//! use shareflow::dashboard::Dashboard;
//! use shareflow::prometheus::MetricsServer;
//! let server = MetricsServer::bind("127.0.0.1:8080").await?;
//! Dashboard::new(job).serve(&server);
//! println!("dashboard on http://{}/", server.local_addr());
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use hyper::StatusCode;
use serde::Serialize;
use shareflow_checkpoint::instances::{InstanceRegistry, Standing};
use shareflow_connector::broker::EmbeddedBroker;
use shareflow_connector::share::{RecordState, TopicPartition};
use shareflow_runtime::{DeadLetterCause, DeadLetters, Job, JobGraph, JobMetrics};

use crate::prometheus::{MetricsServer, Route, WebRequest, WebResponse};

/// The page: HTML, CSS and JavaScript in one file.
const PAGE: &str = include_str!("dashboard.html");

/// What a dashboard shows, taken from a job (and, on the embedded broker, the broker).
#[derive(Clone)]
pub struct Dashboard {
    name: String,
    group: String,
    prefix: String,
    graph: JobGraph,
    metrics: JobMetrics,
    dead_letters: Option<DeadLetters>,
    registry: InstanceRegistry,
    broker: Option<(EmbeddedBroker, Vec<String>)>,
    #[cfg(feature = "kafka")]
    kafka: Option<(shareflow_connector::kafka::KafkaCluster, Vec<String>)>,
    started: Instant,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard").field("name", &self.name).finish_non_exhaustive()
    }
}

/// `/api/job`.
#[derive(Debug, Serialize)]
pub struct JobView {
    /// The job's id (its checkpoints' directory).
    pub name: String,
    /// The share group.
    pub group: String,
    /// This instance's transaction prefix.
    pub prefix: String,
    /// Milliseconds since the dashboard started.
    pub uptime_ms: u64,
    /// Restarts after failures.
    pub restarts: u64,
    /// Sources and operators.
    pub nodes: Vec<NodeView>,
    /// Edges, by index into `nodes`.
    pub edges: Vec<EdgeView>,
}

/// One node of `/api/job`.
#[derive(Debug, Serialize)]
pub struct NodeView {
    /// Its name.
    pub name: String,
    /// `source` or `operator`.
    pub kind: &'static str,
    /// Subtasks.
    pub parallelism: u32,
    /// Rows received (a source: read), over every attempt.
    pub rows_in: u64,
    /// Rows emitted.
    pub rows_out: u64,
    /// Time spent waiting for room downstream, ms in all (its growth per second is the
    /// backpressure).
    pub backpressure_ms: u64,
}

/// One edge of `/api/job`.
#[derive(Debug, Serialize)]
pub struct EdgeView {
    /// Upstream node.
    pub from: usize,
    /// Downstream node.
    pub to: usize,
    /// How rows are spread.
    pub partitioning: String,
}

/// `/api/checkpoints`.
#[derive(Debug, Serialize)]
pub struct CheckpointsView {
    /// Completed so far.
    pub completed: u64,
    /// Aborted so far.
    pub aborted: u64,
    /// Transactions open now.
    pub transactions_open: u64,
    /// The newest checkpoints, newest first.
    pub history: Vec<CheckpointView>,
}

/// One checkpoint of `/api/checkpoints`.
#[derive(Debug, Serialize)]
pub struct CheckpointView {
    /// n.
    pub id: u64,
    /// T(n).
    pub transaction: String,
    /// Trigger to commit (or abort), ms.
    pub duration_ms: f64,
    /// State bytes.
    pub size_bytes: u64,
    /// `completed`, or `aborted`.
    pub outcome: &'static str,
    /// Why it was aborted.
    pub reason: Option<String>,
}

/// One partition of `/api/partitions`: where the job's group stands on it. The
/// embedded broker tells the state of each record; Kafka tells only the share
/// partition's start offset and lag, so there the states are `None`.
#[derive(Debug, Default, Serialize)]
pub struct PartitionView {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// One past its last offset.
    pub end_offset: i64,
    /// The share-partition start offset (Kafka; `None` until the group initialised it,
    /// and on the embedded broker).
    pub start_offset: Option<i64>,
    /// Records the group has not finished (not yet acknowledged or archived).
    pub unfinished: Option<u64>,
    /// AVAILABLE (never delivered included).
    pub available: Option<u64>,
    /// ACQUIRED by a member.
    pub acquired: Option<u64>,
    /// LOCKED in an undecided transaction.
    pub locked: Option<u64>,
    /// ACKNOWLEDGED.
    pub acknowledged: Option<u64>,
    /// ARCHIVED.
    pub archived: Option<u64>,
}

/// One transaction of `/api/transactions`.
#[derive(Debug, Serialize)]
pub struct TransactionView {
    /// Its id.
    pub id: String,
    /// ONGOING, PREPARE, ... (Kafka's names on Kafka: ONGOING, PREPARECOMMIT, ...)
    pub state: String,
    /// Acknowledgements it holds (embedded broker; Kafka does not tell).
    pub acknowledgements: Option<u64>,
    /// Records it produced (embedded broker; Kafka does not tell).
    pub produced: Option<u64>,
    /// Milliseconds since it began.
    pub age_ms: u64,
}

/// One instance of `/api/instances`.
#[derive(Debug, Serialize)]
pub struct InstanceView {
    /// Its prefix.
    pub instance: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// Its last heartbeat's beat count.
    pub beats: Option<u64>,
    /// The newest checkpoint its last heartbeat named.
    pub checkpoint: Option<u64>,
    /// registered, retired, adopted by ..., being adopted by ...
    pub standing: String,
}

/// `/api/dead-letters`.
#[derive(Debug, Serialize)]
pub struct DeadLettersView {
    /// Whether the job has a dead-letter topic.
    pub enabled: bool,
    /// Dead letters by cause.
    pub by_cause: std::collections::BTreeMap<&'static str, u64>,
}

impl Dashboard {
    /// The dashboard of `job`: its graph, metrics, checkpoints, instances and dead
    /// letters.
    pub fn new(job: &Job) -> Self {
        let config = job.config();
        Self {
            name: config.storage.paths().job_id().to_string(),
            group: config.transaction_group.clone(),
            prefix: config.transaction_prefix.clone(),
            graph: job.graph(),
            metrics: job.metrics_handle(),
            dead_letters: job.dead_letters().cloned(),
            registry: config.storage.registry(),
            broker: None,
            #[cfg(feature = "kafka")]
            kafka: None,
            started: Instant::now(),
        }
    }

    /// Shows the share partitions of `topics` and the pending transactions of the
    /// embedded `broker` the job reads.
    pub fn with_embedded_broker(mut self, broker: &EmbeddedBroker, topics: &[&str]) -> Self {
        self.broker = Some((broker.clone(), topics.iter().map(|t| t.to_string()).collect()));
        self
    }

    /// Shows the share partitions of `topics` on Kafka `cluster` (start offset and lag:
    /// Kafka does not tell the state of each record).
    #[cfg(feature = "kafka")]
    pub fn with_kafka(mut self, cluster: &shareflow_connector::kafka::KafkaCluster, topics: &[&str]) -> Self {
        self.kafka = Some((cluster.clone(), topics.iter().map(|t| t.to_string()).collect()));
        self
    }

    /// Serves the page at `/` and the endpoints under `/api/` on `server`.
    pub fn serve(self, server: &MetricsServer) {
        let this = Arc::new(self);
        let page: Route = Arc::new(|req: WebRequest| {
            Box::pin(async move {
                if req.path == "/" || req.path == "/index.html" {
                    WebResponse {
                        status: StatusCode::OK,
                        content_type: "text/html; charset=utf-8",
                        body: bytes::Bytes::from_static(PAGE.as_bytes()),
                    }
                } else {
                    WebResponse::text(StatusCode::NOT_FOUND, "the dashboard is at /, its data under /api/\n")
                }
            }) as BoxFuture<'static, WebResponse>
        });
        server.route("/", page);
        let api: Route = Arc::new(move |req: WebRequest| {
            let this = this.clone();
            Box::pin(async move { this.api(&req).await })
        });
        server.route("/api/", api);
    }

    async fn api(&self, req: &WebRequest) -> WebResponse {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            WebResponse::text(StatusCode::SERVICE_UNAVAILABLE, format!("cannot read the {what}: {e}\n"))
        };
        match req.path.as_str() {
            "/api/job" => WebResponse::json(&self.job()),
            "/api/checkpoints" => WebResponse::json(&self.checkpoints()),
            "/api/partitions" => match self.partitions().await {
                Ok(p) => WebResponse::json(&p),
                Err(e) => failed("share partitions", &e),
            },
            "/api/transactions" => match self.transactions().await {
                Ok(t) => WebResponse::json(&t),
                Err(e) => failed("transactions", &e),
            },
            "/api/instances" => match self.instances().await {
                Ok(i) => WebResponse::json(&i),
                Err(e) => failed("instance registry", &e),
            },
            "/api/dead-letters" => WebResponse::json(&self.dead_letters()),
            other => WebResponse::text(
                StatusCode::NOT_FOUND,
                format!(
                    "{other}: no such endpoint; there are /api/job, /api/checkpoints, /api/partitions, \
                     /api/transactions, /api/instances and /api/dead-letters\n"
                ),
            ),
        }
    }

    /// `/api/job`.
    pub fn job(&self) -> JobView {
        let snapshot = self.metrics.snapshot();
        JobView {
            name: self.name.clone(),
            group: self.group.clone(),
            prefix: self.prefix.clone(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            restarts: snapshot.restarts,
            nodes: self
                .graph
                .nodes
                .iter()
                .map(|n| {
                    let m = snapshot.operators.get(&n.name).cloned().unwrap_or_default();
                    NodeView {
                        name: n.name.clone(),
                        kind: if n.source { "source" } else { "operator" },
                        parallelism: n.parallelism,
                        rows_in: m.rows_in,
                        rows_out: m.rows_out,
                        backpressure_ms: m.backpressure.as_millis() as u64,
                    }
                })
                .collect(),
            edges: self
                .graph
                .edges
                .iter()
                .map(|e| EdgeView { from: e.from, to: e.to, partitioning: e.partitioning.clone() })
                .collect(),
        }
    }

    /// `/api/checkpoints`.
    pub fn checkpoints(&self) -> CheckpointsView {
        let c = self.metrics.snapshot().checkpoints;
        CheckpointsView {
            completed: c.completed,
            aborted: c.aborted,
            transactions_open: c.transactions_open,
            history: c
                .history
                .iter()
                .rev()
                .map(|o| CheckpointView {
                    id: o.id,
                    transaction: o.transaction.clone(),
                    duration_ms: o.duration.as_secs_f64() * 1e3,
                    size_bytes: o.size_bytes,
                    outcome: if o.aborted.is_some() { "aborted" } else { "completed" },
                    reason: o.aborted.clone(),
                })
                .collect(),
        }
    }

    /// `/api/partitions`: empty unless the job reads an embedded broker or Kafka.
    pub async fn partitions(&self) -> Result<Vec<PartitionView>, shareflow_connector::Error> {
        #[cfg(feature = "kafka")]
        if let Some((cluster, topics)) = &self.kafka {
            let mut out = Vec::new();
            for topic in topics {
                for p in cluster.share_group_partitions(&self.group, topic).await? {
                    out.push(PartitionView {
                        topic: topic.clone(),
                        partition: p.partition,
                        end_offset: p.end_offset,
                        start_offset: p.start_offset,
                        unfinished: p.unfinished(),
                        ..Default::default()
                    });
                }
            }
            return Ok(out);
        }
        let Some((broker, topics)) = &self.broker else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for topic in topics {
            for p in 0..broker.partition_count(topic)? as i32 {
                let tp = TopicPartition::new(topic.as_str(), p);
                let mut counts = [0u64; 5]; // available, acquired, locked, acknowledged, archived
                let mut covered = 0;
                for (first, last, state) in broker.share_partition_runs(&self.group, &tp).await? {
                    let n = (last - first + 1) as u64;
                    covered += n;
                    counts[match state {
                        RecordState::Available => 0,
                        RecordState::Acquired => 1,
                        RecordState::Locked => 2,
                        RecordState::Acknowledged => 3,
                        RecordState::Archived => 4,
                    }] += n;
                }
                let end_offset = broker.end_offset(&tp).await?;
                let start = broker.start_offset(&tp).await?;
                counts[0] += ((end_offset - start).max(0) as u64).saturating_sub(covered);
                let [available, acquired, locked, acknowledged, archived] = counts.map(Some);
                out.push(PartitionView {
                    topic: topic.clone(),
                    partition: p,
                    end_offset,
                    start_offset: None,
                    unfinished: Some(counts[0] + counts[1] + counts[2]),
                    available,
                    acquired,
                    locked,
                    acknowledged,
                    archived,
                });
            }
        }
        Ok(out)
    }

    /// `/api/transactions`: the embedded broker's pending transactions.
    pub async fn transactions(&self) -> Result<Vec<TransactionView>, shareflow_connector::Error> {
        let now = shareflow_checkpoint::now_ms();
        #[cfg(feature = "kafka")]
        if let Some((cluster, _)) = &self.kafka {
            // The instance's slots, `{group}-{prefix}-g{generation}-s{slot}` (not those
            // of a longer prefix that starts the same), each with an open transaction.
            let Ok(template) = shareflow_runtime::TransactionTemplate::new(&self.group, &self.prefix) else {
                return Ok(Vec::new()); // the job refused such a group or prefix before it ran
            };
            let ids = format!("{}-{}-", self.group, self.prefix);
            return Ok(cluster
                .describe_transactions(&ids)
                .await?
                .into_iter()
                .filter(|t| shareflow_connector::kafka::is_slot_id(&t.id, &template))
                .filter_map(|t| {
                    let started = t.started_at_ms?;
                    Some(TransactionView {
                        id: t.id,
                        state: t.state.to_uppercase(),
                        acknowledgements: None,
                        produced: None,
                        age_ms: now.saturating_sub(started),
                    })
                })
                .collect());
        }
        let Some((broker, _)) = &self.broker else { return Ok(Vec::new()) };
        Ok(broker
            .pending_transactions()
            .await?
            .into_iter()
            .map(|t| TransactionView {
                id: t.id.to_string(),
                state: format!("{:?}", t.state).to_uppercase(),
                acknowledgements: Some(t.pending_ack_records),
                produced: Some(t.produced_records),
                age_ms: now.saturating_sub(t.created_at_ms),
            })
            .collect())
    }

    /// `/api/instances`.
    pub async fn instances(&self) -> Result<Vec<InstanceView>, shareflow_checkpoint::CheckpointError> {
        Ok(instance_views(self.registry.observe().await?))
    }

    /// `/api/dead-letters`.
    pub fn dead_letters(&self) -> DeadLettersView {
        let counts = self.dead_letters.as_ref().map(|d| d.counts()).unwrap_or_default();
        DeadLettersView {
            enabled: self.dead_letters.is_some(),
            by_cause: DeadLetterCause::ALL.iter().zip(counts).map(|(c, n)| (c.as_str(), n)).collect(),
        }
    }
}

/// The rows of `/api/instances` (and of `shareflow instances`) for registry `records`.
pub fn instance_views(records: Vec<shareflow_checkpoint::instances::InstanceRecord>) -> Vec<InstanceView> {
    records
        .into_iter()
        .map(|r| InstanceView {
            standing: match r.standing() {
                Standing::Adopted { by } => format!("adopted by {by}"),
                Standing::BeingAdopted { by } => format!("being adopted by {by}"),
                Standing::Retired => "retired".to_string(),
                Standing::Registered => "registered".to_string(),
            },
            beats: r.heartbeat.map(|h| h.beat),
            checkpoint: r.heartbeat.and_then(|h| h.checkpoint_id),
            incarnation: r.incarnation,
            instance: r.prefix,
        })
        .collect()
}
