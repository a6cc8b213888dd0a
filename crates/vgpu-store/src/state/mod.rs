//! The state store (SPEC 4.2): one JSON file per workload under `<state-dir>/workloads/`,
//! one directory per vGPU under `<state-dir>/vgpus/` (the shim's usage file and
//! per-process files), and persistent partitions under `<lib-dir>/partitions.json`.
//!
//! Every write is atomic (temp file + rename). Every read-modify-write happens under
//! `<state-dir>/lock`, an `flock` the kernel drops when its holder dies, so a killed
//! `vgpu` never leaves the store locked.

pub mod atomic;
pub mod boot;
pub mod dirs;

pub mod damaged;
pub mod ended;
pub mod intent;
pub mod inventory;
pub mod lock;
pub mod partition;
pub mod small_file;
pub mod workload;

pub use damaged::DamagedRecord;
pub use lock::StoreLock;
pub use partition::{Partition, Partitions};
pub use workload::{Enforcement, EnforcementAction, ServiceRef, SlurmStep, SuspendedMemory, UserSpec, Workload, WorkloadGpu, WorkloadState};

use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StateError {
    #[error("cannot access {path}")]
    Io { path: PathBuf, #[source] source: std::io::Error },
    #[error("damaged state file {path}: {}", printable(.message))]
    Damaged { path: PathBuf, message: String },
    #[error("{path}: not a regular file (a {kind}); not opened")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("refusing the vgpu directory {path}: {reason} (fix: {fix})")]
    UnsafeDir { path: PathBuf, reason: String, fix: String },
    #[error("{}", busy_message(.path, .waited, .pid, .command))]
    LockBusy { path: PathBuf, waited: std::time::Duration, pid: Option<u32>, command: Option<String> },
}

/// A message quoting a file's content (serde quotes unknown keys and values as they are) on
/// one line: control characters as `?`.
fn printable(message: &str) -> String {
    message.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

fn busy_message(path: &Path, waited: &std::time::Duration, pid: &Option<u32>, command: &Option<String>) -> String {
    let holder = match (pid, command) {
        (Some(pid), Some(cmd)) => format!("pid {pid} ({cmd})"),
        (Some(pid), None) => format!("pid {pid} (its command cannot be read; it may have just exited)"),
        (None, _) => "a process that has not written its pid yet".to_string(),
    };
    format!(
        "{} is held by {holder}; gave up after {} (wait set by {})",
        path.display(),
        humantime::format_duration(*waited),
        lock::TIMEOUT_ENV
    )
}

/// Whether `name` is a plain file name: not empty, not `.` or `..`, no `/` and no NUL, at
/// most 255 bytes, printable ASCII. Names read from directories and records must be, before
/// they are joined to a path.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

/// A store in a new temporary directory, its directories made (for unit tests).
#[cfg(any(test, feature = "test-support"))]
pub fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
    store.ensure_dirs().unwrap();
    (dir, store)
}

impl StateError {
    pub fn io(path: &Path, source: std::io::Error) -> StateError {
        StateError::Io { path: path.to_path_buf(), source }
    }
}

/// Paths of the store.
#[derive(Debug, Clone)]
pub struct Store {
    pub state_dir: PathBuf,
    pub lib_dir: PathBuf,
    /// When [`Store::ensure_dirs`] last found every directory safe (shared by clones).
    checked: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// How long a check of the store's directories ([`Store::ensure_dirs`]) stands for this
/// process: the directories and every one above them were found writable by root (or this
/// user) alone, so only they could make one unsafe meanwhile. A short command (`vgpu run`
/// takes the lock three times) checks once; a long-lived one (`vgpu watch`) checks again
/// at its next use after this.
pub const DIRS_CHECK_STANDS: std::time::Duration = std::time::Duration::from_secs(1);

impl Store {
    pub fn new(state_dir: &Path, lib_dir: &Path) -> Store {
        Store { state_dir: state_dir.to_path_buf(), lib_dir: lib_dir.to_path_buf(), checked: Default::default() }
    }

    pub fn workloads_dir(&self) -> PathBuf {
        self.state_dir.join("workloads")
    }

    pub fn workload_path(&self, id: &str) -> PathBuf {
        self.workloads_dir().join(format!("{id}.json"))
    }

    /// Intent records of multi-step changes under way (see `intent`).
    pub fn intents_dir(&self) -> PathBuf {
        self.state_dir.join("intents")
    }

    pub fn vgpus_dir(&self) -> PathBuf {
        self.state_dir.join("vgpus")
    }

    /// Directory of one vGPU: the shim's `VGPU_DIR`.
    pub fn vgpu_dir(&self, vgpu_id: &str) -> PathBuf {
        self.vgpus_dir().join(vgpu_id)
    }

    pub fn partitions_path(&self) -> PathBuf {
        self.lib_dir.join("partitions.json")
    }

    /// Create the directories unless they exist (mode 0755, whatever the umask; vGPU
    /// directories are made per vGPU) and check them all, and every directory above them,
    /// like sshd's `StrictModes` ([`dirs::check_dir`]): owned by root, writable by nobody else.
    ///
    /// A check that passed stands for [`DIRS_CHECK_STANDS`] in this store and its clones.
    pub fn ensure_dirs(&self) -> Result<(), StateError> {
        let mut checked = self.checked.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if checked.is_some_and(|at| at.elapsed() < DIRS_CHECK_STANDS) {
            return Ok(());
        }
        for dir in [&self.state_dir, &self.lib_dir] {
            dirs::ensure_dir(dir, dirs::DIR_MODE)?;
        }
        for dir in [&self.workloads_dir(), &self.vgpus_dir()] {
            self.ensure_child(dir)?;
        }
        *checked = Some(std::time::Instant::now());
        Ok(())
    }

    /// Create `dir`, a directory right under the state directory, unless it exists (mode
    /// 0755), and check it as [`dirs::check_dir`] would, after [`Store::ensure_dirs`]: it is
    /// a directory, not a link (one is refused, never followed), owned by root or this user
    /// and writable by nobody else. Its parent is the state directory, whose own check
    /// stands for every directory above, so only it is looked at.
    pub fn ensure_subdir(&self, dir: &Path) -> Result<(), StateError> {
        self.ensure_dirs()?;
        self.ensure_child(dir)
    }

    /// [`Store::ensure_subdir`] once the state directory is checked.
    fn ensure_child(&self, dir: &Path) -> Result<(), StateError> {
        debug_assert_eq!(dir.parent(), Some(self.state_dir.as_path()));
        let meta = match std::fs::symlink_metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                dirs::ensure_dir(dir, dirs::DIR_MODE)?;
                std::fs::symlink_metadata(dir).map_err(|e| StateError::io(dir, e))?
            }
            other => other.map_err(|e| StateError::io(dir, e))?,
        };
        if !meta.file_type().is_dir() {
            let kind = vgpu_abi::mapping::kind_name(&meta.file_type());
            return Err(StateError::Damaged { path: dir.to_path_buf(), message: format!("a {kind}, not a directory; not followed") });
        }
        dirs::check_meta(dir, &meta)
    }

    /// Check, never create, the store's directories that exist, as [`Store::ensure_dirs`]
    /// checks them: what a read-only listing reads comes from directories nobody but root
    /// (or this user) could have written. A directory that does not exist holds nothing.
    pub fn check_existing_dirs(&self) -> Result<(), StateError> {
        for dir in [&self.state_dir, &self.workloads_dir(), &self.vgpus_dir(), &self.lib_dir] {
            match std::fs::symlink_metadata(dir) {
                Ok(_) => dirs::check_dir(dir)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StateError::io(dir, e)),
            }
        }
        Ok(())
    }

    /// Take the store's lock (blocking).
    pub fn lock(&self) -> Result<StoreLock, StateError> {
        self.ensure_dirs()?;
        StoreLock::acquire(&self.state_dir.join("lock"))
    }

    /// Take the store's lock, waiting at most `wait` ([`StateError::LockBusy`] after that).
    pub fn lock_within(&self, wait: std::time::Duration) -> Result<StoreLock, StateError> {
        self.ensure_dirs()?;
        StoreLock::acquire_within(&self.state_dir.join("lock"), wait)
    }

    /// Every workload file: the good ones, and an error naming each damaged one.
    pub fn workloads(&self) -> (Vec<Workload>, Vec<StateError>) {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        let dir = self.workloads_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (good, bad),
            Err(e) => return (good, vec![StateError::io(&dir, e)]),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            if !entry.file_name().to_str().is_some_and(is_plain_name) {
                bad.push(StateError::Damaged { path, message: "not a plain file name".into() });
                continue;
            }
            match Workload::read(&path) {
                Ok(w) => good.push(w),
                Err(e) => bad.push(e),
            }
        }
        good.sort_by(|a, b| a.created_unix_ms.cmp(&b.created_unix_ms).then(a.id.cmp(&b.id)));
        (good, bad)
    }

    pub fn write_workload(&self, workload: &Workload) -> Result<(), StateError> {
        workload.write(&self.workload_path(&workload.id))
    }

    /// Remove vGPU `vgpu`'s directory, its slots on the GPUs' boards first (the others stop
    /// counting it at once). One that is not there is removed already.
    pub fn remove_vgpu(&self, vgpu: &str) -> Result<(), StateError> {
        let dir = self.vgpu_dir(vgpu);
        if !is_plain_name(vgpu) {
            return Err(StateError::Damaged { path: dir, message: format!("vGPU {vgpu:?} is not a plain name") });
        }
        vgpu_abi::board::release_vgpu(&dir);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::io(&dir, e)),
        }
    }

    pub fn remove_workload(&self, id: &str) -> Result<(), StateError> {
        let path = self.workload_path(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::io(&path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_passed_check_of_the_directories_stands_for_a_while_then_is_made_again() {
        let (_dir, store) = temp_store();
        // Made unsafe (by root: nobody else could) right after a check that passed.
        chmod(&store.state_dir, 0o777);
        store.ensure_dirs().expect("the check of a moment ago stands");
        store.clone().ensure_dirs().expect("for its clones too");
        let unsafe_dir = |r: Result<(), StateError>| matches!(r, Err(StateError::UnsafeDir { .. }));
        assert!(unsafe_dir(Store::new(&store.state_dir, &store.lib_dir).ensure_dirs()), "another store checks anew");
        // Once it no longer stands, the same store checks again and refuses.
        *store.checked.lock().unwrap() = std::time::Instant::now().checked_sub(DIRS_CHECK_STANDS);
        assert!(unsafe_dir(store.ensure_dirs()));
        assert!(unsafe_dir(store.lock().map(drop)), "nor is the lock taken");
        // A refusal is not remembered: fixed, it passes.
        chmod(&store.state_dir, 0o755);
        store.ensure_dirs().expect("fixed");
    }

    #[test]
    fn a_directory_under_the_state_directory_is_checked_itself_and_never_followed() {
        let (dir, store) = temp_store();
        // Made when missing, 0755.
        store.ensure_subdir(&store.intents_dir()).expect("made");
        assert_eq!(std::fs::metadata(store.intents_dir()).unwrap().permissions().mode() & 0o7777, 0o755);
        chmod(&store.intents_dir(), 0o775);
        let e = store.ensure_subdir(&store.intents_dir()).expect_err("group-writable");
        assert!(e.to_string().contains("its group"), "{e}");
        std::fs::remove_dir(store.intents_dir()).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, store.intents_dir()).unwrap();
        let e = store.ensure_subdir(&store.intents_dir()).expect_err("a link");
        assert!(e.to_string().contains("not followed"), "{e}");
        // The store's own: a link for its workloads directory is refused at its first check.
        let (dir, _) = temp_store();
        let fresh = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        std::fs::remove_dir(fresh.workloads_dir()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, fresh.workloads_dir()).unwrap();
        let e = fresh.ensure_dirs().expect_err("a link");
        assert!(e.to_string().contains("not followed"), "{e}");
    }
}
