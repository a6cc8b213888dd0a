//! The driver's view of the workloads (NVML, through [`Snapshot`]): the figures a row gets
//! where the shim's files cannot be read, and the processes on the workloads' GPUs that are
//! in no vGPU. Processes are mapped to workloads by `/proc/PID/cgroup`, which every user
//! can read, so these figures are everybody's, as `nvidia-smi`'s are.

use std::cell::OnceCell;
use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;

use serde::Serialize;

use super::{MemSource, ProcRow, Row};
use vgpu_gpu::unmanaged;
use vgpu_gpu::unmanaged::Unmanaged;
use vgpu_gpu::snapshot::Snapshot;
use crate::context::Context;
use vgpu_gpu::Nvml;
use vgpu_store::state::Workload;

/// NVML, opened (without making anything, [`Context::nvml_read_only`]) the first time a
/// listing needs it, and kept for the next refreshes of `--watch`.
pub struct Driver<'a> {
    ctx: &'a Context,
    nvml: OnceCell<Option<Nvml>>,
}

impl<'a> Driver<'a> {
    pub fn new(ctx: &'a Context) -> Driver<'a> {
        Driver { ctx, nvml: OnceCell::new() }
    }

    /// Whether it is the simulated driver (`--simulate`).
    pub fn simulated(&self) -> bool {
        self.ctx.simulate
    }

    /// Every GPU now. None when the host has no driver, or it cannot be read (a warning:
    /// the listing goes on without the driver's figures).
    pub fn snapshot(&self) -> Option<Snapshot> {
        let nvml = self.nvml.get_or_init(|| match self.ctx.nvml_read_only() {
            Ok(nvml) => nvml,
            Err(e) => {
                tracing::warn!("no figures from the driver: {e:#}");
                None
            }
        });
        match Snapshot::take(nvml.as_ref()?, 0) {
            Ok(snapshot) => Some(snapshot),
            Err(e) => {
                tracing::warn!("no figures from the driver: {}", vgpu_gpu::explain(&e));
                None
            }
        }
    }
}

/// Fill in from the driver what the shim's files did not give `row` (the row of `w`): on
/// each of its GPUs, the device memory its processes hold; with `-a`, when the usage file
/// could not be read, its processes.
pub fn fill(row: &mut Row, w: &Workload, snapshot: &Snapshot) {
    for g in row.gpus.iter_mut().filter(|g| g.mem_used_source.is_none()) {
        if snapshot.gpu(&g.uuid).is_none() {
            continue;
        }
        let held = snapshot.processes_of(&w.cgroup).filter(|(gpu, _)| gpu.uuid == g.uuid).filter_map(|(_, p)| p.memory_bytes);
        g.mem_used = Some(held.sum());
        g.mem_used_source = Some(MemSource::Driver);
    }
    if row.usage_readable {
        return;
    }
    if let Some(processes) = row.processes.as_mut() {
        // pid → bytes on each of the workload's GPUs, in the order of `row.gpus`.
        let mut by_pid: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (gpu, p) in snapshot.processes_of(&w.cgroup) {
            let used = by_pid.entry(p.pid).or_insert_with(|| vec![0; row.gpus.len()]);
            if let Some(i) = row.gpus.iter().position(|g| g.uuid == gpu.uuid) {
                used[i] += p.memory_bytes.unwrap_or(0);
            }
        }
        *processes = by_pid
            .into_iter()
            .map(|(pid, mem_used)| ProcRow { pid, mem_used, mem_peak: Vec::new(), gpu_time_ns: Vec::new(), source: MemSource::Driver })
            .collect();
    }
}

/// A process in no vGPU on a GPU that workloads use, as `vgpu ps` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct UnmanagedRow {
    #[serde(flatten)]
    pub process: Unmanaged,
    /// Its user's name (its uid when the name is unknown); None when it is gone.
    pub user: Option<String>,
}

/// The processes in no vGPU on the GPUs `workloads` use (those `vgpu watch` reports too).
pub fn unmanaged(snapshot: &Snapshot, workloads: &[Workload]) -> Vec<UnmanagedRow> {
    let gpus: HashSet<String> = workloads.iter().flat_map(|w| w.gpus.iter().map(|g| g.uuid.clone())).collect();
    unmanaged::find(snapshot, &gpus, &[])
        .into_iter()
        .map(|process| UnmanagedRow { user: user_of(process.pid), process })
        .collect()
}

/// The user a process runs as: the owner of `/proc/PID`.
fn user_of(pid: u32) -> Option<String> {
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    Some(match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_gpu::snapshot::GpuProcessSample;
    use vgpu_gpu::snapshot::Owner;
    use crate::listing::GpuRow;

    use vgpu_gpu::snapshot::idle_gpu as gpu;

    fn process(pid: u32, bytes: Option<u64>, owner: Owner) -> GpuProcessSample {
        GpuProcessSample { pid, start_time: Some(1), memory_bytes: bytes, sm_util_pct: None, owner }
    }

    /// A record of workload `id` (its cgroup too) on the GPUs `GPU-<index>`.
    fn workload(id: &str, gpus: &[u32]) -> Workload {
        let gpus: Vec<serde_json::Value> = gpus
            .iter()
            .map(|i| serde_json::json!({"index": i, "uuid": format!("GPU-{i}"), "mem_bytes": 4u64 << 30, "device_bytes": 16u64 << 30, "compute_pct": 100}))
            .collect();
        let record = serde_json::json!({
            "format": 1, "id": id, "name": "x", "command": ["x"],
            "user": {"name": "root", "uid": 0, "gid": 0, "groups": [0], "home": "/root"},
            "gpus": gpus, "vgpu": id, "partition": null, "priority": 50,
            "pool_blocks": null, "cgroup": id, "supervisor": {"pid": 1, "start_time": 1},
            "pid": null, "state": "running", "suspended_reason": null, "created_unix_ms": 0
        });
        Workload::parse(record.to_string().as_bytes(), format!("{id}.json").as_ref()).unwrap()
    }

    fn gpu_row(index: u32, mem_used: Option<u64>, source: Option<MemSource>) -> GpuRow {
        GpuRow {
            index,
            uuid: format!("GPU-{index}"),
            mem_used,
            mem_peak: None,
            mem_used_source: source,
            mem_quota: 4 << 30,
            compute_pct: 100,
            compute_measured_pct: None,
            gpu_time_ns: 0,
            throttled_ns: 0,
            turns_taken: 0,
            turn_wait_ns: 0,
            switches_avoided: 0,
        }
    }

    #[test]
    fn unreadable_figures_are_the_sum_of_the_workloads_processes_on_each_gpu() {
        let w = workload("w1", &[0, 1, 2]);
        let snapshot = Snapshot {
            taken_unix_ms: 0,
            taken_us: 0,
            gpus: vec![
                gpu(
                    0,
                    vec![
                        process(10, Some(1 << 30), Owner::Workload("w1".into())),
                        process(11, Some(2 << 30), Owner::Workload("w1".into())),
                        process(12, None, Owner::Workload("w1".into())),
                        process(20, Some(8 << 30), Owner::Workload("other".into())),
                        process(30, Some(8 << 30), Owner::Unmanaged),
                    ],
                ),
                gpu(1, vec![process(11, Some(5 << 20), Owner::Workload("w1".into()))]),
            ],
        };
        let mut row = crate::listing::row(&vgpu_store::state::Store::new("/nonexistent".as_ref(), "/nonexistent".as_ref()), None, &w, true);
        assert!(!row.usage_readable);
        assert!(row.gpus.iter().all(|g| g.mem_used.is_none() && g.mem_used_source.is_none()));
        fill(&mut row, &w, &snapshot);
        assert_eq!(row.gpus[0].mem_used, Some(3 << 30));
        assert_eq!(row.gpus[0].mem_used_source, Some(MemSource::Driver));
        assert_eq!(row.gpus[1].mem_used, Some(5 << 20));
        assert_eq!((row.gpus[2].mem_used, row.gpus[2].mem_used_source), (None, None), "a GPU the driver does not list");
        let processes = row.processes.as_ref().unwrap();
        assert_eq!(processes.iter().map(|p| (p.pid, p.mem_used.clone())).collect::<Vec<_>>(), vec![
            (10, vec![1 << 30, 0, 0]),
            (11, vec![2 << 30, 5 << 20, 0]),
            (12, vec![0, 0, 0])
        ]);
        assert!(processes.iter().all(|p| p.source == MemSource::Driver && p.mem_peak.is_empty()));

        // The shim's figures are never replaced.
        row.gpus = vec![gpu_row(0, Some(7), Some(MemSource::Shim))];
        fill(&mut row, &w, &snapshot);
        assert_eq!((row.gpus[0].mem_used, row.gpus[0].mem_used_source), (Some(7), Some(MemSource::Shim)));
    }

    #[test]
    fn unmanaged_are_on_the_workloads_gpus_only_with_their_user() {
        let w = workload("w1", &[0]);
        let me = std::process::id();
        let snapshot = Snapshot {
            taken_unix_ms: 0,
            taken_us: 0,
            gpus: vec![
                gpu(0, vec![process(me, Some(1 << 20), Owner::Unmanaged), process(2, None, Owner::Workload("x".into()))]),
                gpu(1, vec![process(me, Some(1 << 20), Owner::Unmanaged)]),
            ],
        };
        let found = unmanaged(&snapshot, &[w]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].process.pid, found[0].process.gpu_index), (me, 0));
        let mine = nix::unistd::User::from_uid(nix::unistd::geteuid()).unwrap().unwrap().name;
        assert_eq!(found[0].user.as_deref(), Some(mine.as_str()));
        let json = serde_json::to_value(&found[0]).unwrap();
        assert_eq!(json["pid"], me);
        assert_eq!(json["gpu_uuid"], "GPU-0");
        assert_eq!(json["memory_used_bytes"], 1 << 20);
        assert_eq!(json["user"], mine.as_str());
    }
}
