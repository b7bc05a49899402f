//! Where the PostgreSQL server started by `scripts/postgres` is, if it is.
#![allow(unreachable_pub, dead_code)]

use tokio_postgres::{Client, NoTls};

/// The server's URL, or `None` with the reason printed. Under CI (or
/// `SHAREFLOW_REQUIRE_SERVERS=1`, which `./scripts/test` sets) a missing server is a
/// failure, never a skip.
pub fn url() -> Option<String> {
    match std::env::var("SHAREFLOW_POSTGRES") {
        Ok(u) => Some(u),
        Err(_) => {
            let why = "SHAREFLOW_POSTGRES is not set: start PostgreSQL with ./scripts/postgres start and \
                       eval \"$(./scripts/postgres env)\" (./scripts/test does both)";
            assert!(
                std::env::var("CI").is_err() && std::env::var("SHAREFLOW_REQUIRE_SERVERS").is_err(),
                "this run must test against the real PostgreSQL server: {why}"
            );
            eprintln!("skipping the PostgreSQL test: {why}");
            None
        }
    }
}

/// A connection, or a panic naming the URL: the variable is set, so the server must be up.
pub async fn client(url: &str) -> Client {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {url}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A table name unique to this process and call.
pub fn unique(base: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{base}_{}_{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// The prepared transactions whose id starts with `prefix`.
pub async fn prepared(client: &Client, prefix: &str) -> Vec<String> {
    let rows = client.query("SELECT gid FROM pg_prepared_xacts", &[]).await.expect("pg_prepared_xacts");
    rows.iter().map(|r| r.get::<_, String>(0)).filter(|g| g.starts_with(prefix)).collect()
}
