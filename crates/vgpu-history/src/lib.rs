//! History (SPEC 4.6): what the GPUs did, which workload used them, the grid's intensity and
//! every clock decision, in SQLite at `<lib_dir>/history.db`. `vgpu watch` records it;
//! `vgpu carbon report` reads it; `vgpu carbon profile` keeps its power models there;
//! `vgpu carbon plan/apply` read what a daily or monthly budget has spent ([`spent`]) and
//! record the intensity forecasts they fetch.
//!
//! The layout is defined once, in `schema.sql` ([`SCHEMA`]), and documented for admins in
//! docs/history.md.

/// The database's file name in the lib directory.
pub const DB_FILE: &str = "history.db";

/// The schema this build writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 2;

/// Every table and index, `CREATE … IF NOT EXISTS`.
pub const SCHEMA: &str = include_str!("schema.sql");

pub mod config;
pub mod db;
pub mod query;
pub mod reader;
pub mod rollup;
#[cfg(test)]
mod rollup_tests;
pub(crate) mod source;
pub mod snapshot;
pub mod spent;
pub mod store;
pub mod tick;

pub use store::{History, RollUp, WriteError};

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// How long a command's best-effort record may take in all (its open, every lock wait,
/// every statement's).
pub const BEST_EFFORT_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// Record something in `<lib_dir>/history.db` for a command that is not the watch (an
/// intensity it resolved, a decision it logged, `vgpu run`'s end): best effort, bounded by
/// [`BEST_EFFORT_BUDGET`] in total. Nothing when `[history] enabled = false`; a failure is a
/// warning, or a debug line where this caller may not write the database (not root, or
/// refused the directory or file).
pub fn best_effort<T>(lib_dir: &std::path::Path, config: &config::HistoryConfig, what: &str, f: impl FnOnce(&History) -> Result<T, WriteError>) {
    best_effort_then(lib_dir, config, what, |h| f(&h));
}

/// [`best_effort`], `f` given the connection to keep (e.g. to read back through it,
/// [`crate::query::Reader::from_history`], rather than open the database a second time);
/// `None` where nothing was recorded.
pub fn best_effort_then<T>(lib_dir: &std::path::Path, config: &config::HistoryConfig, what: &str, f: impl FnOnce(History) -> Result<T, WriteError>) -> Option<T> {
    Ahead::none(lib_dir, config).then(what, f)
}

/// The history opened ahead of a best-effort record, on a thread of its own: `vgpu run`
/// opens it while its workload runs, so that a workload's end is not also kept waiting for
/// the open (most of it SQLite reading the schema: 0.6 ms here), which every short workload
/// paid. The connection is kept for [`KEEP_AHEAD`], then closed; [`Ahead::then`] opens it
/// again where it is no longer there (a longer workload).
pub struct Ahead {
    lib_dir: std::path::PathBuf,
    /// `[history] enabled`: nothing is opened or recorded where it is false.
    enabled: bool,
    /// The thread that opens it (its result: the connection, or `None` once closed
    /// unasked), and how it is asked for.
    opening: Option<(std::thread::JoinHandle<Opened>, std::sync::mpsc::Sender<()>)>,
}

/// What the thread of an [`Ahead`] ends with.
type Opened = Option<Result<History, WriteError>>;

/// How long a connection opened ahead is kept for its record.
pub const KEEP_AHEAD: std::time::Duration = std::time::Duration::from_secs(1);

impl Ahead {
    /// Start opening `<lib_dir>/history.db` (nothing when `[history] enabled = false`, or
    /// where no thread can be had: [`Ahead::then`] opens it then).
    pub fn open(lib_dir: &std::path::Path, config: &config::HistoryConfig) -> Ahead {
        Ahead::open_keeping(lib_dir, config, KEEP_AHEAD)
    }

    fn open_keeping(lib_dir: &std::path::Path, config: &config::HistoryConfig, keep: std::time::Duration) -> Ahead {
        let mut ahead = Ahead::none(lib_dir, config);
        if !config.enabled {
            return ahead;
        }
        let (take, taken) = std::sync::mpsc::channel();
        let dir = lib_dir.to_path_buf();
        let opening = std::thread::Builder::new().name("vgpu-history".into()).spawn(move || {
            let opened = History::open_within(&dir, std::time::Instant::now() + BEST_EFFORT_BUDGET);
            match taken.recv_timeout(keep) {
                Ok(()) => Some(opened),
                // Not asked for in time (or no longer wanted): closed here.
                Err(_) => None,
            }
        });
        ahead.opening = opening.ok().map(|thread| (thread, take));
        ahead
    }

    /// Nothing opened ahead: [`Ahead::then`] opens the history itself.
    pub fn none(lib_dir: &std::path::Path, config: &config::HistoryConfig) -> Ahead {
        Ahead { lib_dir: lib_dir.to_path_buf(), enabled: config.enabled, opening: None }
    }

    /// [`best_effort_then`] through the connection opened ahead, if it is still kept (its
    /// waits bounded by [`BEST_EFFORT_BUDGET`] from now on, as a connection opened now);
    /// else through one opened now.
    pub fn then<T>(self, what: &str, f: impl FnOnce(History) -> Result<T, WriteError>) -> Option<T> {
        if !self.enabled {
            return None;
        }
        let ahead = self.opening.and_then(|(thread, take)| {
            let _ = take.send(());
            thread.join().ok().flatten()
        });
        let deadline = std::time::Instant::now() + BEST_EFFORT_BUDGET;
        let opened = match ahead {
            Some(Ok(history)) => Ok(history.bounded_by(deadline)),
            // Closed meanwhile, or it failed then (the database busy, say): now.
            Some(Err(_)) | None => History::open_within(&self.lib_dir, deadline),
        };
        match opened.and_then(f) {
            Ok(kept) => Some(kept),
            // Root's watch and commands record; a user's command may not write there.
            Err(e) if e.is_permission() || !nix::unistd::geteuid().is_root() => {
                tracing::debug!("history: cannot record {what}: {e}");
                None
            }
            Err(e) => {
                tracing::warn!("history: cannot record {what}: {e}");
                None
            }
        }
    }
}

#[cfg(test)]
mod ahead_tests {
    use super::*;

    fn info(id: &str) -> store::WorkloadInfo {
        store::WorkloadInfo { id: id.into(), name: id.into(), uid: 0, user: "root".into(), service: None, command: "true".into(), gpus: Vec::new(), started_ms: 1 }
    }

    /// Whether workload `id` is recorded as ended, as a reader opened now sees it.
    fn ended(lib: &std::path::Path, id: &str) -> bool {
        let conn = db::open_live_ro(lib).expect("read").expect("a database");
        conn.query_row("SELECT ended_ms IS NOT NULL FROM workloads WHERE id = ?1", [id], |r| r.get(0)).unwrap_or(false)
    }

    #[test]
    fn a_record_goes_through_the_connection_opened_ahead_or_one_opened_then() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config::HistoryConfig::default();
        // Kept: the record is made through it.
        let ahead = Ahead::open_keeping(dir.path(), &config, std::time::Duration::from_secs(600));
        assert_eq!(ahead.then("a test", |h| h.record_ended(&info("kept"), 5, Some("exit 0"))), Some(true));
        assert!(ended(dir.path(), "kept"));
        // Closed before it was asked for (a workload longer than KEEP_AHEAD): opened again.
        let ahead = Ahead::open_keeping(dir.path(), &config, std::time::Duration::ZERO);
        while !ahead.opening.as_ref().is_some_and(|(thread, _)| thread.is_finished()) {
            std::thread::yield_now();
        }
        assert_eq!(ahead.then("a test", |h| h.record_ended(&info("reopened"), 5, Some("exit 0"))), Some(true));
        assert!(ended(dir.path(), "reopened"));
        // Disabled: nothing opened, nothing recorded.
        let off = config::HistoryConfig { enabled: false, ..config::HistoryConfig::default() };
        let ahead = Ahead::open_keeping(dir.path(), &off, std::time::Duration::from_secs(600));
        assert!(ahead.opening.is_none());
        assert_eq!(ahead.then("a test", |h| h.record_ended(&info("off"), 5, None)), None);
        assert!(!ended(dir.path(), "off"));
    }
}
