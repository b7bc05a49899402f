//! [`FaultyStore`]: an `ObjectStore` wrapper that injects seeded faults.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};

/// Which store call a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// `put_opts`
    Put,
    /// `get_opts`
    Get,
    /// `list`, `list_with_delimiter`
    List,
    /// `delete_stream`
    Delete,
    /// `copy_opts`
    Copy,
    /// Every call.
    Any,
}

/// What a matching call suffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Fail without doing anything.
    Error,
    /// Sleep first, then do it.
    Latency(Duration),
    /// Do it, then report a timeout: the caller cannot tell it happened.
    AppliedThenTimeout,
    /// Puts only: write the first `keep` fraction of the bytes, then fail, as a crash in
    /// the middle of a local write would leave it.
    Torn {
        /// Fraction of the payload that lands, 0.0..1.0.
        keep: f64,
    },
}

/// One injection rule.
#[derive(Debug, Clone)]
pub struct FaultRule {
    /// The calls it applies to.
    pub op: StoreOp,
    /// Only paths containing this text (empty: all).
    pub path_contains: String,
    /// What happens.
    pub fault: Fault,
    /// Chance per matching call, 0.0..=1.0, drawn from the store's seeded generator.
    pub probability: f64,
    /// How many more times it may fire (`None`: unlimited).
    pub remaining: Option<u32>,
}

impl FaultRule {
    /// A rule that fires on every matching call, forever.
    pub fn always(op: StoreOp, path_contains: &str, fault: Fault) -> Self {
        Self { op, path_contains: path_contains.to_string(), fault, probability: 1.0, remaining: None }
    }

    /// A rule that fires on the next matching call only.
    pub fn once(op: StoreOp, path_contains: &str, fault: Fault) -> Self {
        Self { remaining: Some(1), ..Self::always(op, path_contains, fault) }
    }
}

/// Wraps a store and injects the faults of its rules. The same seed and the same calls
/// give the same faults, so a failing case can be replayed.
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    rules: Mutex<Vec<FaultRule>>,
    rng: Mutex<u64>,
    injected: Mutex<Vec<String>>,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore").field("inner", &self.inner.to_string()).finish()
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

fn injected_error(what: &str, path: &Path) -> object_store::Error {
    object_store::Error::Generic { store: "FaultyStore", source: format!("injected {what} at {path}").into() }
}

impl FaultyStore {
    /// Wraps `inner` with no rules; `seed` drives the probabilities.
    pub fn new(inner: Arc<dyn ObjectStore>, seed: u64) -> Self {
        // splitmix64, so neighbouring seeds give unrelated streams; xorshift needs non-zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let state = (z ^ (z >> 31)).max(1);
        Self { inner, rules: Mutex::new(Vec::new()), rng: Mutex::new(state), injected: Mutex::new(Vec::new()) }
    }

    /// Adds a rule.
    pub fn inject(&self, rule: FaultRule) {
        crate::sync::lock(&self.rules).push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        crate::sync::lock(&self.rules).clear();
    }

    /// A line per fault injected so far: `op fault path`.
    pub fn injected(&self) -> Vec<String> {
        crate::sync::lock(&self.injected).clone()
    }

    fn next_f64(&self) -> f64 {
        let mut s = crate::sync::lock(&self.rng);
        // xorshift64*
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn fault_for(&self, op: StoreOp, path: &Path) -> Option<Fault> {
        let mut rules = crate::sync::lock(&self.rules);
        let text = path.as_ref();
        for rule in rules.iter_mut() {
            if (rule.op == op || rule.op == StoreOp::Any)
                && text.contains(&rule.path_contains)
                && rule.remaining != Some(0)
                && (rule.probability >= 1.0 || self.next_f64() < rule.probability)
            {
                if let Some(n) = rule.remaining.as_mut() {
                    *n -= 1;
                }
                crate::sync::lock(&self.injected).push(format!("{op:?} {:?} {path}", rule.fault));
                return Some(rule.fault);
            }
        }
        None
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        match self.fault_for(StoreOp::Put, location) {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(Fault::Error) => Err(injected_error("put error", location)),
            Some(Fault::Latency(d)) => {
                tokio::time::sleep(d).await;
                self.inner.put_opts(location, payload, opts).await
            }
            Some(Fault::AppliedThenTimeout) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(injected_error("timeout after the put was applied", location))
            }
            Some(Fault::Torn { keep }) => {
                let bytes: bytes::Bytes = payload.into();
                let cut = ((bytes.len() as f64) * keep.clamp(0.0, 1.0)) as usize;
                self.inner.put_opts(location, PutPayload::from_bytes(bytes.slice(..cut)), opts).await?;
                Err(injected_error("torn write", location))
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        match self.fault_for(StoreOp::Put, location) {
            Some(Fault::Error | Fault::Torn { .. } | Fault::AppliedThenTimeout) => {
                Err(injected_error("put error", location))
            }
            Some(Fault::Latency(d)) => {
                tokio::time::sleep(d).await;
                self.inner.put_multipart_opts(location, opts).await
            }
            None => self.inner.put_multipart_opts(location, opts).await,
        }
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        match self.fault_for(StoreOp::Get, location) {
            Some(Fault::Error | Fault::Torn { .. }) => Err(injected_error("get error", location)),
            Some(Fault::Latency(d)) => {
                tokio::time::sleep(d).await;
                self.inner.get_opts(location, options).await
            }
            Some(Fault::AppliedThenTimeout) => {
                drop(self.inner.get_opts(location, options).await?);
                Err(injected_error("get timeout", location))
            }
            None => self.inner.get_opts(location, options).await,
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // Decide per path up front: the stream outlives `&self`.
        let inner = self.inner.clone();
        let faults: Arc<Mutex<Vec<(String, Fault)>>> = Arc::new(Mutex::new(
            crate::sync::lock(&self.rules)
                .iter()
                .filter(|r| {
                    matches!(r.op, StoreOp::Delete | StoreOp::Any) && r.fault == Fault::Error && r.remaining != Some(0)
                })
                .map(|r| (r.path_contains.clone(), r.fault))
                .collect(),
        ));
        let checked = locations.map(move |p| {
            let p = p?;
            let hit = crate::sync::lock(&faults).iter().any(|(s, _)| p.as_ref().contains(s.as_str()));
            if hit {
                Err(injected_error("delete error", &p))
            } else {
                Ok(p)
            }
        });
        inner.delete_stream(checked.boxed())
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let at = prefix.cloned().unwrap_or_default();
        match self.fault_for(StoreOp::List, &at) {
            Some(Fault::Latency(_)) | None => self.inner.list(prefix),
            Some(_) => futures::stream::once(async move { Err(injected_error("list error", &at)) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let at = prefix.cloned().unwrap_or_default();
        match self.fault_for(StoreOp::List, &at) {
            Some(Fault::Latency(d)) => {
                tokio::time::sleep(d).await;
                self.inner.list_with_delimiter(prefix).await
            }
            Some(_) => Err(injected_error("list error", &at)),
            None => self.inner.list_with_delimiter(prefix).await,
        }
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        match self.fault_for(StoreOp::Copy, to) {
            Some(Fault::Error | Fault::Torn { .. }) => Err(injected_error("copy error", to)),
            Some(Fault::Latency(d)) => {
                tokio::time::sleep(d).await;
                self.inner.copy_opts(from, to, options).await
            }
            Some(Fault::AppliedThenTimeout) => {
                self.inner.copy_opts(from, to, options).await?;
                Err(injected_error("copy timeout", to))
            }
            None => self.inner.copy_opts(from, to, options).await,
        }
    }
}
