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
    if !config.enabled {
        return None;
    }
    said(what, History::open_within(lib_dir, std::time::Instant::now() + BEST_EFFORT_BUDGET).and_then(f))
}

/// The history opened ahead of a best-effort record, on a thread of its own: `vgpu run`
/// opens it while its workload runs, so that a workload's end is not also kept waiting for
/// the open (most of it SQLite reading the schema: 0.6 ms here), which every short workload
/// paid. The connection is kept for [`KEEP_AHEAD`], then closed; where it is no longer there
/// (a longer workload), the record opens it again.
///
/// The record is made on that thread ([`Ahead::begin`]), while the caller does something
/// else (`vgpu run` removes the workload's cgroup and records meanwhile).
pub struct Ahead {
    lib_dir: std::path::PathBuf,
    /// `[history] enabled`: nothing is opened or recorded where it is false.
    enabled: bool,
    /// The thread that opens it, and how it is given its job (dropped unrun: closed).
    opening: Option<(std::thread::JoinHandle<()>, std::sync::mpsc::Sender<Job>)>,
}

/// What the thread of an [`Ahead`] does with what it opened, once asked in time.
type Job = Box<dyn FnOnce(Result<History, WriteError>) + Send>;

/// How long a connection opened ahead is kept for its record.
pub const KEEP_AHEAD: std::time::Duration = std::time::Duration::from_secs(1);

impl Ahead {
    /// Start opening `<lib_dir>/history.db` (nothing when `[history] enabled = false`, or
    /// where no thread can be had: the record opens it then).
    pub fn open(lib_dir: &std::path::Path, config: &config::HistoryConfig) -> Ahead {
        Ahead::open_keeping(lib_dir, config, KEEP_AHEAD)
    }

    fn open_keeping(lib_dir: &std::path::Path, config: &config::HistoryConfig, keep: std::time::Duration) -> Ahead {
        let mut ahead = Ahead::none(lib_dir, config);
        if !config.enabled {
            return ahead;
        }
        let (give, given) = std::sync::mpsc::channel::<Job>();
        let dir = lib_dir.to_path_buf();
        let opening = std::thread::Builder::new().name("vgpu-history".into()).spawn(move || {
            let opened = History::open_within(&dir, std::time::Instant::now() + BEST_EFFORT_BUDGET);
            // Not asked in time (or no longer wanted): closed here, with a job given just
            // too late, which its caller then does itself.
            if let Ok(job) = given.recv_timeout(keep) {
                job(opened);
            }
        });
        ahead.opening = opening.ok().map(|thread| (thread, give));
        ahead
    }

    /// Nothing opened ahead: the record opens the history itself.
    pub fn none(lib_dir: &std::path::Path, config: &config::HistoryConfig) -> Ahead {
        Ahead { lib_dir: lib_dir.to_path_buf(), enabled: config.enabled, opening: None }
    }

    /// [`best_effort_then`] on the thread that opened the history, which `f` is given to
    /// now (its waits bounded by [`BEST_EFFORT_BUDGET`] from then on, as a connection opened
    /// then): the caller goes on meanwhile and takes the result with [`Pending::wait`].
    /// Where that thread closed the connection already (or none was opened), `f` runs at
    /// `wait`, on the caller's thread, through a connection opened then.
    pub fn begin<T: Send + 'static>(self, what: &'static str, f: impl Fn(History) -> Result<T, WriteError> + Send + Sync + 'static) -> Pending<T> {
        let f = std::sync::Arc::new(f);
        let mut pending = Pending { lib_dir: self.lib_dir.clone(), enabled: self.enabled, what, f: f.clone(), result: None, thread: None };
        if !self.enabled {
            return pending;
        }
        if let Some((thread, give)) = self.opening {
            let (back, result) = std::sync::mpsc::channel();
            let dir = self.lib_dir;
            let job: Job = Box::new(move |opened| {
                let deadline = std::time::Instant::now() + BEST_EFFORT_BUDGET;
                let opened = match opened {
                    Ok(history) => Ok(history.bounded_by(deadline)),
                    Err(_) => History::open_within(&dir, deadline),
                };
                let _ = back.send(opened.and_then(|h| f(h)));
            });
            if give.send(job).is_ok() {
                pending.result = Some(result);
            }
            pending.thread = Some(thread);
        }
        pending
    }
}

/// A record begun by [`Ahead::begin`].
pub struct Pending<T> {
    lib_dir: std::path::PathBuf,
    enabled: bool,
    what: &'static str,
    f: std::sync::Arc<dyn Fn(History) -> Result<T, WriteError> + Send + Sync>,
    /// Where the thread was given the record, its result.
    result: Option<std::sync::mpsc::Receiver<Result<T, WriteError>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T> Pending<T> {
    /// The record's result, once made: `None` where nothing was recorded (disabled, or it
    /// failed: a warning, or a debug line where this caller may not write the database).
    pub fn wait(self) -> Option<T> {
        if !self.enabled {
            return None;
        }
        let done = self.result.and_then(|result| result.recv().ok());
        if let Some(thread) = self.thread {
            let _ = thread.join();
        }
        let done = match done {
            Some(done) => done,
            // Not given in time: here, now.
            None => History::open_within(&self.lib_dir, std::time::Instant::now() + BEST_EFFORT_BUDGET).and_then(|h| (self.f)(h)),
        };
        said(self.what, done)
    }
}

/// A best-effort record's result, its failure said.
fn said<T>(what: &str, done: Result<T, WriteError>) -> Option<T> {
    match done {
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
        assert_eq!(ahead.begin("a test", |h| h.record_ended(&info("kept"), 5, Some("exit 0"))).wait(), Some(true));
        assert!(ended(dir.path(), "kept"));
        // Closed before it was asked for (a workload longer than KEEP_AHEAD): opened again.
        let ahead = Ahead::open_keeping(dir.path(), &config, std::time::Duration::ZERO);
        while !ahead.opening.as_ref().is_some_and(|(thread, _)| thread.is_finished()) {
            std::thread::yield_now();
        }
        assert_eq!(ahead.begin("a test", |h| h.record_ended(&info("reopened"), 5, Some("exit 0"))).wait(), Some(true));
        assert!(ended(dir.path(), "reopened"));
        // Disabled: nothing opened, nothing recorded.
        let off = config::HistoryConfig { enabled: false, ..config::HistoryConfig::default() };
        let ahead = Ahead::open_keeping(dir.path(), &off, std::time::Duration::from_secs(600));
        assert!(ahead.opening.is_none());
        assert_eq!(ahead.begin("a test", |h| h.record_ended(&info("off"), 5, None)).wait(), None);
        assert!(!ended(dir.path(), "off"));
    }

    #[test]
    fn a_record_begun_is_made_on_the_thread_that_opened_the_history_or_at_the_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config::HistoryConfig::default();
        let on = |id: &'static str| {
            move |h: History| {
                h.record_ended(&info(id), 5, Some("exit 0"))?;
                Ok(std::thread::current().name().map(str::to_string))
            }
        };
        // Kept: made on its thread, while this one goes on.
        let ahead = Ahead::open_keeping(dir.path(), &config, std::time::Duration::from_secs(600));
        let pending = ahead.begin("a test", on("there"));
        assert_eq!(pending.wait(), Some(Some("vgpu-history".to_string())));
        assert!(ended(dir.path(), "there"));
        // The thread closed it before it was given the record: made at the wait, here.
        let ahead = Ahead::open_keeping(dir.path(), &config, std::time::Duration::ZERO);
        while !ahead.opening.as_ref().is_some_and(|(thread, _)| thread.is_finished()) {
            std::thread::yield_now();
        }
        let here = std::thread::current().name().map(str::to_string);
        assert_eq!(ahead.begin("a test", on("here")).wait(), Some(here.clone()));
        assert!(ended(dir.path(), "here"));
        // None opened ahead: at the wait too. Disabled: nothing.
        assert_eq!(Ahead::none(dir.path(), &config).begin("a test", on("none")).wait(), Some(here));
        assert!(ended(dir.path(), "none"));
        let off = config::HistoryConfig { enabled: false, ..config::HistoryConfig::default() };
        assert_eq!(Ahead::open_keeping(dir.path(), &off, std::time::Duration::from_secs(600)).begin("a test", on("off")).wait(), None);
        assert!(!ended(dir.path(), "off"));
    }
}
