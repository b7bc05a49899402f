//! Where the S3 server started by `scripts/s3` is, if it is.
#![allow(unreachable_pub, dead_code)]

use std::sync::Arc;

use object_store::ObjectStore;

/// The S3 server's store and bucket URL, or `None` with the reason printed. Under CI a
/// missing server is a failure, never a skip.
pub fn s3_store() -> Option<(Arc<dyn ObjectStore>, String)> {
    let endpoint = std::env::var("SHAREFLOW_S3_ENDPOINT").ok();
    let Some(endpoint) = endpoint else {
        let why = "SHAREFLOW_S3_ENDPOINT is not set: start the S3 server with ./scripts/s3 start (./scripts/test does)";
        assert!(std::env::var("CI").is_err(), "CI must test against the S3 server: {why}");
        eprintln!("skipping the S3 backend: {why}");
        return None;
    };
    let bucket = std::env::var("SHAREFLOW_S3_BUCKET").unwrap_or_else(|_| "shareflow".into());
    let key = std::env::var("SHAREFLOW_S3_ACCESS_KEY").unwrap_or_else(|_| "shareflow".into());
    let secret = std::env::var("SHAREFLOW_S3_SECRET_KEY").unwrap_or_else(|_| "shareflow-secret".into());
    let url = format!("s3://{bucket}");
    let (store, _) = shareflow::checkpoint::open_url(
        &url,
        &[("endpoint", &endpoint), ("access_key_id", &key), ("secret_access_key", &secret), ("region", "us-east-1")],
    )
    .unwrap_or_else(|e| panic!("cannot open the S3 server at {endpoint}: {e}"));
    Some((store, url))
}

/// A tag unique to this test run, so runs sharing the server do not collide.
pub fn run_tag() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{}", std::process::id(), nanos % 1_000_000_000)
}

/// The environment a `shareflow` process needs to keep its checkpoints on the S3 server
/// (object_store reads the `AWS_*` variables).
pub fn aws_env() -> Vec<(&'static str, String)> {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    vec![
        ("AWS_ACCESS_KEY_ID", var("SHAREFLOW_S3_ACCESS_KEY")),
        ("AWS_SECRET_ACCESS_KEY", var("SHAREFLOW_S3_SECRET_KEY")),
        ("AWS_ENDPOINT_URL", var("SHAREFLOW_S3_ENDPOINT")),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}
