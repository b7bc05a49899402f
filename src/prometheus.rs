//! A Prometheus endpoint: `GET /metrics` serves every [`Metric`] of the given sources in
//! the OpenMetrics text format, read fresh at each scrape.
//!
//! The format is written by the `prometheus-client` crate; names have `_` for the `-`
//! of our spelling (`share-transaction-active` is scraped as `share_transaction_active`),
//! histograms are in milliseconds with power-of-two buckets.
//!
//! ```no_run
//! # async fn example(job: &shareflow::runtime::Job) -> Result<(), shareflow::prometheus::MetricsError> {
//! use shareflow::prometheus::{job_source, MetricsServer};
//! let server = MetricsServer::bind("127.0.0.1:9464").await?;
//! server.add(job_source(job));
//! println!("metrics on http://{}/metrics", server.local_addr());
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use shareflow_runtime::{Job, Metric, MetricValue};

/// Something that has metrics: called at every scrape.
pub type MetricSource = Arc<dyn Fn() -> BoxFuture<'static, Vec<Metric>> + Send + Sync>;

/// The metrics of a running job ([`shareflow_runtime::JobMetricsSnapshot::metrics`]).
pub fn job_source(job: &Job) -> MetricSource {
    let metrics = job.metrics_handle();
    let late = job.late_rows_by_operator();
    let dead_letters = job.dead_letters().cloned();
    Arc::new(move || {
        let mut m = metrics.snapshot().metrics();
        if let Some(d) = &dead_letters {
            for (cause, n) in shareflow_runtime::DeadLetterCause::ALL.iter().zip(d.counts()) {
                m.push(
                    Metric::new(
                        "shareflow-dead-letters-total",
                        "records the job wrote to its dead-letter topic, by cause (an aborted checkpoint's again)",
                        MetricValue::Counter(n),
                    )
                    .label("cause", cause.as_str().to_string()),
                );
            }
        }
        for (operator, rows) in &late {
            m.push(
                Metric::new(
                    "shareflow-sql-late-rows-total",
                    "rows a stateful SQL operator dropped as late (their windows had been emitted)",
                    MetricValue::Counter(rows.get()),
                )
                .label("operator", operator.clone()),
            );
        }
        Box::pin(async move { m })
    })
}

/// A source of metrics known at once.
pub fn source(f: impl Fn() -> Vec<Metric> + Send + Sync + 'static) -> MetricSource {
    Arc::new(move || {
        let m = f();
        Box::pin(async move { m })
    })
}

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address does not parse as `HOST:PORT`.
    #[error("metrics address {addr:?} is not HOST:PORT (e.g. 127.0.0.1:9464): {reason}")]
    Address {
        /// What was given.
        addr: String,
        /// Why it does not parse.
        reason: String,
    },
    /// Nothing can listen there.
    #[error("cannot serve metrics on {addr}: {source}; pick a free port (or port 0 for any)")]
    Bind {
        /// Where.
        addr: String,
        /// The socket error.
        source: std::io::Error,
    },
}

/// The sources one endpoint reads.
type Sources = Arc<RwLock<Vec<MetricSource>>>;

/// A request a [`Route`] answers, its body read whole.
#[derive(Debug)]
pub struct WebRequest {
    /// GET, POST, ...
    pub method: Method,
    /// The path, from its `/`.
    pub path: String,
    /// The query string without its `?` (empty if none).
    pub query: String,
    /// The body (at most [`MAX_BODY_BYTES`]).
    pub body: Bytes,
}

impl WebRequest {
    /// The value of query parameter `name`, if given (not percent-decoded: the
    /// parameters here are numbers and plain names).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
    }
}

/// A [`Route`]'s answer.
#[derive(Debug, Clone)]
pub struct WebResponse {
    /// The HTTP status.
    pub status: StatusCode,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Bytes,
}

impl WebResponse {
    /// 200 with `value` as JSON.
    pub fn json(value: &impl serde::Serialize) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self { status: StatusCode::OK, content_type: "application/json", body: body.into() },
            Err(e) => Self::text(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the answer: {e}\n")),
        }
    }

    /// `status` with a plain-text message.
    pub fn text(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: Bytes::from(message.into()) }
    }
}

/// Answers the requests under one path prefix ([`MetricsServer::route`]).
pub type Route = Arc<dyn Fn(WebRequest) -> BoxFuture<'static, WebResponse> + Send + Sync>;

/// The largest request body a route is given; a larger one gets 413.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// The routes of one endpoint, by path prefix.
type Routes = Arc<RwLock<Vec<(String, Route)>>>;

/// A running endpoint: `/metrics`, and the routes added to it (the dashboard, its
/// `/api/`, an embedded job's produce endpoint). It stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    sources: Sources,
    routes: Routes,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks a free one), serving no metrics
    /// until [`add`](Self::add) gives it some. Bind first, before any work starts, so a
    /// taken port fails at once.
    pub async fn bind(addr: &str) -> Result<Self, MetricsError> {
        let parsed: SocketAddr = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| MetricsError::Address { addr: addr.into(), reason: e.to_string() })?
            .next()
            .ok_or_else(|| MetricsError::Address { addr: addr.into(), reason: "it resolves to nothing".into() })?;
        let listener = tokio::net::TcpListener::bind(parsed)
            .await
            .map_err(|source| MetricsError::Bind { addr: addr.into(), source })?;
        let local = listener.local_addr().map_err(|source| MetricsError::Bind { addr: addr.into(), source })?;
        let sources: Sources = Arc::default();
        let routes: Routes = Arc::default();
        let served = (sources.clone(), routes.clone());
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, say: wait a little, then go on serving.
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (sources, routes) = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| respond(req, sources.clone(), routes.clone()));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                        tracing::debug!(error = %e, "metrics endpoint: connection ended");
                    }
                });
            }
        });
        Ok(Self { addr: local, sources, routes, task })
    }

    /// Answers every request whose path starts with `prefix` with `route` (the longest
    /// matching prefix wins; `/metrics` stays the metrics').
    pub fn route(&self, prefix: &str, route: Route) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        routes.retain(|(p, _)| p != prefix);
        routes.push((prefix.to_string(), route));
        routes.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    }

    /// Serves `source` too, from the next scrape on.
    pub fn add(&self, source: MetricSource) {
        self.sources.write().unwrap_or_else(|p| p.into_inner()).push(source);
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `response` as hyper's.
fn reply(response: WebResponse) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut r = Response::new(Full::new(response.body));
    *r.status_mut() = response.status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(response.content_type));
    r.headers_mut().insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-store"));
    Ok(r)
}

/// Hands `req` to the route of the longest prefix it matches, its body read whole.
async fn serve_route(req: Request<hyper::body::Incoming>, route: Route) -> Result<Response<Full<Bytes>>, Infallible> {
    use http_body_util::BodyExt;
    let (parts, body) = req.into_parts();
    let body = match http_body_util::Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let message = format!("the request body could not be read whole (at most {MAX_BODY_BYTES} bytes): {e}\n");
            return reply(WebResponse::text(StatusCode::PAYLOAD_TOO_LARGE, message));
        }
    };
    let request = WebRequest {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        body,
    };
    reply(route(request).await)
}

async fn respond(
    req: Request<hyper::body::Incoming>,
    sources: Sources,
    routes: Routes,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status, content_type, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        Ok(r)
    };
    if req.uri().path() != "/metrics" {
        let found = {
            let routes = routes.read().unwrap_or_else(|p| p.into_inner());
            routes.iter().find(|(p, _)| req.uri().path().starts_with(p.as_str())).map(|(_, r)| r.clone())
        };
        return match found {
            Some(r) => serve_route(req, r).await,
            None => reply(StatusCode::NOT_FOUND, "text/plain", "metrics are at /metrics\n".into()),
        };
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET /metrics\n".into());
    }
    let sources: Vec<MetricSource> = sources.read().unwrap_or_else(|p| p.into_inner()).clone();
    let mut metrics = Vec::new();
    for s in sources {
        metrics.extend(s().await);
    }
    match encode(metrics) {
        Ok(text) => reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", text),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("cannot encode the metrics: {e}\n")),
    }
}

/// `metrics` in the OpenMetrics text format. Series of one name share one descriptor
/// (the first one's help and type); a counter's `-total` suffix is the format's `_total`.
pub fn encode(metrics: Vec<Metric>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot(metrics)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

/// The metrics read for one scrape.
#[derive(Debug)]
struct Snapshot(Vec<Metric>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut names: Vec<&'static str> = Vec::new();
        for m in &self.0 {
            if !names.contains(&m.name) {
                names.push(m.name);
            }
        }
        for name in names {
            let series: Vec<&Metric> = self.0.iter().filter(|m| m.name == name).collect();
            let first = series[0];
            let kind = Value(&first.value).metric_type();
            let mut exported = name.replace('-', "_");
            if kind == MetricType::Counter {
                // The format adds `_total` to a counter's name.
                if let Some(stem) = exported.strip_suffix("_total") {
                    exported = stem.to_string();
                }
            }
            let mut family = encoder.encode_descriptor(&exported, first.help, None, kind)?;
            for m in series {
                // A series whose type differs from its name's first is left out, not
                // written under the wrong type.
                if std::mem::discriminant(&m.value) != std::mem::discriminant(&first.value) {
                    continue;
                }
                // No labels write no braces.
                Value(&m.value).encode(family.encode_family(&m.labels)?)?;
            }
        }
        Ok(())
    }
}

/// One value, written as its type.
#[derive(Debug)]
struct Value<'a>(&'a MetricValue);

impl EncodeMetric for Value<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        match self.0 {
            MetricValue::Counter(v) => {
                encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(v, None)
            }
            MetricValue::Gauge(v) => encoder.encode_gauge(v),
            MetricValue::Histogram(h) => encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                h.sum_ms,
                h.count,
                // Each bucket alone: the encoder sums them into Prometheus's cumulative
                // form itself (given cumulative counts, it would count them twice).
                &h.bucket_counts(),
                None,
            ),
        }
    }

    fn metric_type(&self) -> MetricType {
        match self.0 {
            MetricValue::Counter(_) => MetricType::Counter,
            MetricValue::Gauge(_) => MetricType::Gauge,
            MetricValue::Histogram(_) => MetricType::Histogram,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shareflow_runtime::Histogram;

    #[tokio::test]
    async fn a_stateful_jobs_late_rows_are_a_counter_per_operator() {
        use shareflow_runtime::testing::{CollectSink, SequenceSource};
        use shareflow_runtime::{JobBuilder, JobConfig};
        let sink = CollectSink::new();
        let job = JobBuilder::new();
        // Event time falls back by 10 s after offset 100: the rows after it are late.
        let throttled = SequenceSource::factory_throttled(1, 200, 10, std::time::Duration::from_millis(2));
        job.source("numbers", SequenceSource::schema(), throttled)
            .sql(
                "agg",
                r#"SELECT split, count(*) AS c FROM input
                   GROUP BY split, tumble(CASE WHEN "offset" < 100 THEN "offset" + 20000 ELSE "offset" END, INTERVAL '1 second')"#,
            )
            .sink("collect", sink.factory())
            .participant(sink.participant());
        let storage = shareflow_checkpoint::CheckpointStore::from_url("memory://late/c", &[], "late").unwrap();
        let job = job
            .build(JobConfig::new(storage, "late", "late").checkpoint_interval(std::time::Duration::from_millis(1)))
            .unwrap();
        job.run().await.unwrap();
        let metrics = job_source(&job)().await;
        let late: Vec<&Metric> = metrics.iter().filter(|m| m.name == "shareflow-sql-late-rows-total").collect();
        assert_eq!(late.len(), 1, "{late:?}");
        assert_eq!(late[0].labels, vec![("operator", "agg".to_string())]);
        assert!(job.late_rows() > 0, "rows after the fall back are late");
        assert!(matches!(late[0].value, MetricValue::Counter(n) if n == job.late_rows()), "{late:?}");
    }

    /// A dead-letter writer that keeps what it is given.
    #[derive(Default)]
    struct Kept(std::sync::Mutex<Vec<shareflow_runtime::DeadLetter>>);

    #[shareflow_runtime::async_trait]
    impl shareflow_runtime::DeadLetterWriter for Kept {
        async fn write(
            &self,
            _txn: &shareflow_checkpoint::TransactionId,
            letters: Vec<shareflow_runtime::DeadLetter>,
        ) -> shareflow_runtime::Result<()> {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).extend(letters);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_jobs_dead_letters_are_a_counter_per_cause() {
        use shareflow_runtime::testing::{CollectSink, SequenceSource};
        use shareflow_runtime::{JobBuilder, JobConfig};
        let sink = CollectSink::new();
        let kept = Arc::new(Kept::default());
        let job = JobBuilder::new();
        // One row in ten casts text that is not a number: 20 of 200.
        job.source("numbers", SequenceSource::schema(), SequenceSource::factory(1, 200, 10))
            .sql(
                "parse",
                r#"SELECT split, CAST(CASE WHEN "offset" % 10 = 3 THEN 'x' ELSE CAST("offset" AS VARCHAR) END AS BIGINT) AS n
                   FROM input"#,
            )
            .sink("collect", sink.factory())
            .participant(sink.participant());
        job.dead_letters(kept.clone());
        let storage = shareflow_checkpoint::CheckpointStore::from_url("memory://dlq/c", &[], "dlq").unwrap();
        let job = job
            .build(JobConfig::new(storage, "dlq", "dlq").checkpoint_interval(std::time::Duration::from_millis(1)))
            .unwrap();
        job.run().await.unwrap();
        let metrics = job_source(&job)().await;
        let dead: Vec<&Metric> = metrics.iter().filter(|m| m.name == "shareflow-dead-letters-total").collect();
        let by_cause: Vec<(String, u64)> = dead
            .iter()
            .map(|m| match m.value {
                MetricValue::Counter(n) => (m.labels[0].1.clone(), n),
                _ => panic!("{m:?}"),
            })
            .collect();
        let want: Vec<(String, u64)> = [("decode", 0), ("sql", 20), ("sink", 0), ("delivery-limit", 0)]
            .iter()
            .map(|(c, n)| (c.to_string(), *n))
            .collect();
        assert_eq!(by_cause, want);
        let kept = kept.0.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(kept.len(), 20, "each bad row once");
        assert!(kept.iter().all(|l| l.message.contains("parse") || l.message.contains("x")), "{:?}", kept[0]);
        assert_eq!(sink.committed_rows(), 180, "the other rows went on");
    }

    #[test]
    fn the_text_has_every_metric_typed_with_prometheus_names() {
        let mut h = Histogram::default();
        h.record(std::time::Duration::from_millis(3));
        let text = encode(vec![
            Metric::new("share-transaction-abort-total", "aborted", MetricValue::Counter(3)),
            Metric::new("share-transaction-active", "active", MetricValue::Gauge(2)),
            Metric::new("share-transaction-commit-time-ms", "commit", MetricValue::Histogram(Box::new(h))),
            Metric::new("shareflow-records-in-total", "in", MetricValue::Counter(5)).label("operator", "sink"),
            Metric::new("shareflow-records-in-total", "in", MetricValue::Counter(9)).label("operator", "map"),
        ])
        .expect("encode");
        assert!(text.contains("# TYPE share_transaction_abort counter\nshare_transaction_abort_total 3\n"), "{text}");
        assert!(text.contains("# TYPE share_transaction_active gauge\nshare_transaction_active 2\n"), "{text}");
        // 3 ms falls in the bucket below 4 ms, and in every larger one.
        assert!(text.contains("share_transaction_commit_time_ms_bucket{le=\"2.0\"} 0\n"), "{text}");
        assert!(text.contains("share_transaction_commit_time_ms_bucket{le=\"4.0\"} 1\n"), "{text}");
        assert!(text.contains("share_transaction_commit_time_ms_count 1\n"), "{text}");
        assert!(text.contains("shareflow_records_in_total{operator=\"sink\"} 5\n"), "{text}");
        assert!(text.contains("shareflow_records_in_total{operator=\"map\"} 9\n"), "{text}");
        // One descriptor for both series.
        assert_eq!(text.matches("# TYPE shareflow_records_in counter").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// Every bucket counts the samples at or below its bound, once; the last is `+Inf`
    /// and holds them all.
    #[test]
    fn histogram_buckets_are_cumulative_once_and_end_at_inf() {
        let mut h = Histogram::default();
        for ms in [3, 3, 100] {
            h.record(std::time::Duration::from_millis(ms));
        }
        let text =
            encode(vec![Metric::new("commit-time-ms", "commit", MetricValue::Histogram(Box::new(h)))]).expect("encode");
        let buckets: Vec<(String, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("commit_time_ms_bucket{le=\""))
            .map(|l| {
                let (le, n) = l.split_once("\"} ").expect("a bucket line");
                (le.to_string(), n.parse().expect("a count"))
            })
            .collect();
        let count = |le: &str| buckets.iter().find(|(l, _)| l == le).map(|b| b.1);
        assert_eq!((count("2.0"), count("4.0"), count("64.0"), count("128.0")), (Some(0), Some(2), Some(2), Some(3)));
        assert_eq!(buckets.last(), Some(&("+Inf".to_string(), 3)), "{text}");
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{text}");
        assert!(text.contains("commit_time_ms_count 3\n"), "{text}");
    }

    #[tokio::test]
    async fn a_bad_address_is_named() {
        let e = MetricsServer::bind("no-port").await.expect_err("no port");
        assert!(e.to_string().contains("\"no-port\" is not HOST:PORT"), "{e}");
        let first = MetricsServer::bind("127.0.0.1:0").await.expect("any port");
        let taken = first.local_addr().to_string();
        let e = MetricsServer::bind(&taken).await.expect_err("taken");
        assert!(e.to_string().contains(&format!("cannot serve metrics on {taken}")), "{e}");
    }
}
