//! Opening checkpoint storage from a URL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;

use crate::error::{CheckpointError, Result};
use crate::local::DurableLocalStore;

/// Options `s3://` URLs accept.
pub const S3_OPTIONS: &[&str] = &["endpoint", "region", "access_key_id", "secret_access_key", "allow_http"];

fn invalid(url: &str, option: &str, reason: impl ToString) -> CheckpointError {
    CheckpointError::InvalidUrl { url: url.to_string(), option: option.to_string(), reason: reason.to_string() }
}

fn memory_store(name: &str) -> Arc<dyn ObjectStore> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    let stores = STORES.get_or_init(Default::default);
    let mut stores = crate::sync::lock(stores);
    stores.entry(name.to_string()).or_insert_with(|| Arc::new(InMemory::new())).clone()
}

/// Opens storage for a URL and returns the store and the root prefix inside it.
///
/// - `memory://NAME/prefix`: an in-process store, shared by every open of the same
///   `NAME` in this process (so a restarted job finds its checkpoints).
/// - `file:///absolute/dir`: a local directory, fsynced on every write.
/// - `s3://bucket/prefix` with options `endpoint`, `region`, `access_key_id`,
///   `secret_access_key`, `allow_http` (or the usual `AWS_*` environment variables).
/// - `gs://` and `az://` when built with the `gcp` or `azure` feature.
///
/// ```
/// let (_store, root) = shareflow_checkpoint::open_url("memory://doc/checkpoints", &[]).unwrap();
/// assert_eq!(root.as_ref(), "checkpoints");
/// let err = shareflow_checkpoint::open_url("s3://bucket", &[("endpoit", "x")]).unwrap_err();
/// assert!(err.to_string().contains("endpoit"));
/// ```
pub fn open_url(url: &str, options: &[(&str, &str)]) -> Result<(Arc<dyn ObjectStore>, Path)> {
    let parsed = url::Url::parse(url).map_err(|e| invalid(url, "url", format!("does not parse ({e})")))?;
    let prefix = Path::parse(parsed.path().trim_start_matches('/'))
        .map_err(|e| invalid(url, "path", format!("is not a valid object path ({e})")))?;
    match parsed.scheme() {
        "memory" => {
            reject_options(url, options, &[])?;
            Ok((memory_store(parsed.host_str().unwrap_or_default()), prefix))
        }
        "file" => {
            reject_options(url, options, &[])?;
            if parsed.host_str().is_some_and(|h| !h.is_empty()) {
                return Err(invalid(
                    url,
                    "path",
                    "file:// URLs need an absolute path with three slashes, like file:///var/lib/shareflow",
                ));
            }
            let dir = parsed.to_file_path().map_err(|()| invalid(url, "path", "must be an absolute local path"))?;
            let store = DurableLocalStore::new(&dir)
                .map_err(|e| invalid(url, "path", format!("cannot create {} ({e})", dir.display())))?;
            Ok((Arc::new(store), Path::default()))
        }
        "s3" => open_s3(url, &parsed, options).map(|s| (s, prefix)),
        "gs" | "az" | "abfs" | "abfss" => {
            let opts = options.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            let (store, path) = object_store::parse_url_opts(&parsed, opts).map_err(|e| {
                invalid(url, "scheme", format!("{e} (gs:// needs the `gcp` feature, az:// the `azure` feature)"))
            })?;
            Ok((Arc::from(store), path))
        }
        other => Err(invalid(
            url,
            "scheme",
            format!("{other}:// is not supported; use memory://, file://, s3://, gs:// or az://"),
        )),
    }
}

fn reject_options(url: &str, options: &[(&str, &str)], allowed: &[&str]) -> Result<()> {
    match options.iter().find(|(k, _)| !allowed.contains(k)) {
        Some((k, _)) => Err(invalid(url, k, format!("unknown option; this scheme accepts {allowed:?}"))),
        None => Ok(()),
    }
}

#[cfg(feature = "s3")]
fn open_s3(url: &str, parsed: &url::Url, options: &[(&str, &str)]) -> Result<Arc<dyn ObjectStore>> {
    use object_store::aws::AmazonS3Builder;
    reject_options(url, options, S3_OPTIONS)?;
    let bucket = parsed
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| invalid(url, "bucket", "s3:// URLs need a bucket: s3://bucket/prefix"))?;
    let get = |k: &str, env: &str| {
        options.iter().find(|(key, _)| *key == k).map(|(_, v)| v.to_string()).or_else(|| std::env::var(env).ok())
    };
    let key = get("access_key_id", "AWS_ACCESS_KEY_ID");
    let secret = get("secret_access_key", "AWS_SECRET_ACCESS_KEY");
    let (Some(key), Some(secret)) = (key, secret) else {
        return Err(invalid(
            url,
            "access_key_id/secret_access_key",
            "s3:// needs credentials: pass access_key_id and secret_access_key, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ));
    };
    let region = get("region", "AWS_REGION").unwrap_or_else(|| "us-east-1".to_string());
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(region)
        .with_access_key_id(key)
        .with_secret_access_key(secret);
    if let Some(endpoint) = get("endpoint", "AWS_ENDPOINT_URL") {
        if url::Url::parse(&endpoint).is_err() {
            return Err(invalid(url, "endpoint", format!("{endpoint:?} is not a URL like http://127.0.0.1:9000")));
        }
        builder = builder.with_endpoint(&endpoint).with_allow_http(endpoint.starts_with("http://"));
    }
    if let Some(allow) = get("allow_http", "AWS_ALLOW_HTTP") {
        let allow = allow.parse::<bool>().map_err(|_| invalid(url, "allow_http", "must be true or false"))?;
        builder = builder.with_allow_http(allow);
    }
    let store = builder.build().map_err(|e| invalid(url, "s3", e))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "s3"))]
fn open_s3(url: &str, _parsed: &url::Url, _options: &[(&str, &str)]) -> Result<Arc<dyn ObjectStore>> {
    Err(invalid(url, "scheme", "this build has no s3:// support; enable the `s3` feature of shareflow-checkpoint"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option_of(err: CheckpointError) -> String {
        match err {
            CheckpointError::InvalidUrl { option, .. } => option,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn bad_urls_name_the_option() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case] = &[
            ("not a url", &[], "url"),
            ("ftp://x/y", &[], "scheme"),
            ("file://relative/dir", &[], "path"),
            ("memory://x", &[("region", "eu")], "region"),
            ("s3:///prefix", &[("access_key_id", "a"), ("secret_access_key", "b")], "bucket"),
            ("s3://b/p", &[("regoin", "eu")], "regoin"),
            ("s3://b/p", &[("access_key_id", "a"), ("secret_access_key", "b"), ("endpoint", "::")], "endpoint"),
            ("s3://b/p", &[("access_key_id", "a"), ("secret_access_key", "b"), ("allow_http", "maybe")], "allow_http"),
        ];
        for (url, options, option) in cases {
            assert_eq!(option_of(open_url(url, options).unwrap_err()), *option, "{url}");
        }
    }

    #[test]
    fn s3_without_credentials_is_invalid_not_a_network_call() {
        if std::env::var("AWS_ACCESS_KEY_ID").is_ok() {
            return; // the environment supplies credentials
        }
        let err = open_url("s3://bucket/prefix", &[("endpoint", "http://127.0.0.1:1")]).unwrap_err();
        assert_eq!(option_of(err), "access_key_id/secret_access_key");
    }

    #[test]
    fn memory_urls_share_a_store_by_name() {
        let (a, root) = open_url("memory://shared-test/x/y", &[]).unwrap();
        let (b, _) = open_url("memory://shared-test/other", &[]).unwrap();
        assert_eq!(root.as_ref(), "x/y");
        assert!(Arc::ptr_eq(&a, &b));
        let (c, _) = open_url("memory://another", &[]).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
    }

    #[test]
    fn file_urls_create_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b");
        let url = format!("file://{}", target.display());
        open_url(&url, &[]).unwrap();
        assert!(target.is_dir());
    }
}
