//! C types at the driver boundary. Struct layouts come from `cudarc::driver::sys` and
//! `nvml_wrapper_sys` (bindgen output of NVIDIA's headers). Result codes and enum fields are
//! handled as raw integers: a driver may return a code newer than those enums know, and a Rust
//! enum holding an unknown value is undefined behaviour.

use cudarc::driver::sys::CUresult;

pub use cudarc::driver::sys::{
    cuuint64_t, CUarray, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUgraphExec, CUlaunchConfig, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemPoolProps, CUmemoryPool, CUmipmappedArray, CUstream, CUDA_LAUNCH_PARAMS, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR,
};
pub use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessUtilizationSample_t};

/// `CUresult` as its raw value.
pub type CuResult = u32;
/// `nvmlReturn_t`.
pub type NvmlReturn = u32;

pub const CUDA_SUCCESS: CuResult = CUresult::CUDA_SUCCESS as u32;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = CUresult::CUDA_ERROR_INVALID_VALUE as u32;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32;
/// What a wrapper answers when the real driver lacks the function it wraps.
pub const CUDA_ERROR_NOT_FOUND: CuResult = CUresult::CUDA_ERROR_NOT_FOUND as u32;
pub const CUDA_ERROR_NOT_READY: CuResult = CUresult::CUDA_ERROR_NOT_READY as u32;
/// `CU_EVENT_DEFAULT` (timing enabled, spin/yield wait).
pub const CU_EVENT_DEFAULT: u32 = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT as u32;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: u32 =
    cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32;

pub const NVML_SUCCESS: NvmlReturn = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn =
    nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn =
    nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = cudarc::driver::sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 =
    cudarc::driver::sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM as u64;
/// `CUDA_ARRAY3D_LAYERED`.
pub const CUDA_ARRAY3D_LAYERED: u32 = cudarc::driver::sys::CUDA_ARRAY3D_LAYERED;
