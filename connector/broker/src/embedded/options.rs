//! Where a broker keeps its journal and what it is opened with, and the lock that keeps a
//! local directory to one broker.

use super::*;

/// Where the broker keeps its journal, what clock it reads, and group defaults.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) root: Path,
    pub(super) local: Option<(std::path::PathBuf, Durability)>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) default_config: ShareConfig,
    pub(super) retention: Retention,
    pub(super) topic_retention: BTreeMap<String, Retention>,
    pub(super) retention_check_ms: u64,
    pub(super) tuning: Tuning,
}

/// The largest batch one produce call may make for one partition: a journal entry is
/// at most 1 GiB (the envelope's limit), and this leaves it room.
pub(super) const MAX_BATCH_BYTES: usize = 512 << 20;

/// Kafka's default `log.retention.ms`: 7 days.
pub const DEFAULT_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// Kafka's default `log.retention.check.interval.ms`: 5 minutes.
pub const DEFAULT_RETENTION_CHECK: Duration = Duration::from_secs(5 * 60);

impl BrokerOptions {
    /// A journal in a fresh in-memory store: nothing survives the process.
    pub fn in_memory() -> Self {
        Self::with_store(Arc::new(InMemory::new()), Path::from("broker"))
    }

    /// A journal under `root` in `store`. Reopening on the same store recovers.
    pub fn with_store(store: Arc<dyn ObjectStore>, root: Path) -> Self {
        Self {
            store,
            root,
            local: None,
            clock: Arc::new(SystemClock),
            default_config: ShareConfig::default(),
            retention: Retention { ms: Some(DEFAULT_RETENTION_MS), bytes: None },
            topic_retention: BTreeMap::new(),
            retention_check_ms: DEFAULT_RETENTION_CHECK.as_millis() as u64,
            tuning: Tuning::default(),
        }
    }

    /// Arms a fault point of [`fault`](super::fault): the journal step there fails once,
    /// leaving the directory as a crash at that moment would. For crash tests.
    #[doc(hidden)]
    pub fn fail_at(self, point: &'static str) -> Self {
        self.tuning.faults.arm(point);
        self
    }

    /// Whether the fault point armed with [`fail_at`](Self::fail_at) is still waiting
    /// to fire.
    #[doc(hidden)]
    pub fn fault_armed(&self, point: &str) -> bool {
        self.tuning.faults.armed(point)
    }

    /// A snapshot starts at the latest once the journal written since the last one
    /// reaches this many bytes, records included (default 256 MiB): it bounds what a
    /// reopen replays. Small values are for tests.
    #[doc(hidden)]
    pub fn snapshot_every_bytes(mut self, bytes: u64) -> Self {
        self.tuning.replay_bound_bytes = bytes.max(1);
        self
    }

    /// A journal in a local directory (created if missing). Writes append to segment
    /// files and `fdatasync` them; see [`durability`](Self::durability).
    pub fn local_dir(dir: impl AsRef<std::path::Path>) -> Result<Self> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::storage(dir.display(), format!("cannot create the broker directory: {e}"), None))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| Error::storage(dir.display(), "cannot open the broker directory", Some(e)))?;
        let mut options = Self::with_store(Arc::new(store), Path::from("broker"));
        options.local = Some((dir.join("broker"), Durability::Fsync));
        Ok(options)
    }

    /// How far a local-directory journal write goes before a call returns (default
    /// [`Durability::Fsync`]). Object-store journals are as durable as their store.
    pub fn durability(mut self, durability: Durability) -> Self {
        if let Some((_, d)) = self.local.as_mut() {
            *d = durability;
        }
        self
    }

    /// From a URL: `memory://` or `file:///absolute/dir`.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = url::Url::parse(url).map_err(|e| Error::InvalidConfig {
            key: "broker.url".into(),
            value: url.into(),
            rule: format!("must be memory:// or file:///absolute/dir ({e})"),
        })?;
        match parsed.scheme() {
            "memory" => Ok(Self::in_memory()),
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| Error::InvalidConfig {
                    key: "broker.url".into(),
                    value: url.into(),
                    rule: "file:// URLs need an absolute path, like file:///var/lib/shareflow".into(),
                })?;
                Self::local_dir(dir)
            }
            other => Err(Error::InvalidConfig {
                key: "broker.url".into(),
                value: url.into(),
                rule: format!(
                    "scheme {other}:// is not supported for the embedded broker journal; use memory:// or file://"
                ),
            }),
        }
    }

    /// Fails with [`Error::DirectoryLocked`] if a live broker holds this local
    /// directory; for tools that must not clear or replace a directory in use. (Between
    /// this check and what follows another broker could start: use
    /// [`EmbeddedBroker::open`] where that matters.)
    pub fn check_not_in_use(&self) -> Result<()> {
        match &self.local {
            Some((dir, _)) => DirLock::acquire(dir).map(drop),
            None => Ok(()),
        }
    }

    /// The clock for lock and transaction timeouts.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The configuration of groups that are not configured explicitly.
    pub fn default_config(mut self, config: ShareConfig) -> Self {
        self.default_config = config;
        self
    }

    /// How long and how much every topic's log keeps (Kafka's broker keys
    /// `log.retention.ms` and `log.retention.bytes`; default Kafka's: 7 days
    /// ([`DEFAULT_RETENTION_MS`]) and no byte limit; `Retention::default()` keeps
    /// everything, forever).
    /// Retention deletes whole batches from the start of a partition, once per
    /// [`log_retention_check_interval`](Self::log_retention_check_interval), and never a
    /// record of an open producer transaction or one a share group has ACQUIRED or
    /// LOCKED. A share partition's start offset advances past what it deletes: records
    /// deleted before they were delivered are never delivered. As on Kafka, a record's
    /// age is its timestamp's: records produced with timestamps older than `ms` are
    /// deleted at the next check.
    pub fn log_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// How often retention looks at the logs, in broker time (Kafka's
    /// `log.retention.check.interval.ms`; default 5 minutes, [`DEFAULT_RETENTION_CHECK`]).
    /// The first look comes 30 s after the broker opens (Kafka's initial task delay), or
    /// at once when it reopens more than an interval after its last command. A zero
    /// interval is taken as one millisecond.
    pub fn log_retention_check_interval(mut self, every: Duration) -> Self {
        self.retention_check_ms = (every.as_millis() as u64).max(1);
        self
    }

    /// `retention.ms` and `retention.bytes` of one topic, over [`log_retention`](Self::log_retention).
    pub fn topic_retention(mut self, topic: &str, retention: Retention) -> Self {
        self.topic_retention.insert(topic.to_string(), retention);
        self
    }
}

/// An OS lock on `{dir}/LOCK`, released when the file is closed: by [`close`], by drop,
/// or by the death of the process.
///
/// [`close`]: EmbeddedBroker::close
#[derive(Debug)]
pub(super) struct DirLock {
    pub(super) file: std::fs::File,
    /// The canonical directory, as [`HELD_DIRS`] knows it.
    pub(super) dir: std::path::PathBuf,
}

/// The broker directories this process holds locked right now.
///
/// The OS lock belongs to the open file, and a child process being spawned holds a copy
/// of every descriptor until its `exec` closes them. So right after a broker closes,
/// the OS can still say "locked" for a moment. In this process, this set tells that
/// moment (nobody here holds the directory: wait for the copy to go) from a live broker
/// (refuse at once). For another process, a closing broker empties the lock file before
/// it lets go, while a live one always names itself in it: a locked, empty file is
/// waited for.
static HELD_DIRS: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// How long an open waits for a spawning child's copy of a closed lock to go.
const INHERITED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl DirLock {
    /// Takes the lock, or says who holds it.
    pub(super) fn acquire(dir: &std::path::Path) -> Result<Self> {
        use std::io::{Read, Seek, Write};
        let shown = dir.display().to_string();
        let io = |what: &str, e: std::io::Error| Error::storage(&shown, format!("{what}: {e}"), None);
        std::fs::create_dir_all(dir).map_err(|e| io("cannot create the broker directory", e))?;
        let canonical = dir.canonicalize().map_err(|e| io("cannot resolve the broker directory", e))?;
        let path = dir.join("LOCK");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("cannot open the lock file", e))?;
        let own = format!("pid {}", std::process::id());
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(2);
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.rewind().and_then(|_| file.read_to_string(&mut holder));
                    let holder = holder.trim().to_string();
                    let held_here = HELD_DIRS.lock().map(|held| held.contains(&canonical)).unwrap_or(true);
                    // Closed (here, or by another process that emptied the file), still
                    // held by a child that has not reached its exec.
                    let closed = (holder == own && !held_here) || holder.is_empty();
                    if !closed || started.elapsed() >= INHERITED_LOCK_WAIT {
                        let holder = if holder.is_empty() { "another process".to_string() } else { holder };
                        return Err(Error::DirectoryLocked { dir: shown, holder });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(100));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io("cannot lock the broker directory", e)),
            }
        }
        // Who holds it, for the message a second opener gets.
        let written = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{own}"));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot record the lock holder");
        }
        if let Ok(mut held) = HELD_DIRS.lock() {
            held.push(canonical.clone());
        }
        Ok(Self { file, dir: canonical })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Tells another process that this broker closed: a copy of this descriptor in a
        // child being spawned may hold the OS lock a moment longer.
        let _ = self.file.set_len(0);
        if let Ok(mut held) = HELD_DIRS.lock() {
            if let Some(i) = held.iter().position(|d| d == &self.dir) {
                held.swap_remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    fn content(file: &mut std::fs::File) -> String {
        let mut s = String::new();
        file.rewind().unwrap();
        file.read_to_string(&mut s).unwrap();
        s
    }

    /// A broker that closed while a child being spawned still holds a copy of its lock
    /// descriptor: the file says nobody, and a second opener (in any process) waits for
    /// the copy to go instead of refusing.
    #[test]
    fn a_closed_lock_held_by_a_lingering_copy_is_emptied_and_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(dir.path()).unwrap();
        let mut copy = lock.file.try_clone().unwrap();
        assert_eq!(content(&mut copy).trim(), format!("pid {}", std::process::id()));
        drop(lock);
        assert_eq!(content(&mut copy), "", "a closed broker's lock file names nobody");
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(copy);
        });
        DirLock::acquire(dir.path()).unwrap();
        release.join().unwrap();
    }

    /// A lock held by another live process (its pid in the file) is refused at once,
    /// naming the holder.
    #[test]
    fn a_lock_naming_another_process_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(dir.path()).unwrap();
        let mut copy = lock.file.try_clone().unwrap();
        drop(lock);
        copy.set_len(0).unwrap();
        copy.rewind().unwrap();
        write!(copy, "pid 1").unwrap();
        match DirLock::acquire(dir.path()) {
            Err(Error::DirectoryLocked { holder, .. }) => assert_eq!(holder, "pid 1"),
            other => panic!("expected DirectoryLocked, got {other:?}"),
        }
    }
}
