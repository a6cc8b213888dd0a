//! The NVML half (`libnvidia-ml.so.1`).
//!
//! NVML sees every configured device (it ignores CUDA_VISIBLE_DEVICES, as the real one
//! does), in config order. Device handles are addresses inside a static array, so they are
//! stable, distinct and checkable. Every exported function runs through [`entry`], which
//! turns a panic into NVML_ERROR_UNKNOWN.

pub(crate) mod board;
pub(crate) mod clocks;
pub(crate) mod device;
pub(crate) mod ecc;
pub(crate) mod media;
pub(crate) mod pci;
pub(crate) mod processes;
pub(crate) mod setters;
pub(crate) mod system;
pub(crate) mod thermal;
pub(crate) mod unsupported;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use nvml_wrapper_sys::bindings::{self as nv, nvmlDevice_t, nvmlReturn_t};

use crate::config::MAX_DEVICES;
use crate::driver::{self, Device, Driver};
use crate::ffi::{self, CopyError, Null};

/// Every NVML symbol this library exports.
pub const EXPORTED: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetProcessName",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetDefaultApplicationsClock",
    "nvmlDeviceGetClock",
    "nvmlDeviceGetSupportedMemoryClocks",
    "nvmlDeviceGetSupportedGraphicsClocks",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceSetPersistenceMode",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetInforomVersion",
    "nvmlDeviceGetInforomImageVersion",
    "nvmlDeviceGetInforomConfigurationChecksum",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetBoardId",
    "nvmlDeviceGetMultiGpuBoard",
    "nvmlDeviceGetPowerManagementMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetMemoryBusWidth",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetDriverModel_v2",
    "nvmlDeviceGetDriverModel",
    "nvmlDeviceGetMaxCustomerBoostClock",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetPowerState",
    "nvmlDeviceGetSupportedPerformanceStates",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetDefaultEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetDetailedEccErrors",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetJpgUtilization",
    "nvmlDeviceGetOfaUtilization",
    "nvmlDeviceGetEncoderStats",
    "nvmlDeviceGetEncoderSessions",
    "nvmlDeviceGetFBCStats",
    "nvmlDeviceGetFBCSessions",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetPciInfoExt",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieSpeed",
    "nvmlDeviceGetPcieLinkMaxSpeed",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetBusType",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetRunningProcessDetailList",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetMarginTemperature",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetTargetFanSpeed",
    "nvmlDeviceGetMinMaxFanSpeed",
];

pub(crate) type NvResult<T = ()> = Result<T, nvmlReturn_t>;

pub(crate) const SUCCESS: nvmlReturn_t = nv::nvmlReturn_enum_NVML_SUCCESS;
pub(crate) const UNINITIALIZED: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub(crate) const INVALID_ARGUMENT: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub(crate) const NOT_SUPPORTED: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub(crate) const NO_PERMISSION: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
pub(crate) const NOT_FOUND: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub(crate) const INSUFFICIENT_SIZE: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub(crate) const DRIVER_NOT_LOADED: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub(crate) const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t =
    nv::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub(crate) const UNKNOWN: nvmlReturn_t = nv::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// The body of every exported NVML function.
pub(crate) fn entry(body: impl FnOnce() -> NvResult) -> nvmlReturn_t {
    ffi::guard(UNKNOWN, || match body() {
        Ok(()) => SUCCESS,
        Err(e) => e,
    })
}

/// Out-parameter helpers report NULL as NVML_ERROR_INVALID_ARGUMENT.
pub(crate) fn null_arg(_: Null) -> nvmlReturn_t {
    INVALID_ARGUMENT
}

pub(crate) fn copy_error(e: CopyError) -> nvmlReturn_t {
    match e {
        CopyError::Null => INVALID_ARGUMENT,
        CopyError::TooSmall => INSUFFICIENT_SIZE,
    }
}

/// nvmlInit* calls minus nvmlShutdown calls.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

pub(crate) fn init() -> NvResult {
    driver::load().ok_or(DRIVER_NOT_LOADED)?;
    INIT_COUNT.fetch_add(1, SeqCst);
    Ok(())
}

pub(crate) fn shutdown() -> NvResult {
    INIT_COUNT
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .map(|_| ())
        .map_err(|_| UNINITIALIZED)
}

/// The driver, if NVML is initialized.
pub(crate) fn driver() -> NvResult<&'static Driver> {
    if INIT_COUNT.load(SeqCst) == 0 {
        return Err(UNINITIALIZED);
    }
    driver::loaded().ok_or(UNINITIALIZED)
}

static HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

/// The handle of device `index`.
pub(crate) fn handle(index: usize) -> nvmlDevice_t {
    HANDLES[..]
        .as_ptr()
        .wrapping_add(index.min(MAX_DEVICES - 1)) as nvmlDevice_t
}

/// The device behind `handle` (NVML_ERROR_INVALID_ARGUMENT for anything else).
pub(crate) fn device(handle: nvmlDevice_t) -> NvResult<&'static Device> {
    let driver = driver()?;
    let offset = (handle as usize).wrapping_sub(HANDLES[..].as_ptr() as usize);
    if offset >= MAX_DEVICES {
        return Err(INVALID_ARGUMENT);
    }
    driver.device(offset).ok_or(INVALID_ARGUMENT)
}

/// Whether the caller may change device settings (as the real NVML: root only).
pub(crate) fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
