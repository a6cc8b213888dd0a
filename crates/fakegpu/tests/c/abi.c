/* Prints "name value" for the layouts and constants the simulated driver relies on, as
 * NVIDIA's cuda.h and nvml.h define them. tests/abi.rs compares them with the Rust types. */
#include <cuda.h>
#include <nvml.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SIZE(t) printf("sizeof(%s) %zu\n", #t, sizeof(t))
#define OFFSET(t, f) printf("offsetof(%s.%s) %zu\n", #t, #f, offsetof(t, f))
#define VALUE(v) printf("%s %llu\n", #v, (unsigned long long)(v))

int main(void) {
    SIZE(CUDA_ARRAY_DESCRIPTOR);
    OFFSET(CUDA_ARRAY_DESCRIPTOR, Width);
    OFFSET(CUDA_ARRAY_DESCRIPTOR, Height);
    OFFSET(CUDA_ARRAY_DESCRIPTOR, Format);
    OFFSET(CUDA_ARRAY_DESCRIPTOR, NumChannels);
    SIZE(CUDA_ARRAY3D_DESCRIPTOR);
    OFFSET(CUDA_ARRAY3D_DESCRIPTOR, Width);
    OFFSET(CUDA_ARRAY3D_DESCRIPTOR, Height);
    OFFSET(CUDA_ARRAY3D_DESCRIPTOR, Depth);
    OFFSET(CUDA_ARRAY3D_DESCRIPTOR, Format);
    OFFSET(CUDA_ARRAY3D_DESCRIPTOR, NumChannels);
    OFFSET(CUDA_ARRAY3D_DESCRIPTOR, Flags);
    SIZE(CUmemLocation);
    OFFSET(CUmemLocation, type);
    OFFSET(CUmemLocation, id);
    SIZE(CUmemAllocationProp);
    OFFSET(CUmemAllocationProp, type);
    OFFSET(CUmemAllocationProp, requestedHandleTypes);
    OFFSET(CUmemAllocationProp, location);
    OFFSET(CUmemAllocationProp, win32HandleMetaData);
    OFFSET(CUmemAllocationProp, allocFlags);
    SIZE(CUmemPoolProps);
    OFFSET(CUmemPoolProps, allocType);
    OFFSET(CUmemPoolProps, location);
    SIZE(CUmemAccessDesc);
    OFFSET(CUmemAccessDesc, location);
    OFFSET(CUmemAccessDesc, flags);
    SIZE(CUlaunchConfig);
    OFFSET(CUlaunchConfig, gridDimX);
    OFFSET(CUlaunchConfig, blockDimZ);
    OFFSET(CUlaunchConfig, sharedMemBytes);
    OFFSET(CUlaunchConfig, hStream);
    OFFSET(CUlaunchConfig, attrs);
    OFFSET(CUlaunchConfig, numAttrs);
    SIZE(CUuuid);
    SIZE(CUarray_format);
    SIZE(CUmemLocationType);
    SIZE(CUmemAllocationType);
    SIZE(CUresult);
    SIZE(CUdevice_attribute);
    SIZE(CUdriverProcAddressQueryResult);
    SIZE(CUdeviceptr);
    SIZE(CUdevice);

    VALUE(CU_MEM_LOCATION_TYPE_DEVICE);
    VALUE(CU_MEM_LOCATION_TYPE_HOST);
    VALUE(CU_MEM_LOCATION_TYPE_HOST_NUMA);
    VALUE(CU_MEM_ALLOCATION_TYPE_PINNED);
    VALUE(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    VALUE(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    VALUE(CU_AD_FORMAT_FLOAT);
    VALUE(CU_AD_FORMAT_HALF);
    VALUE(CU_AD_FORMAT_UNSIGNED_INT8);
    VALUE(CUDA_ARRAY3D_LAYERED);
    VALUE(CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    VALUE(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    VALUE(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    VALUE(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    VALUE(CUDA_ERROR_NOT_FOUND);
    VALUE(CUDA_ERROR_OUT_OF_MEMORY);
    VALUE(CUDA_ERROR_INVALID_CONTEXT);
    VALUE(CUDA_ERROR_NO_DEVICE);
    SIZE(CUcheckpointLockArgs);
    OFFSET(CUcheckpointLockArgs, timeoutMs);
    OFFSET(CUcheckpointLockArgs, reserved0);
    OFFSET(CUcheckpointLockArgs, reserved1);
    SIZE(CUcheckpointCheckpointArgs);
    SIZE(CUcheckpointRestoreArgs);
    SIZE(CUcheckpointUnlockArgs);
    SIZE(CUprocessState);
    VALUE(CU_PROCESS_STATE_RUNNING);
    VALUE(CU_PROCESS_STATE_LOCKED);
    VALUE(CU_PROCESS_STATE_CHECKPOINTED);
    VALUE(CU_PROCESS_STATE_FAILED);
    VALUE(CUDA_ERROR_ILLEGAL_STATE);
    VALUE(CUDA_ERROR_NOT_READY);
    VALUE(CUDA_ERROR_NOT_SUPPORTED);
    VALUE(CUDA_ERROR_INVALID_VALUE);
    VALUE(CUDA_ERROR_NOT_INITIALIZED);
    VALUE(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    VALUE(CU_DEVICE_ATTRIBUTE_MAX);
    VALUE((uintptr_t)CU_STREAM_LEGACY);
    VALUE((uintptr_t)CU_STREAM_PER_THREAD);

    SIZE(nvmlMemory_t);
    OFFSET(nvmlMemory_t, used);
    SIZE(nvmlMemory_v2_t);
    OFFSET(nvmlMemory_v2_t, version);
    OFFSET(nvmlMemory_v2_t, total);
    OFFSET(nvmlMemory_v2_t, reserved);
    OFFSET(nvmlMemory_v2_t, free);
    OFFSET(nvmlMemory_v2_t, used);
    VALUE(nvmlMemory_v2);
    SIZE(nvmlProcessInfo_t);
    OFFSET(nvmlProcessInfo_t, pid);
    OFFSET(nvmlProcessInfo_t, usedGpuMemory);
    OFFSET(nvmlProcessInfo_t, gpuInstanceId);
    OFFSET(nvmlProcessInfo_t, computeInstanceId);
    SIZE(nvmlProcessInfo_v1_t);
    SIZE(nvmlPciInfo_t);
    OFFSET(nvmlPciInfo_t, busIdLegacy);
    OFFSET(nvmlPciInfo_t, domain);
    OFFSET(nvmlPciInfo_t, pciDeviceId);
    OFFSET(nvmlPciInfo_t, pciSubSystemId);
    OFFSET(nvmlPciInfo_t, busId);
    SIZE(nvmlUtilization_t);
    OFFSET(nvmlUtilization_t, memory);
    SIZE(nvmlProcessUtilizationSample_t);
    OFFSET(nvmlProcessUtilizationSample_t, timeStamp);
    OFFSET(nvmlProcessUtilizationSample_t, decUtil);
    VALUE(NVML_ERROR_INSUFFICIENT_SIZE);
    VALUE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    VALUE(NVML_ERROR_NO_PERMISSION);
    VALUE(NVML_DEVICE_ARCH_HOPPER);
    VALUE(NVML_DEVICE_ARCH_AMPERE);
    VALUE(NVML_CLOCK_SM);
    VALUE(NVML_CLOCK_MEM);
    VALUE(NVML_CLOCK_LIMIT_ID_TDP);
    VALUE(NVML_CLOCK_LIMIT_ID_UNLIMITED);
    VALUE(NVML_TEMPERATURE_GPU);
    VALUE(NVML_FEATURE_ENABLED);
    VALUE(NVML_DEVICE_MIG_DISABLE);
    return 0;
}
