//! Modules, functions and every kernel launch path.
//!
//! Nothing runs. A launch queues a simulated kernel on its stream (see `stream` for the
//! order and `model` for how long it takes) and counts it. Any module image is accepted and
//! any function name resolves; a name listed in `FAKEGPU_KERNELS` gives the function its
//! own wave time.

use std::collections::HashMap;
use std::ffi::{c_char, c_float, c_int, c_uint, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    CUfunction, CUjit_option, CUlaunchConfig, CUmodule, CUresult, CUstream, CUDA_LAUNCH_PARAMS,
};

use super::process::{self, Process};
use super::stream::{StreamKey, Target};
use super::{entry, CuResult, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::ffi;
use crate::model;

/// One block has at most this many threads (cuDeviceGetAttribute MAX_THREADS_PER_BLOCK).
const MAX_THREADS_PER_BLOCK: u64 = 1024;
/// Cooperative grids must be co-resident: at most this many blocks per SM.
const COOPERATIVE_BLOCKS_PER_SM: u64 = 32;
/// Environment variable naming per-function wave times.
pub const KERNELS_ENV: &str = "FAKEGPU_KERNELS";

/// A function handle's state.
#[derive(Debug, Clone)]
pub(crate) struct Function {
    pub module: u64,
    /// One wave's time at the maximum clock, from `FAKEGPU_KERNELS` (`None`: the device's).
    pub wave_ns: Option<u64>,
    /// `cuFuncSetBlockShape` (for the legacy launches).
    pub block: Option<[c_uint; 3]>,
    /// What cuFuncSetAttribute / cuFuncSetCacheConfig changed.
    pub attrs: super::occupancy::FuncAttrs,
}

/// A kernel to run: its blocks and wave time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kernel {
    pub blocks: u64,
    pub wave_ns: Option<u64>,
}

static KERNEL_TABLE: OnceLock<Result<HashMap<String, u64>, String>> = OnceLock::new();

/// `FAKEGPU_KERNELS`, read once per process (a bad value is reported once on stderr).
pub(crate) fn kernel_table() -> CuResult<&'static HashMap<String, u64>> {
    KERNEL_TABLE
        .get_or_init(|| {
            let spec = std::env::var(KERNELS_ENV).unwrap_or_default();
            model::parse_kernel_table(&spec)
                .map(|t| t.into_iter().collect())
                .map_err(|e| {
                    let message = format!("fakegpu: {KERNELS_ENV}={spec}: {e}");
                    eprintln!("{message}");
                    message
                })
        })
        .as_ref()
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
}

impl Process {
    /// The kernel `f` launched with this shape would run, after checking both.
    pub(crate) fn kernel(
        &self,
        f: CUfunction,
        grid: [c_uint; 3],
        block: [c_uint; 3],
    ) -> CuResult<Kernel> {
        let blocks = grid_blocks(f, grid, block)?;
        let function = self
            .functions
            .get(&(f as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(Kernel {
            blocks,
            wave_ns: function.wave_ns,
        })
    }

    /// Launch `f` on `stream`; `cooperative` launches must fit on the device at once.
    fn launch(
        &mut self,
        f: CUfunction,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        stream: CUstream,
        per_thread: bool,
        cooperative: bool,
    ) -> CuResult {
        let kernel = self.kernel(f, grid, block)?;
        let key = self.stream_key(stream, per_thread)?;
        if cooperative {
            self.check_cooperative(key, kernel)?;
        }
        self.submit(key, &[kernel])
    }

    fn check_cooperative(&self, key: StreamKey, kernel: Kernel) -> CuResult {
        let device = self.ctx_device(key.ctx)?;
        let sms = u64::from(self.device(device)?.config.sm_count);
        if kernel.blocks > sms * COOPERATIVE_BLOCKS_PER_SM {
            return Err(CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        }
        Ok(())
    }

    fn function_mut(&mut self, f: CUfunction) -> CuResult<&mut Function> {
        self.functions
            .get_mut(&(f as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }
}

pub(crate) fn out_handle<T>(out: *mut *mut T, handle: u64) -> CuResult {
    // SAFETY: `out` is NULL or writable (driver API contract).
    Ok(unsafe { ffi::write(out, handle as usize as *mut T) }?)
}

fn load_module(module: *mut CUmodule, image: *const c_void) -> CuResult {
    if module.is_null() || image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = process::with(|p| {
        let (ctx, _) = p.current_ctx()?;
        let handle = p.new_handle();
        p.modules.insert(handle, ctx);
        Ok(handle)
    })?;
    out_handle(module, handle)
}

/// Any non-NULL image loads.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    entry(|| load_module(module, image))
}

/// JIT options are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut CUjit_option,
    _values: *mut *mut c_void,
) -> CUresult {
    entry(|| load_module(module, image))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    entry(|| {
        process::with(|p| {
            let m = module as u64;
            p.modules
                .remove(&m)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            p.functions.retain(|_, f| f.module != m);
            Ok(())
        })
    })
}

/// Every name resolves to a fresh function handle, which remembers the name's wave time.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    function: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry(|| {
        // SAFETY: `name` is NULL or a C string (driver API contract).
        let Some(name) = (unsafe { ffi::c_str(name) }) else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        if function.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let wave_ns = kernel_table()?.get(name).copied();
        let handle = process::with(|p| {
            let m = module as u64;
            if !p.modules.contains_key(&m) {
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            let handle = p.new_handle();
            p.functions.insert(
                handle,
                Function {
                    module: m,
                    wave_ns,
                    block: None,
                    attrs: Default::default(),
                },
            );
            Ok(handle)
        })?;
        out_handle(function, handle)
    })
}

/// Blocks in the grid, after checking the launch shape.
fn grid_blocks(function: CUfunction, grid: [c_uint; 3], block: [c_uint; 3]) -> CuResult<u64> {
    let threads: u64 = block.iter().map(|&b| u64::from(b)).product();
    if function.is_null()
        || grid.contains(&0)
        || block.contains(&0)
        || threads > MAX_THREADS_PER_BLOCK
        || block[2] > 64
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(grid.iter().map(|&g| u64::from(g)).product())
}

/// The arguments every `cuLaunchKernel`-shaped call passes.
struct Launch {
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
}

fn launch(l: Launch, per_thread: bool, cooperative: bool) -> CuResult {
    process::with(|p| p.launch(l.f, l.grid, l.block, l.stream, per_thread, cooperative))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    let grid = [grid_x, grid_y, grid_z];
    let block = [block_x, block_y, block_z];
    entry(|| {
        launch(
            Launch {
                f,
                grid,
                block,
                stream,
            },
            false,
            false,
        )
    })
}

/// NULL means the calling thread's per-thread default stream.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    let grid = [grid_x, grid_y, grid_z];
    let block = [block_x, block_y, block_z];
    entry(|| {
        launch(
            Launch {
                f,
                grid,
                block,
                stream,
            },
            true,
            false,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
) -> CUresult {
    let grid = [grid_x, grid_y, grid_z];
    let block = [block_x, block_y, block_z];
    entry(|| {
        launch(
            Launch {
                f,
                grid,
                block,
                stream,
            },
            false,
            true,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
) -> CUresult {
    let grid = [grid_x, grid_y, grid_z];
    let block = [block_x, block_y, block_z];
    entry(|| {
        launch(
            Launch {
                f,
                grid,
                block,
                stream,
            },
            true,
            true,
        )
    })
}

/// Launch attributes are ignored.
fn launch_kernel_ex(config: *const CUlaunchConfig, f: CUfunction, per_thread: bool) -> CuResult {
    // SAFETY: `config` is NULL or points to a CUlaunchConfig (driver API contract); all the
    // fields read are plain integers and a pointer.
    let c = unsafe { ffi::read(config) }?;
    let grid = [c.gridDimX, c.gridDimY, c.gridDimZ];
    let block = [c.blockDimX, c.blockDimY, c.blockDimZ];
    launch(
        Launch {
            f,
            grid,
            block,
            stream: c.hStream,
        },
        per_thread,
        false,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    entry(|| launch_kernel_ex(config, f, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    entry(|| launch_kernel_ex(config, f, true))
}

/// `CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_PRE_LAUNCH_SYNC` / `_NO_POST_LAUNCH_SYNC`.
const NO_PRE_LAUNCH_SYNC: c_uint = 0x01;
const NO_POST_LAUNCH_SYNC: c_uint = 0x02;

/// One cooperative kernel per entry, each on its stream (one device each). Unless the flags
/// say otherwise, every kernel waits for all the streams' earlier work, and later work on
/// any of the streams waits for all the kernels.
fn launch_multi_device(list: *mut CUDA_LAUNCH_PARAMS, count: c_uint, flags: c_uint) -> CuResult {
    if list.is_null() || count == 0 || flags & !(NO_PRE_LAUNCH_SYNC | NO_POST_LAUNCH_SYNC) != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and holding `count` entries (driver API contract); the fields read
    // are integers and pointers.
    let entries = unsafe { std::slice::from_raw_parts(list, count as usize) };
    process::with(|p| {
        let mut planned = Vec::with_capacity(entries.len());
        let mut devices = Vec::with_capacity(entries.len());
        for e in entries {
            let h = e.hStream as usize;
            if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let grid = [e.gridDimX, e.gridDimY, e.gridDimZ];
            let block = [e.blockDimX, e.blockDimY, e.blockDimZ];
            let kernel = p.kernel(e.function, grid, block)?;
            let key = p.stream_key(e.hStream, false)?;
            p.check_cooperative(key, kernel)?;
            let device = p.ctx_device(key.ctx)?;
            if devices.contains(&device) {
                return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
            }
            devices.push(device);
            planned.push((key, kernel, p.target(key)?));
        }
        let all_ready = planned
            .iter()
            .filter_map(|(_, _, t)| match t {
                Target::Queue { ready_ns, .. } => Some(*ready_ns),
                Target::Capture { .. } => None,
            })
            .max()
            .unwrap_or(0);
        let mut ends = Vec::with_capacity(planned.len());
        for (key, kernel, target) in &planned {
            match *target {
                Target::Capture { .. } => p.submit(*key, &[*kernel])?,
                Target::Queue { device, ready_ns } => {
                    let not_before = if flags & NO_PRE_LAUNCH_SYNC != 0 {
                        ready_ns
                    } else {
                        all_ready
                    };
                    let end = p.queue_kernels(device, not_before, &[*kernel])?;
                    p.stream_state(*key).ready_ns = end;
                    ends.push((*key, end));
                }
            }
        }
        if flags & NO_POST_LAUNCH_SYNC == 0 {
            let last = ends.iter().map(|(_, end)| *end).max().unwrap_or(0);
            for (key, _) in ends {
                p.stream_state(key).ready_ns = last;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CUDA_LAUNCH_PARAMS,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    entry(|| launch_multi_device(list, count, flags))
}

// ----- the legacy (pre-4.0) execution control API -----

/// Remember the block shape the legacy launches use.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetBlockShape(
    f: CUfunction,
    x: c_int,
    y: c_int,
    z: c_int,
) -> CUresult {
    entry(|| {
        let shape = [x, y, z].map(|d| c_uint::try_from(d).unwrap_or(0));
        if shape.contains(&0) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        process::with(|p| {
            p.function_mut(f)?.block = Some(shape);
            Ok(())
        })
    })
}

/// Accepted for a valid function; nothing to remember.
fn accept(f: CUfunction) -> CuResult {
    process::with(|p| p.function_mut(f).map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetSharedSize(f: CUfunction, _bytes: c_uint) -> CUresult {
    entry(|| accept(f))
}

#[no_mangle]
pub unsafe extern "C" fn cuParamSetSize(f: CUfunction, _bytes: c_uint) -> CUresult {
    entry(|| accept(f))
}

#[no_mangle]
pub unsafe extern "C" fn cuParamSeti(f: CUfunction, _offset: c_int, _value: c_uint) -> CUresult {
    entry(|| accept(f))
}

#[no_mangle]
pub unsafe extern "C" fn cuParamSetf(f: CUfunction, _offset: c_int, _value: c_float) -> CUresult {
    entry(|| accept(f))
}

#[no_mangle]
pub unsafe extern "C" fn cuParamSetv(
    f: CUfunction,
    _offset: c_int,
    ptr: *mut c_void,
    bytes: c_uint,
) -> CUresult {
    entry(|| {
        if ptr.is_null() && bytes > 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        accept(f)
    })
}

/// A legacy launch: the block shape set by cuFuncSetBlockShape (required).
fn launch_grid(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> CuResult {
    let grid = [width, height, 1].map(|d| c_uint::try_from(d).unwrap_or(0));
    process::with(|p| {
        let block = p
            .function_mut(f)?
            .block
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        p.launch(f, grid, block, stream, false, false)
    })
}

/// A 1×1 grid on the legacy stream.
#[no_mangle]
pub unsafe extern "C" fn cuLaunch(f: CUfunction) -> CUresult {
    entry(|| launch_grid(f, 1, 1, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchGrid(f: CUfunction, width: c_int, height: c_int) -> CUresult {
    entry(|| launch_grid(f, width, height, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchGridAsync(
    f: CUfunction,
    width: c_int,
    height: c_int,
    stream: CUstream,
) -> CUresult {
    entry(|| launch_grid(f, width, height, stream))
}
