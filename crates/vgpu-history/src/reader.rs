//! Opening the history to read, as this caller may: root the live database, anyone else
//! the public copy (`snapshot`), so that a reader never needs the private file.

use std::path::Path;

use rusqlite::Connection;

use crate::db::{open_live_ro, path_in, HistoryError, Opened, ReadFrom};

/// Open the history to read, as this caller may: root reads the live database, anyone else
/// the public copy ([`crate::snapshot::open`], no lock taken). `Ok(None)` when there is
/// none yet.
pub fn open_ro(lib_dir: &Path) -> Result<Option<Connection>, HistoryError> {
    Ok(open_reader(lib_dir)?.map(|r| r.conn))
}

/// [`open_ro`], saying what was opened.
pub fn open_reader(lib_dir: &Path) -> Result<Option<Opened>, HistoryError> {
    if !nix::unistd::geteuid().is_root() {
        return crate::snapshot::open(lib_dir);
    }
    Ok(open_live_ro(lib_dir)?.map(|conn| Opened { conn, path: path_in(lib_dir), from: ReadFrom::Live }))
}
