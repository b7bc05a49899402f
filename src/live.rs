//! Input into a running embedded job (decision 0044). The directory of an embedded
//! broker belongs to the one process that runs a job on it; that process serves
//! `POST /api/topics/{topic}/records` on its HTTP endpoint (the dashboard's), and writes
//! the endpoint's address to `DIR/endpoint` while it runs. `shareflow produce --dir DIR`
//! finds it there and appends through it; with no live process it opens the directory
//! itself.
//!
//! A request's body is records, one per line (each line's bytes are a record's value,
//! as `produce` reads standard input); they are appended in one journaled write, spread
//! over the topic's partitions in turn. The answer says how many went in. A batch is in
//! the topic once it is answered; one in flight when the process dies may or may not
//! be, and `produce` says from which line on it cannot tell.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use shareflow::prometheus::{MetricsServer, Route, WebRequest, WebResponse};
use shareflow_connector::broker::EmbeddedBroker;
use shareflow_connector::share::ProducerRecord;

use crate::embedded_run::BoxError;

/// The file in an embedded broker's directory that holds the running job's address.
pub(crate) const ENDPOINT_FILE: &str = "endpoint";

/// Bytes of lines `produce` sends per request.
const REQUEST_BYTES: usize = 4 << 20;

/// The answer to a produce request.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Produced {
    /// Records appended.
    pub(crate) records: u64,
}

/// `DIR/endpoint` while the job runs; removed when dropped (a process killed leaves it
/// behind, and `produce` then finds nobody listening and opens the directory itself).
#[derive(Debug)]
pub(crate) struct EndpointFile(PathBuf);

impl Drop for EndpointFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Serves produce requests for `broker` on `server`, and writes the server's address to
/// `dir`'s endpoint file.
pub(crate) fn serve(server: &MetricsServer, broker: &EmbeddedBroker, dir: &Path) -> Result<EndpointFile, BoxError> {
    let broker = broker.clone();
    let turn = Arc::new(AtomicU64::new(0));
    let route: Route = Arc::new(move |req: WebRequest| {
        let (broker, turn) = (broker.clone(), turn.clone());
        Box::pin(async move { produce_request(&broker, &turn, req).await })
    });
    server.route("/api/topics/", route);
    let path = dir.join(ENDPOINT_FILE);
    let tmp = dir.join(format!("{ENDPOINT_FILE}.tmp"));
    std::fs::write(&tmp, format!("{}\n", server.local_addr()))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(EndpointFile(path))
}

/// `POST /api/topics/{topic}/records`: the body's lines into `topic`, in one write.
async fn produce_request(broker: &EmbeddedBroker, turn: &AtomicU64, req: WebRequest) -> WebResponse {
    let Some(topic) = req.path.strip_prefix("/api/topics/").and_then(|t| t.strip_suffix("/records")) else {
        return WebResponse::text(StatusCode::NOT_FOUND, "POST /api/topics/{topic}/records\n");
    };
    if req.method != Method::POST {
        return WebResponse::text(StatusCode::METHOD_NOT_ALLOWED, "POST /api/topics/{topic}/records\n");
    }
    let partitions = match broker.partition_count(topic) {
        Ok(n) => n as u64,
        Err(_) => {
            let n = req.param("partitions").and_then(|p| p.parse::<u32>().ok()).filter(|&n| n > 0).unwrap_or(4);
            if let Err(e) = broker.create_topic(topic, n).await {
                return WebResponse::text(StatusCode::BAD_REQUEST, format!("cannot create topic {topic}: {e}\n"));
            }
            u64::from(n)
        }
    };
    let lines = split_lines(&req.body);
    let first = turn.fetch_add(lines.len() as u64, Ordering::Relaxed);
    let records: Vec<ProducerRecord> = lines
        .into_iter()
        .enumerate()
        .map(|(i, line)| ProducerRecord::new(topic, ((first + i as u64) % partitions) as i32, line))
        .collect();
    let n = records.len() as u64;
    match broker.produce(records).await {
        Ok(_) => WebResponse::json(&Produced { records: n }),
        Err(e) => WebResponse::text(StatusCode::SERVICE_UNAVAILABLE, format!("cannot append to {topic}: {e}\n")),
    }
}

/// The lines of `body`, without their `\n` (and a `\r` before it); a last line without
/// `\n` counts too.
fn split_lines(body: &Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &b) in body.iter().enumerate() {
        if b == b'\n' {
            let end = if i > start && body[i - 1] == b'\r' { i - 1 } else { i };
            out.push(body.slice(start..end));
            start = i + 1;
        }
    }
    if start < body.len() {
        out.push(body.slice(start..));
    }
    out
}

/// The address a live job on `dir` serves, if one answers there.
pub(crate) async fn live_endpoint(dir: &Path) -> Option<String> {
    let addr = std::fs::read_to_string(dir.join(ENDPOINT_FILE)).ok()?.trim().to_string();
    // A file a killed process left behind: nobody listens.
    tokio::net::TcpStream::connect(&addr).await.ok().map(|_| addr)
}

/// Appends `input`'s lines to `topic` through the job serving `addr`, a request per
/// [`REQUEST_BYTES`]. Returns how many went in; an error names the first line whose
/// batch was not answered.
pub(crate) async fn produce_through(
    addr: &str,
    topic: &str,
    partitions: u32,
    input: impl BufRead,
) -> Result<u64, BoxError> {
    let mut sent = 0u64;
    let mut batch = Vec::with_capacity(REQUEST_BYTES);
    let mut lines = 0u64;
    for line in input.split(b'\n') {
        let line = line.map_err(|e| format!("reading the records from standard input: {e}"))?;
        batch.extend_from_slice(&line);
        batch.push(b'\n');
        lines += 1;
        if batch.len() >= REQUEST_BYTES {
            sent += post(addr, topic, partitions, std::mem::take(&mut batch), sent).await?;
            lines = 0;
        }
    }
    if lines > 0 {
        sent += post(addr, topic, partitions, batch, sent).await?;
    }
    Ok(sent)
}

/// One produce request; `before` records went in before it.
async fn post(addr: &str, topic: &str, partitions: u32, body: Vec<u8>, before: u64) -> Result<u64, BoxError> {
    let path = format!("/api/topics/{topic}/records?partitions={partitions}");
    let (status, body) = http_post(addr, &path, body).await.map_err(|e| {
        format!(
            "the job at {addr} did not answer a batch: {e}. The first {before} records are in {topic}; \
             from line {} on, a record may or may not be in",
            before + 1
        )
    })?;
    if status != StatusCode::OK {
        return Err(
            format!("the job at {addr} refused a batch ({status}): {}", String::from_utf8_lossy(&body).trim()).into()
        );
    }
    Ok(serde_json::from_slice::<Produced>(&body)?.records)
}

/// `POST path` with `body` to the job serving `addr`: its status and body, or why there
/// was no answer.
pub(crate) async fn http_post(addr: &str, path: &str, body: Vec<u8>) -> Result<(StatusCode, Bytes), String> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, addr)
        .body(http_body_util::Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    driver.abort();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_splits_into_its_lines() {
        let lines = |s: &'static str| split_lines(&Bytes::from(s)).into_iter().map(|b| b.to_vec()).collect::<Vec<_>>();
        assert_eq!(lines("a\nbb\n"), vec![b"a".to_vec(), b"bb".to_vec()]);
        assert_eq!(lines("a\r\n\nc"), vec![b"a".to_vec(), b"".to_vec(), b"c".to_vec()]);
        assert!(lines("").is_empty());
    }
}
