//! Opening the history database: the one place that creates it, sets its mode and owner,
//! and brings its schema up to date.
//!
//! * The file is made (`O_CREAT|O_NOFOLLOW`, never through a link) mode [`DB_MODE`] and
//!   owned by the caller (root, for `vgpu watch`), then opened by SQLite with
//!   `SQLITE_OPEN_NOFOLLOW`. SQLite gives its `-wal` and `-shm` files the database's mode.
//! * WAL journal (`synchronous = NORMAL`): a writer killed mid-transaction leaves the last
//!   committed state; readers never block the writer.
//! * Every wait on SQLite's lock is bounded by [`BUSY_TIMEOUT`].
//! * A database of a newer schema than this build's is refused, never rewritten.

use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use thiserror::Error;

use super::{DB_FILE, SCHEMA, SCHEMA_VERSION};

/// Mode of history.db (and, through SQLite, of its `-wal` and `-shm`): anyone may read the
/// history (as anyone may run `vgpu ps`); only its owner writes.
pub const DB_MODE: u32 = 0o644;

/// The longest any history access waits for another connection's lock.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum HistoryError {
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a regular file; the history database must be one", .path.display())]
    NotRegular { path: PathBuf },
    #[error("{}: {source}", .path.display())]
    Sqlite { path: PathBuf, source: rusqlite::Error },
    #[error("{}: schema version {found} is newer than this vgpu's ({SCHEMA_VERSION}); upgrade vgpu to read it", .path.display())]
    NewerSchema { path: PathBuf, found: i64 },
}

impl HistoryError {
    pub(crate) fn sqlite(path: &Path) -> impl FnOnce(rusqlite::Error) -> HistoryError + '_ {
        move |source| HistoryError::Sqlite { path: path.to_path_buf(), source }
    }
}

/// `<lib_dir>/history.db`.
pub fn path_in(lib_dir: &Path) -> PathBuf {
    lib_dir.join(DB_FILE)
}

/// Open (creating it and its tables if needed) the database for writing.
pub fn open_rw(lib_dir: &Path) -> Result<Connection, HistoryError> {
    let path = path_in(lib_dir);
    crate::carbon::create_dir(lib_dir).map_err(|source| HistoryError::Io { path: lib_dir.to_path_buf(), source })?;
    create_file(&path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NOFOLLOW | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&path, flags).map_err(HistoryError::sqlite(&path))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(HistoryError::sqlite(&path))?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(HistoryError::sqlite(&path))?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(HistoryError::sqlite(&path))?;
    migrate(&conn, &path)?;
    Ok(conn)
}

/// Open the database to read; `Ok(None)` when there is none yet.
pub fn open_ro(lib_dir: &Path) -> Result<Option<Connection>, HistoryError> {
    let path = path_in(lib_dir);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(HistoryError::Io { path, source }),
        Ok(meta) if !meta.file_type().is_file() => return Err(HistoryError::NotRegular { path }),
        Ok(_) => {}
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NOFOLLOW | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&path, flags).map_err(HistoryError::sqlite(&path))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(HistoryError::sqlite(&path))?;
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(HistoryError::sqlite(&path))?;
    if found > SCHEMA_VERSION {
        return Err(HistoryError::NewerSchema { path, found });
    }
    Ok(Some(conn))
}

/// Create the file with its mode (not the umask's), or check the one there: a regular file,
/// reached without a link.
fn create_file(path: &Path) -> Result<(), HistoryError> {
    let io = |source| HistoryError::Io { path: path.to_path_buf(), source };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(DB_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(HistoryError::NotRegular { path: path.to_path_buf() });
    }
    if meta.permissions().mode() & 0o7777 != DB_MODE {
        file.set_permissions(std::fs::Permissions::from_mode(DB_MODE)).map_err(io)?;
    }
    Ok(())
}

/// Bring an older (or new, empty) database to [`SCHEMA_VERSION`]; refuse a newer one.
fn migrate(conn: &Connection, path: &Path) -> Result<(), HistoryError> {
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(HistoryError::sqlite(path))?;
    if found > SCHEMA_VERSION {
        return Err(HistoryError::NewerSchema { path: path.to_path_buf(), found });
    }
    if found < SCHEMA_VERSION {
        let sql = format!("BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;");
        conn.execute_batch(&sql).map_err(HistoryError::sqlite(path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_the_schema_with_its_mode_and_reads_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_rw(dir.path()).unwrap();
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 7);
        drop(conn);
        let mode = std::fs::metadata(path_in(dir.path())).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, DB_MODE);
        // Opening again is idempotent; a reader sees the version.
        open_rw(dir.path()).unwrap();
        let ro = open_ro(dir.path()).unwrap().unwrap();
        let v: i64 = ro.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn refuses_a_link_and_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", path_in(dir.path())).unwrap();
        assert!(matches!(open_rw(dir.path()), Err(HistoryError::Io { .. })));
        assert!(matches!(open_ro(dir.path()), Err(HistoryError::NotRegular { .. })));
        std::fs::remove_file(path_in(dir.path())).unwrap();
        assert!(open_ro(dir.path()).unwrap().is_none());
        let conn = open_rw(dir.path()).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        drop(conn);
        assert!(matches!(open_rw(dir.path()), Err(HistoryError::NewerSchema { .. })));
        assert!(matches!(open_ro(dir.path()), Err(HistoryError::NewerSchema { .. })));
    }
}
