//! The simulated NVIDIA driver: one cdylib, `libfakegpu.so`, that is both `libcuda.so.1` and
//! `libnvidia-ml.so.1` for machines without a GPU.
//!
//! It exports the real CUDA driver API and NVML symbols with their real C signatures (types
//! from `cudarc::driver::sys` and `nvml_wrapper_sys::bindings`, both generated from NVIDIA's
//! headers), simulates the devices a TOML file describes ([`config`]), and keeps what must
//! be seen by every process (memory in use, clocks, power limit, kernel activity) in one
//! memory-mapped file per device ([`state`]). Put links named `libcuda.so.1` and
//! `libnvidia-ml.so.1` to it first on `LD_LIBRARY_PATH` and it is *the* driver for programs
//! linked against libcuda, for `dlopen` users, Python ctypes and `nvml-wrapper`.
//!
//! As an rlib it offers tests the same [`config`] loading and a read-only-ish view of the
//! shared [`state`] (usage, peak, per-process bytes, clocks, power limit).
//!
//! README.md next to this crate lists what is simulated and what is not.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod duration;
pub mod model;
pub mod state;

mod cuda;
mod driver;
mod ffi;
mod nvml;

/// The CUDA version the simulated driver reports (`cuDriverGetVersion`,
/// `nvmlSystemGetCudaDriverVersion`): CUDA 12.8.
pub const CUDA_DRIVER_VERSION: i32 = 12080;

/// The driver version string NVML reports (an R570 driver, which ships CUDA 12.8).
pub const DRIVER_VERSION: &str = "570.124.06";

/// The NVML library version string (`nvmlSystemGetNVMLVersion`).
pub const NVML_VERSION: &str = "12.570.124.06";

/// Every CUDA driver API symbol this library exports (what `cuGetProcAddress` can hand out):
/// the simulated functions, then the generated NOT_SUPPORTED stubs.
pub fn cuda_symbols() -> &'static [&'static str] {
    static ALL: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| [cuda::procaddr::EXPORTED, cuda::unsupported::SYMBOLS].concat())
}

/// Every NVML symbol this library exports: the simulated functions, then the stubs.
pub fn nvml_symbols() -> &'static [&'static str] {
    static ALL: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| [nvml::EXPORTED, nvml::unsupported::SYMBOLS].concat())
}

/// The exported CUDA symbols that are generated NOT_SUPPORTED stubs (`gen_exports.py`).
pub fn cuda_unsupported_symbols() -> &'static [&'static str] {
    cuda::unsupported::SYMBOLS
}

/// The exported NVML symbols that are generated NOT_SUPPORTED stubs (`gen_exports.py`).
pub fn nvml_unsupported_symbols() -> &'static [&'static str] {
    nvml::unsupported::SYMBOLS
}
