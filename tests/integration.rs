//! vgpu end to end, in one test executable (ripgrep's layout): the real `vgpu` binary, the
//! shim and the simulated driver, real cgroups, a real systemd in containers and a real
//! Slurm. Each area is a module (its file says what it covers), each file of its folder a
//! module of it:
//!
//! - `host` (tests/host.rs, tests/host/): running workloads on one host;
//! - `daemon` (tests/daemon.rs, tests/daemon/): `vgpu watch` and what runs under it;
//! - `carbon` (tests/carbon.rs, tests/carbon/): carbon budgets, end to end;
//! - `cli` (tests/cli.rs, tests/cli/): the command line's conventions, its documentation,
//!   the JSON contract, the architecture's rules, the PyPI clients;
//! - `systemd` (tests/systemd.rs, tests/systemd/): vgpu under a real systemd;
//! - `slurm` (tests/slurm.rs, tests/slurm/): vgpu as a real Slurm's GPU fence.
//!
//! One executable, so a change to vgpu links it once, and the areas' tests share the test
//! threads (`RUST_TEST_THREADS`, .cargo/config.toml): while one area's last slow tests run,
//! the others' fill the threads, where six executables in a row each waited for its own
//! slowest. The tests that measure time or rates run one at a time and ahead of the others on
//! the CPU (`common::serial()`: nice -15).
//! One area: `cargo test --test integration daemon::`; one file:
//! `cargo test --test integration daemon::watch_memory::`.

mod common;

mod carbon;
mod cli;
mod daemon;
mod host;
mod slurm;
mod systemd;
