//! The store's directories: created with explicit modes (never the umask's), and refused —
//! as sshd's `StrictModes` refuses a home directory — when they, or a directory above them,
//! could be changed by someone other than root (or the user running `vgpu`).
//!
//! A state directory other users can write lets them plant records, links and FIFOs that a
//! root `vgpu` would then act on; so it is checked before every use, not only at creation.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::StateError;

/// Mode of the state directory, the library directory and their subdirectories.
pub const DIR_MODE: u32 = 0o755;

/// Create `dir` (and missing parents) unless it exists, with exactly `mode`; then check it
/// with [`check_dir`]. An existing directory's mode is not changed (it is checked).
pub fn ensure_dir(dir: &Path, mode: u32) -> Result<(), StateError> {
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                if std::fs::symlink_metadata(parent).is_err() {
                    ensure_dir(parent, DIR_MODE)?;
                }
            }
            match std::fs::DirBuilder::new().mode(mode).create(dir) {
                Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| StateError::io(dir, e))?,
                // Another vgpu made it meanwhile: checked below like any existing one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StateError::io(dir, e)),
            }
        }
        Err(e) => return Err(StateError::io(dir, e)),
    }
    check_dir(dir)
}

/// `StrictModes` for `dir`: it is a directory, owned by root or by this process's user and
/// writable by neither group nor others; every directory above it (after resolving links,
/// e.g. `/var/run` → `/run`) is owned by root or this user and is not writable by group or
/// others unless it has the sticky bit (like `/tmp`).
pub fn check_dir(dir: &Path) -> Result<(), StateError> {
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    let real = std::fs::canonicalize(dir).map_err(|e| StateError::io(dir, e))?;
    let meta = std::fs::symlink_metadata(&real).map_err(|e| StateError::io(&real, e))?;
    if !meta.file_type().is_dir() {
        return Err(unsafe_dir(dir, format!("{} is not a directory", real.display()), "remove it".into()));
    }
    check_one(dir, &real, &meta, me, false)?;
    let mut above = real.parent();
    while let Some(ancestor) = above {
        let meta = std::fs::symlink_metadata(ancestor).map_err(|e| StateError::io(ancestor, e))?;
        check_one(dir, ancestor, &meta, me, true)?;
        above = ancestor.parent();
    }
    Ok(())
}

/// [`check_dir`]'s test of `dir` alone, from its metadata (not followed if a link): for a
/// directory whose parent was just checked, with every one above it.
pub fn check_meta(dir: &Path, meta: &std::fs::Metadata) -> Result<(), StateError> {
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    check_one(dir, dir, meta, me, false)
}

fn check_one(dir: &Path, path: &Path, meta: &std::fs::Metadata, me: u32, ancestor: bool) -> Result<(), StateError> {
    let mode = meta.mode() & 0o7777;
    let owner = meta.uid();
    if owner != 0 && owner != me {
        return Err(unsafe_dir(
            dir,
            format!("{} is owned by uid {owner}", path.display()),
            format!("chown root {}", path.display()),
        ));
    }
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !(ancestor && sticky) {
        return Err(unsafe_dir(
            dir,
            format!("{} is writable by {} (mode {mode:04o})", path.display(), if mode & 0o002 != 0 { "others" } else { "its group" }),
            format!("chmod go-w {}", path.display()),
        ));
    }
    Ok(())
}

fn unsafe_dir(dir: &Path, reason: String, fix: String) -> StateError {
    StateError::UnsafeDir { path: PathBuf::from(dir), reason, fix }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn umask(mask: u32) -> u32 {
        // SAFETY: umask only swaps the process's mask.
        unsafe { libc::umask(mask as libc::mode_t) as u32 }
    }

    #[test]
    fn created_with_the_mode_asked_for_whatever_the_umask() {
        // The umask is the whole process's: change it only in a child that runs this test
        // alone, never beside the other tests' threads (their files would get mode 0777).
        const CHILD: &str = "VGPU_TEST_UMASK_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let name = "state::dirs::tests::created_with_the_mode_asked_for_whatever_the_umask";
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && stdout.contains("1 passed"), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let old = umask(0);
        let made = ensure_dir(&tmp.path().join("a/b"), DIR_MODE);
        umask(old);
        made.unwrap();
        for dir in ["a", "a/b"] {
            let mode = std::fs::metadata(tmp.path().join(dir)).unwrap().mode() & 0o7777;
            assert_eq!(mode, 0o755, "{dir}");
        }
    }

    #[test]
    fn group_or_world_writable_directories_are_refused_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("writable by others (mode 0777)") && err.contains("chmod go-w"), "{err}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(check_dir(&dir).unwrap_err().to_string().contains("its group"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_dir(&dir).unwrap();
        // An unsafe directory above it is refused too; a sticky one (like /tmp) is not.
        let inner = dir.join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_dir(&inner).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_dir(&inner).is_err());
        assert!(check_dir(&dir.join("missing")).is_err());
    }

    #[test]
    fn a_directory_owned_by_another_user_is_refused() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (it chowns)");
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
        let err = check_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("owned by uid 65534") && err.contains("chown root"), "{err}");
    }
}
