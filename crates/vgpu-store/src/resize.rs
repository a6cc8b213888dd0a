//! Live resize of a vGPU's memory quota: `vgpu update ID --mem` (a workload with a vGPU of
//! its own, per GPU) and `vgpu partition update NAME --mem` (a partition's vGPU, which all
//! its workloads share).
//!
//! Everything is checked before anything is written, under the store lock the caller holds:
//! a raise goes through the same memory admission as `vgpu run` ([`crate::admission`],
//! against every other reservation on that GPU, naming what holds it when refused); a cut
//! below what the vGPU uses now (its shared counter, `used_bytes`) is refused with both
//! figures. Then [`apply`] writes the quota into the vGPU's root-owned `limits` file, where
//! the shim reads it at every reservation and every `cuMemGetInfo`/NVML answer, and the
//! caller writes the records (`ps` shows them).
//!
//! A cut races with reservations in flight (the shim takes no lock): the new quota is
//! stored first, then the counter is read ([`UsageFile::lower_quota`]); a reservation whose
//! compare-and-swap comes after the store re-reads the quota and undoes itself
//! ([`UsageFile::try_reserve`]), and one that came before is in the counter, which then
//! reads above the new quota: the old quota goes back and the cut is refused. So the
//! counter never stays above the quota a successful cut set.

use serde::Serialize;
use vgpu_abi::size::format_size;
use vgpu_abi::usage::UsageFile;

use crate::admission;

use crate::admission::AdmissionGpu;

use crate::admission::MemSpec;
use crate::state::DamagedRecord;
use crate::state::Partition;
use crate::state::Workload;
use crate::state::WorkloadState;

/// Why a resize was refused; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error("{what} runs in partition {partition:?}, whose workloads share its memory: use `vgpu partition update {partition} --mem …`")]
    InPartition { what: String, partition: String },
    #[error("{what} has no GPU yet (it is {state}): update it once it runs")]
    NoGpu { what: String, state: &'static str },
    #[error("{what}: GPU {uuid} is no longer present")]
    GpuGone { what: String, uuid: String },
    #[error("{what}: {path} has no device {uuid}")]
    NoDevice { what: String, path: String, uuid: String },
    #[error("{what}: {reason}")]
    Refused { what: String, reason: String },
    #[error(
        "{what}: cannot lower the memory on GPU {gpu} to {}: {} is in use there (free some first, or ask for at least that)",
        format_size(*asked),
        format_size(*used)
    )]
    BelowUse { what: String, gpu: u32, asked: u64, used: u64 },
    #[error("{what}: {path}: {source}")]
    Io { what: String, path: String, source: std::io::Error },
}

impl ResizeError {
    /// Whether the request itself is wrong (exit 2), rather than refused by the state of the host.
    pub fn is_usage(&self) -> bool {
        matches!(self, ResizeError::InPartition { .. } | ResizeError::NoGpu { .. })
    }

    /// As the CLI reports it: a usage error (exit 2) or a refusal (exit 1).
    pub fn into_cli(self) -> anyhow::Error {
        if self.is_usage() {
            crate::error::UsageError::new(self.to_string()).into()
        } else {
            self.into()
        }
    }
}

/// One device's quota change in one vGPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuotaChange {
    /// The GPU's index and UUID.
    pub index: u32,
    pub uuid: String,
    pub mem_bytes: u64,
    pub previous_mem_bytes: u64,
    /// The device's position in the vGPU's files (None: the vGPU has no files yet, an unused
    /// partition).
    #[serde(skip)]
    pub device: Option<usize>,
}

/// What a workload or partition is called in messages.
pub fn workload_name(w: &Workload) -> String {
    format!("{} ({})", w.name, w.id)
}

/// Check `--mem spec` for a workload with a vGPU of its own, one change per GPU. `view` is
/// every workload as it will be (earlier targets of the same command already changed);
/// `usage` is the workload's open usage file.
pub fn plan_workload(
    w: &Workload,
    spec: MemSpec,
    devices: &[AdmissionGpu],
    view: &[Workload],
    partitions: &[Partition],
    damaged: &[DamagedRecord],
    usage: &UsageFile,
) -> Result<Vec<QuotaChange>, ResizeError> {
    let what = format!("workload {}", workload_name(w));
    if let Some(p) = &w.partition {
        return Err(ResizeError::InPartition { what, partition: p.clone() });
    }
    if w.state == WorkloadState::Waiting || w.gpus.is_empty() {
        return Err(ResizeError::NoGpu { what, state: w.state.as_str() });
    }
    let others: Vec<Workload> = view.iter().filter(|o| o.id != w.id).cloned().collect();
    w.gpus
        .iter()
        .map(|g| {
            let device = devices.iter().find(|d| d.uuid == g.uuid).ok_or_else(|| ResizeError::GpuGone { what: what.clone(), uuid: g.uuid.clone() })?;
            let index = usage.find_device_str(&g.uuid).ok_or_else(|| ResizeError::NoDevice {
                what: what.clone(),
                path: usage.path().display().to_string(),
                uuid: g.uuid.clone(),
            })?;
            let change = QuotaChange { index: g.index, uuid: g.uuid.clone(), mem_bytes: spec.bytes_of(device.memory), previous_mem_bytes: g.mem_bytes, device: Some(index) };
            check(&what, device, &change, usage.used_bytes(index), &others, partitions, damaged)?;
            Ok(change)
        })
        .collect()
}

/// Check `--mem spec` for partition `p` (`usage`: its vGPU's usage file, None while no
/// workload has used it).
pub fn plan_partition(
    p: &Partition,
    spec: MemSpec,
    devices: &[AdmissionGpu],
    workloads: &[Workload],
    partitions: &[Partition],
    damaged: &[DamagedRecord],
    usage: Option<&UsageFile>,
) -> Result<QuotaChange, ResizeError> {
    let what = format!("partition {}", p.name);
    let device = devices.iter().find(|d| d.uuid == p.gpu_uuid).ok_or_else(|| ResizeError::GpuGone { what: what.clone(), uuid: p.gpu_uuid.clone() })?;
    let index = usage
        .map(|u| {
            u.find_device_str(&p.gpu_uuid)
                .ok_or_else(|| ResizeError::NoDevice { what: what.clone(), path: u.path().display().to_string(), uuid: p.gpu_uuid.clone() })
        })
        .transpose()?;
    let used = match (usage, index) {
        (Some(u), Some(i)) => u.used_bytes(i),
        _ => 0,
    };
    let others: Vec<Partition> = partitions.iter().filter(|o| o.name != p.name).cloned().collect();
    let change = QuotaChange { index: device.index, uuid: device.uuid.clone(), mem_bytes: spec.bytes_of(device.memory), previous_mem_bytes: p.mem_bytes, device: index };
    check(&what, device, &change, used, workloads, &others, damaged)?;
    Ok(change)
}

/// A raise must pass admission beside the others; a cut must leave room for what is used.
fn check(
    what: &str,
    device: &AdmissionGpu,
    change: &QuotaChange,
    used: u64,
    others: &[Workload],
    partitions: &[Partition],
    damaged: &[DamagedRecord],
) -> Result<(), ResizeError> {
    if change.mem_bytes > change.previous_mem_bytes {
        admission::check_not_blocked(device, damaged)
            .and_then(|()| admission::check_fits(device, change.mem_bytes, others, partitions))
            .map_err(|reason| ResizeError::Refused { what: what.to_string(), reason })?;
    }
    if change.mem_bytes < used {
        return Err(ResizeError::BelowUse { what: what.to_string(), gpu: change.index, asked: change.mem_bytes, used });
    }
    Ok(())
}

/// Write the checked `changes` into the vGPU's limits file. A cut re-checks the counter
/// after storing the new quota ([`UsageFile::lower_quota`]); if a reservation slipped in
/// since the check, every change made here is undone and the cut refused.
pub fn apply(what: &str, usage: &UsageFile, changes: &[QuotaChange]) -> Result<(), ResizeError> {
    let io = |source: std::io::Error| ResizeError::Io { what: what.to_string(), path: usage.path().display().to_string(), source };
    for (n, c) in changes.iter().enumerate() {
        let Some(device) = c.device else { continue };
        let result = if c.mem_bytes >= c.previous_mem_bytes {
            usage.set_quota(device, c.mem_bytes).map_err(io)
        } else {
            match usage.lower_quota(device, c.mem_bytes) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(used)) => Err(ResizeError::BelowUse { what: what.to_string(), gpu: c.index, asked: c.mem_bytes, used }),
                Err(e) => Err(io(e)),
            }
        };
        if let Err(e) = result {
            undo(usage, &changes[..n]);
            return Err(e);
        }
    }
    Ok(())
}

/// Put back the quotas `changes` replaced (best effort: a failure here is a warning).
pub fn undo(usage: &UsageFile, changes: &[QuotaChange]) {
    for c in changes.iter().rev() {
        if let Some(device) = c.device {
            if let Err(e) = usage.set_quota(device, c.previous_mem_bytes) {
                tracing::warn!("{}: could not put back the quota of {}: {e}", usage.path().display(), c.uuid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_abi::compute::Policy;
    use vgpu_abi::usage::DeviceQuota;

    const GIB: u64 = 1 << 30;

    fn usage_file(dir: &std::path::Path, quota: u64) -> UsageFile {
        std::fs::create_dir_all(dir.join(vgpu_abi::layout::PROCS_DIR)).unwrap();
        let path = dir.join("usage");
        UsageFile::create(&path, &[DeviceQuota { uuid: "GPU-0".into(), quota_bytes: quota, compute_pct: 100, policy: Policy::Strict, priority: 50, turn_max_us: 0 }]).unwrap();
        UsageFile::open(&path).unwrap()
    }

    fn change(from: u64, to: u64) -> QuotaChange {
        QuotaChange { index: 0, uuid: "GPU-0".into(), mem_bytes: to, previous_mem_bytes: from, device: Some(0) }
    }

    #[test]
    fn apply_raises_and_lowers_and_a_refused_cut_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let usage = usage_file(dir.path(), GIB);
        apply("w", &usage, &[change(GIB, 2 * GIB)]).unwrap();
        assert_eq!(usage.quota_bytes(0), 2 * GIB);
        let proc = usage.register(vgpu_abi::process::ProcessId::current().unwrap()).unwrap();
        usage.try_reserve(&proc, 0, 3 * GIB / 2).unwrap();
        // Below what is used: refused with both figures, the quota as it was.
        let err = apply("w", &usage, &[change(2 * GIB, GIB)]).unwrap_err();
        assert!(matches!(err, ResizeError::BelowUse { used, asked, .. } if used == 3 * GIB / 2 && asked == GIB), "{err}");
        assert!(err.to_string().contains("1 GiB") && err.to_string().contains("1.50 GiB"), "{err}");
        assert_eq!(usage.quota_bytes(0), 2 * GIB);
        // Above it: the shim's next reservation sees the new quota.
        apply("w", &usage, &[change(2 * GIB, 7 * GIB / 4)]).unwrap();
        assert_eq!(usage.quota_bytes(0), 7 * GIB / 4);
        assert!(usage.try_reserve(&proc, 0, GIB / 2).is_err());
        usage.try_reserve(&proc, 0, GIB / 4).unwrap();
        assert_eq!(usage.used_bytes(0), 7 * GIB / 4);
    }

    #[test]
    fn a_cut_racing_reservations_never_leaves_the_counter_above_the_quota() {
        let dir = tempfile::tempdir().unwrap();
        let usage = std::sync::Arc::new(usage_file(dir.path(), 8 * GIB));
        let proc = std::sync::Arc::new(usage.register(vgpu_abi::process::ProcessId::current().unwrap()).unwrap());
        for round in 0..200u64 {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (u, p, s) = (usage.clone(), proc.clone(), stop.clone());
            let taker = std::thread::spawn(move || {
                let mut held = 0;
                while !s.load(std::sync::atomic::Ordering::SeqCst) && held < 64 {
                    if u.try_reserve(&p, 0, GIB / 16).is_ok() {
                        held += 1;
                    }
                }
                held
            });
            let cut = GIB + (round % 4) * GIB / 8;
            let result = apply("w", &usage, &[change(8 * GIB, cut)]);
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let held = taker.join().unwrap();
            let quota = usage.quota_bytes(0);
            assert!(usage.used_bytes(0) <= quota, "round {round}: {} used over {quota} ({result:?})", usage.used_bytes(0));
            assert_eq!(quota, if result.is_ok() { cut } else { 8 * GIB });
            usage.release(&proc, 0, held * (GIB / 16));
            usage.set_quota(0, 8 * GIB).unwrap();
        }
    }
}
