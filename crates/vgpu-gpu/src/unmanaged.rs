//! Processes outside every vGPU on a GPU that hosts vGPUs: started without vgpu, they take
//! device memory and time that admission promised to the vGPUs there. Found in the
//! snapshot; reported once each, terminated under `[watch] unmanaged = "kill"`.

use std::collections::HashSet;

use serde::Serialize;
use vgpu_abi::process::ProcessId;

use crate::snapshot::{Owner, Snapshot};

/// One process in no vGPU, on a GPU that has vGPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unmanaged {
    pub pid: u32,
    #[serde(skip)]
    pub process: ProcessId,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    #[serde(rename = "memory_used_bytes")]
    pub memory_bytes: Option<u64>,
    /// Its command line, printable, shortened.
    pub command: Option<String>,
}

/// The unmanaged processes of the snapshot on the GPUs in `vgpu_gpus` (UUIDs), leaving out
/// `exempt` (the watch itself).
pub fn find(snapshot: &Snapshot, vgpu_gpus: &HashSet<String>, exempt: &[u32]) -> Vec<Unmanaged> {
    snapshot
        .gpus
        .iter()
        .filter(|g| vgpu_gpus.contains(&g.uuid))
        .flat_map(|g| {
            g.processes.iter().filter(|p| p.owner == Owner::Unmanaged && !exempt.contains(&p.pid)).filter_map(move |p| {
                Some(Unmanaged {
                    pid: p.pid,
                    process: p.process_id()?,
                    gpu_index: g.index,
                    gpu_uuid: g.uuid.clone(),
                    memory_bytes: p.memory_bytes,
                    command: vgpu_store::state::lock::command_line(p.pid),
                })
            })
        })
        .collect()
}

/// Which unmanaged processes were reported already (each is logged once).
#[derive(Debug, Default)]
pub struct Reported {
    seen: HashSet<(ProcessId, String)>,
}

impl Reported {
    /// Whether this one is new (and remember it); forget those no longer found.
    pub fn first_time<'a>(&mut self, found: &'a [Unmanaged]) -> Vec<&'a Unmanaged> {
        let now: HashSet<(ProcessId, String)> = found.iter().map(|u| (u.process, u.gpu_uuid.clone())).collect();
        self.seen.retain(|k| now.contains(k));
        found.iter().filter(|u| self.seen.insert((u.process, u.gpu_uuid.clone()))).collect()
    }
}

/// The log line for one.
pub fn describe(u: &Unmanaged) -> String {
    let memory = u.memory_bytes.map(vgpu_abi::size::format_size).unwrap_or_else(|| "unknown memory".into());
    format!(
        "pid {} ({}) uses GPU {} outside every vGPU, holding {memory}",
        u.pid,
        u.command.as_deref().unwrap_or("?"),
        u.gpu_index
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::GpuProcessSample;

    use crate::snapshot::idle_gpu as gpu;

    fn proc(pid: u32, owner: Owner) -> GpuProcessSample {
        GpuProcessSample { pid, start_time: Some(1), memory_bytes: Some(1 << 30), sm_util_pct: None, owner }
    }

    #[test]
    fn only_unmanaged_processes_on_gpus_with_vgpus_and_once_each() {
        let snapshot = Snapshot {
            taken_unix_ms: 0,
            taken_us: 0,
            gpus: vec![
                gpu(0, vec![proc(10, Owner::Unmanaged), proc(11, Owner::Workload("w".into())), proc(12, Owner::Gone), proc(99, Owner::Unmanaged)]),
                gpu(1, vec![proc(20, Owner::Unmanaged)]),
            ],
        };
        let gpus: HashSet<String> = ["GPU-0".to_string()].into();
        let found = find(&snapshot, &gpus, &[99]);
        assert_eq!(found.iter().map(|u| u.pid).collect::<Vec<_>>(), vec![10]);
        let mut reported = Reported::default();
        assert_eq!(reported.first_time(&found).len(), 1);
        assert_eq!(reported.first_time(&found).len(), 0, "once");
        assert_eq!(reported.first_time(&[]).len(), 0);
        assert_eq!(reported.first_time(&found).len(), 1, "again after it was gone");
        assert!(describe(&found[0]).starts_with("pid 10 ("), "{}", describe(&found[0]));
        assert!(describe(&found[0]).ends_with("uses GPU 0 outside every vGPU, holding 1 GiB"));
    }
}
