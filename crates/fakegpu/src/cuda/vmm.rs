//! Virtual memory management: cuMemCreate / cuMemRelease (physical memory), address
//! reservations, cuMemMap / cuMemUnmap, cuMemSetAccess, granularity (2 MiB).
//!
//! Physical memory located on a device is charged at cuMemCreate and given back when the
//! handle is released and no longer mapped; host-located memory is never charged.

use std::ffi::{c_uint, c_ulonglong};

use cudarc::driver::sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationGranularity_flags,
    CUmemAllocationProp, CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocationType,
    CUresult,
};

use super::mem::LARGE_PAGE;
use super::process::{self, Mapping, Physical};
use super::{entry, CuResult};
use crate::ffi;

/// cuMemGetAllocationGranularity's answer, minimum and recommended.
pub(crate) const GRANULARITY: u64 = LARGE_PAGE;

/// A non-zero multiple of the granularity (a power of two).
fn aligned(v: u64) -> bool {
    v != 0 && v & (GRANULARITY - 1) == 0
}

/// Where a CUmemAllocationProp puts the memory: `Some(ordinal)` for a device, `None` for
/// host memory. Enum fields are read as raw integers.
///
/// # Safety
/// `prop` is non-NULL and points to a CUmemAllocationProp.
unsafe fn placement(prop: *const CUmemAllocationProp) -> CuResult<Option<i32>> {
    // SAFETY: by this function's contract; see ffi::read_enum for the enum fields.
    let (kind, location, id) = unsafe {
        (
            ffi::read_enum(std::ptr::addr_of!((*prop).type_)),
            ffi::read_enum(std::ptr::addr_of!((*prop).location.type_)),
            std::ptr::addr_of!((*prop).location.id).read_unaligned(),
        )
    };
    if kind != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED as u32 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let host_kinds = [
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST as u32,
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA as u32,
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as u32,
    ];
    if location == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32 {
        Ok(Some(id))
    } else if host_kinds.contains(&location) {
        Ok(None)
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        if handle.is_null() || prop.is_null() || flags != 0 || !aligned(size as u64) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `prop` is non-NULL and points to a CUmemAllocationProp (driver API contract).
        let ordinal = unsafe { placement(prop) }?;
        let h = process::with(|p| {
            let ctx = process::current();
            let ctx = if p.contexts.contains_key(&ctx) {
                ctx
            } else {
                0
            };
            let device = match ordinal {
                Some(ordinal) => {
                    let device = p.device_of(ordinal)?;
                    p.charge(device, size as u64)?;
                    Some(device)
                }
                None => None,
            };
            let h = p.new_handle();
            p.physical.insert(
                h,
                Physical {
                    device,
                    size: size as u64,
                    ctx,
                    released: false,
                    maps: 0,
                },
            );
            Ok(h)
        })?;
        // SAFETY: `handle` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(handle, h) }?)
    })
}

/// The memory goes back once the handle is also unmapped everywhere.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    entry(|| {
        process::with(|p| {
            let physical = p
                .physical
                .get_mut(&handle)
                .filter(|ph| !ph.released)
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            physical.released = true;
            let physical = *physical;
            if physical.maps == 0 {
                p.physical.remove(&handle);
                if let Some(device) = physical.device {
                    p.uncharge(device, physical.size);
                }
            }
            Ok(())
        })
    })
}

/// `addr` is a hint and ignored; alignment 0 means the granularity.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        let alignment = if alignment == 0 {
            GRANULARITY
        } else {
            alignment as u64
        };
        if ptr.is_null() || flags != 0 || !aligned(size as u64) || !alignment.is_power_of_two() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let start = process::with(|p| {
            let start = p.alloc_va(size as u64, alignment.max(GRANULARITY))?;
            p.reservations.insert(start, size as u64);
            Ok(start)
        })?;
        // SAFETY: `ptr` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(ptr, start) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry(|| {
        process::with(|p| {
            if p.reservations.get(&ptr) != Some(&(size as u64)) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            p.reservations.remove(&ptr);
            p.free_va(ptr);
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        let (size, offset) = (size as u64, offset as u64);
        if flags != 0 || !aligned(size) || offset & (GRANULARITY - 1) != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        process::with(|p| {
            let physical = p
                .physical
                .get(&handle)
                .filter(|ph| !ph.released)
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            if offset
                .checked_add(size)
                .is_none_or(|end| end > physical.size)
            {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let end = ptr
                .checked_add(size)
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            let inside = p
                .reservations
                .range(..=ptr)
                .next_back()
                .is_some_and(|(&start, &len)| end <= start + len);
            let overlaps = p
                .mappings
                .range(..end)
                .next_back()
                .is_some_and(|(&start, m)| start + m.size > ptr);
            if !inside {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            if overlaps {
                return Err(CUresult::CUDA_ERROR_ALREADY_MAPPED);
            }
            p.mappings.insert(ptr, Mapping { size, handle });
            if let Some(ph) = p.physical.get_mut(&handle) {
                ph.maps += 1;
            }
            Ok(())
        })
    })
}

/// Unmaps every mapping that starts inside `[ptr, ptr + size)`.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry(|| {
        process::with(|p| {
            let end = ptr.saturating_add(size as u64);
            let starts: Vec<u64> = p.mappings.range(ptr..end).map(|(&s, _)| s).collect();
            if starts.is_empty() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            for start in starts {
                let Some(mapping) = p.mappings.remove(&start) else {
                    continue;
                };
                let Some(ph) = p.physical.get_mut(&mapping.handle) else {
                    continue;
                };
                ph.maps = ph.maps.saturating_sub(1);
                let ph = *ph;
                if ph.released && ph.maps == 0 {
                    p.physical.remove(&mapping.handle);
                    if let Some(device) = ph.device {
                        p.uncharge(device, ph.size);
                    }
                }
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    entry(|| {
        if desc.is_null() || count == 0 || size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let flags_ok = [
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE as u32,
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ as u32,
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u32,
        ];
        let mut ordinals = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `desc` points to `count` CUmemAccessDesc (driver API contract); enum
            // fields are read as raw integers.
            let (location, id, flags) = unsafe {
                let d = desc.add(i);
                (
                    ffi::read_enum(std::ptr::addr_of!((*d).location.type_)),
                    std::ptr::addr_of!((*d).location.id).read_unaligned(),
                    ffi::read_enum(std::ptr::addr_of!((*d).flags)),
                )
            };
            if location != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32
                || !flags_ok.contains(&flags)
            {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            ordinals.push(id);
        }
        process::with(|p| {
            for id in ordinals {
                p.device_of(id)?;
            }
            let end = ptr.saturating_add(size as u64);
            let mapped = p
                .mappings
                .range(..=ptr)
                .next_back()
                .is_some_and(|(&s, m)| s + m.size > ptr)
                && p.mappings
                    .range(..end)
                    .next_back()
                    .is_some_and(|(&s, m)| s + m.size >= end);
            if mapped {
                Ok(())
            } else {
                Err(CUresult::CUDA_ERROR_INVALID_VALUE)
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_uint,
) -> CUresult {
    entry(|| {
        let known = [
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM as c_uint,
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED as c_uint,
        ];
        if prop.is_null() || !known.contains(&option) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `prop` is non-NULL and points to a CUmemAllocationProp (driver API contract).
        let ordinal = unsafe { placement(prop) }?;
        process::with(|p| ordinal.map_or(Ok(0), |o| p.device_of(o)).map(|_| ()))?;
        // SAFETY: `granularity` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(granularity, GRANULARITY as usize) }?)
    })
}
