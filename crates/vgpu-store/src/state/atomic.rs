//! Atomic file replacement: readers see the old content or the new, never a mix.
//!
//! Whatever kills the writer (SIGKILL at any step included), the content of a file renamed
//! into place is whole: it is in the kernel's page cache, which outlives the process. Only a
//! crash of the machine itself can lose what was not synced to the disk, so only what must
//! outlive the machine's processes is synced: the persistent state (`<lib>`, [`Durability::Durable`]).
//! The runtime state (`<state>`, [`Durability::Runtime`]) describes processes that such a crash
//! ends with it; on a tmpfs (`/run`) it goes with them, and a state directory on a disk is
//! repaired at the first command of the next boot (`state::boot`).

use std::io::Write;
use std::path::Path;

use super::StateError;

/// Whether a write is synced to the disk before it is renamed into place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Persistent state (`<lib>`): synced, so that it outlives a crash of the machine.
    Durable,
    /// Runtime state (`<state>`): not synced (see the module).
    Runtime,
}

/// Write `bytes` to `path` through a temp file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateError> {
    write_atomic_as(path, bytes, mode, Durability::Durable)
}

/// Write `bytes` to `path` through a temp file in the same directory (synced first for
/// [`Durability::Durable`]), then rename it into place.
pub fn write_atomic_as(path: &Path, bytes: &[u8], mode: u32, durability: Durability) -> Result<(), StateError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp = || tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir);
    // The directory is made when the temporary file finds it missing (not looked at first:
    // it nearly always exists).
    let mut tmp = match temp() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| StateError::io(dir, e))?;
            temp()
        }
        made => made,
    }
    .map_err(|e| StateError::io(dir, e))?;
    tmp.write_all(bytes).map_err(|e| StateError::io(tmp.path(), e))?;
    if durability == Durability::Durable {
        tmp.as_file().sync_all().map_err(|e| StateError::io(tmp.path(), e))?;
    }
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode)).map_err(|e| StateError::io(tmp.path(), e))?;
    tmp.persist(path).map_err(|e| StateError::io(path, e.error))?;
    Ok(())
}

/// The most a record read from the store may hold.
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// Read a whole state file: never through a symlink, never blocking on a FIFO, a regular
/// file only (checked on the opened descriptor), at most `max` bytes.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, StateError> {
    read_regular_with_meta(path, max).map(|(bytes, _)| bytes)
}

/// [`read_regular`], with the file's metadata as it was opened (its owner, mode and times,
/// for the caller to check).
pub fn read_regular_with_meta(path: &Path, max: u64) -> Result<(Vec<u8>, std::fs::Metadata), StateError> {
    use std::io::Read;
    let file = vgpu_abi::mapping::open_no_links(path, false).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => StateError::NotRegular { path: path.to_path_buf(), kind: "symbolic link" },
            _ => StateError::io(path, e),
        })?;
    let meta = file.metadata().map_err(|e| StateError::io(path, e))?;
    if !meta.file_type().is_file() {
        return Err(super::lock::not_regular(path, &meta.file_type()));
    }
    if meta.len() > max {
        return Err(StateError::Damaged { path: path.to_path_buf(), message: format!("{} bytes (at most {max} expected)", meta.len()) });
    }
    // One read of the size it has and a byte more: a regular file read short is at its end
    // (`read_to_end` would ask once more to be sure: a system call per record, and a listing
    // reads every record). A file that grew since is read on to its end.
    let mut file = file.take(max + 1);
    let want = meta.len() as usize + 1;
    let mut bytes = vec![0u8; want];
    let n = loop {
        match file.read(&mut bytes) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StateError::io(path, e)),
        }
    };
    bytes.truncate(n);
    if n == want {
        file.read_to_end(&mut bytes).map_err(|e| StateError::io(path, e))?;
    }
    Ok((bytes, meta))
}

/// Serialise `value` as pretty JSON and write it atomically, synced (persistent state).
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    write_json_as(path, value, Durability::Durable)
}

/// Serialise `value` as pretty JSON and write it atomically, as `durability` says.
pub fn write_json_as<T: serde::Serialize>(path: &Path, value: &T, durability: Durability) -> Result<(), StateError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| StateError::Damaged { path: path.to_path_buf(), message: e.to_string() })?;
    bytes.push(b'\n');
    write_atomic_as(path, &bytes, 0o644, durability)
}

/// Read JSON; a parse failure is a `Damaged` error naming the file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, StateError> {
    let bytes = read_regular(path, MAX_RECORD_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| StateError::Damaged { path: path.to_path_buf(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        write_json(&path, &vec![1, 2]).unwrap();
        write_json(&path, &vec![3]).unwrap();
        let back: Vec<i32> = read_json(&path).unwrap();
        assert_eq!(back, vec![3]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_missing_directory_is_made_and_a_file_in_the_way_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/x.json");
        write_json(&path, &vec![1]).unwrap();
        assert_eq!(read_json::<Vec<i32>>(&path).unwrap(), vec![1]);
        std::fs::write(dir.path().join("file"), "").unwrap();
        let err = write_json(&dir.path().join("file/x.json"), &vec![1]).unwrap_err();
        assert!(err.to_string().contains("file"), "{err}");
    }

    /// One read of the file's size and a byte more gets it whole, whatever its size (a
    /// short read ends it); more than `max` is refused.
    #[test]
    fn a_file_is_read_whole_at_every_size_and_not_past_the_most() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 797, 4095, 4096, 4097, 200_000] {
            let path = dir.path().join(format!("f{len}"));
            let content: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            std::fs::write(&path, &content).unwrap();
            assert_eq!(read_regular(&path, 1 << 20).unwrap(), content, "{len} bytes");
        }
        let path = dir.path().join("f4097");
        assert!(matches!(read_regular(&path, 4096), Err(StateError::Damaged { .. })));
        assert_eq!(read_regular(&path, 4097).unwrap().len(), 4097);
    }

    #[test]
    fn fifos_and_symlinks_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.json");
        write_json(&target, &vec![1]).unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = read_json::<Vec<i32>>(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        let fifo = dir.path().join("fifo.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = read_json::<Vec<i32>>(&fifo).unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
    }

    #[test]
    fn damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.json");
        std::fs::write(&path, b"{ not json").unwrap();
        let err = read_json::<Vec<i32>>(&path).unwrap_err().to_string();
        assert!(err.contains("bad.json") && err.contains("damaged"), "{err}");
    }
}
