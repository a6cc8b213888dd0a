//! What really runs on the GPUs, as the driver sees it: NVML's per-process device memory and
//! utilization, each process mapped to the workload whose cgroup holds it
//! (`/proc/PID/cgroup`). `vgpu watch` audits from this snapshot (`memory`, `compute`,
//! `unmanaged`), and the listings use it where the shim's files cannot be read.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use serde::Serialize;
use vgpu_abi::process::ProcessId;

use crate::Nvml;

/// Whose a GPU process is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "cgroup")]
pub enum Owner {
    /// In the cgroup `vgpu/<name>` (or below it): a workload's, named like its id.
    Workload(String),
    /// In no cgroup of vgpu.
    Unmanaged,
    /// It exited between NVML's list and the look at `/proc`.
    Gone,
}

/// One process NVML lists on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuProcessSample {
    pub pid: u32,
    /// Its start time (`/proc/PID/stat`), so that a signal never reaches a recycled pid.
    pub start_time: Option<u64>,
    /// Device memory NVML says it holds (None: the driver does not say, as in some
    /// containers and for graphics processes on some drivers).
    pub memory_bytes: Option<u64>,
    /// Its SM utilization over the sampling window, percent (NVML's process samples, the
    /// highest sample in the window); None: no sample.
    pub sm_util_pct: Option<u32>,
    pub owner: Owner,
}

impl GpuProcessSample {
    pub fn process_id(&self) -> Option<ProcessId> {
        self.start_time.map(|start_time| ProcessId { pid: self.pid, start_time })
    }
}

/// One GPU at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_used: u64,
    /// Device utilization over the driver's last sample period, percent.
    pub utilization_pct: Option<u32>,
    pub power_w: Option<f64>,
    /// Energy since the driver loaded, millijoules.
    pub energy_mj: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub processes: Vec<GpuProcessSample>,
}

/// Every GPU at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    /// When it was taken, ms since the epoch.
    pub taken_unix_ms: u64,
    /// When it was taken, µs on NVML's clock (the epoch), for the next `since_us`.
    pub taken_us: u64,
    pub gpus: Vec<GpuSample>,
}

impl Snapshot {
    /// Read every GPU. Process utilization covers the samples after `since_us` (NVML's µs
    /// timestamps; 0: whatever the driver still has, about the last second).
    pub fn take(nvml: &Nvml, since_us: u64) -> Result<Snapshot, NvmlError> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let mut gpus = Vec::new();
        for index in 0..nvml.count()? {
            gpus.push(sample_gpu(nvml, index, since_us)?);
        }
        Ok(Snapshot { taken_unix_ms: now.as_millis() as u64, taken_us: now.as_micros() as u64, gpus })
    }

    /// Every process of workload cgroup `cgroup`, with its GPU.
    pub fn processes_of<'a>(&'a self, cgroup: &'a str) -> impl Iterator<Item = (&'a GpuSample, &'a GpuProcessSample)> + 'a {
        self.gpus.iter().flat_map(move |g| {
            g.processes.iter().filter(move |p| matches!(&p.owner, Owner::Workload(c) if c == cgroup)).map(move |p| (g, p))
        })
    }

    /// Whether the driver leaves out the device memory of some workload's process (NVML's
    /// "not available": some drivers for unprivileged callers, some containers): the memory
    /// audit cannot see those.
    pub fn memory_unreported(&self) -> bool {
        self.gpus.iter().flat_map(|g| &g.processes).any(|p| matches!(p.owner, Owner::Workload(_)) && p.memory_bytes.is_none())
    }

    pub fn gpu(&self, uuid: &str) -> Option<&GpuSample> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// Give the workloads whose processes live in cgroups that are not vgpu's (Slurm job
    /// steps: their tasks stay in Slurm's cgroups) the processes in no vGPU that descend
    /// from their supervisor (the step's slurmstepd). `steps` is (supervisor, workload
    /// cgroup name). A process that left the step's process tree (a daemon reparented to
    /// init) stays in no vGPU.
    pub fn adopt_descendants(&mut self, steps: &[(ProcessId, String)]) {
        if steps.is_empty() {
            return;
        }
        for p in self.gpus.iter_mut().flat_map(|g| g.processes.iter_mut()).filter(|p| p.owner == Owner::Unmanaged) {
            if let Some(cgroup) = crate::ancestry::descends_from(p.pid, steps) {
                p.owner = Owner::Workload(cgroup.to_string());
            }
        }
    }
}

fn sample_gpu(nvml: &Nvml, index: u32, since_us: u64) -> Result<GpuSample, NvmlError> {
    use nvml_wrapper::enum_wrappers::device::Clock;
    let device = nvml.device(index)?;
    let memory = device.memory_info()?;
    // Compute and graphics lists; a process in both (C+G) once, with the larger figure.
    let mut listed: Vec<(u32, Option<u64>)> = Vec::new();
    for list in [device.running_compute_processes(), device.running_graphics_processes()] {
        let list = match list {
            Ok(list) => list,
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Vec::new(),
            Err(e) => return Err(e),
        };
        for p in list {
            let bytes = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            match listed.iter_mut().find(|(pid, _)| *pid == p.pid) {
                Some((_, have)) => *have = (*have).max(bytes),
                None => listed.push((p.pid, bytes)),
            }
        }
    }
    let utilization = match device.process_utilization_stats(since_us) {
        Ok(samples) => samples,
        Err(NvmlError::NotFound | NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut processes: Vec<GpuProcessSample> = listed
        .into_iter()
        .map(|(pid, memory_bytes)| {
            let sm_util_pct = utilization.iter().filter(|s| s.pid == pid).map(|s| s.sm_util).max();
            describe(pid, memory_bytes, sm_util_pct)
        })
        .collect();
    // A process that used the GPU in the window but holds no context any more still counts
    // for compute.
    for s in &utilization {
        if !processes.iter().any(|p| p.pid == s.pid) {
            let best = utilization.iter().filter(|o| o.pid == s.pid).map(|o| o.sm_util).max();
            processes.push(describe(s.pid, None, best));
        }
    }
    let optional = |r: Result<u32, NvmlError>| r.ok();
    Ok(GpuSample {
        index,
        uuid: device.uuid()?,
        name: device.name()?,
        memory_total: memory.total,
        memory_used: memory.used,
        utilization_pct: device.utilization_rates().ok().map(|u| u.gpu),
        power_w: optional(device.power_usage()).map(|mw| f64::from(mw) / 1000.0),
        energy_mj: device.total_energy_consumption().ok(),
        sm_clock_mhz: optional(device.clock_info(Clock::SM)),
        sm_clock_max_mhz: optional(device.max_clock_info(Clock::SM)),
        processes,
    })
}

fn describe(pid: u32, memory_bytes: Option<u64>, sm_util_pct: Option<u32>) -> GpuProcessSample {
    let start_time = vgpu_abi::process::start_time(pid);
    let owner = match (start_time, crate::cgroup_of::workload_of_pid(pid)) {
        (None, _) | (_, Err(_)) => Owner::Gone,
        (Some(_), Ok(Some(cgroup))) => Owner::Workload(cgroup),
        (Some(_), Ok(None)) => Owner::Unmanaged,
    };
    GpuProcessSample { pid, start_time, memory_bytes, sm_util_pct, owner }
}

/// An idle simulated H100 at `index` with these processes, for tests.
#[cfg(any(test, feature = "test-support"))]
pub fn idle_gpu(index: u32, processes: Vec<GpuProcessSample>) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        name: "H100".into(),
        memory_total: 80 << 30,
        memory_used: 0,
        utilization_pct: None,
        power_w: None,
        energy_mj: None,
        sm_clock_mhz: None,
        sm_clock_max_mhz: None,
        processes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreported_memory_of_workload_processes_is_noticed() {
        let proc = |owner: Owner, memory_bytes: Option<u64>| GpuProcessSample { pid: 1, start_time: Some(1), memory_bytes, sm_util_pct: None, owner };
        let snapshot = |p: GpuProcessSample| Snapshot { taken_unix_ms: 0, taken_us: 0, gpus: vec![idle_gpu(0, vec![p])] };
        assert!(snapshot(proc(Owner::Workload("w".into()), None)).memory_unreported());
        assert!(!snapshot(proc(Owner::Workload("w".into()), Some(0))).memory_unreported());
        assert!(!snapshot(proc(Owner::Unmanaged, None)).memory_unreported(), "only workloads' matter to the audit");
    }
}
