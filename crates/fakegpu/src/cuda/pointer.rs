//! Pointer attributes (`cuPointerGetAttribute`, `cuPointerGetAttributes`) and the lookup
//! of the memory an address belongs to, which the copies share.
//!
//! Device memory lives in the fake's device address window; an address there that is in no
//! allocation is no memory (`CUDA_ERROR_INVALID_VALUE`). Pinned host memory from
//! `cuMemAllocHost`/`cuMemHostAlloc` is host memory of the context that allocated it.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUdeviceptr, CUmemorytype, CUpointer_attribute, CUresult};

use super::process::{self, Process, VA_END, VA_START};
use super::{entry, CuResult};
use crate::ffi;

/// What kind of memory a region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// cuMemAlloc*, pools.
    Device,
    Managed,
    /// An IPC mapping of another process's allocation.
    Imported,
    /// A cuMemMap mapping of a cuMemCreate allocation.
    Mapped,
    /// Pinned host memory.
    Host,
}

/// The allocation an address falls in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub base: u64,
    pub size: u64,
    pub kind: Kind,
    /// The owning context (0 for none).
    pub ctx: u64,
    /// Driver device index (`None`: host memory).
    pub device: Option<usize>,
    /// Buffer id (0 where the fake has none).
    pub id: u64,
    /// Memory pool handle (0: none).
    pub pool: u64,
}

/// Whether `ptr` is in the fake's device address window.
pub(crate) fn in_device_window(ptr: u64) -> bool {
    (VA_START..VA_END).contains(&ptr)
}

fn containing<V>(map: &std::collections::BTreeMap<u64, V>, ptr: u64) -> Option<(u64, &V)> {
    map.range(..=ptr).next_back().map(|(&b, v)| (b, v))
}

impl Process {
    /// The allocation `ptr` is in, if any.
    pub(crate) fn region(&self, ptr: u64) -> Option<Region> {
        if let Some((base, a)) = containing(&self.allocs, ptr) {
            if ptr < base + a.size {
                return Some(Region {
                    base,
                    size: a.size,
                    kind: if a.managed {
                        Kind::Managed
                    } else {
                        Kind::Device
                    },
                    ctx: a.ctx,
                    device: Some(a.device),
                    id: a.id,
                    pool: a.pool,
                });
            }
        }
        if let Some((base, i)) = containing(&self.imports, ptr) {
            if ptr < base + i.size {
                return Some(Region {
                    base,
                    size: i.size,
                    kind: Kind::Imported,
                    ctx: i.ctx,
                    device: Some(i.device),
                    id: 0,
                    pool: 0,
                });
            }
        }
        if let Some((base, m)) = containing(&self.mappings, ptr) {
            if ptr < base + m.size {
                let physical = self.physical.get(&m.handle);
                return Some(Region {
                    base,
                    size: m.size,
                    kind: Kind::Mapped,
                    ctx: physical.map_or(0, |p| p.ctx),
                    device: physical.and_then(|p| p.device),
                    id: 0,
                    pool: 0,
                });
            }
        }
        let host = self.host.range(..=(ptr as usize)).next_back();
        if let Some((&base, &(size, ctx))) = host {
            if (ptr as usize) < base + size {
                return Some(Region {
                    base: base as u64,
                    size: size as u64,
                    kind: Kind::Host,
                    ctx,
                    device: None,
                    id: 0,
                    pool: 0,
                });
            }
        }
        None
    }

    /// The CUDA ordinal of driver device `device` (the first that maps to it).
    pub(crate) fn ordinal_of(&self, device: usize) -> Option<usize> {
        self.visible.iter().position(|&d| d == device)
    }
}

/// An attribute's value, typed as cuda.h says `data` points to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    /// CUcontext, void *, CUdeviceptr, CUmemoryPool: pointer-sized.
    Pointer(u64),
    /// unsigned int (memory type, access flags).
    Uint(c_uint),
    /// int (device ordinal).
    Int(c_int),
    /// A boolean, written as one byte (a C `bool`).
    Bool(bool),
    /// unsigned long long (buffer id, handle types, memory block id).
    U64(u64),
    /// size_t.
    Size(usize),
}

const CONTEXT: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT as u32;
const MEMORY_TYPE: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as u32;
const DEVICE_POINTER: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER as u32;
const HOST_POINTER: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_HOST_POINTER as u32;
const SYNC_MEMOPS: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS as u32;
const BUFFER_ID: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID as u32;
const IS_MANAGED: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED as u32;
const DEVICE_ORDINAL: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as u32;
const IPC_CAPABLE: u32 =
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE as u32;
const RANGE_START: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as u32;
const RANGE_SIZE: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE as u32;
const MAPPED: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPED as u32;
const HANDLE_TYPES: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES as u32;
const RDMA_CAPABLE: u32 =
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE as u32;
const ACCESS_FLAGS: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS as u32;
const MEMPOOL_HANDLE: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE as u32;
const MAPPING_SIZE: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_SIZE as u32;
const MAPPING_BASE: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR as u32;
const BLOCK_ID: u32 = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID as u32;
/// `CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE` (CUDA 12.8).
const HW_DECOMPRESS: u32 = 21;

/// `CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE`.
const ACCESS_READWRITE: c_uint = 3;

/// The value of `attr` for `ptr` in `region`, or the error cuPointerGetAttribute returns.
fn value(p: &Process, attr: u32, ptr: u64, r: &Region) -> CuResult<Value> {
    let host = r.kind == Kind::Host;
    Ok(match attr {
        CONTEXT => Value::Pointer(r.ctx),
        MEMORY_TYPE => Value::Uint(if host {
            CUmemorytype::CU_MEMORYTYPE_HOST as c_uint
        } else {
            CUmemorytype::CU_MEMORYTYPE_DEVICE as c_uint
        }),
        // Unified addressing: the same address on both sides where both exist.
        DEVICE_POINTER => Value::Pointer(ptr),
        HOST_POINTER if host || r.kind == Kind::Managed => Value::Pointer(ptr),
        HOST_POINTER => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        SYNC_MEMOPS => Value::Bool(false),
        BUFFER_ID => Value::U64(r.id),
        IS_MANAGED => Value::Bool(r.kind == Kind::Managed),
        DEVICE_ORDINAL => {
            let device = match r.device {
                Some(d) => Some(d),
                None => p.contexts.get(&r.ctx).map(|c| c.device),
            };
            let ordinal = device.and_then(|d| p.ordinal_of(d));
            Value::Int(ordinal.map_or(-1, |o| o as c_int))
        }
        IPC_CAPABLE => Value::Bool(r.kind == Kind::Device && r.pool == 0),
        RANGE_START => Value::Pointer(r.base),
        RANGE_SIZE => Value::Size(r.size as usize),
        MAPPED => Value::Bool(true),
        HANDLE_TYPES => Value::U64(0),
        RDMA_CAPABLE => Value::Bool(!host && r.kind != Kind::Managed),
        ACCESS_FLAGS => Value::Uint(ACCESS_READWRITE),
        MEMPOOL_HANDLE => Value::Pointer(r.pool),
        MAPPING_SIZE => Value::Size(r.size as usize),
        MAPPING_BASE => Value::Pointer(r.base),
        BLOCK_ID => Value::U64(r.id),
        HW_DECOMPRESS => Value::Bool(false),
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

/// The value cuPointerGetAttributes reports for an address that is no allocation.
fn default_value(attr: u32) -> CuResult<Value> {
    Ok(match attr {
        CONTEXT | DEVICE_POINTER | HOST_POINTER | RANGE_START | MEMPOOL_HANDLE | MAPPING_BASE => {
            Value::Pointer(0)
        }
        MEMORY_TYPE | ACCESS_FLAGS => Value::Uint(0),
        DEVICE_ORDINAL => Value::Int(-2),
        SYNC_MEMOPS | IS_MANAGED | IPC_CAPABLE | MAPPED | RDMA_CAPABLE | HW_DECOMPRESS => {
            Value::Bool(false)
        }
        BUFFER_ID | HANDLE_TYPES | BLOCK_ID => Value::U64(0),
        RANGE_SIZE | MAPPING_SIZE => Value::Size(0),
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

/// Store `v` at `data`.
///
/// # Safety
/// `data` is non-NULL and points to the attribute's type (driver API contract).
unsafe fn store(data: *mut c_void, v: Value) -> CuResult {
    // SAFETY: by this function's contract.
    unsafe {
        match v {
            Value::Pointer(x) => ffi::write(data.cast::<u64>(), x)?,
            Value::Uint(x) => ffi::write(data.cast::<c_uint>(), x)?,
            Value::Int(x) => ffi::write(data.cast::<c_int>(), x)?,
            Value::Bool(x) => ffi::write(data.cast::<u8>(), u8::from(x))?,
            Value::U64(x) => ffi::write(data.cast::<u64>(), x)?,
            Value::Size(x) => ffi::write(data.cast::<usize>(), x)?,
        }
    }
    Ok(())
}

/// An address in no allocation is CUDA_ERROR_INVALID_VALUE; `HOST_POINTER` of device memory
/// too (it has no host address).
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: `attribute` is a local copy of the argument; read as a raw integer.
    let attr = unsafe { ffi::read_enum(&attribute) };
    entry(|| {
        if data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = process::with(|p| {
            let region = p.region(ptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            value(p, attr, ptr, &region)
        })?;
        // SAFETY: `data` is non-NULL and points to the attribute's type (driver API
        // contract).
        unsafe { store(data, v) }
    })
}

/// Never an error for an address that is no allocation: every attribute gets its NULL
/// value (device ordinal -2, as the real driver reports).
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    num_attributes: c_uint,
    attributes: *mut CUpointer_attribute,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    entry(|| {
        if num_attributes > 0 && (attributes.is_null() || data.is_null()) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = num_attributes as usize;
        let mut attrs = Vec::with_capacity(n);
        let mut outs = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: both arrays hold `num_attributes` entries (driver API contract); the
            // enum is read as a raw integer.
            unsafe {
                attrs.push(ffi::read_enum(attributes.add(i)));
                outs.push(ffi::read(data.add(i))?);
            }
        }
        let values = process::with(|p| {
            let region = p.region(ptr);
            attrs
                .iter()
                .map(|&a| match &region {
                    Some(r) => match value(p, a, ptr, r) {
                        Err(_) if a == HOST_POINTER => Ok(Value::Pointer(0)),
                        other => other,
                    },
                    None => default_value(a),
                })
                .collect::<CuResult<Vec<Value>>>()
        })?;
        for (out, v) in outs.into_iter().zip(values) {
            if out.is_null() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: each non-NULL `data[i]` points to its attribute's type (driver API
            // contract).
            unsafe { store(out, v) }?;
        }
        Ok(())
    })
}
