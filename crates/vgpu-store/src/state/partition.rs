//! Partitions: persistent named vGPUs in `<lib-dir>/partitions.json`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{atomic, StateError};

pub const PARTITIONS_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub name: String,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub mem_bytes: u64,
    pub compute_pct: u32,
    /// How the share is applied; files written before policies existed read as strict.
    #[serde(default)]
    pub compute_policy: crate::compute::ComputePolicy,
    pub created_unix_ms: u64,
    /// Who may run workloads in it and write its vGPU's counters: one user
    /// (`partition create --user`) …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// … or the members of one group (`--group`). Neither: root's only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Partition {
    /// The vGPU id its workloads share.
    pub fn vgpu_id(&self) -> String {
        format!("p-{}", self.name)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partitions {
    pub format: u32,
    pub partitions: Vec<Partition>,
}

impl Partitions {
    /// Read the file; a missing file is an empty list.
    pub fn load(path: &Path) -> Result<Partitions, StateError> {
        if !path.exists() {
            return Ok(Partitions { format: PARTITIONS_FORMAT, partitions: Vec::new() });
        }
        let bytes = atomic::read_regular(path, atomic::MAX_RECORD_BYTES)?;
        Partitions::parse(&bytes, path)
    }

    /// Decode and check the file's bytes, as [`Partitions::load`] does; `path` only names
    /// the file in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Partitions, StateError> {
        let parts: Partitions =
            serde_json::from_slice(bytes).map_err(|e| StateError::Damaged { path: path.to_path_buf(), message: e.to_string() })?;
        if parts.format != PARTITIONS_FORMAT {
            return Err(StateError::Damaged {
                path: path.to_path_buf(),
                message: format!("format {} is not the format {PARTITIONS_FORMAT} this vgpu reads", parts.format),
            });
        }
        // A name becomes a directory name (`vgpus/p-<name>`): only what `partition create` accepts.
        if let Some(p) = parts.partitions.iter().find(|p| !valid_name(&p.name)) {
            return Err(StateError::Damaged { path: path.to_path_buf(), message: format!("partition name {:?} is not a plain name", p.name) });
        }
        Ok(parts)
    }

    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        atomic::write_json(path, self)
    }

    pub fn get(&self, name: &str) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.name == name)
    }
}

/// Partition names become directory names and must be typeable.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("serve-a_1.x"));
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn missing_file_is_empty_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("partitions.json");
        let mut parts = Partitions::load(&path).unwrap();
        assert!(parts.partitions.is_empty());
        parts.partitions.push(Partition { name: "a".into(), gpu_index: 0, gpu_uuid: "GPU-1".into(), mem_bytes: 1, compute_pct: 100, compute_policy: Default::default(), created_unix_ms: 0, user: None, group: None });
        parts.save(&path).unwrap();
        assert_eq!(Partitions::load(&path).unwrap(), parts);
    }

    #[test]
    fn a_name_that_is_not_plain_is_damage() {
        // A name read from the file was joined to a path unchecked (the `partitions` fuzz check asserts this too).
        for name in ["../../etc", "a/b", ".hidden", ""] {
            let text = format!(r#"{{"format":1,"partitions":[{{"name":{name:?},"gpu_index":0,"gpu_uuid":"GPU-1","mem_bytes":1,"compute_pct":40,"created_unix_ms":0}}]}}"#);
            let err = Partitions::parse(text.as_bytes(), Path::new("partitions.json")).unwrap_err().to_string();
            assert!(err.contains("partitions.json") && err.contains("not a plain name"), "{err}");
        }
    }

    #[test]
    fn files_without_a_policy_read_as_strict() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("partitions.json");
        std::fs::write(
            &path,
            r#"{"format":1,"partitions":[{"name":"old","gpu_index":0,"gpu_uuid":"GPU-1","mem_bytes":1,"compute_pct":40,"created_unix_ms":0}]}"#,
        )
        .unwrap();
        let parts = Partitions::load(&path).unwrap();
        assert_eq!(parts.partitions[0].compute_policy, crate::compute::ComputePolicy::Strict);
        assert_eq!(parts.partitions[0].compute_pct, 40);
    }
}
