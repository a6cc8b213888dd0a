//! vgpu as a library: everything the `vgpu` binary does. The modules the binary, the
//! integration tests, the benchmarks and the fuzz targets use are `pub`; the rest is
//! `pub(crate)`.

pub(crate) mod access;
pub mod admission;
pub mod audit;
pub mod carbon;
pub mod cgroup;
pub mod cli;
pub(crate) mod clock;
pub mod commands;
pub(crate) mod compute;
pub mod config;
pub mod context;
pub mod error;
pub mod fdlimit;
pub mod gpu;
pub mod history;
pub mod identity;
pub(crate) mod launch;
pub(crate) mod lifecycle;
pub mod listing;
pub mod metrics;
pub mod output;
pub(crate) mod paths;
pub(crate) mod policy;
pub mod pool;
pub mod pool_effects;
pub(crate) mod read_only;
pub(crate) mod recovery;
pub(crate) mod repair;
pub(crate) mod resize;
pub mod service;
pub mod state;
pub(crate) mod stop_point;
pub(crate) mod supervise;
pub mod suspension;
pub mod watch;
pub mod workload_file;
