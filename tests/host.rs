//! Running workloads on one host, end to end: `vgpu run` and its security rules and edge
//! cases, `ps`, `suspend`/`resume`/`kill`, live resize, the compute pool and the compute
//! governor, suspension that releases device memory, crash consistency and damaged state,
//! tenants against each other and against sudo, the cgroup layer and managers on this
//! machine's real cgroups, `devices` and `doctor`. Most tests run the real `vgpu` binary
//! against the simulated driver (`common::Sim`); they need root.
//!
//! An area of the integration harness (tests/integration.rs): each file of tests/host/ is
//! a module here. This area: `cargo test --test integration host::`; one file's tests:
//! `cargo test --test integration host::run_edges::`.


#[path = "host/run.rs"]
mod run;
#[path = "host/run_edges.rs"]
mod run_edges;
#[path = "host/run_policy.rs"]
mod run_policy;
#[path = "host/resize.rs"]
mod resize;
#[path = "host/pool.rs"]
mod pool;
#[path = "host/compute.rs"]
mod compute;
#[path = "host/turns.rs"]
mod turns;
#[path = "host/compute_cli.rs"]
mod compute_cli;
#[path = "host/suspend_memory.rs"]
mod suspend_memory;
#[path = "host/state_safety.rs"]
mod state_safety;
#[path = "host/crash_consistency.rs"]
mod crash_consistency;
#[path = "host/damaged_state.rs"]
mod damaged_state;
#[path = "host/tenant_isolation.rs"]
mod tenant_isolation;
#[path = "host/sudo_caller.rs"]
mod sudo_caller;
#[path = "host/board_security.rs"]
mod board_security;
#[path = "host/cgroup_real.rs"]
mod cgroup_real;
#[path = "host/systemd_cgroup.rs"]
mod systemd_cgroup;
#[path = "host/foundation.rs"]
mod foundation;
