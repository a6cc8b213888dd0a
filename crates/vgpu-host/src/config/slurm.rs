//! The `[slurm]` table of the config file: how a Slurm job step's shards become a vGPU
//! (`spank_vgpu.so`, `vgpu slurm conf`).
//!
//! ```toml
//! [slurm]
//! shards_per_gpu = 8   # the shards each GPU is split into (gres.conf Name=shard Count=)
//! ```
//!
//! A step that holds S shards of a GPU split into `shards_per_gpu` gets S / shards_per_gpu
//! of that GPU's memory and of its compute (spread evenly over the step's GPUs when it
//! holds several).

use serde::Deserialize;

pub const DEFAULT_SHARDS_PER_GPU: u32 = 8;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Shards per GPU: what `vgpu slurm conf` declares and what a shard is worth.
    pub shards_per_gpu: u32,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig { shards_per_gpu: DEFAULT_SHARDS_PER_GPU }
    }
}

impl SlurmConfig {
    /// Whether the table can be used: at least 1 and at most 1000 shards per GPU.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1000).contains(&self.shards_per_gpu) {
            return Err(format!("[slurm] shards_per_gpu must be between 1 and 1000, got {}", self.shards_per_gpu));
        }
        Ok(())
    }
}
