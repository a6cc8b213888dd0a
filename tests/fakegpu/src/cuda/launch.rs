//! Streams, modules, kernels, graphs.
//!
//! Nothing runs. A launch queues a simulated kernel on the device (see `model` for how long
//! it takes) and counts it; stream and context synchronization sleep until this process's
//! queued kernels on that device would have finished. Any module image is accepted and any
//! function name resolves.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use cudarc::driver::sys::{
    CUfunction, CUgraph, CUgraphExec, CUjit_option, CUlaunchConfig, CUmodule, CUresult, CUstream,
    CUstream_flags,
};

use super::ctx::wait_until;
use super::process::{self, Process};
use super::{entry, CuResult};
use crate::ffi::{self, now_ns};

/// One block has at most this many threads (cuDeviceGetAttribute MAX_THREADS_PER_BLOCK).
const MAX_THREADS_PER_BLOCK: u64 = 1024;

impl Process {
    /// Queue a kernel of `blocks` thread blocks on the device of `stream`.
    fn launch(&mut self, stream: CUstream, blocks: u64) -> CuResult {
        let ctx = self.stream_ctx(stream)?;
        let device = self.ctx_device(ctx)?;
        let slot = self.ensure_slot(device)?;
        self.device(device)?.launch(Some(slot), blocks);
        Ok(())
    }

    /// When the work this process queued on `stream`'s device finishes.
    fn stream_deadline(&self, stream: CUstream) -> CuResult<u64> {
        let ctx = self.stream_ctx(stream)?;
        Ok(self.busy_until(self.ctx_device(ctx)?))
    }
}

fn out_handle<T>(out: *mut *mut T, handle: u64) -> CuResult {
    // SAFETY: `out` is NULL or writable (driver API contract).
    Ok(unsafe { ffi::write(out, handle as usize as *mut T) }?)
}

fn create_stream(out: *mut CUstream, flags: c_uint) -> CuResult {
    let known = CUstream_flags::CU_STREAM_DEFAULT as c_uint
        | CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
    if out.is_null() || flags & !known != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = process::with(|p| {
        let (ctx, _) = p.current_ctx()?;
        let handle = p.new_handle();
        p.streams.insert(handle, ctx);
        Ok(handle)
    })?;
    out_handle(out, handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    entry(|| create_stream(stream, flags))
}

/// Priorities are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut CUstream,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    entry(|| create_stream(stream, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.streams
                .remove(&(stream as u64))
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
        })
    })
}

fn synchronize(stream: CUstream) -> CuResult {
    let deadline = process::with(|p| p.stream_deadline(stream))?;
    wait_until(deadline);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    entry(|| synchronize(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    entry(|| synchronize(stream))
}

fn query(stream: CUstream) -> CuResult {
    let deadline = process::with(|p| p.stream_deadline(stream))?;
    if deadline > now_ns() {
        Err(CUresult::CUDA_ERROR_NOT_READY)
    } else {
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    entry(|| query(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(stream: CUstream) -> CUresult {
    entry(|| query(stream))
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
            p.functions.retain(|_, owner| *owner != m);
            Ok(())
        })
    })
}

/// Every name resolves to a fresh function handle.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    function: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry(|| {
        // SAFETY: `name` is NULL or a C string (driver API contract).
        if function.is_null() || unsafe { ffi::c_str(name) }.is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            let m = module as u64;
            if !p.modules.contains_key(&m) {
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            let handle = p.new_handle();
            p.functions.insert(handle, m);
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

fn launch_kernel(
    function: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
) -> CuResult {
    let blocks = grid_blocks(function, grid, block)?;
    process::with(|p| {
        if !p.functions.contains_key(&(function as u64)) {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        p.launch(stream, blocks)
    })
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
    entry(|| {
        launch_kernel(
            f,
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            stream,
        )
    })
}

/// The simulated streams behave the same under either default-stream mode.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same signature and contract as cuLaunchKernel; arguments passed through.
    unsafe {
        cuLaunchKernel(f, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem_bytes, stream, params, extra)
    }
}

/// Launch attributes are ignored.
fn launch_kernel_ex(config: *const CUlaunchConfig, f: CUfunction) -> CuResult {
    // SAFETY: `config` is NULL or points to a CUlaunchConfig (driver API contract); all the
    // fields read are plain integers and a pointer.
    let c = unsafe { ffi::read(config) }?;
    launch_kernel(
        f,
        [c.gridDimX, c.gridDimY, c.gridDimZ],
        [c.blockDimX, c.blockDimY, c.blockDimZ],
        c.hStream,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    entry(|| launch_kernel_ex(config, f))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    entry(|| launch_kernel_ex(config, f))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) -> CUresult {
    entry(|| {
        if graph.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            let (ctx, _) = p.current_ctx()?;
            let handle = p.new_handle();
            p.graphs.insert(handle, ctx);
            Ok(handle)
        })?;
        out_handle(graph, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.graphs
                .remove(&(graph as u64))
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        if exec.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            let ctx = *p
                .graphs
                .get(&(graph as u64))
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            let handle = p.new_handle();
            p.graph_execs.insert(handle, ctx);
            Ok(handle)
        })?;
        out_handle(exec, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.graph_execs
                .remove(&(exec as u64))
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
        })
    })
}

/// A graph launch counts as one kernel of one wave.
fn graph_launch(exec: CUgraphExec, stream: CUstream) -> CuResult {
    process::with(|p| {
        if !p.graph_execs.contains_key(&(exec as u64)) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        p.launch(stream, 1)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    entry(|| graph_launch(exec, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    entry(|| graph_launch(exec, stream))
}
