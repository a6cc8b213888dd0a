//! The CLI's side of the compute governor: the `[compute]` config table, the policy names
//! users type, the GPU board slots the CLI creates, and changing a vGPU's share live.
//!
//! The shim enforces the share (`crates/vgpu-shim/src/governor/compute.rs`); the CLI only writes the
//! share, the policy and the priority into the vGPU's usage file and creates the vGPU's
//! slot on the board of every GPU it uses (`<state>/gpus/<uuid>/<vgpu-id>`, owned by the
//! vGPU's user), through which the vGPUs sharing a GPU see each other. The shim re-reads
//! the share on every launch, so a change is followed within one governor period.
//!
//! The compute pool (`--tflops`) fixes a workload's per-GPU share when it is admitted
//! (blocks held on the GPU / blocks of the GPU): preemption suspends the whole workload and
//! resumption gives it the same number of blocks on the same devices, and compaction only
//! relabels blocks within a device, so only `vgpu update --tflops` (a resize of its blocks)
//! rewrites the share, through the same live change as `--compute`.

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
    /// The longest turn (`docs/turns.md`) a vGPU takes on a GPU while a vGPU of higher
    /// priority is active there (`"2ms"`, from [`MIN_TURN`] to [`MAX_TURN`]), for workloads
    /// that do not name one (`vgpu run --turn`) [default: none beyond its share of the
    /// 15 ms cycle].
    pub turn: Option<String>,
}

/// The shortest bound `[compute] turn` and `--turn` take: a turn is never shorter than this
/// anyway (`vgpu_abi::turn::MIN_TURN_NS`)…
pub const MIN_TURN: std::time::Duration = std::time::Duration::from_nanos(vgpu_abi::turn::MIN_TURN_NS);
/// …and the longest: no turn is longer than the cycle (`vgpu_abi::turn::CYCLE_NS`).
pub const MAX_TURN: std::time::Duration = std::time::Duration::from_nanos(vgpu_abi::turn::CYCLE_NS);

/// Parse a turn bound (`[compute] turn`, `--turn`): a duration from [`MIN_TURN`] to
/// [`MAX_TURN`], in whole µs as the limits file stores it. The error is one line naming
/// what is wrong.
pub fn parse_turn(text: &str) -> Result<u32, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| format!("`{text}` is not a duration such as \"2ms\" ({e})"))?;
    if d < MIN_TURN || d > MAX_TURN {
        return Err(format!(
            "`{text}`: a turn bound must be from {} to {}",
            humantime::format_duration(MIN_TURN),
            humantime::format_duration(MAX_TURN)
        ));
    }
    Ok(u32::try_from(d.as_micros()).unwrap_or(u32::MAX))
}

impl ComputeConfig {
    /// Values serde cannot check; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        self.turn_us().map(|_| ()).map_err(|e| format!("[compute] turn: {e}"))
    }

    /// `turn` in µs (0: not set).
    pub fn turn_us(&self) -> Result<u32, String> {
        self.turn.as_deref().map_or(Ok(0), parse_turn)
    }
}

/// A workload's pool priority as the usage file stores it (0..=100).
pub fn abi_priority(priority: i32) -> u32 {
    priority.clamp(0, 100) as u32
}

/// Give the vGPU `vgpu_id` its slot on the board of every GPU in `uuids` under `state_dir`
/// (`<state>/gpus/<uuid>/<vgpu_id>`, owned by `owner` (uid, gid), mode 0644, or 0664 when
/// `group_writable`), unless it has one. A slot that cannot be made is a warning, not a
/// failure: that vGPU then keeps exactly its own share on that GPU (no work-conserving, no
/// priority order), and the others do not see it.
pub fn ensure_slots<'a>(state_dir: &Path, vgpu_id: &str, uuids: impl IntoIterator<Item = &'a str>, owner: (u32, u32), group_writable: bool) {
    for uuid in uuids {
        match vgpu_abi::board::ensure_slot(state_dir, uuid, vgpu_id, owner, group_writable) {
            Ok(done) if done.replaced_old_board => {
                tracing::info!("replaced the compute board file of GPU {uuid} left by an earlier vgpu with a directory of per-vGPU slots");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("no compute board slot for vGPU {vgpu_id} on GPU {uuid}: {e}; it keeps its own share there"),
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
        let quota = |uuid: &str| DeviceQuota { uuid: uuid.into(), quota_bytes: 1 << 30, compute_pct: 30, policy: Policy::Strict, priority: 50, turn_max_us: 0 };
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
    fn slots_are_created_per_vgpu_owned_and_kept() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(vgpu_abi::layout::BOARDS_DIR).join("GPU-1234");
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        std::fs::write(&old, [0u8; 64]).unwrap(); // an earlier vgpu's board file
        // SAFETY: getuid and getgid cannot fail.
        let me = unsafe { (libc::getuid(), libc::getgid()) };
        ensure_slots(dir.path(), "3f2a", ["GPU-1234", "../evil"], me, false);
        assert!(std::fs::symlink_metadata(&old).unwrap().is_dir(), "the old board file became a directory");
        assert_eq!(std::fs::metadata(&old).unwrap().permissions().mode() & 0o7777, 0o755);
        let slot = old.join("3f2a");
        let meta = std::fs::metadata(&slot).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        assert_eq!((meta.uid(), meta.gid()), me);
        assert_eq!(std::fs::read_dir(dir.path().join(vgpu_abi::layout::BOARDS_DIR)).unwrap().count(), 1);
        // A slot that is there is left alone (same inode); a group's is group-writable.
        ensure_slots(dir.path(), "3f2a", ["GPU-1234"], me, false);
        assert_eq!(std::fs::metadata(&slot).unwrap().ino(), meta.ino());
        ensure_slots(dir.path(), "p-team", ["GPU-1234"], me, true);
        assert_eq!(std::fs::metadata(old.join("p-team")).unwrap().permissions().mode() & 0o7777, 0o664);
    }
}
