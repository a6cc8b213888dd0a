//! `libvgpu.so`, loaded with `LD_PRELOAD` into a workload: enforces its vGPU's GPU-memory
//! quota, shared by all processes of the vGPU, from inside the CUDA process.
//!
//! - [`interpose`]: how calls reach the shim (exports, `dlsym`, `cuGetProcAddress`).
//! - [`governed`]: THE list of governed functions (expanded into their exports and the
//!   `dlsym`/`cuGetProcAddress` table by `interpose`, into their real-driver slots by `real`).
//! - [`hooks`]: what each governed function does around the driver call.
//! - [`governor`]: the memory accounting on the vGPU's shared usage file (the protocol
//!   itself lives in `vgpu_abi::usage`, shared with the `vgpu` CLI).
//! - [`config`] / [`state`] / `fork`: which vGPU, this process's state file, fork handling.
//!
//! Nothing runs at load time: no constructor, no allocation, no driver call. Design notes:
//! `shim/README.md`.

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
