//! The `[pool]` table of the config file.
//!
//! ```toml
//! [pool]
//! block_tflops = 1.0                       # the unit: TFLOPS per block
//!
//! [pool.tflops]                            # per GPU model (the name NVML reports)
//! "NVIDIA H100 80GB HBM3" = 989
//!
//! [pool.uuid_tflops]                       # per GPU; wins over the model figure
//! "GPU-5d4c…" = 900
//!
//! [[pool.device]]                          # a device NVML cannot see
//! kind = "npu"                             # gpu, npu or fpga
//! name = "Ascend 910B"
//! tflops = 320                             # required
//! id = "0"                                 # optional: its identity for the workload …
//! env = "ASCEND_RT_VISIBLE_DEVICES"        # … in this variable (comma-joined if several)
//! ```
//!
//! Values are checked while the file is parsed, so a bad value is reported with the file
//! and line like every other config error.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

use super::error::PoolError;
use super::kind::DeviceKind;

pub const DEFAULT_BLOCK_TFLOPS: f64 = 1.0;

/// The smallest block: 1 GFLOPS. Smaller blocks only make the block map (and `vgpu pool`)
/// enormous; a device's block count is its TFLOPS / block_tflops.
pub const MIN_BLOCK_TFLOPS: f64 = 0.001;

/// The largest block: 10 000 TFLOPS, several times the largest accelerator; a block larger
/// than every device would make the pool empty.
pub const MAX_BLOCK_TFLOPS: f64 = 10_000.0;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawPoolConfig")]
pub struct PoolConfig {
    /// TFLOPS per block.
    pub block_tflops: f64,
    /// Peak TFLOPS by GPU model name, over the built-in table.
    pub tflops: BTreeMap<String, f64>,
    /// Peak TFLOPS by GPU UUID, over the model figures.
    pub uuid_tflops: BTreeMap<String, f64>,
    /// Devices declared in the config (`[[pool.device]]`), in file order.
    pub devices: Vec<DeclaredDevice>,
}

/// A `[[pool.device]]` table: an accelerator vgpu accounts for but does not drive.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredDevice {
    pub kind: DeviceKind,
    pub name: String,
    pub tflops: f64,
    /// Its identity as the workload should see it (default: its name).
    pub id: Option<String>,
    /// The environment variable that carries `id` to a workload holding blocks on it.
    pub env: Option<String>,
}

impl DeclaredDevice {
    /// What identifies the device across runs: its id, else its name.
    pub fn key(&self) -> &str {
        self.id.as_deref().unwrap_or(&self.name)
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            block_tflops: DEFAULT_BLOCK_TFLOPS,
            tflops: BTreeMap::new(),
            uuid_tflops: BTreeMap::new(),
            devices: Vec::new(),
        }
    }
}

/// Where a device's TFLOPS figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TflopsSource {
    /// The built-in table (`gpu::tflops`).
    Table,
    /// `[pool.tflops]`, by model name.
    ModelOverride,
    /// `[pool.uuid_tflops]`, by UUID.
    UuidOverride,
    /// A `[[pool.device]]` table.
    Declared,
}

impl PoolConfig {
    /// Check every value; parsing does this already, call it for a config built in code.
    pub fn validate(&self) -> Result<(), PoolError> {
        if !(self.block_tflops.is_finite() && (MIN_BLOCK_TFLOPS..=MAX_BLOCK_TFLOPS).contains(&self.block_tflops)) {
            return Err(PoolError::InvalidBlockTflops { value: self.block_tflops, min: MIN_BLOCK_TFLOPS, max: MAX_BLOCK_TFLOPS });
        }
        for (table, map) in [("tflops", &self.tflops), ("uuid_tflops", &self.uuid_tflops)] {
            for (key, &value) in map {
                positive(value)
                    .ok_or_else(|| PoolError::InvalidConfigTflops { key: format!("{table}.{key:?}"), value })?;
            }
        }
        let mut keys = HashSet::new();
        for device in &self.devices {
            positive(device.tflops)
                .ok_or_else(|| PoolError::InvalidDeviceTflops { name: device.name.clone(), value: device.tflops })?;
            if !keys.insert((device.kind, device.key())) {
                return Err(PoolError::DuplicateDevice(device.key().to_string()));
            }
        }
        Ok(())
    }

    /// The configured figure for an NVML GPU: by UUID, else by model name (exact, then
    /// ignoring case and surrounding spaces).
    pub fn gpu_override(&self, name: &str, uuid: &str) -> Option<(f64, TflopsSource)> {
        if let Some(&t) = self.uuid_tflops.get(uuid) {
            return Some((t, TflopsSource::UuidOverride));
        }
        if let Some(&t) = self.tflops.get(name) {
            return Some((t, TflopsSource::ModelOverride));
        }
        let name = name.trim();
        self.tflops
            .iter()
            .find(|(model, _)| model.trim().eq_ignore_ascii_case(name))
            .map(|(_, &t)| (t, TflopsSource::ModelOverride))
    }
}

fn positive(value: f64) -> Option<f64> {
    (value.is_finite() && value > 0.0).then_some(value)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawPoolConfig {
    block_tflops: f64,
    tflops: BTreeMap<String, f64>,
    uuid_tflops: BTreeMap<String, f64>,
    device: Vec<RawDevice>,
}

impl Default for RawPoolConfig {
    fn default() -> Self {
        RawPoolConfig {
            block_tflops: DEFAULT_BLOCK_TFLOPS,
            tflops: BTreeMap::new(),
            uuid_tflops: BTreeMap::new(),
            device: Vec::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    kind: DeviceKind,
    name: String,
    tflops: Option<f64>,
    id: Option<String>,
    env: Option<String>,
}

impl TryFrom<RawPoolConfig> for PoolConfig {
    type Error = PoolError;

    fn try_from(raw: RawPoolConfig) -> Result<Self, PoolError> {
        let devices = raw
            .device
            .into_iter()
            .map(|d| {
                let tflops = d.tflops.ok_or_else(|| PoolError::DeviceWithoutTflops { name: d.name.clone() })?;
                Ok(DeclaredDevice { kind: d.kind, name: d.name, tflops, id: d.id, env: d.env })
            })
            .collect::<Result<Vec<_>, PoolError>>()?;
        let config =
            PoolConfig { block_tflops: raw.block_tflops, tflops: raw.tflops, uuid_tflops: raw.uuid_tflops, devices };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// A config file with only the `[pool]` table, read as the root config
    /// (`vgpu_host::config::Config`) reads it; the root's own tests parse whole files.
    #[derive(Debug, serde::Deserialize)]
    struct Config {
        #[serde(default)]
        pool: PoolConfig,
    }

    impl Config {
        fn parse(text: &str) -> Result<Config, String> {
            toml::from_str(text).map_err(|e| e.to_string())
        }
    }

    #[test]
    fn the_whole_table_parses() {
        let config = Config::parse(
            r#"
            [pool]
            block_tflops = 2.0
            [pool.tflops]
            "NVIDIA H100 80GB HBM3" = 989
            [pool.uuid_tflops]
            "GPU-1234" = 500.5
            [[pool.device]]
            kind = "npu"
            name = "Ascend 910B"
            tflops = 320
            id = "0"
            env = "ASCEND_RT_VISIBLE_DEVICES"
            [[pool.device]]
            kind = "fpga"
            name = "Alveo U280"
            tflops = 24.5
            "#,
        )
        .unwrap();
        let pool = config.pool;
        assert_eq!(pool.block_tflops, 2.0);
        assert_eq!(pool.gpu_override("NVIDIA H100 80GB HBM3", "GPU-x"), Some((989.0, TflopsSource::ModelOverride)));
        assert_eq!(pool.gpu_override("nvidia h100 80gb hbm3 ", "GPU-x"), Some((989.0, TflopsSource::ModelOverride)));
        assert_eq!(pool.gpu_override("NVIDIA H100 80GB HBM3", "GPU-1234"), Some((500.5, TflopsSource::UuidOverride)));
        assert_eq!(pool.gpu_override("Tesla T4", "GPU-x"), None);
        assert_eq!(pool.devices.len(), 2);
        assert_eq!(pool.devices[0].kind, DeviceKind::Npu);
        assert_eq!(pool.devices[0].env.as_deref(), Some("ASCEND_RT_VISIBLE_DEVICES"));
        assert_eq!(pool.devices[1].key(), "Alveo U280");
    }

    #[test]
    fn defaults() {
        let pool = Config::parse("").unwrap().pool;
        assert_eq!(pool, PoolConfig::default());
        assert_eq!(Config::parse("[pool]\n").unwrap().pool.block_tflops, 1.0);
    }

    #[test]
    fn a_device_without_tflops_is_an_error_naming_it() {
        let err = Config::parse("[[pool.device]]\nkind = \"npu\"\nname = \"npu0\"\n").unwrap_err();
        assert!(err.contains("\"npu0\"") && err.contains("no TFLOPS"), "{err}");
    }

    #[test]
    fn bad_values_are_errors() {
        for (text, needle) in [
            ("[pool]\nblock_tflops = 0.0\n", "block_tflops"),
            ("[pool]\nblock_tflops = -1.0\n", "block_tflops"),
            ("[pool]\nblock_tflops = nan\n", "block_tflops"),
            ("[pool]\nblock_tflops = 1e-300\n", "block_tflops"),
            ("[pool]\nblock_tflops = 0.0009\n", "block_tflops"),
            ("[pool]\nblock_tflops = 1e6\n", "block_tflops"),
            ("[pool.tflops]\n\"NVIDIA L4\" = 0\n", "NVIDIA L4"),
            ("[pool.uuid_tflops]\n\"GPU-1\" = -3\n", "GPU-1"),
            ("[[pool.device]]\nkind = \"tpu\"\nname = \"x\"\ntflops = 1\n", "unknown device kind"),
            ("[[pool.device]]\nkind = \"npu\"\nname = \"x\"\ntflops = -1\n", "\"x\""),
            ("[[pool.device]]\nkind = \"npu\"\nname = \"x\"\ntflops = 1\ncolor = 1\n", "color"),
            ("[pool]\nblocks = 1\n", "blocks"),
            (
                concat!(
                    "[[pool.device]]\nkind = \"npu\"\nname = \"x\"\ntflops = 1\n",
                    "[[pool.device]]\nkind = \"npu\"\nname = \"x\"\ntflops = 2\n",
                ),
                "twice",
            ),
        ] {
            let err = Config::parse(text).expect_err(text);
            assert!(err.contains(needle), "{text:?} gave {err:?}");
        }
    }
}
