//! The daemon pieces: `vgpu watch` (the enforcer), its audits, the metrics endpoint, the service runner.

pub mod audit;
pub mod event;
pub mod metrics;
pub mod service;
pub mod watch;
