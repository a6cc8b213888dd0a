//! A snapshot of one GPU for listings (`vgpu devices`) and decisions (admission, pool).

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    #[serde(rename = "memory_total_bytes")]
    pub memory_total: u64,
    #[serde(rename = "memory_used_bytes")]
    pub memory_used: u64,
    /// Current and maximum SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    /// Power draw and enforced limit, watts.
    pub power_draw_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    /// GPU utilization, percent.
    pub utilization_pct: Option<u32>,
    pub processes: Vec<GpuProcess>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// Device memory the driver says the process holds (None: not reported).
    #[serde(rename = "memory_used_bytes")]
    pub memory_used: Option<u64>,
}

/// Read what NVML offers; optional readings that the device does not support are `None`
/// rather than a failure of the whole listing.
pub fn snapshot(device: &Device<'_>, index: u32) -> Result<GpuInfo, NvmlError> {
    let identity = identity(device, index)?;
    let processes = optional(device.running_compute_processes())
        .unwrap_or_default()
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            memory_used: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            },
        })
        .collect();
    Ok(GpuInfo {
        sm_clock_mhz: optional(device.clock_info(Clock::SM)),
        sm_clock_max_mhz: optional(device.max_clock_info(Clock::SM)),
        power_draw_w: optional(device.power_usage()).map(milliwatts),
        power_limit_w: optional(device.enforced_power_limit()).map(milliwatts),
        utilization_pct: optional(device.utilization_rates()).map(|u| u.gpu),
        processes,
        ..identity
    })
}

/// The GPU's index, UUID, name and memory only: what admitting a workload reads. The
/// readings [`snapshot`] adds are `None` and the process list empty. Each is a driver call
/// (the process list one of the slowest) that no admission decision depends on.
pub fn identity(device: &Device<'_>, index: u32) -> Result<GpuInfo, NvmlError> {
    let memory = device.memory_info()?;
    Ok(GpuInfo::identified(index, device.uuid()?, device.name()?, memory.total, memory.used))
}

impl GpuInfo {
    /// A GPU known by its identity and memory alone, without readings.
    pub fn identified(index: u32, uuid: String, name: String, memory_total: u64, memory_used: u64) -> GpuInfo {
        GpuInfo {
            index,
            uuid,
            name,
            memory_total,
            memory_used,
            sm_clock_mhz: None,
            sm_clock_max_mhz: None,
            power_draw_w: None,
            power_limit_w: None,
            utilization_pct: None,
            processes: Vec::new(),
        }
    }
}

fn milliwatts(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

fn optional<T>(result: Result<T, NvmlError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::debug!("NVML reading unavailable: {e}");
            None
        }
    }
}
