//! Workload records that cannot be read. A damaged record must never free what it reserved:
//! admission treats its GPUs (or, when the file no longer says which, every GPU) as held
//! until `vgpu doctor --repair` removes it, which it does only once no process is left in
//! its cgroup.

use std::path::PathBuf;

use vgpu_abi::process::ProcessId;

use super::{atomic, StateError};

/// What is known about one workload record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedRecord {
    /// The record (or the workloads directory, when it cannot be listed).
    pub path: PathBuf,
    /// Its workload id: the file's stem, when that is a plain name. The workload's cgroup
    /// (`vgpu/<id>`) and its own vGPU (`vgpus/<id>`) carry the same name.
    pub id: Option<String>,
    /// What is wrong with it.
    pub problem: String,
    /// UUIDs of the GPUs it reserves memory on, when what is left of the file still says;
    /// `None`: unknown, so every GPU.
    pub gpus: Option<Vec<String>>,
    /// Its supervisor (`vgpu run`), when what is left of the file still says.
    pub supervisor: Option<ProcessId>,
}

impl DamagedRecord {
    /// Describe one error of [`Store::workloads`](super::Store::workloads). What is left of
    /// the file is read the same safe way as a record (no symlink, no FIFO, bounded).
    pub fn from_error(err: &StateError) -> DamagedRecord {
        let (path, problem) = match err {
            StateError::Damaged { path, message } => (path.clone(), message.clone()),
            StateError::NotRegular { path, kind } => (path.clone(), format!("not a regular file (a {kind})")),
            StateError::Io { path, source } => (path.clone(), format!("cannot be read: {source}")),
            StateError::UnsafeDir { path, reason, .. } => (path.clone(), reason.clone()),
            StateError::LockBusy { path, .. } => (path.clone(), err.to_string()),
        };
        let id = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => path.file_stem().and_then(|s| s.to_str()).filter(|s| super::is_plain_name(s)).map(str::to_owned),
            _ => None,
        };
        let remains = match err {
            StateError::Damaged { .. } if id.is_some() => atomic::read_regular(&path, atomic::MAX_RECORD_BYTES)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok()),
            _ => None,
        };
        let gpus = remains.as_ref().and_then(gpus_of);
        let supervisor = remains.as_ref().and_then(|v| {
            let s = v.get("supervisor")?;
            let pid = u32::try_from(s.get("pid")?.as_u64()?).ok()?;
            Some(ProcessId { pid, start_time: s.get("start_time")?.as_u64()? })
        });
        DamagedRecord { path, id, problem, gpus, supervisor }
    }

    /// Whether it may hold memory on the GPU `uuid`.
    pub fn may_hold(&self, uuid: &str) -> bool {
        self.gpus.as_ref().is_none_or(|gpus| gpus.iter().any(|g| g == uuid))
    }
}

/// The UUIDs of a damaged record's `gpus`, only when every entry still names one.
fn gpus_of(value: &serde_json::Value) -> Option<Vec<String>> {
    value
        .get("gpus")?
        .as_array()?
        .iter()
        .map(|g| g.get("uuid").and_then(|u| u.as_str()).map(str::to_owned))
        .collect()
}

/// Every damaged workload record of the store.
pub fn damaged_records(errors: &[StateError]) -> Vec<DamagedRecord> {
    errors.iter().map(DamagedRecord::from_error).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_of_a_record_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a1b2c3d4.json");
        // Valid JSON of another format: the GPUs and the supervisor are still known.
        std::fs::write(&path, r#"{"format": 9, "gpus": [{"uuid": "GPU-1"}], "supervisor": {"pid": 7, "start_time": 8}}"#).unwrap();
        let d = DamagedRecord::from_error(&StateError::Damaged { path: path.clone(), message: "format 9".into() });
        assert_eq!(d.id.as_deref(), Some("a1b2c3d4"));
        assert_eq!(d.gpus, Some(vec!["GPU-1".to_string()]));
        assert_eq!(d.supervisor, Some(ProcessId { pid: 7, start_time: 8 }));
        assert!(d.may_hold("GPU-1") && !d.may_hold("GPU-2"));
        // Not JSON: nothing is known, every GPU may be held.
        std::fs::write(&path, "{ not json").unwrap();
        let d = DamagedRecord::from_error(&StateError::Damaged { path: path.clone(), message: "eof".into() });
        assert_eq!(d.gpus, None);
        assert!(d.may_hold("GPU-2"));
        // A GPU entry without a UUID: unknown too.
        std::fs::write(&path, r#"{"gpus": [{"uuid": "GPU-1"}, {"index": 1}]}"#).unwrap();
        let d = DamagedRecord::from_error(&StateError::Damaged { path, message: "x".into() });
        assert_eq!(d.gpus, None);
        // The directory itself: no id.
        let d = DamagedRecord::from_error(&StateError::io(dir.path(), std::io::Error::from_raw_os_error(libc::EACCES)));
        assert_eq!(d.id, None);
        assert!(d.may_hold("GPU-1"));
    }
}
