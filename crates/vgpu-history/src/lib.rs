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
    let deadline = std::time::Instant::now() + BEST_EFFORT_BUDGET;
    match History::open_within(lib_dir, deadline).and_then(f) {
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
