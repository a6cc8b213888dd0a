//! The pool as `vgpu pool` shows it; its JSON form (`--json`) is stable for scripts.
//!
//! Block ranges are inclusive `[first, last]` pairs of block numbers; neighbouring ranges
//! are merged, also across device boundaries (a workload on blocks 1–18 of the GPUs and
//! 19–38 of the NPU holds `[1, 38]`).

use std::collections::HashMap;

use serde::Serialize;

use crate::config::TflopsSource;
use crate::inventory::{DeviceOrigin, Region};
use crate::kind::{DeviceKind, KindFilter};
use crate::state::{AllocState, Pool};
use vgpu_json::SuspendedReason;
use vgpu_json::WorkloadRef;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolView {
    pub block_tflops: f64,
    /// What the built-in TFLOPS figures measure.
    pub tflops_precision: &'static str,
    pub total_blocks: u64,
    pub used_blocks: u64,
    pub free_blocks: u64,
    pub regions: Vec<Region>,
    pub devices: Vec<DeviceView>,
    /// Oldest first.
    pub allocations: Vec<AllocationView>,
    pub free: Vec<[u64; 2]>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceView {
    pub kind: DeviceKind,
    pub name: String,
    /// NVML GPUs: their UUID and NVML index.
    #[serde(rename = "gpu_uuid")]
    pub uuid: Option<String>,
    #[serde(rename = "gpu_index")]
    pub nvml_index: Option<u32>,
    /// Declared devices: their id.
    pub id: Option<String>,
    pub tflops: f64,
    pub tflops_source: TflopsSource,
    pub blocks: u64,
    /// `[first, last]`; absent for a device worth no block.
    pub range: Option<[u64; 2]>,
    pub free_blocks: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocationView {
    pub id: String,
    pub name: String,
    pub priority: i32,
    pub state: AllocState,
    pub kind: KindFilter,
    /// Blocks requested (held while running, held again on resuming).
    pub blocks: u64,
    /// Blocks held now; empty unless running.
    pub ranges: Vec<[u64; 2]>,
    /// Device positions (into the view's `devices`) of its blocks; kept while suspended.
    #[serde(rename = "device_indexes")]
    pub devices: Vec<usize>,
    /// `preempted` while a higher-priority workload holds its blocks.
    pub suspended_reason: Option<SuspendedReason>,
    /// That workload.
    pub suspended_by: Option<WorkloadRef>,
}

impl Pool {
    pub fn view(&self) -> PoolView {
        let mut owned: HashMap<u64, Vec<[u64; 2]>> = HashMap::new();
        let mut free = Vec::new();
        for (device, runs) in self.inventory.devices.iter().zip(self.map.devices()) {
            let mut at = device.first_block;
            for run in runs.runs() {
                let range = [at, at + run.len - 1];
                at += run.len;
                let ranges = match run.owner {
                    Some(owner) => owned.entry(owner).or_default(),
                    None => &mut free,
                };
                push_merged(ranges, range);
            }
        }
        PoolView {
            block_tflops: self.inventory.block_tflops,
            tflops_precision: crate::tflops::PRECISION,
            total_blocks: self.total_blocks(),
            used_blocks: self.used_blocks(),
            free_blocks: self.free_blocks(),
            regions: self.inventory.regions(),
            devices: self
                .inventory
                .devices
                .iter()
                .zip(self.map.devices())
                .map(|(d, runs)| {
                    let (uuid, nvml_index, id) = match &d.origin {
                        DeviceOrigin::Nvml { index, uuid } => (Some(uuid.clone()), Some(*index), None),
                        DeviceOrigin::Declared { id, .. } => (None, None, id.clone()),
                    };
                    DeviceView {
                        kind: d.kind,
                        name: d.name.clone(),
                        uuid,
                        nvml_index,
                        id,
                        tflops: d.tflops,
                        tflops_source: d.tflops_source,
                        blocks: d.blocks,
                        range: d.range().map(|(a, b)| [a, b]),
                        free_blocks: runs.free(),
                    }
                })
                .collect(),
            allocations: self
                .allocations
                .values()
                .map(|a| AllocationView {
                    id: a.id.clone(),
                    name: a.name.clone(),
                    priority: a.priority.get(),
                    state: a.state,
                    kind: a.kind,
                    blocks: a.blocks,
                    ranges: owned.remove(&a.seq).unwrap_or_default(),
                    devices: a.shares.iter().map(|s| s.device).collect(),
                    suspended_reason: a.preempted_by.as_ref().map(|_| SuspendedReason::Preempted),
                    suspended_by: a
                        .preempted_by
                        .as_ref()
                        .map(|by| WorkloadRef { id: by.clone(), name: self.allocation(by).map(|b| b.name.clone()).unwrap_or_else(|| by.clone()) }),
                })
                .collect(),
            free,
        }
    }
}

fn push_merged(ranges: &mut Vec<[u64; 2]>, range: [u64; 2]) {
    match ranges.last_mut() {
        Some(last) if last[1] + 1 == range[0] => last[1] = range[1],
        _ => ranges.push(range),
    }
}
