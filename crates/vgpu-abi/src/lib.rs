//! What the `vgpu` CLI, the shim (`libvgpu.so`) and the simulated driver must agree on:
//! on-disk layouts, size syntax, and how a process is identified across PID reuse.
//!
//! Nothing here allocates on a hot path or panics on bad input.

pub mod board;
pub mod compute;
pub mod cuda_procs;
pub mod error;
pub mod layout;
pub mod mapping;
pub mod process;
pub mod procfile;
pub mod size;
pub mod turn;
pub mod usage;
pub mod vgpu_lock;
