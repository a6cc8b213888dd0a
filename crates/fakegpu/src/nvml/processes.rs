//! Process lists: compute processes (every version), graphics and MPS processes (none: no
//! graphics work and no MPS server are simulated), and the versioned detail list.
//!
//! All versions list the same processes with the same memory: those holding a context or
//! memory on the device, less checkpointed ones. Without MIG, instance ids are 0xFFFFFFFF.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessDetailList_t, nvmlProcessDetail_v1_t, nvmlProcessInfo_t,
    nvmlProcessInfo_v1_t, nvmlReturn_t,
};

use super::device::{put, put_list, versioned};
use super::{device, entry, null_arg, INSUFFICIENT_SIZE, INVALID_ARGUMENT};
use crate::driver::Device;
use crate::ffi;

/// Live processes holding a context or memory on the device: (pid, bytes). A checkpointed
/// process has released the GPU (its memory is in host memory), so it is not listed.
fn processes(d: &Device) -> Vec<(u32, u64)> {
    d.state.reclaim_dead();
    d.state
        .processes()
        .into_iter()
        .filter(|p| p.checkpoint != crate::state::CheckpointState::Checkpointed)
        .map(|p| (p.pid, p.bytes))
        .collect()
}

/// No MIG: instance ids are 0xFFFFFFFF as nvml.h specifies.
fn process_infos(d: &Device) -> Vec<nvmlProcessInfo_t> {
    processes(d)
        .into_iter()
        .map(|(pid, bytes)| nvmlProcessInfo_t {
            pid,
            usedGpuMemory: bytes,
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
        })
        .collect()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    entry(|| put_list(count, infos, &process_infos(device(handle)?)))
}

/// Same structure as _v3 (nvml.h: nvmlProcessInfo_v2_t is nvmlProcessInfo_t).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    entry(|| put_list(count, infos, &process_infos(device(handle)?)))
}

/// Graphics processes: the simulated devices run no graphics work, so the list is empty (a
/// real data-centre GPU running only CUDA answers the same).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        put_list::<nvmlProcessInfo_t>(count, infos, &[])
    })
}

/// Same structure as _v3.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the same arguments, under the same contract.
    unsafe { nvmlDeviceGetGraphicsRunningProcesses_v3(handle, count, infos) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        put_list::<nvmlProcessInfo_v1_t>(count, infos, &[])
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    entry(|| {
        let list: Vec<nvmlProcessInfo_v1_t> = processes(device(handle)?)
            .into_iter()
            .map(|(pid, bytes)| nvmlProcessInfo_v1_t {
                pid,
                usedGpuMemory: bytes,
            })
            .collect();
        put_list(count, infos, &list)
    })
}

/// MPS clients: none (no MPS server is simulated).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        put_list::<nvmlProcessInfo_t>(count, infos, &[])
    })
}

/// Same structure as _v3.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the same arguments, under the same contract.
    unsafe { nvmlDeviceGetMPSComputeRunningProcesses_v3(handle, count, infos) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        put_list::<nvmlProcessInfo_v1_t>(count, infos, &[])
    })
}

/// nvml.h's process modes (`nvmlProcessDetailList_t.mode`).
const MODE_COMPUTE: c_uint = 0;
const MODE_GRAPHICS: c_uint = 1;
const MODE_MPS: c_uint = 2;

/// `plist->version` must be nvml.h's `nvmlProcessDetailList_v1` and `plist->mode` one of
/// compute, graphics, MPS (else NVML_ERROR_INVALID_ARGUMENT, as nvml.h lists);
/// `numProcArrayEntries` is the capacity of `procArray` in and the count out (too small or a
/// NULL array with processes to list: NVML_ERROR_INSUFFICIENT_SIZE with the count).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    handle: nvmlDevice_t,
    plist: *mut nvmlProcessDetailList_t,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        // SAFETY: `plist` is NULL or points to an nvmlProcessDetailList_t (NVML API contract);
        // its fields are integers and a pointer, any bit pattern valid.
        let list = unsafe { ffi::read(plist.cast_const()) }.map_err(null_arg)?;
        if list.version != versioned::<nvmlProcessDetailList_t>(1) {
            return Err(INVALID_ARGUMENT);
        }
        let entries: Vec<nvmlProcessDetail_v1_t> = match list.mode {
            MODE_COMPUTE => processes(d)
                .into_iter()
                .map(|(pid, bytes)| nvmlProcessDetail_v1_t {
                    pid,
                    usedGpuMemory: bytes,
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                    usedGpuCcProtectedMemory: 0,
                })
                .collect(),
            MODE_GRAPHICS | MODE_MPS => Vec::new(),
            _ => return Err(INVALID_ARGUMENT),
        };
        let capacity = list.numProcArrayEntries as usize;
        // SAFETY: `plist` is not NULL (it was read above); this only takes a field's address.
        let count_field = unsafe { std::ptr::addr_of_mut!((*plist).numProcArrayEntries) };
        put(count_field, entries.len() as c_uint)?;
        if entries.is_empty() {
            return Ok(());
        }
        if entries.len() > capacity || list.procArray.is_null() {
            return Err(INSUFFICIENT_SIZE);
        }
        // SAFETY: `procArray` holds `capacity` >= entries.len() writable entries (NVML API
        // contract).
        unsafe { std::ptr::copy_nonoverlapping(entries.as_ptr(), list.procArray, entries.len()) };
        Ok(())
    })
}
