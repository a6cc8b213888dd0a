//! cuGetProcAddress (CUDA 11.3, four arguments) and cuGetProcAddress_v2 (CUDA 12, with a
//! symbol status), resolved like the real driver.
//!
//! The base name and CUDA version pick an exported symbol through the table generated from
//! NVIDIA's headers (`vgpu_abi::cuda_procs`); the symbol then picks this library's own
//! function from [`own_symbol`], a static table. (Not `dlsym`: a shim that interposes
//! `dlsym` would otherwise be handed its own lookups back.)
//!
//! Flags: `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` prefers the `_ptsz`/`_ptds`
//! variant and falls back to the legacy one; `LEGACY_STREAM` and `DEFAULT` return legacy
//! variants. The driver cannot know how its caller was compiled: `cuda.h` itself turns
//! DEFAULT into PER_THREAD (an inline `cuGetProcAddress_v2_ptsz`) when the caller is built
//! with per-thread default streams, and no environment variable is consulted.
//!
//! A function of the headers that is not simulated is its generated NOT_SUPPORTED stub
//! (`super::unsupported`, the fallback after [`own_symbol`]). Every miss returns
//! CUDA_ERROR_NOT_FOUND with `*pfn = NULL`; the status says whether the name is unknown or
//! the version too old.

use std::ffi::{c_char, c_int, c_void};

use cudarc::driver::sys::{
    cuuint64_t, CUdriverProcAddressQueryResult as Status, CUdriverProcAddress_flags as Flags,
    CUresult,
};
use vgpu_abi::cuda_procs::{resolve, Resolution};

use super::{
    array, checkpoint, ctx, entry, event, graph, init, launch, mem, stream, vmm, CuResult,
};
use super::{copy, ipc, library, mempool, occupancy, pointer, queries};
use crate::ffi;

macro_rules! exports {
    ($($module:ident :: $name:ident),* $(,)?) => {
        /// This library's implementation of exported symbol `symbol`.
        pub(crate) fn own_symbol(symbol: &str) -> Option<*mut c_void> {
            match symbol {
                $(stringify!($name) => Some($module::$name as *mut c_void),)*
                _ => None,
            }
        }

        /// Every CUDA driver symbol this library exports.
        pub const EXPORTED: &[&str] = &[$(stringify!($name)),*];
    };
}

exports! {
    init::cuInit, init::cuDriverGetVersion, init::cuDeviceGet, init::cuDeviceGetCount,
    init::cuDeviceGetName, init::cuDeviceGetUuid, init::cuDeviceGetUuid_v2, init::cuDeviceTotalMem_v2,
    init::cuDeviceGetAttribute, init::cuDeviceComputeCapability, init::cuDeviceGetPCIBusId,
    init::cuDeviceGetByPCIBusId, init::cuGetErrorName, init::cuGetErrorString,
    ctx::cuCtxCreate_v2, ctx::cuCtxCreate_v3, ctx::cuCtxCreate_v4, ctx::cuCtxDestroy_v2,
    ctx::cuCtxSetCurrent, ctx::cuCtxGetCurrent, ctx::cuCtxPushCurrent_v2, ctx::cuCtxPopCurrent_v2,
    ctx::cuCtxGetDevice, ctx::cuCtxGetFlags, ctx::cuCtxSynchronize,
    ctx::cuDevicePrimaryCtxRetain, ctx::cuDevicePrimaryCtxRelease, ctx::cuDevicePrimaryCtxRelease_v2,
    ctx::cuDevicePrimaryCtxGetState, ctx::cuDevicePrimaryCtxSetFlags_v2, ctx::cuDevicePrimaryCtxReset_v2,
    mem::cuMemAlloc_v2, mem::cuMemAllocPitch_v2, mem::cuMemAllocManaged, mem::cuMemFree_v2,
    mem::cuMemGetAddressRange_v2, mem::cuMemGetInfo_v2, mem::cuMemAllocHost_v2, mem::cuMemHostAlloc,
    mem::cuMemFreeHost, mem::cuMemAllocAsync, mem::cuMemAllocAsync_ptsz, mem::cuMemFreeAsync,
    mem::cuMemFreeAsync_ptsz, mem::cuMemPoolCreate, mem::cuMemPoolDestroy,
    mem::cuMemAllocFromPoolAsync, mem::cuMemAllocFromPoolAsync_ptsz,
    vmm::cuMemCreate, vmm::cuMemRelease, vmm::cuMemAddressReserve, vmm::cuMemAddressFree,
    vmm::cuMemMap, vmm::cuMemUnmap, vmm::cuMemSetAccess, vmm::cuMemGetAllocationGranularity,
    array::cuArrayCreate_v2, array::cuArray3DCreate_v2, array::cuArrayDestroy,
    array::cuMipmappedArrayCreate, array::cuMipmappedArrayDestroy,
    stream::cuStreamCreate, stream::cuStreamCreateWithPriority, stream::cuStreamDestroy_v2,
    stream::cuStreamSynchronize, stream::cuStreamSynchronize_ptsz, stream::cuStreamQuery,
    stream::cuStreamQuery_ptsz,
    stream::cuStreamBeginCapture, stream::cuStreamBeginCapture_ptsz,
    stream::cuStreamBeginCapture_v2, stream::cuStreamBeginCapture_v2_ptsz,
    stream::cuStreamEndCapture, stream::cuStreamEndCapture_ptsz,
    stream::cuStreamIsCapturing, stream::cuStreamIsCapturing_ptsz,
    stream::cuStreamGetCaptureInfo, stream::cuStreamGetCaptureInfo_ptsz,
    stream::cuStreamGetCaptureInfo_v2, stream::cuStreamGetCaptureInfo_v2_ptsz,
    stream::cuStreamGetCaptureInfo_v3, stream::cuStreamGetCaptureInfo_v3_ptsz,
    event::cuEventCreate, event::cuEventDestroy_v2, event::cuEventRecord, event::cuEventRecord_ptsz,
    event::cuEventRecordWithFlags, event::cuEventRecordWithFlags_ptsz, event::cuEventQuery,
    event::cuEventSynchronize, event::cuEventElapsedTime, event::cuEventElapsedTime_v2,
    event::cuStreamWaitEvent, event::cuStreamWaitEvent_ptsz,
    launch::cuModuleLoadData, launch::cuModuleLoadDataEx,
    launch::cuModuleUnload, launch::cuModuleGetFunction, launch::cuLaunchKernel,
    launch::cuLaunchKernel_ptsz, launch::cuLaunchKernelEx, launch::cuLaunchKernelEx_ptsz,
    launch::cuLaunchCooperativeKernel, launch::cuLaunchCooperativeKernel_ptsz,
    launch::cuLaunchCooperativeKernelMultiDevice,
    launch::cuFuncSetBlockShape, launch::cuFuncSetSharedSize, launch::cuParamSetSize,
    launch::cuParamSeti, launch::cuParamSetf, launch::cuParamSetv,
    launch::cuLaunch, launch::cuLaunchGrid, launch::cuLaunchGridAsync,
    graph::cuGraphCreate, graph::cuGraphDestroy, graph::cuGraphAddKernelNode,
    graph::cuGraphAddKernelNode_v2, graph::cuGraphAddEmptyNode, graph::cuGraphGetNodes,
    graph::cuGraphInstantiate, graph::cuGraphInstantiate_v2, graph::cuGraphInstantiateWithFlags,
    graph::cuGraphInstantiateWithParams, graph::cuGraphInstantiateWithParams_ptsz,
    graph::cuGraphExecDestroy, graph::cuGraphLaunch, graph::cuGraphLaunch_ptsz,
    checkpoint::cuCheckpointProcessGetRestoreThreadId, checkpoint::cuCheckpointProcessGetState,
    checkpoint::cuCheckpointProcessLock, checkpoint::cuCheckpointProcessCheckpoint,
    checkpoint::cuCheckpointProcessRestore, checkpoint::cuCheckpointProcessUnlock,
    self::cuGetProcAddress, self::cuGetProcAddress_v2,
    mempool::cuDeviceGetDefaultMemPool, mempool::cuDeviceGetMemPool, mempool::cuDeviceSetMemPool,
    mempool::cuMemPoolGetAttribute, mempool::cuMemPoolSetAttribute, mempool::cuMemPoolTrimTo,
    mempool::cuMemPoolSetAccess, mempool::cuMemPoolGetAccess, queries::cuCtxGetStreamPriorityRange,
    queries::cuStreamGetPriority, queries::cuStreamGetPriority_ptsz, queries::cuStreamGetFlags,
    queries::cuStreamGetFlags_ptsz, queries::cuStreamGetCtx, queries::cuStreamGetCtx_ptsz,
    queries::cuStreamGetDevice, queries::cuStreamGetDevice_ptsz, queries::cuCtxGetLimit,
    queries::cuCtxSetLimit, queries::cuCtxGetCacheConfig, queries::cuCtxSetCacheConfig,
    queries::cuCtxGetApiVersion, queries::cuCtxGetId, queries::cuDeviceGetProperties,
    ipc::cuIpcGetMemHandle, ipc::cuIpcOpenMemHandle_v2, ipc::cuIpcCloseMemHandle,
    ipc::cuIpcGetEventHandle, ipc::cuIpcOpenEventHandle, library::cuLibraryLoadData,
    library::cuLibraryLoadFromFile, library::cuLibraryUnload, library::cuLibraryGetKernel,
    library::cuLibraryGetModule, library::cuLibraryGetKernelCount,
    library::cuLibraryEnumerateKernels, library::cuKernelGetFunction, library::cuKernelGetLibrary,
    library::cuKernelGetName, library::cuKernelGetAttribute, library::cuKernelSetAttribute,
    library::cuKernelSetCacheConfig, pointer::cuPointerGetAttribute,
    pointer::cuPointerGetAttributes, occupancy::cuFuncGetAttribute, occupancy::cuFuncSetAttribute,
    occupancy::cuFuncSetCacheConfig, occupancy::cuOccupancyMaxActiveBlocksPerMultiprocessor,
    occupancy::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    occupancy::cuOccupancyMaxPotentialBlockSize,
    occupancy::cuOccupancyMaxPotentialBlockSizeWithFlags,
    occupancy::cuOccupancyAvailableDynamicSMemPerBlock, copy::cuMemcpy, copy::cuMemcpy_ptds,
    copy::cuMemcpyAsync, copy::cuMemcpyAsync_ptsz, copy::cuMemcpyHtoD_v2,
    copy::cuMemcpyHtoD_v2_ptds, copy::cuMemcpyDtoH_v2, copy::cuMemcpyDtoH_v2_ptds,
    copy::cuMemcpyDtoD_v2, copy::cuMemcpyDtoD_v2_ptds, copy::cuMemcpyHtoDAsync_v2,
    copy::cuMemcpyHtoDAsync_v2_ptsz, copy::cuMemcpyDtoHAsync_v2, copy::cuMemcpyDtoHAsync_v2_ptsz,
    copy::cuMemcpyDtoDAsync_v2, copy::cuMemcpyDtoDAsync_v2_ptsz, copy::cuMemcpyPeer,
    copy::cuMemcpyPeer_ptds, copy::cuMemcpyPeerAsync, copy::cuMemcpyPeerAsync_ptsz,
    copy::cuMemcpy2D_v2, copy::cuMemcpy2D_v2_ptds, copy::cuMemcpy2DUnaligned_v2,
    copy::cuMemcpy2DUnaligned_v2_ptds, copy::cuMemcpy2DAsync_v2, copy::cuMemcpy2DAsync_v2_ptsz,
    copy::cuMemcpy3D_v2, copy::cuMemcpy3D_v2_ptds, copy::cuMemcpy3DAsync_v2,
    copy::cuMemcpy3DAsync_v2_ptsz, copy::cuMemsetD8_v2, copy::cuMemsetD8_v2_ptds,
    copy::cuMemsetD16_v2, copy::cuMemsetD16_v2_ptds, copy::cuMemsetD32_v2,
    copy::cuMemsetD32_v2_ptds, copy::cuMemsetD8Async, copy::cuMemsetD8Async_ptsz,
    copy::cuMemsetD16Async, copy::cuMemsetD16Async_ptsz, copy::cuMemsetD32Async,
    copy::cuMemsetD32Async_ptsz, copy::cuMemsetD2D8_v2, copy::cuMemsetD2D8_v2_ptds,
    copy::cuMemsetD2D16_v2, copy::cuMemsetD2D16_v2_ptds, copy::cuMemsetD2D32_v2,
    copy::cuMemsetD2D32_v2_ptds, copy::cuMemsetD2D8Async, copy::cuMemsetD2D8Async_ptsz,
    copy::cuMemsetD2D16Async, copy::cuMemsetD2D16Async_ptsz, copy::cuMemsetD2D32Async,
    copy::cuMemsetD2D32Async_ptsz,
}

/// Whether `symbol` is one an older driver lacks: the checkpoint API with `checkpoint =
/// false` in the config (driver < 570). Before cuInit the config file is read for it (and
/// nothing else: a bad config is reported by cuInit).
fn absent_from_driver(symbol: &str) -> bool {
    if !symbol.starts_with("cuCheckpoint") {
        return false;
    }
    match crate::driver::loaded() {
        Some(driver) => !driver.checkpoint,
        None => crate::config::load().is_ok_and(|c| !c.checkpoint),
    }
}

/// What a lookup found: the function, or the status to report.
fn lookup(
    symbol: *const c_char,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CuResult<Result<*mut c_void, Status>> {
    // SAFETY: `symbol` is NULL or a C string (driver API contract).
    let Some(name) = (unsafe { ffi::c_str(symbol) }) else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    let legacy = Flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM as cuuint64_t;
    let per_thread = Flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM as cuuint64_t;
    if flags & !(legacy | per_thread) != 0 || flags == legacy | per_thread {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(match resolve(name, cuda_version, flags & per_thread != 0) {
        Resolution::Found(proc_) => own_symbol(proc_.symbol)
            // Not simulated: the generated NOT_SUPPORTED stub (gen_exports.py).
            .or_else(|| super::unsupported::symbol(proc_.symbol))
            .filter(|_| !absent_from_driver(proc_.symbol))
            .ok_or(Status::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        Resolution::VersionNotSufficient { .. } => {
            Err(Status::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        }
        Resolution::NotFound => Err(Status::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    })
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut Status,
) -> CuResult {
    if pfn.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let found = lookup(symbol, cuda_version, flags)?;
    let (function, code) = match found {
        Ok(f) => (f, Status::CU_GET_PROC_ADDRESS_SUCCESS),
        Err(code) => (std::ptr::null_mut(), code),
    };
    // SAFETY: `pfn` is non-NULL and writable; `status` is optional (NULL) or writable
    // (driver API contract).
    unsafe {
        ffi::write(pfn, function)?;
        if !status.is_null() {
            ffi::write(status, code)?;
        }
    }
    if function.is_null() {
        Err(CUresult::CUDA_ERROR_NOT_FOUND)
    } else {
        Ok(())
    }
}

/// CUDA 12's signature; works before cuInit, as cudart needs it to find cuInit.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut Status,
) -> CUresult {
    entry(|| get_proc_address(symbol, pfn, cuda_version, flags, status))
}

/// CUDA 11.3's signature (no status).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    entry(|| get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_abi::cuda_procs::by_symbol;

    /// Every exported function is reachable through cuGetProcAddress under its own name.
    #[test]
    fn every_export_is_in_the_generated_table() {
        for symbol in EXPORTED {
            let row = by_symbol(symbol)
                .unwrap_or_else(|| panic!("{symbol} is not a driver symbol of cuda.h"));
            let found = match resolve(row.name, row.version, row.per_thread) {
                Resolution::Found(p) => p.symbol,
                other => panic!("{symbol}: {other:?}"),
            };
            // A newer ABI of the same name may shadow it only when resolving at its version.
            assert_eq!(found, *symbol, "{} at {}", row.name, row.version);
            assert!(own_symbol(symbol).is_some());
        }
    }

    #[test]
    fn statuses() {
        let name = |s: &str| std::ffi::CString::new(s).unwrap();
        let per_thread = Flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM as u64;
        let ok = |s: &str, v, f| lookup(name(s).as_ptr(), v, f).unwrap().map(|p| p as usize);
        assert_eq!(
            ok("cuMemAlloc", 12000, 0),
            Ok(mem::cuMemAlloc_v2 as *const () as usize)
        );
        assert_eq!(
            ok("cuLaunchKernel", 12000, per_thread),
            Ok(launch::cuLaunchKernel_ptsz as *const () as usize)
        );
        assert_eq!(
            ok("cuMemAlloc", 12000, per_thread),
            Ok(mem::cuMemAlloc_v2 as *const () as usize)
        );
        assert_eq!(
            ok("cuGetProcAddress", 12000, 0),
            Ok(cuGetProcAddress_v2 as *const () as usize)
        );
        assert_eq!(
            ok("cuMemCreate", 10000, 0),
            Err(Status::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(
            ok("cuNope", 12000, 0),
            Err(Status::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
        assert_eq!(
            ok("cuCheckpointProcessLock", 12080, 0),
            Ok(checkpoint::cuCheckpointProcessLock as *const () as usize)
        );
        assert_eq!(
            ok("cuCheckpointProcessLock", 12070, 0),
            Err(Status::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
        // Known to cuda.h but not simulated: the generated NOT_SUPPORTED stub.
        assert_eq!(
            ok("cuTexRefCreate", 12000, 0),
            Ok(crate::cuda::unsupported::cuTexRefCreate as *const () as usize)
        );
        assert_eq!(
            lookup(name("cuInit").as_ptr(), 12000, 8),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
    }
}
