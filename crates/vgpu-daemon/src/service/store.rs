//! Where services live: `<lib>/services/NAME.toml` (the definition, root's, 0644) and
//! `<lib>/services/NAME.state.json` (what the runner keeps: desired count, replicas, the
//! last decisions). Both are written atomically in a directory made with mode 0755 and
//! checked like the store's (`state::dirs`); neither is read through a symbolic link.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::def::{DefError, ServiceDef};
use super::scale::Decision;
use vgpu_store::state::atomic;
use vgpu_store::state::dirs;
use vgpu_store::state::StateError;

/// The most decisions a state file keeps.
pub const MAX_DECISIONS: usize = 20;
/// The largest service file read (a definition is a few lines).
pub const MAX_FILE_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("no service {name:?} (see `vgpu service list`)")]
    NotFound { name: String },
    #[error("invalid service file {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("refusing service file {}: {reason}", path.display())]
    Refused { path: PathBuf, reason: String },
    #[error(transparent)]
    State(#[from] StateError),
}

/// The runner's record of one service (`NAME.state.json`); `service show` reads it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceState {
    /// Set by `service scale` and by the autoscaler; `create` writes MIN.
    pub desired: u32,
    /// Why fewer than `desired` run (e.g. "replica 4 not admitted: GPU 0 has 0 B free").
    #[serde(default)]
    pub short: Option<String>,
    /// The last [`MAX_DECISIONS`], oldest first.
    #[serde(default)]
    pub decisions: Vec<Decision>,
    #[serde(default)]
    pub replicas: Vec<ReplicaState>,
    /// `service remove --force` of a service whose replicas run: the definition is gone, the
    /// runner stops the replicas and then removes this file.
    #[serde(default)]
    pub stopping: bool,
}

impl ServiceState {
    /// Appends `d`, keeping the last [`MAX_DECISIONS`].
    pub fn push_decision(&mut self, d: Decision) {
        self.decisions.push(d);
        let extra = self.decisions.len().saturating_sub(MAX_DECISIONS);
        self.decisions.drain(..extra);
    }

    /// Replicas with a running workload. An id that is not a workload id (hex digits, as
    /// `vgpu run` makes them) is not one: a damaged file's `../x` never becomes a path.
    pub fn running(&self) -> impl Iterator<Item = &ReplicaState> {
        self.replicas.iter().filter(|r| r.workload_id.as_deref().is_some_and(is_workload_id))
    }
}

/// Lowercase hex digits (`launch::ids::new_id` makes eight), at most 64.
fn is_workload_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// One replica slot, as the runner last saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaState {
    pub index: u32,
    /// Its workload's id while it runs.
    #[serde(default)]
    pub workload_id: Option<String>,
    #[serde(default)]
    pub restarts: u32,
    /// How its last run ended: its exit status (128+N for signal N).
    #[serde(default)]
    pub last_exit: Option<i32>,
    /// Back-off: not started again before then.
    #[serde(default)]
    pub next_start_unix_ms: Option<u64>,
}

/// A service file's bytes and the metadata of the file they were read from (the opened
/// descriptor's, not the path's): never through a symlink (any component), never blocking
/// on a FIFO, a regular file of at most [`MAX_FILE_BYTES`].
fn read_with_metadata(path: &Path) -> Result<(Vec<u8>, std::fs::Metadata), StateError> {
    use vgpu_store::state::small_file;
    use vgpu_store::state::small_file::Links;
    use vgpu_store::state::small_file::SmallFileError;
    let refused = |e: SmallFileError| match e {
        SmallFileError::Io(e) => StateError::io(path, e),
        SmallFileError::Link => StateError::NotRegular { path: path.to_path_buf(), kind: "symbolic link" },
        SmallFileError::NotRegular => StateError::NotRegular { path: path.to_path_buf(), kind: "special file" },
        SmallFileError::TooLarge(n) => {
            StateError::Damaged { path: path.to_path_buf(), message: format!("{n} bytes (at most {MAX_FILE_BYTES} expected)") }
        }
    };
    let (file, meta) = small_file::open(path, Links::Nowhere, MAX_FILE_BYTES).map_err(refused)?;
    let bytes = small_file::read(file, MAX_FILE_BYTES).map_err(refused)?;
    Ok((bytes, meta))
}

/// The services of a lib directory.
#[derive(Debug, Clone)]
pub struct Services {
    dir: PathBuf,
}

impl Services {
    pub fn new(lib_dir: &Path) -> Self {
        Services {
            dir: lib_dir.join("services"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn def_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.toml"))
    }

    pub fn state_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.state.json"))
    }

    fn checked_name(&self, name: &str) -> Result<(), ServiceError> {
        if super::def::valid_name(name) {
            Ok(())
        } else {
            Err(ServiceError::NotFound {
                name: name.to_string(),
            })
        }
    }

    /// Every definition, by name; the damaged ones (unreadable, invalid, not root's) apart,
    /// as errors, so that one bad file does not hide the others.
    pub fn list(&self) -> Result<(Vec<ServiceDef>, Vec<ServiceError>), ServiceError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Vec::new(), Vec::new()))
            }
            Err(e) => return Err(StateError::io(&self.dir, e).into()),
        };
        dirs::check_dir(&self.dir)?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StateError::io(&self.dir, e))?;
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".toml")) else {
                continue;
            };
            names.push(name.to_string());
        }
        names.sort();
        let (mut defs, mut damaged) = (Vec::new(), Vec::new());
        for name in names {
            if !super::def::valid_name(&name) {
                damaged.push(ServiceError::Invalid {
                    path: self.def_path(&name),
                    message: "not a service name".into(),
                });
                continue;
            }
            match self.load(&name) {
                Ok(def) => defs.push(def),
                Err(e) => damaged.push(e),
            }
        }
        Ok((defs, damaged))
    }

    /// The definition of `name`, validated (see `def`).
    pub fn load(&self, name: &str) -> Result<ServiceDef, ServiceError> {
        self.checked_name(name)?;
        let path = self.def_path(name);
        let (bytes, meta) = match read_with_metadata(&path) {
            Ok(read) => read,
            Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(ServiceError::NotFound {
                    name: name.to_string(),
                })
            }
            Err(e) => return Err(e.into()),
        };
        // Its `user` and `command` run as root's workload: a file root alone can write.
        if meta.uid() != 0 && meta.uid() != nix::unistd::geteuid().as_raw()
            || meta.mode() & 0o022 != 0
        {
            return Err(ServiceError::Refused {
                path,
                reason: format!(
                    "owned by uid {} with mode {:o}: a service file must be root's and writable by root alone",
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| ServiceError::Invalid {
            path: path.clone(),
            message: "not UTF-8".into(),
        })?;
        ServiceDef::parse(name, &text, &path)
            .map_err(|DefError { message }| ServiceError::Invalid { path, message })
    }

    /// The service whose replica `workload_name` is named after (`NAME-<index>`, the
    /// service defined), if any: that name is kept for the replica (`vgpu run --name`).
    pub fn replica_name_owner(&self, workload_name: &str) -> Option<String> {
        let (name, index) = workload_name.rsplit_once('-')?;
        let index: u32 = index.parse().ok()?;
        if index >= super::def::MAX_REPLICAS
            || index.to_string() != workload_name[name.len() + 1..]
            || !super::def::valid_name(name)
        {
            return None;
        }
        std::fs::symlink_metadata(self.def_path(name))
            .is_ok()
            .then(|| name.to_string())
    }

    /// Writes the definition (atomically, mode 0644, the directory 0755). One larger than
    /// [`MAX_FILE_BYTES`] is refused: it could not be read back (a sudo caller's megabytes
    /// of arguments are not stored as root's).
    pub fn save(&self, def: &ServiceDef) -> Result<(), ServiceError> {
        self.checked_name(&def.name)?;
        let text = def.to_toml();
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(ServiceError::Invalid {
                path: self.def_path(&def.name),
                message: format!("the definition would be {} bytes, more than a service file may hold ({MAX_FILE_BYTES}): shorten its command or environment", text.len()),
            });
        }
        dirs::ensure_dir(&self.dir, dirs::DIR_MODE)?;
        atomic::write_atomic(&self.def_path(&def.name), text.as_bytes(), 0o644)?;
        Ok(())
    }

    /// Removes the definition and its state file (gone already is fine).
    pub fn remove(&self, name: &str) -> Result<(), ServiceError> {
        self.checked_name(name)?;
        for path in [self.def_path(name), self.state_path(name)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StateError::io(&path, e).into()),
            }
        }
        Ok(())
    }

    /// Removes the definition only (`remove --force` while replicas run: the state, marked
    /// `stopping`, stays for the runner).
    pub fn remove_def(&self, name: &str) -> Result<(), ServiceError> {
        self.checked_name(name)?;
        let path = self.def_path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::io(&path, e).into()),
        }
    }

    /// The state of `name`; the default (desired 0, nothing known) when there is none yet.
    pub fn state(&self, name: &str) -> Result<ServiceState, ServiceError> {
        self.checked_name(name)?;
        let path = self.state_path(name);
        match atomic::read_json(&path) {
            Ok(st) => Ok(st),
            Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(ServiceState::default())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the state of `name` atomically (mode 0644).
    pub fn save_state(&self, name: &str, st: &ServiceState) -> Result<(), ServiceError> {
        self.checked_name(name)?;
        dirs::ensure_dir(&self.dir, dirs::DIR_MODE)?;
        atomic::write_json(&self.state_path(name), st)?;
        Ok(())
    }

    /// The names of the state files whose definition is gone (`remove --force`): the runner
    /// stops their replicas.
    pub fn orphan_states(&self) -> Result<Vec<String>, ServiceError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StateError::io(&self.dir, e).into()),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".state.json")) else {
                continue;
            };
            if super::def::valid_name(name) && !self.def_path(name).exists() {
                out.push(name.to_string());
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn def(name: &str) -> ServiceDef {
        ServiceDef::parse(
            name,
            "replicas = \"1-3\"\nmem = \"1G\"\ncommand = [\"sleep\", \"9\"]\n",
            Path::new("x.toml"),
        )
        .unwrap()
    }

    #[test]
    fn saves_loads_lists_and_removes() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Services::new(tmp.path());
        assert!(s.list().unwrap().0.is_empty());
        let mut web = def("web");
        s.save(&web).unwrap();
        web.run.path = s.def_path("web");
        assert_eq!(s.load("web").unwrap(), web);
        assert_eq!(
            std::fs::metadata(s.def_path("web")).unwrap().mode() & 0o777,
            0o644
        );
        assert_eq!(std::fs::metadata(s.dir()).unwrap().mode() & 0o777, 0o755);
        std::fs::write(
            s.def_path("bad"),
            "replicas = 2\nbogus = 1\ncommand = [\"x\"]\n",
        )
        .unwrap();
        std::fs::set_permissions(s.def_path("bad"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let (defs, damaged) = s.list().unwrap();
        assert_eq!(defs.len(), 1);
        assert!(
            damaged[0].to_string().contains("bogus") && damaged[0].to_string().contains("bad.toml"),
            "{}",
            damaged[0]
        );
        let mut st = ServiceState {
            desired: 2,
            ..Default::default()
        };
        for i in 0..25 {
            st.push_decision(Decision {
                at_unix_ms: i,
                current: 1,
                recommended: 1,
                desired: 1,
                values: vec![],
                reason: String::new(),
            });
        }
        assert_eq!(st.decisions.len(), MAX_DECISIONS);
        assert_eq!(st.decisions[0].at_unix_ms, 5);
        s.save_state("web", &st).unwrap();
        assert_eq!(s.state("web").unwrap(), st);
        s.remove_def("web").unwrap();
        assert_eq!(s.orphan_states().unwrap(), vec!["web"]);
        s.remove("web").unwrap();
        assert!(matches!(s.load("web"), Err(ServiceError::NotFound { .. })));
        assert_eq!(s.state("web").unwrap(), ServiceState::default());
        assert!(matches!(
            s.load("../etc"),
            Err(ServiceError::NotFound { .. })
        ));
    }

    #[test]
    fn files_others_can_write_or_links_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Services::new(tmp.path());
        s.save(&def("web")).unwrap();
        std::fs::set_permissions(s.def_path("web"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        assert!(matches!(s.load("web"), Err(ServiceError::Refused { .. })));
        std::fs::remove_file(s.def_path("web")).unwrap();
        let elsewhere = tmp.path().join("real.toml");
        std::fs::write(&elsewhere, "replicas = 1\ncommand = [\"x\"]\n").unwrap();
        std::os::unix::fs::symlink(&elsewhere, s.def_path("web")).unwrap();
        let err = s.load("web").unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        // A FIFO is refused at once, not waited on.
        std::fs::remove_file(s.def_path("web")).unwrap();
        nix::unistd::mkfifo(
            &s.def_path("web"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let err = s.load("web").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
