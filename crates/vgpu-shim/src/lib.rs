//! `libvgpu.so`, loaded with `LD_PRELOAD` into a workload: enforces its vGPU's GPU-memory
//! quota, shared by all processes of the vGPU, from inside the CUDA process.
//!
//! - [`interpose`]: how calls reach the shim (exports, `dlsym`, `cuGetProcAddress`).
//! - [`governed`]: THE list of governed functions (expanded into their exports and the
//!   `dlsym`/`cuGetProcAddress` table by `interpose`, into their real-driver slots by `real`).
//! - [`hooks`]: what each governed function does around the driver call.
//! - [`governor`]: the memory accounting on the vGPU's shared usage file (the protocol
//!   itself lives in `vgpu_abi::usage`, shared with the `vgpu` CLI) and the compute governor.
//! - [`config`] / [`state`] / `fork`: which vGPU, this process's state file, fork handling.
//!
//! Nothing runs at load time: no constructor, no allocation, no driver call. Design notes:
//! `crates/vgpu-shim/README.md`.
//!
//! # Layers
//!
//! The top-level modules use each other in one direction only, bottom to top (each may use
//! only the ones named after it; `module_graph::MAY_USE`, a unit test, checks the sources
//! against this list):
//!
//! 1. `ffi`, `log`, `spinlock`, `governed` use none.
//! 2. `guard` uses `log`.
//! 3. `real` uses `ffi`, `governed`, `log`.
//! 4. `state` uses `log`.
//! 5. `governor` uses `ffi`, `guard`, `log`, `real`, `spinlock`, `state` (it is handed the
//!    mode, or reads the decided one; it never decides it).
//! 6. `fork` uses `governor`, `log`, `state`.
//! 7. `config` uses `fork`, `guard`, `log`, `state` (deciding the mode installs the fork
//!    handlers).
//! 8. `hooks` uses `config`, `ffi`, `governor`, `guard`, `real`, `state`.
//! 9. `interpose` uses `ffi`, `governed`, `guard`, `hooks`, `log`, `real`.

mod config;
mod ffi;
mod fork;
mod governed;
mod governor;
mod guard;
mod hooks;
mod interpose;
mod log;
mod real;
mod spinlock;
mod state;

#[cfg(test)]
mod module_graph;
