//! The four kinds of stateful query (tumbling, hopping, session, upsert) over values
//! `USER,MS` (event time read from the value), with their batch answers: what a job
//! file runs on either backend, and what its output must be.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::BTreeMap;

/// Input records: `N` values over `USERS` users.
pub const N: u64 = 4_000;
pub const USERS: u64 = 10;
const BASE: u64 = 1_700_000_000_000;
/// The watermark trails the newest event time by this much.
pub const LATENESS_MS: u64 = 500;

/// Record i's event time: 10 ms apart, with a 1 s pause every 100 records (sessions with
/// a 300 ms gap split there).
pub fn time(i: u64) -> u64 {
    BASE + i * 10 + (i / 100) * 1_000
}

/// Record i's value.
pub fn value(i: u64) -> String {
    format!("user-{},{}", i % USERS, time(i))
}

/// One kind: its name, the SQL of its transform, its allowed lateness line (empty
/// without a window), and the batch answer: (user, window start or "") -> count, of
/// the windows the last watermark closes (every user's count, for upsert).
pub struct Kind {
    pub name: &'static str,
    pub sql: String,
    pub lateness: String,
    pub want: BTreeMap<(String, String), u64>,
}

pub fn kinds() -> Vec<Kind> {
    let user = "split_part(CAST(value AS VARCHAR), ',', 1)";
    let t = "CAST(split_part(CAST(value AS VARCHAR), ',', 2) AS BIGINT)";
    let watermark = time(N - 1) - LATENESS_MS;
    let mut out = Vec::new();
    for (name, window) in [
        ("tumble", format!("tumble({t}, INTERVAL '1 second')")),
        ("hop", format!("hop({t}, INTERVAL '0.5 seconds', INTERVAL '1 second')")),
        ("session", format!("session({t}, INTERVAL '0.3 seconds')")),
        ("upsert", String::new()),
    ] {
        let mut want = BTreeMap::<(String, String), u64>::new();
        let key = |i: u64| format!("user-{}", i % USERS);
        match name {
            "upsert" => (0..N).for_each(|i| *want.entry((key(i), String::new())).or_default() += 1),
            "tumble" | "hop" => {
                for i in 0..N {
                    let t = time(i);
                    let starts =
                        if name == "tumble" { vec![t - t % 1_000] } else { vec![t - t % 500, t - t % 500 - 500] };
                    for w in starts.into_iter().filter(|w| w + 1_000 <= watermark) {
                        *want.entry((key(i), w.to_string())).or_default() += 1;
                    }
                }
            }
            _ => {
                for u in 0..USERS {
                    let events: Vec<u64> = (0..N).filter(|i| i % USERS == u).map(time).collect();
                    let (mut start, mut prev, mut count) = (events[0], events[0], 0);
                    for &e in &events {
                        if e >= prev + 300 {
                            if prev + 300 <= watermark {
                                want.insert((format!("user-{u}"), start.to_string()), count);
                            }
                            (start, count) = (e, 0);
                        }
                        count += 1;
                        prev = e;
                    }
                    if prev + 300 <= watermark {
                        want.insert((format!("user-{u}"), start.to_string()), count);
                    }
                }
            }
        }
        let (group_by, value) = if window.is_empty() {
            (user.to_string(), "CAST(count(*) AS VARCHAR)".to_string())
        } else {
            (
                format!("{user}, {window}"),
                format!("concat(CAST(CAST({window} AS BIGINT) AS VARCHAR), ',', CAST(count(*) AS VARCHAR))"),
            )
        };
        let lateness = if window.is_empty() { String::new() } else { format!("allowed_lateness_ms = {LATENESS_MS}\n") };
        let sql = format!("SELECT {user} AS key, {value} AS value FROM input GROUP BY {group_by}");
        out.push(Kind { name, sql, lateness, want });
    }
    out
}

/// Folds output rows (key, value) into the answer's shape; a window twice is an error.
pub fn fold(
    name: &str,
    rows: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeMap<(String, String), u64>, String> {
    let mut got = BTreeMap::new();
    for (key, value) in rows {
        let (w, c) =
            value.rsplit_once(',').map_or((String::new(), value.clone()), |(w, c)| (w.to_string(), c.to_string()));
        let c: u64 = c.parse().map_err(|_| format!("{name}: value {value:?}"))?;
        if got.insert((key.clone(), w.clone()), c).is_some() && name != "upsert" {
            return Err(format!("{name}: window {key} {w} emitted twice"));
        }
    }
    Ok(got)
}
