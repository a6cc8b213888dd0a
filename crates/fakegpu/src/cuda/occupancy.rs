//! Function attributes (`cuFuncGetAttribute`, `cuFuncSetAttribute`, `cuFuncSetCacheConfig`)
//! and the occupancy calculator (`cuOccupancy*`).
//!
//! No image is read, so every function looks like the same plausible kernel: 32 registers
//! per thread, no static shared, constant or local memory, PTX and binary version of the
//! device's compute capability. Occupancy follows the CUDA occupancy calculator with the
//! device's limits (`cuDeviceGetAttribute`): warps and blocks per SM, registers allocated
//! per warp in units of 256, shared memory per SM with 1 KiB reserved per block.

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys::{
    CUdevice_attribute as A, CUfunc_cache, CUfunction, CUfunction_attribute as F,
    CUoccupancyB2DSize, CUresult,
};

use super::init::attribute;
use super::process::{self, Process};
use super::{entry, CuResult};
use crate::config::DeviceConfig;
use crate::ffi;

/// Registers per thread every (simulated) function uses.
pub(crate) const NUM_REGS: c_int = 32;
/// Shared memory the driver reserves per block.
const RESERVED_SHARED_PER_BLOCK: u64 = 1024;
/// Registers are allocated per warp in units of this many.
const REGISTER_UNIT: u64 = 256;
/// Default dynamic shared memory limit without opting in.
const DEFAULT_DYNAMIC_SHARED: c_int = 48 << 10;

/// What cuFuncSetAttribute and cuFuncSetCacheConfig change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FuncAttrs {
    pub max_dynamic_shared: c_int,
    pub carveout: c_int,
    pub cache_config: u32,
    pub required_cluster: [c_int; 3],
    pub non_portable_cluster: c_int,
    pub cluster_scheduling: c_int,
}

impl Default for FuncAttrs {
    fn default() -> FuncAttrs {
        FuncAttrs {
            max_dynamic_shared: DEFAULT_DYNAMIC_SHARED,
            carveout: -1,
            cache_config: 0,
            required_cluster: [0; 3],
            non_portable_cluster: 0,
            cluster_scheduling: 0,
        }
    }
}

fn dev_attr(d: &DeviceConfig, a: A) -> u64 {
    attribute(d, a as c_uint).map_or(0, |v| v.max(0) as u64)
}

/// The value of function attribute `attr` of a function with `attrs` on device `d`.
pub(crate) fn get_attribute(d: &DeviceConfig, attrs: &FuncAttrs, attr: u32) -> CuResult<c_int> {
    let version = (d.compute_capability.0 * 10 + d.compute_capability.1) as c_int;
    Ok(match attr {
        x if x == F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK as u32 => 1024,
        x if x == F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES as u32 => 0,
        x if x == F::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES as u32 => 0,
        x if x == F::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES as u32 => 0,
        x if x == F::CU_FUNC_ATTRIBUTE_NUM_REGS as u32 => NUM_REGS,
        x if x == F::CU_FUNC_ATTRIBUTE_PTX_VERSION as u32 => version,
        x if x == F::CU_FUNC_ATTRIBUTE_BINARY_VERSION as u32 => version,
        x if x == F::CU_FUNC_ATTRIBUTE_CACHE_MODE_CA as u32 => 0,
        x if x == F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as u32 => {
            attrs.max_dynamic_shared
        }
        x if x == F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT as u32 => attrs.carveout,
        x if x == F::CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET as u32 => 0,
        x if x == F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH as u32 => attrs.required_cluster[0],
        x if x == F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT as u32 => attrs.required_cluster[1],
        x if x == F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH as u32 => attrs.required_cluster[2],
        x if x == F::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED as u32 => {
            attrs.non_portable_cluster
        }
        x if x == F::CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE as u32 => {
            attrs.cluster_scheduling
        }
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

/// Set function attribute `attr`; the read-only ones and values out of range are
/// CUDA_ERROR_INVALID_VALUE.
pub(crate) fn set_attribute(
    d: &DeviceConfig,
    attrs: &mut FuncAttrs,
    attr: u32,
    value: c_int,
) -> CuResult {
    let optin = dev_attr(d, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) as c_int;
    let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
    match attr {
        x if x == F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as u32 => {
            if !(0..=optin).contains(&value) {
                return Err(bad);
            }
            attrs.max_dynamic_shared = value;
        }
        x if x == F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT as u32 => {
            if !(-1..=100).contains(&value) {
                return Err(bad);
            }
            attrs.carveout = value;
        }
        x if x == F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH as u32 => {
            attrs.required_cluster[0] = value.max(0)
        }
        x if x == F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT as u32 => {
            attrs.required_cluster[1] = value.max(0)
        }
        x if x == F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH as u32 => {
            attrs.required_cluster[2] = value.max(0)
        }
        x if x == F::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED as u32 => {
            attrs.non_portable_cluster = c_int::from(value != 0)
        }
        x if x == F::CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE as u32 => {
            if !(0..=2).contains(&value) {
                return Err(bad);
            }
            attrs.cluster_scheduling = value;
        }
        _ => return Err(bad),
    }
    Ok(())
}

/// `CUfunc_cache` values 0..=3.
pub(crate) fn check_cache_config(config: u32) -> CuResult {
    if config > CUfunc_cache::CU_FUNC_CACHE_PREFER_EQUAL as u32 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Blocks of `block_size` threads using `dynamic_shared` bytes that fit on one SM at once.
pub(crate) fn blocks_per_sm(
    d: &DeviceConfig,
    attrs: &FuncAttrs,
    block_size: u64,
    dynamic_shared: u64,
) -> u64 {
    if block_size == 0
        || block_size > 1024
        || dynamic_shared > attrs.max_dynamic_shared.max(0) as u64
    {
        return 0;
    }
    let warp = dev_attr(d, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE).max(1);
    let warps = block_size.div_ceil(warp);
    let by_warps =
        dev_attr(d, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) / warp / warps;
    let by_blocks = dev_attr(d, A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
    let regs_per_warp = (NUM_REGS as u64 * warp).div_ceil(REGISTER_UNIT) * REGISTER_UNIT;
    let by_regs = dev_attr(d, A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
        / (regs_per_warp * warps);
    let shared = dev_attr(
        d,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
    );
    let by_shared = shared / (dynamic_shared + RESERVED_SHARED_PER_BLOCK);
    by_warps.min(by_blocks).min(by_regs).min(by_shared)
}

/// `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`.
const DISABLE_CACHING_OVERRIDE: c_uint = 1;

impl Process {
    /// The device and attributes of function `f` (a module's function or a library kernel
    /// used as one: on the current context's device).
    pub(crate) fn function_info(
        &self,
        f: CUfunction,
    ) -> CuResult<(&'static DeviceConfig, FuncAttrs)> {
        let function = self
            .functions
            .get(&(f as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ctx = match self.modules.get(&function.module) {
            Some(&ctx) => ctx,
            None => self.current_ctx()?.0,
        };
        let device = self.ctx_device(ctx)?;
        Ok((&self.device(device)?.config, function.attrs))
    }
}

fn write_int(out: *mut c_int, v: c_int) -> CuResult {
    // SAFETY: `out` is NULL or writable (driver API contract).
    Ok(unsafe { ffi::write(out, v) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: F,
    hfunc: CUfunction,
) -> CUresult {
    // SAFETY: `attrib` is a local copy of the argument; read as a raw integer.
    let attrib = unsafe { ffi::read_enum(&attrib) };
    entry(|| {
        if pi.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = process::with(|p| {
            let (d, attrs) = p.function_info(hfunc)?;
            get_attribute(d, &attrs, attrib)
        })?;
        write_int(pi, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(
    hfunc: CUfunction,
    attrib: F,
    value: c_int,
) -> CUresult {
    // SAFETY: `attrib` is a local copy of the argument; read as a raw integer.
    let attrib = unsafe { ffi::read_enum(&attrib) };
    entry(|| {
        process::with(|p| {
            let (d, mut attrs) = p.function_info(hfunc)?;
            set_attribute(d, &mut attrs, attrib, value)?;
            if let Some(f) = p.functions.get_mut(&(hfunc as u64)) {
                f.attrs = attrs;
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetCacheConfig(hfunc: CUfunction, config: CUfunc_cache) -> CUresult {
    // SAFETY: `config` is a local copy of the argument; read as a raw integer.
    let config = unsafe { ffi::read_enum(&config) };
    entry(|| {
        check_cache_config(config)?;
        process::with(|p| {
            let f = p
                .functions
                .get_mut(&(hfunc as u64))
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            f.attrs.cache_config = config;
            Ok(())
        })
    })
}

fn max_active_blocks(
    num_blocks: *mut c_int,
    func: CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
    flags: c_uint,
) -> CuResult {
    if num_blocks.is_null() || block_size <= 0 || flags & !DISABLE_CACHING_OVERRIDE != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = process::with(|p| {
        let (d, attrs) = p.function_info(func)?;
        Ok(blocks_per_sm(
            d,
            &attrs,
            block_size as u64,
            dynamic_smem as u64,
        ))
    })?;
    write_int(num_blocks, n as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    num_blocks: *mut c_int,
    func: CUfunction,
    block_size: c_int,
    dynamic_smem_size: usize,
) -> CUresult {
    entry(|| max_active_blocks(num_blocks, func, block_size, dynamic_smem_size, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    num_blocks: *mut c_int,
    func: CUfunction,
    block_size: c_int,
    dynamic_smem_size: usize,
    flags: c_uint,
) -> CUresult {
    entry(|| max_active_blocks(num_blocks, func, block_size, dynamic_smem_size, flags))
}

/// The block size with the most resident threads per SM (the largest among equals), the
/// dynamic shared memory of each candidate from the callback when there is one.
fn max_potential_block_size(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    to_dynamic_smem: CUoccupancyB2DSize,
    dynamic_smem_size: usize,
    block_size_limit: c_int,
    flags: c_uint,
) -> CuResult {
    if min_grid_size.is_null() || block_size.is_null() || flags & !DISABLE_CACHING_OVERRIDE != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (d, attrs) = process::with(|p| p.function_info(func))?;
    let limit = if block_size_limit <= 0 {
        1024
    } else {
        (block_size_limit as u64).min(1024)
    };
    let warp = 32;
    let mut best = (0u64, 0u64, 0u64); // (threads resident, block size, blocks per SM)
    let mut size = limit.div_ceil(warp) * warp;
    while size >= warp {
        let candidate = size.min(limit);
        let dynamic = match to_dynamic_smem {
            // SAFETY: the caller's callback, called with a block size as cuda.h documents;
            // it is not called with the process lock held.
            Some(callback) => (unsafe { callback(candidate as c_int) }) as u64,
            None => dynamic_smem_size as u64,
        };
        let blocks = blocks_per_sm(d, &attrs, candidate, dynamic);
        if blocks * candidate > best.0 {
            best = (blocks * candidate, candidate, blocks);
        }
        size -= warp;
    }
    let grid = best.2 * u64::from(d.sm_count);
    write_int(min_grid_size, c_int::try_from(grid).unwrap_or(c_int::MAX))?;
    write_int(block_size, best.1 as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    block_size_to_dynamic_smem_size: CUoccupancyB2DSize,
    dynamic_smem_size: usize,
    block_size_limit: c_int,
) -> CUresult {
    entry(|| {
        max_potential_block_size(
            min_grid_size,
            block_size,
            func,
            block_size_to_dynamic_smem_size,
            dynamic_smem_size,
            block_size_limit,
            0,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    block_size_to_dynamic_smem_size: CUoccupancyB2DSize,
    dynamic_smem_size: usize,
    block_size_limit: c_int,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        max_potential_block_size(
            min_grid_size,
            block_size,
            func,
            block_size_to_dynamic_smem_size,
            dynamic_smem_size,
            block_size_limit,
            flags,
        )
    })
}

/// Dynamic shared memory per block that lets `num_blocks` blocks of `block_size` threads
/// reside on one SM (0 if they cannot, whatever the shared memory).
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    dynamic_smem_size: *mut usize,
    func: CUfunction,
    num_blocks: c_int,
    block_size: c_int,
) -> CUresult {
    entry(|| {
        if dynamic_smem_size.is_null() || num_blocks <= 0 || block_size <= 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (d, attrs) = process::with(|p| p.function_info(func))?;
        let n = num_blocks as u64;
        let fits = blocks_per_sm(d, &attrs, block_size as u64, 0) >= n;
        let shared = dev_attr(
            d,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        );
        let optin = dev_attr(d, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
        let available = if fits {
            (shared / n)
                .saturating_sub(RESERVED_SHARED_PER_BLOCK)
                .min(optin)
        } else {
            0
        };
        // SAFETY: `dynamic_smem_size` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(dynamic_smem_size, available as usize) }?)
    })
}
