//! The node_exporter textfile (`[watch] textfile`): rewritten whole every round, so that
//! the collector never reads half a file. A temporary file is created beside it
//! (exclusively, never through a link, named `.NAME.PID.tmp`, which the collector skips: it
//! reads only `*.prom`), given mode 0644 whatever the umask, synced, and renamed over the
//! path — which replaces a link there rather than writing through it.

use std::path::{Path, PathBuf};

/// Mode of the textfile: node_exporter usually runs as its own user and must read it.
pub const MODE: u32 = 0o644;

#[derive(Debug, thiserror::Error)]
#[error("cannot write the metrics textfile {}: {source}", .path.display())]
pub struct TextfileError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Replace the file at `path` with `text`.
pub fn write(path: &Path, text: &str) -> Result<(), TextfileError> {
    vgpu_abi::mapping::write_new(path, text.as_bytes(), None, MODE).map_err(|source| TextfileError { path: path.to_path_buf(), source })
}

/// Remove a textfile this watch wrote and no longer keeps (its path changed, or was
/// unset). A file that is not there is no error.
pub fn remove(path: &Path) -> Result<(), TextfileError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(TextfileError { path: path.to_path_buf(), source }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn replaces_the_file_whole_with_mode_0644_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.prom");
        write(&path, "a 1\n").unwrap();
        write(&path, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, MODE);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["vgpu.prom"]);
    }

    #[test]
    fn a_link_at_the_path_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "precious").unwrap();
        let path = dir.path().join("vgpu.prom");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write(&path, "a 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.nlink(), 1);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 1\n");
    }

    #[test]
    fn errors_name_the_file_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir/vgpu.prom");
        let err = write(&path, "a 1\n").unwrap_err().to_string();
        assert!(err.contains("missing-dir/vgpu.prom") && !err.contains('\n'), "{err}");
        let taken = dir.path().join("taken");
        std::fs::create_dir(&taken).unwrap();
        assert!(write(&taken, "a 1\n").is_err(), "a directory at the path is not replaced");
        remove(&dir.path().join("never-written.prom")).unwrap();
    }
}
