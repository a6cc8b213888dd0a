//! The shim's integration tests, in one test executable (`cargo test -p vgpu-shim --test
//! shim`; a test is named `MODULE::TEST`). Each module is one file beside this one, and all
//! share the bench in `common/`: the simulated driver installed as libcuda/libnvidia-ml, a
//! vGPU directory, the built `libvgpu.so` preloaded into C programs from `c/`.
//!
//! - `paths`: every allocation path through every way programs reach the driver.
//! - `launches`: every launch path, governed and reaching the driver once.
//! - `panics`: injected panics never call the driver twice nor miscount.
//! - `modes`: pass-through, fail-closed, nothing at load time, `RTLD_NEXT`, devices by UUID.
//! - `sharing`: threads, a forked child and killed processes sharing one quota.
//! - `reclaim`: refusals never caused by dead processes (killed, zombies, registered late);
//!   processes killed at each step of their registration.
//!
//! Every test runs its programs in child processes: nothing here loads the shim or the
//! driver into the test process, so the modules share one executable.

mod common;

mod launches;
mod modes;
mod panics;
mod paths;
mod reclaim;
mod sharing;
