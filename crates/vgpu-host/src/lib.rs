//! This host's effects: the root config, the context (paths, NVML), launching workloads, their lifecycle and recovery, suspension, the pool's effects, carbon's effects (apply, profile, report).

pub mod carbon;
pub mod config;
pub mod context;
pub mod fdlimit;
pub mod launch;
pub mod lifecycle;
pub mod listing;
pub mod notice;
pub mod paths;
pub mod policy;
pub mod pool_effects;
pub mod recovery;
pub mod repair;
pub mod slurm;
pub mod suspension;
pub mod workload_file;
