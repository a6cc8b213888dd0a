//! The CLI's side of the compute governor: the `[compute]` config table, the policy names
//! users type, the GPU boards the CLI creates, and changing a vGPU's share live.
//!
//! The shim enforces the share (`shim/src/governor/compute.rs`); the CLI only writes the
//! share, the policy and the priority into the vGPU's usage file and creates the board of
//! every GPU a vGPU uses (`<state>/gpus/<uuid>`), through which the vGPUs sharing a GPU see
//! each other. The shim re-reads the share on every launch, so a change is followed within
//! one governor period.
//!
//! The compute pool (`--tflops`) fixes a workload's per-GPU share when it is admitted
//! (blocks held on the GPU / blocks of the GPU): preemption suspends the whole workload and
//! resumption gives it the same number of blocks on the same devices, and compaction only
//! relabels blocks within a device, so the share in the usage file never needs rewriting.

use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use vgpu_abi::compute::Policy;
use vgpu_abi::usage::UsageFile;

/// How a vGPU's compute share is applied, as the config, the flags and the records name it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ComputePolicy {
    /// Never above the share, even when the GPU is otherwise idle
    #[default]
    Strict,
    /// The share is a guaranteed floor; idle GPU time goes to vGPUs that want more
    Fair,
}

impl ComputePolicy {
    pub fn abi(self) -> Policy {
        match self {
            ComputePolicy::Strict => Policy::Strict,
            ComputePolicy::Fair => Policy::Fair,
        }
    }

    pub fn from_abi(policy: Policy) -> ComputePolicy {
        match policy {
            Policy::Strict => ComputePolicy::Strict,
            Policy::Fair => ComputePolicy::Fair,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.abi().name()
    }
}

impl std::fmt::Display for ComputePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `[compute]` table of the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ComputeConfig {
    /// The policy of workloads and partitions that do not name one (`--compute-policy`).
    pub policy: ComputePolicy,
}

/// A workload's pool priority as the usage file stores it (0..=100).
pub fn abi_priority(priority: i32) -> u32 {
    priority.clamp(0, 100) as u32
}

/// Create the board of every GPU in `uuids` under `state_dir` unless it is there. A board
/// that cannot be made is a warning, not a failure: the vGPUs on that GPU then each keep
/// exactly their own share (no work-conserving, no priority order).
pub fn ensure_boards<'a>(state_dir: &Path, uuids: impl IntoIterator<Item = &'a str>) {
    for uuid in uuids {
        let Some(path) = vgpu_abi::board::path_in_state(state_dir, uuid) else {
            tracing::warn!("no compute board for GPU {uuid:?}: its UUID is not a plain file name; its vGPUs keep their own shares");
            continue;
        };
        if let Err(e) = vgpu_abi::board::Board::ensure(&path) {
            tracing::warn!("cannot create the compute board {}: {e}; vGPUs on GPU {uuid} keep their own shares", path.display());
        }
    }
}

/// A change to apply to one vGPU's usage file.
#[derive(Debug, Clone, Copy)]
pub struct LiveChange {
    pub compute_pct: Option<u32>,
    pub policy: Option<ComputePolicy>,
}

/// Apply `change` to the devices `uuids` of the open usage file (all devices when `uuids`
/// is None). Every UUID must be in the file: checked before anything is written.
pub fn apply_live(usage: &UsageFile, uuids: Option<&[&str]>, change: LiveChange) -> Result<()> {
    let indices: Vec<usize> = match uuids {
        None => (0..usage.device_count()).collect(),
        Some(uuids) => uuids
            .iter()
            .map(|u| usage.find_device_str(u).with_context(|| format!("{}: no device {u}", usage.path().display())))
            .collect::<Result<_>>()?,
    };
    if !usage.limits_writable() {
        anyhow::bail!("{}: only root can change a vGPU's limits", usage.path().display());
    }
    for i in indices {
        if let Some(pct) = change.compute_pct {
            usage.set_compute_pct(i, pct).with_context(|| format!("{}", usage.path().display()))?;
        }
        if let Some(policy) = change.policy {
            usage.set_policy(i, policy.abi()).with_context(|| format!("{}", usage.path().display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_abi::usage::DeviceQuota;

    #[test]
    fn names_round_trip_through_the_abi() {
        for p in [ComputePolicy::Strict, ComputePolicy::Fair] {
            assert_eq!(ComputePolicy::from_abi(p.abi()), p);
            assert_eq!(Policy::parse(p.as_str()), Some(p.abi()));
        }
        assert_eq!(ComputePolicy::default(), ComputePolicy::Strict);
        assert_eq!(abi_priority(-5), 0);
        assert_eq!(abi_priority(500), 100);
        assert_eq!(abi_priority(42), 42);
    }

    #[test]
    fn live_change_touches_only_the_named_devices() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(vgpu_abi::layout::PROCS_DIR)).unwrap();
        let path = dir.path().join("usage");
        let quota = |uuid: &str| DeviceQuota { uuid: uuid.into(), quota_bytes: 1 << 30, compute_pct: 30, policy: Policy::Strict, priority: 50 };
        UsageFile::create(&path, &[quota("GPU-a"), quota("GPU-b")]).unwrap();
        let usage = UsageFile::open(&path).unwrap();
        apply_live(&usage, Some(&["GPU-b"]), LiveChange { compute_pct: Some(60), policy: Some(ComputePolicy::Fair) }).unwrap();
        assert_eq!((usage.compute_pct(0), usage.policy(0)), (30, Policy::Strict));
        assert_eq!((usage.compute_pct(1), usage.policy(1)), (60, Policy::Fair));
        // An unknown device or a bad share changes nothing.
        assert!(apply_live(&usage, Some(&["GPU-b", "GPU-zzz"]), LiveChange { compute_pct: Some(10), policy: None }).is_err());
        assert_eq!(usage.compute_pct(1), 60);
        apply_live(&usage, None, LiveChange { compute_pct: None, policy: Some(ComputePolicy::Strict) }).unwrap();
        assert_eq!((usage.compute_pct(1), usage.policy(1)), (60, Policy::Strict));
    }

    #[test]
    fn boards_are_created_shared_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        ensure_boards(dir.path(), ["GPU-1234", "../evil"]);
        let path = dir.path().join(vgpu_abi::layout::BOARDS_DIR).join("GPU-1234");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o666);
        assert!(vgpu_abi::board::Board::open(&path).is_ok());
        assert_eq!(std::fs::read_dir(dir.path().join(vgpu_abi::layout::BOARDS_DIR)).unwrap().count(), 1);
        // A board that is there is left alone (same inode).
        use std::os::unix::fs::MetadataExt;
        ensure_boards(dir.path(), ["GPU-1234"]);
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), meta.ino());
    }
}
