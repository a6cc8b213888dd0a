//! What `vgpu ps` lists for each workload, built once for the listing, `--json` and the
//! metrics `vgpu watch` exports (so the figures agree).
//!
//! A row's live figures are the shim's (the vGPU's usage file). Where that file cannot be
//! read — another user's workload: the file is its user's, 0600 — [`driver`] fills in what
//! the driver (NVML) says of the workload's processes, and says so, so that every user sees
//! every workload as `nvidia-smi` shows every process. [`workloads`] is the whole listing.

pub mod driver;
pub mod workloads;

use serde::Serialize;
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::usage::UsageFile;


use vgpu_cgroups::Layout;
use vgpu_store::compute::ComputePolicy;
use vgpu_json::SuspendedReason;
use vgpu_json::WorkloadRef;
use vgpu_store::state::Enforcement;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;

#[derive(Debug, Serialize)]
pub struct Row {
    pub id: String,
    pub name: String,
    pub user: String,
    pub gpus: Vec<GpuRow>,
    pub partition: Option<String>,
    /// Target compute share per GPU, percent (the highest of its GPUs' when they differ;
    /// `gpus[].compute_pct` has each). None: no GPU yet.
    pub compute_pct: Option<u32>,
    pub compute_policy: ComputePolicy,
    /// Share of one GPU's time the vGPU used over the last ~1 s window, percent (the
    /// highest of its GPUs'); null when idle or unknown. A partition's figure is the whole
    /// partition's.
    pub compute_measured_pct: Option<f64>,
    /// GPU time charged to the vGPU, summed over its GPUs, ns.
    pub gpu_time_ns: u64,
    pub priority: i32,
    pub pool_blocks: Option<u64>,
    pub pids: Vec<u32>,
    pub state: String,
    /// Whether the `vgpu run` supervising it still runs. Always true after a reconcile; a
    /// read-only listing ([`vgpu_store::read_only`]) shows a dead one's record as it is, and the
    /// next command run as root cleans it up.
    pub supervisor_alive: bool,
    /// Whether the vGPU's usage file (the shim's counters) could be read: false for another
    /// user's workload when not root. Then `mem_used` is the driver's figure
    /// (`mem_used_source`), `compute_measured_pct` is null, `gpu_time_ns` and `throttled_ns`
    /// are 0 (unknown), and the compute share and policy are the record's.
    pub usage_readable: bool,
    /// Why it is suspended (null unless suspended).
    pub suspended_reason: Option<SuspendedReason>,
    /// The workload that preempted it (`suspended_reason` `preempted`), when known.
    pub suspended_by: Option<WorkloadRef>,
    /// The record's reason in words (`preempted by train`), for the table.
    #[serde(skip)]
    pub suspended_why: Option<String>,
    /// While suspended: where its device memory is, `host` (moved by the CUDA checkpoint
    /// API; free on the GPU for others) or `device` (frozen with its memory held).
    pub suspended_memory: Option<&'static str>,
    /// Why a suspended workload's memory stayed on the device.
    pub suspended_memory_why: Option<String>,
    /// What `vgpu watch` did to it and why (killed, ended or throttled), if anything.
    pub enforcement: Option<Enforcement>,
    /// When it was started, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// The service it is a replica of, `{"name", "replica"}`; null for other workloads.
    pub service: Option<vgpu_store::state::ServiceRef>,
    /// The Slurm job step it fences, `{"job", "step", "node"}` (`spank_vgpu.so`); null for
    /// other workloads.
    pub slurm: Option<vgpu_store::state::SlurmStep>,
    pub command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<ProcRow>>,
}

#[derive(Debug, Serialize)]
pub struct GpuRow {
    #[serde(rename = "gpu_index")]
    pub index: u32,
    #[serde(rename = "gpu_uuid")]
    pub uuid: String,
    #[serde(rename = "memory_used_bytes")]
    pub mem_used: Option<u64>,
    /// The most the vGPU held on this GPU at once (the shim's count), if known.
    #[serde(rename = "memory_peak_bytes")]
    pub mem_peak: Option<u64>,
    /// Where `mem_used` comes from: the shim's counter (the whole vGPU: a partition's
    /// workloads together), or the driver (the device memory NVML says this workload's
    /// processes hold on the GPU). Null when there is no figure.
    #[serde(rename = "memory_used_source")]
    pub mem_used_source: Option<MemSource>,
    #[serde(rename = "memory_quota_bytes")]
    pub mem_quota: u64,
    pub compute_pct: u32,
    pub compute_measured_pct: Option<f64>,
    pub gpu_time_ns: u64,
    /// Time the vGPU's launching threads waited for its compute budget on this GPU, ns.
    pub throttled_ns: u64,
    /// Turns on this GPU (vGPUs sharing it put their work on it one at a time): turns the
    /// vGPU took while others had work there, …
    pub turns_taken: u64,
    /// … time its launches waited for a turn, ns, …
    pub turn_wait_ns: u64,
    /// … and context switches of the GPU avoided (hand-overs after the others' work drained,
    /// turns kept while nobody else waited).
    pub switches_avoided: u64,
}

#[derive(Debug, Serialize)]
pub struct ProcRow {
    pub pid: u32,
    #[serde(rename = "memory_used_bytes")]
    pub mem_used: Vec<u64>,
    /// Empty when `source` is the driver (it does not say).
    #[serde(rename = "memory_peak_bytes")]
    pub mem_peak: Vec<u64>,
    /// GPU time charged to this process, per device of the vGPU, ns. Empty when `source` is
    /// the driver.
    pub gpu_time_ns: Vec<u64>,
    /// The shim's per-process file, or the driver (the usage file could not be read).
    #[serde(rename = "memory_used_source")]
    pub source: MemSource,
}

/// Where a memory figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemSource {
    /// The shim's counters in the vGPU's files.
    Shim,
    /// NVML's per-process device memory of the workload's processes.
    Driver,
}

/// Parts per million → percent with one decimal.
pub fn ppm_to_pct(ppm: u64) -> f64 {
    (ppm as f64 / 1000.0).round() / 10.0
}

/// One workload as `vgpu ps` lists it: the record, the live usage and limits the shim
/// shares, the processes of its cgroup.
pub fn row(store: &Store, layout: Option<&Layout>, w: &Workload, all: bool) -> Row {
    row_with(store, &Pids::new(layout), w, all, Known::default())
}

/// Where a listing finds each workload's processes: in its cgroup (read through
/// [`vgpu_cgroups::CgroupReaders`]: one reader per cgroup home), or for a Slurm step below
/// its slurmstepd.
pub struct Pids<'a> {
    cgroups: Option<vgpu_cgroups::CgroupReaders<'a>>,
}

impl<'a> Pids<'a> {
    pub fn new(layout: Option<&'a Layout>) -> Pids<'a> {
        Pids { cgroups: layout.map(vgpu_cgroups::CgroupReaders::new) }
    }

    /// The processes of `w` (none where they cannot be read).
    fn of(&self, w: &Workload) -> Vec<u32> {
        if w.slurm.is_some() {
            // A Slurm step's tasks are in Slurm's cgroups, below the step's slurmstepd.
            return vgpu_gpu::ancestry::descendants_of(w.supervisor.into());
        }
        self.cgroups
            .as_ref()
            .and_then(|c| c.pids(&w.cgroup_home, &w.cgroup).ok())
            .map(|p| p.into_iter().map(|p| p as u32).collect())
            .unwrap_or_default()
    }
}

/// What the caller of [`row_with`] knows of the workload already, and may do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Known {
    /// Whether its supervisor runs, as a reconcile just found (None: look).
    pub supervisor_alive: Option<bool>,
    /// Give back the memory of the vGPU's dead processes before reading its usage (root
    /// listing after a reconcile that left that to it: `lifecycle::reconcile_but_usage`).
    pub reclaim: bool,
}

/// [`row`], with what the caller knows: its usage file opened once, for the reclaim and
/// the figures.
pub fn row_with(store: &Store, pids: &Pids<'_>, w: &Workload, all: bool, known: Known) -> Row {
    let usage_path = store.vgpu_dir(&w.vgpu).join(USAGE_FILE);
    // A copy of the files for the figures (read, not mapped: a row looks once); the files
    // themselves where the vGPU has dead processes' memory to give back first.
    let mut usage = UsageFile::open_copy(&usage_path).ok();
    if known.reclaim && usage.as_ref().is_some_and(|u| !u.nothing_listed_to_reclaim()) {
        usage = UsageFile::open(&usage_path).ok();
        if let Some(usage) = &usage {
            crate::lifecycle::reclaim_listed(&usage_path, usage);
        }
    }
    let devices = usage.as_ref().map(|u| u.devices()).unwrap_or_default();
    // The usage file is what the shim enforces; the record is the fallback.
    let gpus: Vec<GpuRow> = w
        .gpus
        .iter()
        .map(|g| {
            let live = devices.iter().find(|d| d.uuid == g.uuid);
            GpuRow {
                index: g.index,
                uuid: g.uuid.clone(),
                mem_used: live.map(|d| d.used_bytes),
                mem_peak: live.map(|d| d.peak_bytes),
                mem_used_source: live.map(|_| MemSource::Shim),
                mem_quota: g.mem_bytes,
                compute_pct: live.map(|d| d.compute_pct).unwrap_or(g.compute_pct),
                compute_measured_pct: live.and_then(|d| d.measured_share_ppm).map(ppm_to_pct),
                gpu_time_ns: live.map(|d| d.charged_ns).unwrap_or(0),
                throttled_ns: live.map(|d| d.throttled_ns).unwrap_or(0),
                turns_taken: live.map(|d| d.turns_taken).unwrap_or(0),
                turn_wait_ns: live.map(|d| d.turn_wait_ns).unwrap_or(0),
                switches_avoided: live.map(|d| d.switches_avoided).unwrap_or(0),
            }
        })
        .collect();
    let compute_policy = w
        .gpus
        .first()
        .and_then(|g| devices.iter().find(|d| d.uuid == g.uuid))
        .map(|d| ComputePolicy::from_abi(d.policy))
        .unwrap_or(w.compute_policy);
    let pids: Vec<u32> = pids.of(w);
    let processes = all.then(|| {
        usage
            .as_ref()
            .map(|u| u.processes())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.alive && pids.contains(&p.pid))
            .map(|p| ProcRow {
                pid: p.pid,
                mem_used: p.used_bytes,
                mem_peak: p.peak_bytes,
                gpu_time_ns: p.compute_ns,
                source: MemSource::Shim,
            })
            .collect()
    });
    Row {
        id: w.id.clone(),
        name: w.name.clone(),
        user: w.user.name.clone(),
        compute_pct: gpus.iter().map(|g| g.compute_pct).max(),
        compute_policy,
        compute_measured_pct: gpus.iter().filter_map(|g| g.compute_measured_pct).reduce(f64::max),
        gpu_time_ns: gpus.iter().map(|g| g.gpu_time_ns).sum(),
        gpus,
        partition: w.partition.clone(),
        priority: w.priority,
        pool_blocks: w.pool_blocks,
        pids,
        state: w.state.as_str().to_string(),
        supervisor_alive: known.supervisor_alive.unwrap_or_else(|| w.supervisor_alive()),
        usage_readable: usage.is_some(),
        suspended_reason: w.suspended_reason.as_deref().map(SuspendedReason::of_record),
        suspended_by: None,
        suspended_why: w.suspended_reason.clone(),
        suspended_memory: suspended_memory(w).map(|m| m.place()),
        suspended_memory_why: match suspended_memory(w) {
            Some(vgpu_store::state::SuspendedMemory::Device { why }) => Some(why),
            _ => None,
        },
        enforcement: w.enforcement.clone(),
        created_unix_ms: w.created_unix_ms,
        service: w.service.clone(),
        slurm: w.slurm.clone(),
        command: w.command.clone(),
        processes,
    }
}

/// Where a suspended workload's memory is; a record from before suspension could release
/// memory reads as held on the device.
fn suspended_memory(w: &Workload) -> Option<vgpu_store::state::SuspendedMemory> {
    (w.state == vgpu_store::state::WorkloadState::Suspended).then(|| {
        w.suspended_memory.clone().unwrap_or(vgpu_store::state::SuspendedMemory::Device { why: "suspended by an older vgpu".into() })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_share_is_a_percent_with_one_decimal() {
        assert_eq!(ppm_to_pct(280_000), 28.0);
        assert_eq!(ppm_to_pct(1_000_000), 100.0);
        assert_eq!(ppm_to_pct(123_456), 12.3);
        assert_eq!(ppm_to_pct(0), 0.0);
    }
}
