//! The pool's devices and their block numbering (SPEC 1.2).
//!
//! Blocks are numbered from 1, contiguously over the node. The node is split into regions
//! by kind in the order gpu, npu, fpga; within the GPU region NVML's GPUs come first (by
//! NVML index), then GPUs declared in the config; within every region declared devices keep
//! their order in the config file. A device is worth `floor(tflops / block_tflops)` blocks:
//! never promise compute that is not there.

use serde::{Deserialize, Serialize};

use super::config::{PoolConfig, TflopsSource};
use super::error::PoolError;
use super::kind::{DeviceKind, KindFilter};

/// A GPU as NVML reports it: all the pool needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
}

/// Where a device comes from, and how a workload learns which one it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum DeviceOrigin {
    /// A GPU NVML sees: the workload gets it through `CUDA_VISIBLE_DEVICES` and the shim.
    Nvml { index: u32, uuid: String },
    /// A `[[pool.device]]` table: the workload gets `id` in the variable `env`, if set.
    Declared { id: Option<String>, env: Option<String> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub kind: DeviceKind,
    pub name: String,
    #[serde(flatten)]
    pub origin: DeviceOrigin,
    pub tflops: f64,
    pub tflops_source: TflopsSource,
    /// How many blocks the device is worth.
    pub blocks: u64,
    /// The number of its first block; its blocks are `first_block ..= last_block()`.
    pub first_block: u64,
}

impl Device {
    /// The block numbers of this device, or `None` when it is worth no block.
    pub fn range(&self) -> Option<(u64, u64)> {
        (self.blocks > 0).then(|| (self.first_block, self.first_block + self.blocks - 1))
    }

    /// The identity that survives a restart: the UUID, or the declared id or name.
    pub fn key(&self) -> String {
        match &self.origin {
            DeviceOrigin::Nvml { uuid, .. } => format!("nvml:{uuid}"),
            DeviceOrigin::Declared { id, .. } => format!("{}:{}", self.kind, id.as_deref().unwrap_or(&self.name)),
        }
    }

    pub fn uuid(&self) -> Option<&str> {
        match &self.origin {
            DeviceOrigin::Nvml { uuid, .. } => Some(uuid),
            DeviceOrigin::Declared { .. } => None,
        }
    }
}

/// A contiguous run of blocks of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Region {
    pub kind: DeviceKind,
    pub first: u64,
    pub last: u64,
}

/// Every device of the node, in block order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub block_tflops: f64,
    pub devices: Vec<Device>,
}

impl Inventory {
    /// The node's devices: NVML's GPUs (with their TFLOPS from the config, else the
    /// built-in table) and the config's declared devices. An NVML GPU of unknown model is
    /// an error telling the user how to declare its TFLOPS.
    pub fn build(gpus: &[NvmlGpu], config: &PoolConfig) -> Result<Inventory, PoolError> {
        config.validate()?;
        let mut gpus: Vec<&NvmlGpu> = gpus.iter().collect();
        gpus.sort_by_key(|g| g.index);
        let mut devices = Vec::with_capacity(gpus.len() + config.devices.len());
        for gpu in gpus {
            let (tflops, tflops_source) = match config.gpu_override(&gpu.name, &gpu.uuid) {
                Some(found) => found,
                None => match crate::tflops::peak_tflops(&gpu.name) {
                    Some(t) => (t, TflopsSource::Table),
                    None => return Err(PoolError::UnknownGpuModel { name: gpu.name.clone(), uuid: gpu.uuid.clone() }),
                },
            };
            devices.push(Device {
                kind: DeviceKind::Gpu,
                name: gpu.name.clone(),
                origin: DeviceOrigin::Nvml { index: gpu.index, uuid: gpu.uuid.clone() },
                tflops,
                tflops_source,
                blocks: 0,
                first_block: 0,
            });
        }
        for declared in &config.devices {
            devices.push(Device {
                kind: declared.kind,
                name: declared.name.clone(),
                origin: DeviceOrigin::Declared { id: declared.id.clone(), env: declared.env.clone() },
                tflops: declared.tflops,
                tflops_source: TflopsSource::Declared,
                blocks: 0,
                first_block: 0,
            });
        }
        Ok(Inventory::number(config.block_tflops, devices))
    }

    /// Order devices into regions (stable within a kind) and number their blocks from 1.
    pub fn number(block_tflops: f64, mut devices: Vec<Device>) -> Inventory {
        devices.sort_by_key(|d| d.kind);
        let mut next = 1;
        for device in &mut devices {
            device.blocks = blocks_in(device.tflops, block_tflops);
            device.first_block = next;
            next += device.blocks;
        }
        Inventory { block_tflops, devices }
    }

    pub fn total_blocks(&self) -> u64 {
        self.devices.iter().map(|d| d.blocks).sum()
    }

    /// The indices of the devices a request of `kind` may use.
    pub fn eligible(&self, kind: KindFilter) -> Vec<usize> {
        (0..self.devices.len()).filter(|&i| kind.admits(self.devices[i].kind)).collect()
    }

    /// The regions: one per kind present, in block order.
    pub fn regions(&self) -> Vec<Region> {
        let mut regions: Vec<Region> = Vec::new();
        for device in &self.devices {
            let Some((first, last)) = device.range() else { continue };
            match regions.last_mut() {
                Some(r) if r.kind == device.kind => r.last = last,
                _ => regions.push(Region { kind: device.kind, first, last }),
            }
        }
        regions
    }

    /// The device holding block `number`.
    pub fn device_of_block(&self, number: u64) -> Option<usize> {
        self.devices.iter().position(|d| d.range().is_some_and(|(first, last)| (first..=last).contains(&number)))
    }
}

/// Whole blocks in `tflops`; the small slack absorbs decimal noise (18.0 / 0.1 is 179.99…).
pub fn blocks_in(tflops: f64, block_tflops: f64) -> u64 {
    if !(tflops.is_finite() && block_tflops.is_finite() && tflops > 0.0 && block_tflops > 0.0) {
        return 0;
    }
    // `as` saturates on overflow, which is what a device of absurd size deserves.
    (tflops / block_tflops + 1e-9).floor() as u64
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::DeclaredDevice;

    pub(crate) fn declared(kind: DeviceKind, name: &str, tflops: f64) -> DeclaredDevice {
        DeclaredDevice { kind, name: name.into(), tflops, id: None, env: None }
    }

    /// SPEC 1.2's node 0: two GPUs of 18T in all, an NPU of 20T, an FPGA of 25T, declared
    /// in a scrambled order.
    pub(crate) fn node0() -> Inventory {
        let config = PoolConfig {
            devices: vec![
                declared(DeviceKind::Fpga, "fpga0", 25.0),
                declared(DeviceKind::Gpu, "gpu0", 8.0),
                declared(DeviceKind::Npu, "npu0", 20.0),
                declared(DeviceKind::Gpu, "gpu1", 10.0),
            ],
            ..PoolConfig::default()
        };
        Inventory::build(&[], &config).unwrap()
    }

    #[test]
    fn spec_node0_numbering() {
        let inv = node0();
        let names: Vec<&str> = inv.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu0", "gpu1", "npu0", "fpga0"]);
        let ranges: Vec<_> = inv.devices.iter().map(|d| d.range().unwrap()).collect();
        assert_eq!(ranges, [(1, 8), (9, 18), (19, 38), (39, 63)]);
        assert_eq!(
            inv.regions(),
            [
                Region { kind: DeviceKind::Gpu, first: 1, last: 18 },
                Region { kind: DeviceKind::Npu, first: 19, last: 38 },
                Region { kind: DeviceKind::Fpga, first: 39, last: 63 },
            ]
        );
        assert_eq!(inv.total_blocks(), 63);
        assert_eq!(inv.device_of_block(50), Some(3));
        assert_eq!(inv.device_of_block(64), None);
    }

    #[test]
    fn nvml_gpus_come_first_with_table_or_config_figures() {
        let gpus = [
            NvmlGpu { index: 1, uuid: "GPU-b".into(), name: "Tesla T4".into() },
            NvmlGpu { index: 0, uuid: "GPU-a".into(), name: "NVIDIA L4".into() },
        ];
        let mut config = PoolConfig { devices: vec![declared(DeviceKind::Gpu, "other", 5.0)], ..PoolConfig::default() };
        config.uuid_tflops.insert("GPU-b".into(), 60.0);
        let inv = Inventory::build(&gpus, &config).unwrap();
        let summary: Vec<_> = inv.devices.iter().map(|d| (d.name.as_str(), d.blocks, d.tflops_source)).collect();
        assert_eq!(
            summary,
            [
                ("NVIDIA L4", 121, TflopsSource::Table),
                ("Tesla T4", 60, TflopsSource::UuidOverride),
                ("other", 5, TflopsSource::Declared)
            ]
        );
        assert_eq!(inv.devices[1].key(), "nvml:GPU-b");
        assert_eq!(inv.devices[2].key(), "gpu:other");
    }

    #[test]
    fn unknown_gpu_model_asks_for_an_override() {
        let gpus = [NvmlGpu { index: 0, uuid: "GPU-z".into(), name: "NVIDIA Mystery".into() }];
        let err = Inventory::build(&gpus, &PoolConfig::default()).unwrap_err();
        assert_eq!(err, PoolError::UnknownGpuModel { name: "NVIDIA Mystery".into(), uuid: "GPU-z".into() });
        assert!(err.to_string().contains("[pool.tflops] \"NVIDIA Mystery\""), "{err}");
        let mut config = PoolConfig::default();
        config.tflops.insert("NVIDIA Mystery".into(), 42.0);
        assert_eq!(Inventory::build(&gpus, &config).unwrap().total_blocks(), 42);
    }

    #[test]
    fn block_unit_rounds_down() {
        assert_eq!(blocks_in(18.0, 0.1), 180);
        assert_eq!(blocks_in(2.5, 1.0), 2);
        assert_eq!(blocks_in(0.5, 1.0), 0);
        assert_eq!(blocks_in(f64::NAN, 1.0), 0);
        assert_eq!(blocks_in(989.5, 2.0), 494);
    }
}
