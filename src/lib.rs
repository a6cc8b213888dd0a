//! vgpu as a library: everything the `vgpu` binary does, in modules the tests can reach.

pub mod access;
pub mod admission;
pub mod audit;
pub mod carbon;
pub mod cgroup;
pub mod cli;
pub mod commands;
pub mod compute;
pub mod config;
pub mod context;
pub mod error;
pub mod gpu;
pub mod identity;
pub mod lifecycle;
pub mod listing;
pub mod output;
pub mod paths;
pub mod policy;
pub mod pool;
pub mod pooling;
pub mod recovery;
pub mod repair;
pub mod state;
pub mod stop_point;
pub mod supervise;
pub mod watch;
