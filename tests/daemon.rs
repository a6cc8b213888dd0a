//! `vgpu watch` and what runs under it, end to end: the enforcer (memory and compute
//! quotas outside the shim, offences judged per workload, nothing a local user does stalls
//! it), its history and metrics, the watch as a systemd daemon, monitoring commands for
//! every user, and services (`vgpu service`, replicas scaled and restarted by the watch).
//! They run the real `vgpu` binary against the simulated driver (`common::Sim`, and
//! `common::watch::Watch` for a watch in the background); they need root.
//!
//! An area of the integration harness (tests/integration.rs): each file of tests/daemon/ is
//! a module here. This area: `cargo test --test integration daemon::`; one file's tests:
//! `cargo test --test integration daemon::watch_memory::`.


#[path = "daemon/watch_memory.rs"]
mod watch_memory;
#[path = "daemon/watch_compute.rs"]
mod watch_compute;
#[path = "daemon/watch_offences.rs"]
mod watch_offences;
#[path = "daemon/watch_stall.rs"]
mod watch_stall;
#[path = "daemon/watch_history.rs"]
mod watch_history;
#[path = "daemon/watch_metrics.rs"]
mod watch_metrics;
#[path = "daemon/watch_daemon.rs"]
mod watch_daemon;
#[path = "daemon/watch_inventory.rs"]
mod watch_inventory;
#[path = "daemon/monitoring.rs"]
mod monitoring;
#[path = "daemon/service_cli.rs"]
mod service_cli;
#[path = "daemon/service_run.rs"]
mod service_run;
