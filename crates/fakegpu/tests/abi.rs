//! The Rust types the fake reads and writes (cudarc's and nvml-wrapper-sys's bindings) have
//! the sizes, field offsets and constant values of NVIDIA's headers: a C program compiled
//! against cuda.h and nvml.h prints them, and they are compared one by one.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};

use cudarc::driver::sys as cu;
use nvml_wrapper_sys::bindings as nv;

use crate::common;

fn rust_side() -> Vec<(&'static str, u64)> {
    let s = |n: usize| n as u64;
    vec![
        (
            "sizeof(CUDA_ARRAY_DESCRIPTOR)",
            s(size_of::<cu::CUDA_ARRAY_DESCRIPTOR>()),
        ),
        (
            "offsetof(CUDA_ARRAY_DESCRIPTOR.Width)",
            s(offset_of!(cu::CUDA_ARRAY_DESCRIPTOR, Width)),
        ),
        (
            "offsetof(CUDA_ARRAY_DESCRIPTOR.Height)",
            s(offset_of!(cu::CUDA_ARRAY_DESCRIPTOR, Height)),
        ),
        (
            "offsetof(CUDA_ARRAY_DESCRIPTOR.Format)",
            s(offset_of!(cu::CUDA_ARRAY_DESCRIPTOR, Format)),
        ),
        (
            "offsetof(CUDA_ARRAY_DESCRIPTOR.NumChannels)",
            s(offset_of!(cu::CUDA_ARRAY_DESCRIPTOR, NumChannels)),
        ),
        (
            "sizeof(CUDA_ARRAY3D_DESCRIPTOR)",
            s(size_of::<cu::CUDA_ARRAY3D_DESCRIPTOR>()),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR.Width)",
            s(offset_of!(cu::CUDA_ARRAY3D_DESCRIPTOR, Width)),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR.Height)",
            s(offset_of!(cu::CUDA_ARRAY3D_DESCRIPTOR, Height)),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR.Depth)",
            s(offset_of!(cu::CUDA_ARRAY3D_DESCRIPTOR, Depth)),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR.Format)",
            s(offset_of!(cu::CUDA_ARRAY3D_DESCRIPTOR, Format)),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR.NumChannels)",
            s(offset_of!(cu::CUDA_ARRAY3D_DESCRIPTOR, NumChannels)),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR.Flags)",
            s(offset_of!(cu::CUDA_ARRAY3D_DESCRIPTOR, Flags)),
        ),
        ("sizeof(CUmemLocation)", s(size_of::<cu::CUmemLocation>())),
        (
            "offsetof(CUmemLocation.type)",
            s(offset_of!(cu::CUmemLocation, type_)),
        ),
        (
            "offsetof(CUmemLocation.id)",
            s(offset_of!(cu::CUmemLocation, id)),
        ),
        (
            "sizeof(CUmemAllocationProp)",
            s(size_of::<cu::CUmemAllocationProp>()),
        ),
        (
            "offsetof(CUmemAllocationProp.type)",
            s(offset_of!(cu::CUmemAllocationProp, type_)),
        ),
        (
            "offsetof(CUmemAllocationProp.requestedHandleTypes)",
            s(offset_of!(cu::CUmemAllocationProp, requestedHandleTypes)),
        ),
        (
            "offsetof(CUmemAllocationProp.location)",
            s(offset_of!(cu::CUmemAllocationProp, location)),
        ),
        (
            "offsetof(CUmemAllocationProp.win32HandleMetaData)",
            s(offset_of!(cu::CUmemAllocationProp, win32HandleMetaData)),
        ),
        (
            "offsetof(CUmemAllocationProp.allocFlags)",
            s(offset_of!(cu::CUmemAllocationProp, allocFlags)),
        ),
        ("sizeof(CUmemPoolProps)", s(size_of::<cu::CUmemPoolProps>())),
        (
            "offsetof(CUmemPoolProps.allocType)",
            s(offset_of!(cu::CUmemPoolProps, allocType)),
        ),
        (
            "offsetof(CUmemPoolProps.location)",
            s(offset_of!(cu::CUmemPoolProps, location)),
        ),
        (
            "sizeof(CUmemAccessDesc)",
            s(size_of::<cu::CUmemAccessDesc>()),
        ),
        (
            "offsetof(CUmemAccessDesc.location)",
            s(offset_of!(cu::CUmemAccessDesc, location)),
        ),
        (
            "offsetof(CUmemAccessDesc.flags)",
            s(offset_of!(cu::CUmemAccessDesc, flags)),
        ),
        ("sizeof(CUlaunchConfig)", s(size_of::<cu::CUlaunchConfig>())),
        (
            "offsetof(CUlaunchConfig.gridDimX)",
            s(offset_of!(cu::CUlaunchConfig, gridDimX)),
        ),
        (
            "offsetof(CUlaunchConfig.blockDimZ)",
            s(offset_of!(cu::CUlaunchConfig, blockDimZ)),
        ),
        (
            "offsetof(CUlaunchConfig.sharedMemBytes)",
            s(offset_of!(cu::CUlaunchConfig, sharedMemBytes)),
        ),
        (
            "offsetof(CUlaunchConfig.hStream)",
            s(offset_of!(cu::CUlaunchConfig, hStream)),
        ),
        (
            "offsetof(CUlaunchConfig.attrs)",
            s(offset_of!(cu::CUlaunchConfig, attrs)),
        ),
        (
            "offsetof(CUlaunchConfig.numAttrs)",
            s(offset_of!(cu::CUlaunchConfig, numAttrs)),
        ),
        ("sizeof(CUuuid)", s(size_of::<cu::CUuuid>())),
        ("sizeof(CUarray_format)", s(size_of::<cu::CUarray_format>())),
        (
            "sizeof(CUmemLocationType)",
            s(size_of::<cu::CUmemLocationType>()),
        ),
        (
            "sizeof(CUmemAllocationType)",
            s(size_of::<cu::CUmemAllocationType>()),
        ),
        ("sizeof(CUresult)", s(size_of::<cu::CUresult>())),
        (
            "sizeof(CUdevice_attribute)",
            s(size_of::<cu::CUdevice_attribute>()),
        ),
        (
            "sizeof(CUdriverProcAddressQueryResult)",
            s(size_of::<cu::CUdriverProcAddressQueryResult>()),
        ),
        ("sizeof(CUdeviceptr)", s(size_of::<cu::CUdeviceptr>())),
        ("sizeof(CUdevice)", s(size_of::<cu::CUdevice>())),
        (
            "CU_MEM_LOCATION_TYPE_DEVICE",
            cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u64,
        ),
        (
            "CU_MEM_LOCATION_TYPE_HOST",
            cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST as u64,
        ),
        (
            "CU_MEM_LOCATION_TYPE_HOST_NUMA",
            cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA as u64,
        ),
        (
            "CU_MEM_ALLOCATION_TYPE_PINNED",
            cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED as u64,
        ),
        (
            "CU_MEM_ALLOC_GRANULARITY_RECOMMENDED",
            cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED as u64,
        ),
        (
            "CU_MEM_ACCESS_FLAGS_PROT_READWRITE",
            cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u64,
        ),
        (
            "CU_AD_FORMAT_FLOAT",
            cu::CUarray_format::CU_AD_FORMAT_FLOAT as u64,
        ),
        (
            "CU_AD_FORMAT_HALF",
            cu::CUarray_format::CU_AD_FORMAT_HALF as u64,
        ),
        (
            "CU_AD_FORMAT_UNSIGNED_INT8",
            cu::CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8 as u64,
        ),
        ("CUDA_ARRAY3D_LAYERED", u64::from(cu::CUDA_ARRAY3D_LAYERED)),
        (
            "CU_GET_PROC_ADDRESS_LEGACY_STREAM",
            cu::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM as u64,
        ),
        (
            "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM",
            cu::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM as u64,
        ),
        (
            "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND",
            cu::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND as u64,
        ),
        (
            "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT",
            cu::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT as u64,
        ),
        (
            "CUDA_ERROR_NOT_FOUND",
            cu::CUresult::CUDA_ERROR_NOT_FOUND as u64,
        ),
        (
            "CUDA_ERROR_OUT_OF_MEMORY",
            cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY as u64,
        ),
        (
            "CUDA_ERROR_INVALID_CONTEXT",
            cu::CUresult::CUDA_ERROR_INVALID_CONTEXT as u64,
        ),
        (
            "CUDA_ERROR_NO_DEVICE",
            cu::CUresult::CUDA_ERROR_NO_DEVICE as u64,
        ),
        // The checkpoint API (src/cuda/checkpoint.rs, src/state.rs `ckpt`).
        (
            "sizeof(CUcheckpointLockArgs)",
            s(size_of::<cu::CUcheckpointLockArgs>()),
        ),
        (
            "offsetof(CUcheckpointLockArgs.timeoutMs)",
            s(offset_of!(cu::CUcheckpointLockArgs, timeoutMs)),
        ),
        (
            "offsetof(CUcheckpointLockArgs.reserved0)",
            s(offset_of!(cu::CUcheckpointLockArgs, reserved0)),
        ),
        (
            "offsetof(CUcheckpointLockArgs.reserved1)",
            s(offset_of!(cu::CUcheckpointLockArgs, reserved1)),
        ),
        (
            "sizeof(CUcheckpointCheckpointArgs)",
            s(size_of::<cu::CUcheckpointCheckpointArgs>()),
        ),
        (
            "sizeof(CUcheckpointRestoreArgs)",
            s(size_of::<cu::CUcheckpointRestoreArgs>()),
        ),
        (
            "sizeof(CUcheckpointUnlockArgs)",
            s(size_of::<cu::CUcheckpointUnlockArgs>()),
        ),
        ("sizeof(CUprocessState)", s(size_of::<cu::CUprocessState>())),
        (
            "CU_PROCESS_STATE_RUNNING",
            cu::CUprocessState::CU_PROCESS_STATE_RUNNING as u64,
        ),
        (
            "CU_PROCESS_STATE_LOCKED",
            cu::CUprocessState::CU_PROCESS_STATE_LOCKED as u64,
        ),
        (
            "CU_PROCESS_STATE_CHECKPOINTED",
            cu::CUprocessState::CU_PROCESS_STATE_CHECKPOINTED as u64,
        ),
        (
            "CU_PROCESS_STATE_FAILED",
            cu::CUprocessState::CU_PROCESS_STATE_FAILED as u64,
        ),
        (
            "CUDA_ERROR_ILLEGAL_STATE",
            cu::CUresult::CUDA_ERROR_ILLEGAL_STATE as u64,
        ),
        (
            "CUDA_ERROR_NOT_READY",
            cu::CUresult::CUDA_ERROR_NOT_READY as u64,
        ),
        (
            "CUDA_ERROR_NOT_SUPPORTED",
            cu::CUresult::CUDA_ERROR_NOT_SUPPORTED as u64,
        ),
        (
            "CUDA_ERROR_INVALID_VALUE",
            cu::CUresult::CUDA_ERROR_INVALID_VALUE as u64,
        ),
        (
            "CUDA_ERROR_NOT_INITIALIZED",
            cu::CUresult::CUDA_ERROR_NOT_INITIALIZED as u64,
        ),
        (
            "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as u64,
        ),
        // cudarc is generated from CUDA 12.8's header, the fetched one is 12.9: the enum may
        // grow at the end; everything the fake uses lies below both MAX values.
        ("(uintptr_t)CU_STREAM_LEGACY", 1), // src/cuda/mod.rs CU_STREAM_LEGACY
        ("(uintptr_t)CU_STREAM_PER_THREAD", 2), // src/cuda/mod.rs CU_STREAM_PER_THREAD
        ("sizeof(nvmlMemory_t)", s(size_of::<nv::nvmlMemory_t>())),
        (
            "offsetof(nvmlMemory_t.used)",
            s(offset_of!(nv::nvmlMemory_t, used)),
        ),
        (
            "sizeof(nvmlMemory_v2_t)",
            s(size_of::<nv::nvmlMemory_v2_t>()),
        ),
        (
            "offsetof(nvmlMemory_v2_t.version)",
            s(offset_of!(nv::nvmlMemory_v2_t, version)),
        ),
        (
            "offsetof(nvmlMemory_v2_t.total)",
            s(offset_of!(nv::nvmlMemory_v2_t, total)),
        ),
        (
            "offsetof(nvmlMemory_v2_t.reserved)",
            s(offset_of!(nv::nvmlMemory_v2_t, reserved)),
        ),
        (
            "offsetof(nvmlMemory_v2_t.free)",
            s(offset_of!(nv::nvmlMemory_v2_t, free)),
        ),
        (
            "offsetof(nvmlMemory_v2_t.used)",
            s(offset_of!(nv::nvmlMemory_v2_t, used)),
        ),
        // What src/nvml/device.rs expects in nvmlMemory_v2_t.version.
        (
            "nvmlMemory_v2",
            s(size_of::<nv::nvmlMemory_v2_t>()) | (2 << 24),
        ),
        (
            "sizeof(nvmlProcessInfo_t)",
            s(size_of::<nv::nvmlProcessInfo_t>()),
        ),
        (
            "offsetof(nvmlProcessInfo_t.pid)",
            s(offset_of!(nv::nvmlProcessInfo_t, pid)),
        ),
        (
            "offsetof(nvmlProcessInfo_t.usedGpuMemory)",
            s(offset_of!(nv::nvmlProcessInfo_t, usedGpuMemory)),
        ),
        (
            "offsetof(nvmlProcessInfo_t.gpuInstanceId)",
            s(offset_of!(nv::nvmlProcessInfo_t, gpuInstanceId)),
        ),
        (
            "offsetof(nvmlProcessInfo_t.computeInstanceId)",
            s(offset_of!(nv::nvmlProcessInfo_t, computeInstanceId)),
        ),
        (
            "sizeof(nvmlProcessInfo_v1_t)",
            s(size_of::<nv::nvmlProcessInfo_v1_t>()),
        ),
        ("sizeof(nvmlPciInfo_t)", s(size_of::<nv::nvmlPciInfo_t>())),
        (
            "offsetof(nvmlPciInfo_t.busIdLegacy)",
            s(offset_of!(nv::nvmlPciInfo_t, busIdLegacy)),
        ),
        (
            "offsetof(nvmlPciInfo_t.domain)",
            s(offset_of!(nv::nvmlPciInfo_t, domain)),
        ),
        (
            "offsetof(nvmlPciInfo_t.pciDeviceId)",
            s(offset_of!(nv::nvmlPciInfo_t, pciDeviceId)),
        ),
        (
            "offsetof(nvmlPciInfo_t.pciSubSystemId)",
            s(offset_of!(nv::nvmlPciInfo_t, pciSubSystemId)),
        ),
        (
            "offsetof(nvmlPciInfo_t.busId)",
            s(offset_of!(nv::nvmlPciInfo_t, busId)),
        ),
        (
            "sizeof(nvmlUtilization_t)",
            s(size_of::<nv::nvmlUtilization_t>()),
        ),
        (
            "offsetof(nvmlUtilization_t.memory)",
            s(offset_of!(nv::nvmlUtilization_t, memory)),
        ),
        (
            "sizeof(nvmlProcessUtilizationSample_t)",
            s(size_of::<nv::nvmlProcessUtilizationSample_t>()),
        ),
        (
            "offsetof(nvmlProcessUtilizationSample_t.timeStamp)",
            s(offset_of!(nv::nvmlProcessUtilizationSample_t, timeStamp)),
        ),
        (
            "offsetof(nvmlProcessUtilizationSample_t.decUtil)",
            s(offset_of!(nv::nvmlProcessUtilizationSample_t, decUtil)),
        ),
        (
            "NVML_ERROR_INSUFFICIENT_SIZE",
            u64::from(nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE),
        ),
        (
            "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
            u64::from(nv::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        ),
        (
            "NVML_ERROR_NO_PERMISSION",
            u64::from(nv::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION),
        ),
        (
            "NVML_DEVICE_ARCH_HOPPER",
            u64::from(nv::NVML_DEVICE_ARCH_HOPPER),
        ),
        (
            "NVML_DEVICE_ARCH_AMPERE",
            u64::from(nv::NVML_DEVICE_ARCH_AMPERE),
        ),
        (
            "NVML_CLOCK_SM",
            u64::from(nv::nvmlClockType_enum_NVML_CLOCK_SM),
        ),
        (
            "NVML_CLOCK_MEM",
            u64::from(nv::nvmlClockType_enum_NVML_CLOCK_MEM),
        ),
        (
            "NVML_CLOCK_LIMIT_ID_TDP",
            u64::from(nv::nvmlClockLimitId_enum_NVML_CLOCK_LIMIT_ID_TDP),
        ),
        (
            "NVML_CLOCK_LIMIT_ID_UNLIMITED",
            u64::from(nv::nvmlClockLimitId_enum_NVML_CLOCK_LIMIT_ID_UNLIMITED),
        ),
        (
            "NVML_TEMPERATURE_GPU",
            u64::from(nv::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU),
        ),
        (
            "NVML_FEATURE_ENABLED",
            u64::from(nv::nvmlEnableState_enum_NVML_FEATURE_ENABLED),
        ),
        (
            "NVML_DEVICE_MIG_DISABLE",
            u64::from(nv::NVML_DEVICE_MIG_DISABLE),
        ),
    ]
}

#[test]
fn rust_layouts_match_nvidias_headers() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("abi");
    common::gcc("abi.c", &exe, &[]);
    let out = common::run_ok(&mut std::process::Command::new(&exe));
    let c_side: BTreeMap<&str, u64> = out
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k, v.parse().unwrap_or_else(|_| panic!("bad line {k} {v}"))))
        .collect();
    let mut mismatches = Vec::new();
    for (name, rust) in rust_side() {
        match c_side.get(name) {
            Some(&c) if c == rust => {}
            Some(&c) => mismatches.push(format!("{name}: header {c}, Rust {rust}")),
            None => mismatches.push(format!("{name}: not printed by abi.c")),
        }
    }
    let max = cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX as u64;
    assert!(
        c_side["CU_DEVICE_ATTRIBUTE_MAX"] >= max,
        "the header's attribute enum is not older than cudarc's"
    );
    assert!(
        mismatches.is_empty(),
        "ABI mismatches:\n{}",
        mismatches.join("\n")
    );
    assert_eq!(
        c_side.len(),
        rust_side().len() + 1,
        "every printed value is compared"
    );
}
