//! Opening the history database: the one place that creates it, sets its mode and owner,
//! and brings its schema up to date.
//!
//! * The file is made (`O_CREAT|O_NOFOLLOW`, never through a link) mode [`DB_MODE`] (0600)
//!   and owned by the caller (root, for `vgpu watch`), then opened by SQLite with
//!   `SQLITE_OPEN_NOFOLLOW`. SQLite gives its `-wal` and `-shm` files the database's mode
//!   and owner. No other user may open them: a read-only descriptor is enough to take
//!   SQLite's locks (`F_RDLCK` on the database's SHARED range, on the WAL write lock of
//!   `-shm`) and stall every writer. Users read the public copy instead
//!   ([`super::snapshot`]).
//! * A database an older vgpu left readable (0644, or its `-wal`/`-shm`) is made private on
//!   a new inode before it is opened ([`make_private`]): a chmod would not do, as a
//!   descriptor a user opened before keeps working on the old inode.
//! * WAL journal (`synchronous = NORMAL`): a writer killed mid-transaction leaves the last
//!   committed state; readers never block the writer. The last connection to close
//!   checkpoints (a WAL left for the next opener would cost it a recovery that reads the
//!   whole WAL, more than the checkpoint's syncs).
//! * Every wait on SQLite's lock is bounded by [`BUSY_TIMEOUT`].
//! * A database of a newer schema than this build's is refused, never rewritten.

use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use thiserror::Error;

use super::{DB_FILE, SCHEMA, SCHEMA_VERSION};

/// Mode of history.db (and, through SQLite, of its `-wal` and `-shm`): root's alone.
/// Everyone else reads the public copy ([`super::snapshot`]).
pub const DB_MODE: u32 = 0o600;

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
    #[error("{}: another vgpu is making it private (an older vgpu left it readable); try again", .path.display())]
    Migrating { path: PathBuf },
    #[error("{}: made private, but its copy is damaged ({detail}); the old file is kept as it was", .path.display())]
    BadCopy { path: PathBuf, detail: String },
}

impl HistoryError {
    pub fn sqlite(path: &Path) -> impl FnOnce(rusqlite::Error) -> HistoryError + '_ {
        move |source| HistoryError::Sqlite { path: path.to_path_buf(), source }
    }
}

/// `<lib_dir>/history.db`.
pub fn path_in(lib_dir: &Path) -> PathBuf {
    lib_dir.join(DB_FILE)
}

/// Open (creating it and its tables if needed) the database for writing.
pub fn open_rw(lib_dir: &Path) -> Result<Connection, HistoryError> {
    open_rw_within(lib_dir, BUSY_TIMEOUT)
}

/// [`open_rw`], each wait for another connection's lock bounded by `busy` (at most
/// [`BUSY_TIMEOUT`]).
pub fn open_rw_within(lib_dir: &Path, busy: Duration) -> Result<Connection, HistoryError> {
    let path = path_in(lib_dir);
    vgpu_carbon::create_dir(lib_dir).map_err(|source| HistoryError::Io { path: lib_dir.to_path_buf(), source })?;
    if nix::unistd::geteuid().is_root() {
        make_private(lib_dir, busy)?;
    }
    create_file(&path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NOFOLLOW | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&path, flags).map_err(HistoryError::sqlite(&path))?;
    conn.busy_timeout(busy.min(BUSY_TIMEOUT)).map_err(HistoryError::sqlite(&path))?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(HistoryError::sqlite(&path))?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(HistoryError::sqlite(&path))?;
    migrate(&conn, &path)?;
    Ok(conn)
}

/// Where a reader's rows come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// history.db itself (root).
    Live,
    /// The public copy, made at this time (users other than root).
    Snapshot { made: std::time::SystemTime },
}

/// The history opened to read, and from where.
#[derive(Debug)]
pub struct Opened {
    pub conn: Connection,
    /// The file read.
    pub path: PathBuf,
    pub from: ReadFrom,
}

/// Open the live database to read (root); `Ok(None)` when there is none yet.
///
/// Opened read-write but `query_only` (no statement may change it): a read-only connection
/// makes the `-wal` and `-shm` files when they are not there and, unable to checkpoint,
/// leaves them behind at its close; this one, the last to close, folds the WAL back and
/// removes them as a writer does.
pub fn open_live_ro(lib_dir: &Path) -> Result<Option<Connection>, HistoryError> {
    let path = path_in(lib_dir);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(HistoryError::Io { path, source }),
        Ok(meta) if !meta.file_type().is_file() => return Err(HistoryError::NotRegular { path }),
        Ok(_) => {}
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NOFOLLOW | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&path, flags).map_err(HistoryError::sqlite(&path))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(HistoryError::sqlite(&path))?;
    conn.pragma_update(None, "query_only", true).map_err(HistoryError::sqlite(&path))?;
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

/// The name of `path` with `suffix` appended (`history.db` → `history.db-wal`).
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Whether `path` is absent, or a file of this process's user that nobody else may open.
fn is_private(path: &Path) -> Result<bool, HistoryError> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::symlink_metadata(path) {
        Ok(meta) => Ok(meta.uid() == nix::unistd::geteuid().as_raw() && meta.mode() & 0o077 == 0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(source) => Err(HistoryError::Io { path: path.to_path_buf(), source }),
    }
}

/// The complete private copy of a migration that was interrupted after it was made.
const PRIVATE_COPY: &str = ".history.db.private";
/// A private copy being made.
const PRIVATE_TMP: &str = ".history.db.private.tmp";
/// Held (`flock`) while a database is made private: one process does it.
const MIGRATE_LOCK: &str = ".history.db.lock";

/// Make the database private when an older vgpu left it (or its `-wal`, `-shm`) readable
/// by others: its bytes and its WAL are copied into new files of mode 0600 (no SQLite lock
/// is taken on the old ones, which a user may hold), the copy is opened (SQLite replays the
/// WAL), checked (`quick_check`) and checkpointed, then renamed over the database after the
/// old `-wal` and `-shm` are removed. A descriptor a user holds stays on the old inode,
/// which has no name any more. Killed at any step, the next open starts again or finishes
/// (a complete copy is renamed to [`PRIVATE_COPY`] before the old files go).
///
/// A write another root process makes to the old database while it is copied may be lost
/// (this happens once, at the first open after an upgrade, usually `vgpu watch`'s start).
pub fn make_private(lib_dir: &Path, busy: Duration) -> Result<(), HistoryError> {
    let path = path_in(lib_dir);
    let files = [path.clone(), with_suffix(&path, "-wal"), with_suffix(&path, "-shm")];
    let private = |files: &[PathBuf]| -> Result<bool, HistoryError> {
        for f in files {
            if !is_private(f)? {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let copy = lib_dir.join(PRIVATE_COPY);
    if private(&files)? && !copy.exists() {
        return Ok(());
    }
    let _lock = migration_lock(lib_dir, &path, busy)?;
    if !copy.exists() {
        if private(&files)? {
            return Ok(());
        }
        let tmp = lib_dir.join(PRIVATE_TMP);
        if let Err(e) = copy_database(&path, &tmp) {
            for left in [tmp.clone(), with_suffix(&tmp, "-wal"), with_suffix(&tmp, "-shm")] {
                let _ = std::fs::remove_file(left);
            }
            return Err(e);
        }
        std::fs::rename(&tmp, &copy).map_err(|source| HistoryError::Io { path: copy.clone(), source })?;
        sync_dir(lib_dir)?;
    }
    for old in &files[1..] {
        match std::fs::remove_file(old) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(HistoryError::Io { path: old.clone(), source }),
        }
    }
    std::fs::rename(&copy, &path).map_err(|source| HistoryError::Io { path: path.clone(), source })?;
    sync_dir(lib_dir)
}

/// `flock` on [`MIGRATE_LOCK`], waiting at most `busy`.
fn migration_lock(lib_dir: &Path, path: &Path, busy: Duration) -> Result<std::fs::File, HistoryError> {
    let lock_path = lib_dir.join(MIGRATE_LOCK);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(|source| HistoryError::Io { path: lock_path.clone(), source })?;
    let deadline = std::time::Instant::now() + busy.min(BUSY_TIMEOUT);
    loop {
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(HistoryError::Io { path: lock_path, source: e });
        }
        if std::time::Instant::now() >= deadline {
            return Err(HistoryError::Migrating { path: path.to_path_buf() });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A private, checked, checkpointed copy of the database at `path` (and its WAL) at `to`.
fn copy_database(path: &Path, to: &Path) -> Result<(), HistoryError> {
    for stale in [to.to_path_buf(), with_suffix(to, "-wal"), with_suffix(to, "-shm"), with_suffix(to, "-journal")] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(HistoryError::Io { path: stale, source }),
        }
    }
    copy_file(path, to)?;
    copy_file(&with_suffix(path, "-wal"), &with_suffix(to, "-wal"))?;
    let bad = |detail: String| HistoryError::BadCopy { path: path.to_path_buf(), detail };
    {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NOFOLLOW | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(to, flags).map_err(HistoryError::sqlite(to))?;
        let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(|e| bad(e.to_string()))?;
        if check != "ok" {
            return Err(bad(check));
        }
        // The WAL into the file, and the file on its own (the next open sets WAL again).
        let mode: String = conn.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0)).map_err(HistoryError::sqlite(to))?;
        if !mode.eq_ignore_ascii_case("delete") {
            return Err(bad(format!("its journal stayed {mode}")));
        }
    }
    for left in [with_suffix(to, "-wal"), with_suffix(to, "-shm")] {
        let _ = std::fs::remove_file(left);
    }
    let file = std::fs::File::open(to).map_err(|source| HistoryError::Io { path: to.to_path_buf(), source })?;
    file.sync_all().map_err(|source| HistoryError::Io { path: to.to_path_buf(), source })
}

/// Copy `from` (when there) to a new file `to` of mode 0600, synced; no link followed.
fn copy_file(from: &Path, to: &Path) -> Result<(), HistoryError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HistoryError::Io { path, source }
    };
    let mut src = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(from) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(HistoryError::Io { path: from.to_path_buf(), source }),
    };
    if !src.metadata().map_err(io(from))?.file_type().is_file() {
        return Err(HistoryError::NotRegular { path: from.to_path_buf() });
    }
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(to)
        .map_err(io(to))?;
    std::io::copy(&mut src, &mut dst).map_err(io(to))?;
    dst.sync_all().map_err(io(to))
}

/// fsync a directory, so that a rename in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), HistoryError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|source| HistoryError::Io { path: dir.to_path_buf(), source })
}

/// Bring an older (or new, empty) database to [`SCHEMA_VERSION`]; refuse a newer one.
///
/// One transaction: every `CREATE … IF NOT EXISTS` of [`SCHEMA`] (a database of version 1
/// gains the rollup tables, their triggers and the `workloads_ended` index; its tables and
/// rows stay as they are), then the version. Killed before the commit, the database is the
/// old one, whole (the WAL drops what was not committed), and the next open starts again.
/// No rollup is made here: `vgpu watch` makes them afterwards, in bounded batches
/// ([`crate::History::roll_up`]); until then readers account those hours from their rows,
/// to the same figures.
fn migrate(conn: &Connection, path: &Path) -> Result<(), HistoryError> {
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(HistoryError::sqlite(path))?;
    if found > SCHEMA_VERSION {
        return Err(HistoryError::NewerSchema { path: path.to_path_buf(), found });
    }
    if found < SCHEMA_VERSION {
        conn.execute_batch("BEGIN IMMEDIATE").map_err(HistoryError::sqlite(path))?;
        if let Err(e) = conn.execute_batch(SCHEMA) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(HistoryError::Sqlite { path: path.to_path_buf(), source: e });
        }
        // A test kills the migration here: the database must stay the old one, whole.
        vgpu_store::stop_point::stop_point("history:mid-migration");
        if let Err(e) = conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(HistoryError::Sqlite { path: path.to_path_buf(), source: e });
        }
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
        assert_eq!(tables, 10);
        drop(conn);
        let mode = std::fs::metadata(path_in(dir.path())).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, DB_MODE);
        // Opening again is idempotent; a reader sees the version.
        open_rw(dir.path()).unwrap();
        let ro = open_live_ro(dir.path()).unwrap().unwrap();
        let v: i64 = ro.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn a_reader_changes_nothing_and_leaves_no_wal_behind() {
        let dir = tempfile::tempdir().unwrap();
        drop(open_rw(dir.path()).unwrap());
        let wal = with_suffix(&path_in(dir.path()), "-wal");
        assert!(!wal.exists(), "the writer's close removed its WAL");
        let ro = open_live_ro(dir.path()).unwrap().unwrap();
        let n: i64 = ro.query_row("SELECT count(*) FROM workloads", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 0);
        assert!(ro.execute("INSERT INTO workloads (id, name, uid, user, command, gpus, started_ms) VALUES ('w', 'a', 0, 'root', 'x', '', 1)", []).is_err(), "query_only");
        drop(ro);
        assert!(!wal.exists() && !with_suffix(&path_in(dir.path()), "-shm").exists(), "a reader left its WAL or shm");
    }

    #[test]
    fn a_readable_database_of_an_old_install_is_made_private_on_a_new_inode_with_its_wal() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        // An old install: 0644, rows still in the WAL (a writer open), its -shm readable.
        let old = open_rw(dir.path()).unwrap();
        old.execute_batch("PRAGMA wal_autocheckpoint = 0; INSERT INTO workloads (id, name, uid, user, command, gpus, started_ms) VALUES ('w1', 'a', 0, 'root', 'x', '', 1);").unwrap();
        for f in [path.clone(), with_suffix(&path, "-wal"), with_suffix(&path, "-shm")] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let held = std::fs::File::open(&path).unwrap();
        let old_inode = std::fs::metadata(&path).unwrap().ino();
        // A copy of the files as they are (the old writer never checkpoints): what an
        // older watch killed would leave.
        let copy_dir = tempfile::tempdir().unwrap();
        for suffix in ["", "-wal"] {
            std::fs::copy(with_suffix(&path, suffix), with_suffix(&path_in(copy_dir.path()), suffix)).unwrap();
            std::fs::set_permissions(with_suffix(&path_in(copy_dir.path()), suffix), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        drop(old);
        for dir in [dir.path(), copy_dir.path()] {
            let conn = open_rw(dir).unwrap();
            let n: i64 = conn.query_row("SELECT count(*) FROM workloads", [], |r| r.get(0)).unwrap();
            assert_eq!(n, 1, "the rows of the WAL are kept");
            let p = path_in(dir);
            for f in [p.clone(), with_suffix(&p, "-wal"), with_suffix(&p, "-shm")] {
                let mode = std::fs::metadata(&f).map(|m| m.mode() & 0o7777).unwrap_or(0);
                assert!(mode == 0 || mode == DB_MODE, "{}: {mode:o}", f.display());
            }
            assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, DB_MODE);
            let names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
            assert!(!names.iter().any(|n| n.contains("private")), "{names:?}");
        }
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), old_inode, "a new inode");
        assert_eq!(held.metadata().unwrap().ino(), old_inode, "the old descriptor stays on the old one");
    }

    #[test]
    fn refuses_a_link_and_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", path_in(dir.path())).unwrap();
        assert!(matches!(open_rw(dir.path()), Err(HistoryError::Io { .. })));
        assert!(matches!(open_live_ro(dir.path()), Err(HistoryError::NotRegular { .. })));
        std::fs::remove_file(path_in(dir.path())).unwrap();
        assert!(open_live_ro(dir.path()).unwrap().is_none());
        let conn = open_rw(dir.path()).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        drop(conn);
        assert!(matches!(open_rw(dir.path()), Err(HistoryError::NewerSchema { .. })));
        assert!(matches!(open_live_ro(dir.path()), Err(HistoryError::NewerSchema { .. })));
    }

    // The schema as docs/history.md carries it (moved from the crate root, so that the
    // root uses no module).
    const DOC: &str = include_str!("../../../docs/history.md");

    /// The ```sql blocks of docs/history.md.
    fn sql_blocks() -> Vec<&'static str> {
        DOC.split("```sql\n").skip(1).map(|b| b.split("```").next().unwrap_or_default()).collect()
    }

    #[test]
    fn the_doc_carries_the_schema_verbatim_and_its_queries_run() {
        let blocks = sql_blocks();
        assert_eq!(blocks.last().map(|b| b.trim_end()), Some(SCHEMA.trim_end()), "docs/history.md's last sql block must be schema.sql verbatim");
        let dir = tempfile::tempdir().unwrap();
        let conn = open_rw(dir.path()).unwrap();
        assert!(blocks.len() >= 5, "{}", blocks.len());
        for block in &blocks[..blocks.len() - 1] {
            for query in block.split(';').map(str::trim).filter(|q| !q.is_empty()) {
                let mut stmt = conn.prepare(query).unwrap_or_else(|e| panic!("{query}: {e}"));
                stmt.query([]).unwrap_or_else(|e| panic!("{query}: {e}")).next().unwrap();
            }
        }
    }
}
