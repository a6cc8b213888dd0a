//! The workloads the planner plans for, and where the list comes from.
//!
//! The seam: [`WorkloadSource`]. Two sources feed it today, merged by [`current`]:
//! * the state store of `vgpu run` ([`Recorded`]): each running workload on its GPUs. A GPU
//!   has one clock, so workloads that share a GPU (vGPU slices) are planned as one;
//! * the fallback for everything else: every other GPU with running compute processes is
//!   one workload holding that one GPU, with the default sensitivity.
//!
//! `--gpus MIN-MAX` ranges ([`GpuDemand::Range`], stage 1) and `--freq-sensitivity` come in
//! through the same types once `vgpu run` records them.

use serde::{Deserialize, Serialize};

use vgpu_gpu::GpuInfo;

/// How many GPUs a workload holds or may get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuDemand {
    /// Already running on these GPUs (NVML indexes): the count is not the planner's to change.
    Fixed(Vec<u32>),
    /// About to start and content with any count in `min..=max` (`vgpu run --gpus MIN-MAX`):
    /// stage 1 decides the count.
    Range { min: usize, max: usize },
}

/// One workload as the planner sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedWorkload {
    /// Shown in plans and logged.
    pub id: String,
    pub gpus: GpuDemand,
    /// 0..=1; `None`: the config's default (`[carbon] freq_sensitivity`, 1).
    pub freq_sensitivity: Option<f64>,
    /// Remaining work, in units of one GPU at full clock for one time unit; 1 when unknown
    /// (then every workload weighs the same in the average completion time).
    pub work: f64,
}

impl PlannedWorkload {
    pub fn fixed(id: impl Into<String>, gpus: Vec<u32>) -> PlannedWorkload {
        PlannedWorkload { id: id.into(), gpus: GpuDemand::Fixed(gpus), freq_sensitivity: None, work: 1.0 }
    }

    pub fn range(id: impl Into<String>, min: usize, max: usize) -> PlannedWorkload {
        PlannedWorkload { id: id.into(), gpus: GpuDemand::Range { min, max }, freq_sensitivity: None, work: 1.0 }
    }

    pub fn with_sensitivity(mut self, sensitivity: f64) -> PlannedWorkload {
        self.freq_sensitivity = Some(sensitivity);
        self
    }

    pub fn with_work(mut self, work: f64) -> PlannedWorkload {
        self.work = work;
        self
    }
}

/// Whatever knows the host's workloads.
pub trait WorkloadSource {
    fn workloads(&self) -> anyhow::Result<Vec<PlannedWorkload>>;
}

/// A workload `vgpu run` recorded, as the planner needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Its name (or id).
    pub id: String,
    /// NVML indexes of its GPUs.
    pub gpus: Vec<u32>,
    pub freq_sensitivity: Option<f64>,
}

/// The host's workloads: the recorded ones and the fallback, as one source.
pub struct Host<'a> {
    pub recorded: &'a [Recorded],
    /// Every GPU's NVML index and compute-process pids.
    pub gpu_pids: &'a [(u32, Vec<u32>)],
}

impl WorkloadSource for Host<'_> {
    fn workloads(&self) -> anyhow::Result<Vec<PlannedWorkload>> {
        Ok(current(self.recorded, self.gpu_pids.iter().cloned()))
    }
}

/// Recorded workloads (those sharing a GPU merged into one, with the highest sensitivity
/// among them), then one workload per other GPU that has compute processes.
pub fn current(recorded: &[Recorded], gpu_pids: impl IntoIterator<Item = (u32, Vec<u32>)>) -> Vec<PlannedWorkload> {
    // Groups of positions in `recorded`, with their GPUs.
    let mut groups: Vec<(Vec<usize>, Vec<u32>)> = Vec::new();
    for (i, r) in recorded.iter().enumerate().filter(|(_, r)| !r.gpus.is_empty()) {
        let (mut members, mut gpus) = (vec![i], r.gpus.clone());
        // Absorb every group that shares a GPU with this workload (or with what it absorbed).
        while let Some(k) = groups.iter().position(|(_, g)| g.iter().any(|x| gpus.contains(x))) {
            let (other_members, other_gpus) = groups.remove(k);
            members.extend(other_members);
            gpus.extend(other_gpus);
        }
        members.sort_unstable();
        gpus.sort_unstable();
        gpus.dedup();
        groups.push((members, gpus));
    }
    groups.sort_by_key(|(members, _)| members[0]);
    let taken: Vec<u32> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    let mut out: Vec<PlannedWorkload> = groups
        .into_iter()
        .map(|(members, gpus)| {
            let ids: Vec<&str> = members.iter().map(|&m| recorded[m].id.as_str()).collect();
            let sensitivity = members.iter().filter_map(|&m| recorded[m].freq_sensitivity).reduce(f64::max);
            PlannedWorkload { freq_sensitivity: sensitivity, ..PlannedWorkload::fixed(ids.join("+"), gpus) }
        })
        .collect();
    out.extend(from_gpu_processes(gpu_pids.into_iter().filter(|(index, _)| !taken.contains(index))));
    out
}

/// The fallback source alone: GPUs with compute processes, as NVML lists them.
pub struct GpuProcesses<'a>(pub &'a [GpuInfo]);

impl WorkloadSource for GpuProcesses<'_> {
    fn workloads(&self) -> anyhow::Result<Vec<PlannedWorkload>> {
        Ok(from_gpu_processes(self.0.iter().map(|gpu| (gpu.index, gpu.processes.iter().map(|p| p.pid).collect()))))
    }
}

/// One workload per GPU (NVML index, compute-process pids) that has processes, named by them.
pub fn from_gpu_processes(gpus: impl IntoIterator<Item = (u32, Vec<u32>)>) -> Vec<PlannedWorkload> {
    gpus.into_iter()
        .filter(|(_, pids)| !pids.is_empty())
        .map(|(index, pids)| {
            let label = if pids.len() == 1 { "pid" } else { "pids" };
            let list: Vec<String> = pids.iter().map(u32::to_string).collect();
            PlannedWorkload::fixed(format!("{label} {}", list.join(",")), vec![index])
        })
        .collect()
}

/// The environment a workload starts with once stage 1 has given it `gpus`
/// (NVML indexes): `CUDA_VISIBLE_DEVICES` and `VGPU_NUM_GPUS`.
pub fn launch_env(gpus: &[u32]) -> Vec<(String, String)> {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    vec![("CUDA_VISIBLE_DEVICES".to_string(), list.join(",")), ("VGPU_NUM_GPUS".to_string(), gpus.len().to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_gpus_become_one_workload_each() {
        let found = from_gpu_processes([(0, vec![]), (1, vec![42]), (2, vec![7, 8])]);
        assert_eq!(found, vec![PlannedWorkload::fixed("pid 42", vec![1]), PlannedWorkload::fixed("pids 7,8", vec![2])]);
    }

    #[test]
    fn recorded_workloads_sharing_a_gpu_are_planned_as_one_and_the_rest_fall_back() {
        let recorded = [
            Recorded { id: "a".into(), gpus: vec![0], freq_sensitivity: Some(0.2) },
            Recorded { id: "b".into(), gpus: vec![2], freq_sensitivity: None },
            Recorded { id: "c".into(), gpus: vec![0, 2], freq_sensitivity: Some(0.5) },
            Recorded { id: "npu-only".into(), gpus: vec![], freq_sensitivity: None },
            Recorded { id: "d".into(), gpus: vec![3], freq_sensitivity: None },
        ];
        let pids = [(0, vec![10]), (1, vec![11]), (2, vec![]), (3, vec![12]), (4, vec![])];
        let host = Host { recorded: &recorded, gpu_pids: &pids };
        let got = host.workloads().unwrap();
        assert_eq!(
            got,
            vec![
                PlannedWorkload { freq_sensitivity: Some(0.5), ..PlannedWorkload::fixed("a+b+c", vec![0, 2]) },
                PlannedWorkload::fixed("d", vec![3]),
                PlannedWorkload::fixed("pid 11", vec![1]),
            ]
        );
    }

    #[test]
    fn launch_environment() {
        assert_eq!(
            launch_env(&[2, 3]),
            vec![("CUDA_VISIBLE_DEVICES".into(), "2,3".into()), ("VGPU_NUM_GPUS".into(), "2".into())]
        );
    }
}
