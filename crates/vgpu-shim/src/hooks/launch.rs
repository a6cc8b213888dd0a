//! Every way to queue work on a GPU. Each hook describes the launch as a
//! [`Work`] and hands the one driver call to [`compute::launch`] (or [`compute::launch_many`]),
//! which decides when it may run. Without a compute limit this is the driver call plus a few
//! instructions: no lock, no allocation (a multi-device launch of more than
//! [`MAX_DEVICES`] devices, which no machine has, is the one exception).

use std::ffi::{c_int, c_uint, c_void};

use crate::config;
use crate::ffi::*;
use crate::governor::compute::{self, Work};
use crate::guard::Call;
use crate::real::sig;

/// The launch exports' fast path (`fast if launch::unlimited` in `governed.rs`): nothing to
/// govern now (no vGPU, or no compute limit on any of its devices), so the export calls the
/// driver straight away. Decides the mode on a process's first governed call.
#[inline(always)]
pub fn unlimited() -> bool {
    compute::unlimited(config::mode())
}

/// A kernel grid of `function`.
#[inline(always)]
fn kernel_work(function: CUfunction, grid: [c_uint; 3], block: [c_uint; 3]) -> Work {
    let (blocks, threads) = Work::grid(grid, block);
    Work::Kernel {
        function,
        blocks,
        threads,
    }
}

/// A cooperative grid of `function`.
#[inline(always)]
fn cooperative_work(function: CUfunction, grid: [c_uint; 3], block: [c_uint; 3]) -> Work {
    let (blocks, threads) = Work::grid(grid, block);
    Work::Cooperative {
        function,
        blocks,
        threads,
    }
}

/// `cuLaunchKernel(_ptsz)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel(
    call: &Call<CuResult>,
    real: sig::cuLaunchKernel,
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    let work = kernel_work(f, [grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    compute::launch(config::mode(), stream, work, || {
        call.driver(|| {
            // SAFETY: the real function with the program's arguments.
            unsafe {
                real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_bytes,
                    stream,
                    params,
                    extra,
                )
            }
        })
    })
}

/// `cuLaunchKernelEx(_ptsz)`: the shape and stream are in the config (a NULL config is the
/// driver's to refuse).
#[inline(always)]
pub unsafe fn kernel_ex(
    call: &Call<CuResult>,
    real: sig::cuLaunchKernelEx,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let driver = || call.driver(|| unsafe { real(config, f, params, extra) });
    if config.is_null() {
        return driver();
    }
    // SAFETY: a non-NULL config is readable (driver API contract); its fields read here are
    // plain integers and a pointer.
    let c = unsafe { &*config };
    let work = kernel_work(
        f,
        [c.gridDimX, c.gridDimY, c.gridDimZ],
        [c.blockDimX, c.blockDimY, c.blockDimZ],
    );
    compute::launch(config::mode(), c.hStream, work, driver)
}

/// `cuLaunchCooperativeKernel(_ptsz)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn cooperative(
    call: &Call<CuResult>,
    real: sig::cuLaunchCooperativeKernel,
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CuResult {
    let work = cooperative_work(f, [grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    compute::launch(config::mode(), stream, work, || {
        call.driver(|| {
            // SAFETY: the real function with the program's arguments.
            unsafe {
                real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_bytes,
                    stream,
                    params,
                )
            }
        })
    })
}

/// The most devices a multi-device launch is described for without allocating.
pub const MAX_DEVICES: usize = 64;

/// `cuLaunchCooperativeKernelMultiDevice`: one cooperative grid per device, each into its
/// own stream, governed together. A NULL list or zero devices is the driver's to refuse.
pub unsafe fn cooperative_multi_device(
    call: &Call<CuResult>,
    real: sig::cuLaunchCooperativeKernelMultiDevice,
    list: *mut CUDA_LAUNCH_PARAMS,
    devices: c_uint,
    flags: c_uint,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let driver = || call.driver(|| unsafe { real(list, devices, flags) });
    let n = devices as usize;
    if list.is_null() || n == 0 {
        return driver();
    }
    // SAFETY: the list holds `devices` entries (driver API contract); they are plain data.
    let params = unsafe { std::slice::from_raw_parts(list.cast_const(), n) };
    let item = |p: &CUDA_LAUNCH_PARAMS| {
        (
            p.hStream,
            cooperative_work(
                p.function,
                [p.gridDimX, p.gridDimY, p.gridDimZ],
                [p.blockDimX, p.blockDimY, p.blockDimZ],
            ),
        )
    };
    if n <= MAX_DEVICES {
        let empty = (
            std::ptr::null_mut(),
            Work::Graph {
                exec: std::ptr::null_mut(),
            },
        );
        let mut items = [empty; MAX_DEVICES];
        for (slot, p) in items.iter_mut().zip(params) {
            *slot = item(p);
        }
        compute::launch_many(config::mode(), &items[..n], driver)
    } else {
        let items: Vec<_> = params.iter().map(item).collect();
        compute::launch_many(config::mode(), &items, driver)
    }
}

/// `cuGraphLaunch(_ptsz)`.
#[inline(always)]
pub unsafe fn graph(call: &Call<CuResult>, real: sig::cuGraphLaunch, exec: CUgraphExec, stream: CUstream) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    compute::launch(config::mode(), stream, Work::Graph { exec }, || {
        call.driver(|| unsafe { real(exec, stream) })
    })
}

/// The legacy launches use the block shape set by `cuFuncSetBlockShape`, which the shim does
/// not track: threads per block count as 0 (unknown).
const UNKNOWN_BLOCK: [c_uint; 3] = [0; 3];

/// The legacy grid `width × height` (negative sizes are the driver's to refuse).
fn legacy_shape(width: c_int, height: c_int) -> [c_uint; 3] {
    [width as c_uint, height as c_uint, 1]
}

/// `cuLaunch`: one block, into the NULL stream.
pub unsafe fn legacy(call: &Call<CuResult>, real: sig::cuLaunch, f: CUfunction) -> CuResult {
    let work = kernel_work(f, [1, 1, 1], UNKNOWN_BLOCK);
    // SAFETY: the real function with the program's argument.
    compute::launch(config::mode(), std::ptr::null_mut(), work, || call.driver(|| unsafe { real(f) }))
}

/// `cuLaunchGrid`: into the NULL stream.
pub unsafe fn legacy_grid(
    call: &Call<CuResult>,
    real: sig::cuLaunchGrid,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
) -> CuResult {
    let work = kernel_work(f, legacy_shape(grid_width, grid_height), UNKNOWN_BLOCK);
    // SAFETY: the real function with the program's arguments.
    compute::launch(config::mode(), std::ptr::null_mut(), work, || {
        call.driver(|| unsafe { real(f, grid_width, grid_height) })
    })
}

/// `cuLaunchGridAsync`.
pub unsafe fn legacy_grid_async(
    call: &Call<CuResult>,
    real: sig::cuLaunchGridAsync,
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
    stream: CUstream,
) -> CuResult {
    let work = kernel_work(f, legacy_shape(grid_width, grid_height), UNKNOWN_BLOCK);
    // SAFETY: the real function with the program's arguments.
    compute::launch(config::mode(), stream, work, || {
        call.driver(|| unsafe { real(f, grid_width, grid_height, stream) })
    })
}
