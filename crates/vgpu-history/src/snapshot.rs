//! The public copy of the history, `<lib_dir>/history-snapshot.db` (root, 0644): what users
//! other than root read (`vgpu ps -a`, `vgpu carbon report`, `vgpu carbon plan`).
//!
//! history.db itself is root's alone ([`super::db::DB_MODE`]): SQLite's readers take locks
//! that a writer waits on, so a user who could open it could stall `vgpu watch`. The copy is
//! a whole database in rollback-journal mode, made by the watch's history thread with
//! `VACUUM INTO` (a consistent snapshot of one read transaction) into a new private file,
//! synced, made 0644 and renamed over the old copy: a reader sees the old copy or the new
//! one, never a mix. Readers open it with `immutable=1`, which takes no lock at all, so
//! nothing a reader does (even holding `fcntl` locks on it) reaches the watch, which never
//! opens the published file again.
//!
//! How often: [`Cadence`] (at most once a minute, sooner when a workload ended, never more
//! than [`MAX_DUTY`] of the time).

use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{Connection, OpenFlags};

use super::db::{self, HistoryError, Opened, ReadFrom};

/// The public copy's file name in the lib directory.
pub const SNAPSHOT_FILE: &str = "history-snapshot.db";

/// Its mode: anyone may read it (as anyone may run `vgpu ps`).
pub const SNAPSHOT_MODE: u32 = 0o644;

/// The copy being made (private until it is renamed).
const TMP_FILE: &str = ".history-snapshot.db.tmp";

/// The copy is made at most this often when rows were written...
pub const EVERY: Duration = Duration::from_secs(60);
/// ... and this soon after a workload ended (its line in `ps -a`).
pub const AFTER_END: Duration = Duration::from_secs(10);
/// The longest share of the time spent copying: after a copy that took `d`, the next waits
/// at least `d / MAX_DUTY` (a copy of 2 GB that takes 20 s: one every 400 s at most).
pub const MAX_DUTY: f64 = 0.05;

/// `<lib_dir>/history-snapshot.db`.
pub fn path_in(lib_dir: &Path) -> PathBuf {
    lib_dir.join(SNAPSHOT_FILE)
}

/// Replace the public copy with the database `conn` is connected to, now. Returns how long
/// it took.
pub fn publish(conn: &Connection, lib_dir: &Path) -> Result<Duration, HistoryError> {
    let started = Instant::now();
    let tmp = lib_dir.join(TMP_FILE);
    let path = path_in(lib_dir);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HistoryError::Io { path, source }
    };
    for stale in [tmp.clone(), db::with_suffix(&tmp, "-journal")] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(HistoryError::Io { path: stale, source }),
        }
    }
    // Made empty and private first (VACUUM INTO fills an empty file), so that nobody opens
    // it, nor locks it, while it is written.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(&tmp))?;
    let written = conn.execute("VACUUM INTO ?1", [tmp.to_string_lossy().as_ref()]).map_err(HistoryError::sqlite(&tmp));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    file.sync_all().map_err(io(&tmp))?;
    file.set_permissions(std::fs::Permissions::from_mode(SNAPSHOT_MODE)).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    db::sync_dir(lib_dir)?;
    Ok(started.elapsed())
}

/// Open the public copy to read (no lock taken); `Ok(None)` when there is none yet.
pub fn open(lib_dir: &Path) -> Result<Option<Opened>, HistoryError> {
    let path = path_in(lib_dir);
    let made = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(HistoryError::Io { path, source }),
        Ok(meta) if !meta.file_type().is_file() => return Err(HistoryError::NotRegular { path }),
        Ok(meta) => meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
    };
    let conn = open_immutable(&path)?;
    Ok(Some(Opened { conn, path, from: ReadFrom::Snapshot { made } }))
}

/// Open `path` read-only as an immutable database: no lock, no `-shm`, no journal.
pub(crate) fn open_immutable(path: &Path) -> Result<Connection, HistoryError> {
    let uri = format!("file:{}?immutable=1", uri_path(path));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NOFOLLOW | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(uri, flags).map_err(HistoryError::sqlite(path))?;
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(HistoryError::sqlite(path))?;
    if found > super::SCHEMA_VERSION {
        return Err(HistoryError::NewerSchema { path: path.to_path_buf(), found });
    }
    Ok(conn)
}

/// A path as a `file:` URI's path: every byte but unreserved ones and `/` percent-encoded.
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// When the next copy is due (the watch's history thread asks after every write).
#[derive(Debug, Default)]
pub struct Cadence {
    /// When the last copy was made, and how long it took.
    last: Option<(Instant, Duration)>,
    /// Rows were written since the last copy.
    dirty: bool,
    /// A workload ended since the last copy.
    ended: bool,
}

impl Cadence {
    /// Something was written; `ended`: a workload's end among it.
    pub fn wrote(&mut self, ended: bool) {
        self.dirty = true;
        self.ended |= ended;
    }

    /// Whether a copy is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        if !self.dirty {
            return false;
        }
        let Some((at, took)) = self.last else { return true };
        let since = now.saturating_duration_since(at);
        let wait = if self.ended { AFTER_END } else { EVERY };
        since >= wait && since >= took.div_f64(MAX_DUTY)
    }

    /// A copy was made at `at` and took `took` (or failed: tried again at the same pace).
    pub fn made(&mut self, at: Instant, took: Duration, ok: bool) {
        self.last = Some((at, took));
        if ok {
            self.dirty = false;
            self.ended = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    #[test]
    fn publishes_a_world_readable_consistent_copy_and_replaces_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let conn = db::open_rw(dir.path()).unwrap();
        conn.execute("INSERT INTO workloads (id, name, uid, user, command, gpus, started_ms) VALUES ('w1', 'a', 0, 'root', 'x', '', 1)", []).unwrap();
        publish(&conn, dir.path()).unwrap();
        let path = path_in(dir.path());
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, SNAPSHOT_MODE);
        let first_inode = meta.ino();
        let read = open(dir.path()).unwrap().unwrap();
        assert!(matches!(read.from, ReadFrom::Snapshot { .. }));
        let n: i64 = read.conn.query_row("SELECT count(*) FROM workloads", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        // A reader holding the old copy keeps it; the new one is another inode.
        conn.execute("INSERT INTO workloads (id, name, uid, user, command, gpus, started_ms) VALUES ('w2', 'b', 0, 'root', 'x', '', 1)", []).unwrap();
        publish(&conn, dir.path()).unwrap();
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), first_inode);
        let n: i64 = read.conn.query_row("SELECT count(*) FROM workloads", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "the old copy, whole");
        let again = open(dir.path()).unwrap().unwrap();
        let n: i64 = again.conn.query_row("SELECT count(*) FROM workloads", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 2);
        let mut names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert!(!names.iter().any(|n| n.contains(".tmp")), "{names:?}");
    }

    #[test]
    fn cadence_once_a_minute_sooner_after_an_end_never_above_the_duty() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        assert!(!c.due(t0), "nothing written");
        c.wrote(false);
        assert!(c.due(t0), "the first copy at once");
        c.made(t0, Duration::from_millis(100), true);
        c.wrote(false);
        assert!(!c.due(t0 + Duration::from_secs(59)));
        assert!(c.due(t0 + EVERY));
        c.wrote(true);
        assert!(c.due(t0 + AFTER_END));
        // A slow copy spaces the next ones out.
        c.made(t0, Duration::from_secs(20), true);
        c.wrote(true);
        assert!(!c.due(t0 + Duration::from_secs(399)));
        assert!(c.due(t0 + Duration::from_secs(400)));
    }

    #[test]
    fn uri_paths_are_escaped() {
        assert_eq!(uri_path(Path::new("/var/lib/a b?#%.db")), "/var/lib/a%20b%3F%23%25.db");
    }
}
