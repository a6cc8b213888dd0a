//! The last good reading, remembered in `<lib_dir>/carbon-intensity.json` so that a failing
//! source does not stop the 15-minute apply; the last good forecast likewise, in
//! `<lib_dir>/carbon-forecast.json` ([`FORECAST_FILE`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::Reading;

pub const CACHE_FILE: &str = "carbon-intensity.json";
/// The last good forecast ([`super::Forecast`]), in the lib directory.
pub const FORECAST_FILE: &str = "carbon-forecast.json";
/// The most of a remembered reading or forecast that is read (a forecast of a month of
/// 5-minute rows from a file source is under 1 MiB).
pub const MAX_CACHE: u64 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedReading {
    /// The source's description; another source's reading is never reused.
    pub source: String,
    pub reading: Reading,
    /// When it was read: `max_age` counts from here.
    pub fetched_at: DateTime<Utc>,
}

#[derive(Debug, Error)]
pub enum CacheError {
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} is damaged: {source}", .path.display())]
    Damaged { path: PathBuf, source: serde_json::Error },
    #[error("cannot write {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

#[derive(Debug, Clone)]
pub struct Cache {
    path: PathBuf,
}

impl Cache {
    pub fn new(path: impl Into<PathBuf>) -> Cache {
        Cache { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The remembered reading; `None` when there is none yet.
    pub fn load(&self) -> Result<Option<CachedReading>, CacheError> {
        self.load_as()
    }

    /// The remembered entry, of any kind (a reading, a forecast); `None` when there is none.
    /// Read as root from the lib directory: never through a symbolic link in place of the
    /// file, never a FIFO or device, at most [`MAX_CACHE`] bytes.
    pub fn load_as<T: DeserializeOwned>(&self) -> Result<Option<T>, CacheError> {
        use vgpu_store::state::small_file;
        use vgpu_store::state::small_file::Links;
        use vgpu_store::state::small_file::SmallFileError;
        let read_err = |source| CacheError::Read { path: self.path.clone(), source };
        let refused = |e: SmallFileError| {
            read_err(match e {
                SmallFileError::Io(e) => e,
                SmallFileError::Link => std::io::Error::other("a symbolic link, refused"),
                SmallFileError::NotRegular => std::io::Error::other("not a regular file"),
                SmallFileError::TooLarge(n) => std::io::Error::other(format!("{n} bytes, more than {MAX_CACHE}")),
            })
        };
        let file = match small_file::open(&self.path, Links::NotLast, MAX_CACHE) {
            Ok((file, _)) => file,
            Err(SmallFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(refused(e)),
        };
        let bytes = small_file::read(file, MAX_CACHE).map_err(refused)?;
        let text = String::from_utf8_lossy(&bytes);
        serde_json::from_str(&text).map(Some).map_err(|source| CacheError::Damaged { path: self.path.clone(), source })
    }

    /// Replace the remembered reading atomically (write beside it, then rename).
    pub fn store(&self, entry: &CachedReading) -> Result<(), CacheError> {
        self.store_as(entry)
    }

    /// Replace the remembered entry, of any kind, atomically.
    pub fn store_as<T: Serialize>(&self, entry: &T) -> Result<(), CacheError> {
        let write_err = |source| CacheError::Write { path: self.path.clone(), source };
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        crate::create_dir(dir).map_err(write_err)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(write_err)?;
        let text = serde_json::to_string_pretty(entry).map_err(|e| write_err(e.into()))?;
        tmp.write_all(text.as_bytes()).map_err(write_err)?;
        tmp.write_all(b"\n").map_err(write_err)?;
        set_readable(tmp.path()).map_err(write_err)?;
        tmp.persist(&self.path).map_err(|e| write_err(e.error))?;
        Ok(())
    }
}

/// Temporary files are created 0600; the cache is not secret.
fn set_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> CachedReading {
        let t = DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z").unwrap().with_timezone(&Utc);
        CachedReading { source: "static".into(), reading: Reading { g_per_kwh: 123.5, timestamp: t }, fetched_at: t }
    }

    #[test]
    fn missing_is_none_and_store_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("sub/carbon-intensity.json"));
        assert!(cache.load().unwrap().is_none());
        cache.store(&entry()).unwrap();
        assert_eq!(cache.load().unwrap(), Some(entry()));
        let mut newer = entry();
        newer.reading.g_per_kwh = 99.0;
        cache.store(&newer).unwrap();
        assert_eq!(cache.load().unwrap(), Some(newer));
        assert_eq!(std::fs::read_dir(dir.path().join("sub")).unwrap().count(), 1, "no temporary files left");
    }

    #[test]
    fn damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CACHE_FILE);
        std::fs::write(&path, "{not json").unwrap();
        let err = Cache::new(&path).load().unwrap_err().to_string();
        assert!(err.contains(CACHE_FILE) && err.contains("damaged"), "{err}");
    }

    #[test]
    fn a_link_in_place_of_the_cache_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        Cache::new(&elsewhere).store(&entry()).unwrap();
        let path = dir.path().join(CACHE_FILE);
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let err = Cache::new(&path).load().unwrap_err().to_string();
        assert!(err.contains("a symbolic link, refused"), "{err}");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(Cache::new(&path).load().unwrap_err().to_string().contains("not a regular file"));
    }

    #[test]
    fn unwritable_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        let err = Cache::new(blocker.join("x.json")).store(&entry()).unwrap_err().to_string();
        assert!(err.contains("cannot write"), "{err}");
    }
}
