//! History (SPEC 4.6): what the GPUs did, which workload used them, the grid's intensity and
//! every clock decision, in SQLite at `<lib_dir>/history.db`. `vgpu watch` records it;
//! `vgpu carbon report` reads it; `vgpu carbon profile` keeps its power models there.
//!
//! The layout is defined once, in `schema.sql` ([`SCHEMA`]), and documented for admins in
//! docs/history.md.

/// The database's file name in the lib directory.
pub const DB_FILE: &str = "history.db";

/// The schema this build writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;

/// Every table and index, `CREATE … IF NOT EXISTS`.
pub const SCHEMA: &str = include_str!("schema.sql");

pub mod db;

pub mod query;
