//! Contexts: cuCtxCreate (v2, v3, v4), destroy, the per-thread stack, primary contexts,
//! synchronization.
//!
//! Creating a context on a device takes a slot in that device's state file (the process
//! then appears in NVML's process list) and charges `context_overhead` bytes. Destroying a
//! context frees every allocation made in it, as the real driver does.

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys::{CUcontext, CUctxCreateParams, CUdevice, CUexecAffinityParam, CUresult};

use super::process::{self, Context, Process};
use super::{entry, CuResult};
use crate::ffi::{self, now_ns};

fn handle(ctx: CUcontext) -> u64 {
    ctx as u64
}

fn as_ctx(handle: u64) -> CUcontext {
    handle as usize as CUcontext
}

impl Process {
    /// Create a context on CUDA ordinal `dev` (not made current).
    pub(crate) fn create_context(
        &mut self,
        dev: CUdevice,
        flags: c_uint,
        primary: bool,
    ) -> CuResult<u64> {
        let device = self.device_of(dev)?;
        let overhead = self.device(device)?.config.context_overhead;
        self.ensure_slot(device)?;
        if overhead > 0 {
            if let Err(e) = self.charge(device, overhead) {
                self.release_slot_if_unused(device);
                return Err(e);
            }
        }
        let handle = self.new_handle();
        let ordinal = dev as usize;
        self.next_buffer_id += 1;
        let id = self.next_buffer_id;
        self.contexts.insert(
            handle,
            Context {
                ordinal,
                device,
                primary,
                flags,
                overhead,
                limits: Default::default(),
                cache_config: 0,
                id,
            },
        );
        Ok(handle)
    }

    /// Destroy context `ctx` and everything allocated in it.
    pub(crate) fn destroy_context(&mut self, ctx: u64) -> CuResult {
        let context = self
            .contexts
            .remove(&ctx)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        self.free_context_resources(ctx);
        self.uncharge(context.device, context.overhead);
        if !self.contexts.values().any(|c| c.device == context.device) {
            // The device's last context: its pools give back what they hold unused.
            self.trim_pools_of(context.device);
        }
        self.release_slot_if_unused(context.device);
        process::forget(ctx);
        Ok(())
    }

    /// Free the memory and handles that belong to context `ctx`.
    pub(crate) fn free_context_resources(&mut self, ctx: u64) {
        let owned: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&p, _)| p)
            .collect();
        for ptr in owned {
            if let Some(a) = self.allocs.remove(&ptr) {
                self.release_alloc(ptr, a);
            }
        }
        self.close_imports_of(ctx);
        let mut arrays = Vec::new();
        for map in [&mut self.arrays, &mut self.mipmaps] {
            map.retain(|_, a| {
                let owned = a.ctx == ctx;
                if owned {
                    arrays.push(*a);
                }
                !owned
            });
        }
        for a in arrays {
            self.uncharge(a.device, a.size);
        }
        let physical: Vec<u64> = self
            .physical
            .iter()
            .filter(|(_, p)| p.ctx == ctx)
            .map(|(&h, _)| h)
            .collect();
        for handle in physical {
            if let Some(p) = self.physical.remove(&handle) {
                if let Some(device) = p.device {
                    self.uncharge(device, p.size);
                }
            }
        }
        self.mappings
            .retain(|_, m| self.physical.contains_key(&m.handle));
        self.streams.retain(|_, c| *c != ctx);
        let streams = &self.streams;
        self.stream_info.retain(|s, _| streams.contains_key(s));
        let modules: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, c)| **c == ctx)
            .map(|(&m, _)| m)
            .collect();
        self.functions.retain(|_, f| !modules.contains(&f.module));
        self.modules.retain(|_, c| *c != ctx);
        self.graphs.retain(|_, g| g.ctx != ctx);
        self.graph_execs.retain(|_, e| e.ctx != ctx);
        self.events.retain(|_, e| e.ctx != ctx);
        self.timelines.retain(|key, _| key.ctx != ctx);
    }

    /// Wait target for "everything this process queued on `device`".
    pub(crate) fn busy_until(&self, device: usize) -> u64 {
        match (self.slot(device), self.driver.device(device)) {
            (Some(slot), Some(d)) => d.state.slot_busy_until(slot),
            _ => 0,
        }
    }
}

/// Sleep until `deadline` (ns since the epoch), outside the process lock.
/// Block until `deadline` (ns, the timeline's clock), as a synchronize does. A real driver
/// wakes a waiting thread within microseconds of the GPU finishing (spin, then yield); a
/// plain sleep oversleeps by ~60–100 µs, which would leave the simulated GPU idle between a
/// program's synchronize and its next launch far longer than a real one. So: sleep until
/// [`SPIN_NS`] before the deadline, then yield until it.
pub(crate) fn wait_until(deadline: u64) {
    let limit = now_ns().saturating_add(crate::model::MAX_KERNEL_NS);
    let deadline = deadline.min(limit);
    loop {
        let now = now_ns();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_NS {
            std::thread::sleep(std::time::Duration::from_nanos(left - SPIN_NS));
        } else {
            std::thread::yield_now();
        }
    }
}

/// How close to a deadline a waiting thread stops sleeping and yields instead.
const SPIN_NS: u64 = 150_000;

fn create_and_push(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CuResult {
    if pctx.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = process::with(|p| p.create_context(dev, flags, false))?;
    process::push(ctx);
    // SAFETY: `pctx` is non-NULL and writable (driver API contract).
    Ok(unsafe { ffi::write(pctx, as_ctx(ctx)) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| create_and_push(pctx, flags, dev))
}

/// Execution-affinity parameters are accepted and ignored (no SM partitioning is simulated).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut CUexecAffinityParam,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        create_and_push(pctx, flags, dev)
    })
}

/// `ctxCreateParams` may be NULL; its affinity and CIG parameters are ignored.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| create_and_push(pctx, flags, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    entry(|| {
        process::with(|p| {
            let h = handle(ctx);
            match p.contexts.get(&h) {
                Some(c) if c.primary => Err(CUresult::CUDA_ERROR_INVALID_CONTEXT),
                Some(_) => p.destroy_context(h),
                None => Err(CUresult::CUDA_ERROR_INVALID_CONTEXT),
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    entry(|| {
        let h = handle(ctx);
        process::with(|p| {
            if h == 0 || p.contexts.contains_key(&h) {
                Ok(())
            } else {
                Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
            }
        })?;
        process::set_current(h);
        Ok(())
    })
}

/// NULL (and CUDA_SUCCESS) when the thread has no context.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    entry(|| {
        let current = process::with(|p| Ok(p.current_ctx().map(|(h, _)| h).unwrap_or(0)))?;
        // SAFETY: `pctx` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(pctx, as_ctx(current)) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    entry(|| {
        let h = handle(ctx);
        process::with(|p| {
            p.contexts
                .get(&h)
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
        })?;
        process::push(h);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    entry(|| {
        process::with(|p| p.current_ctx().map(|_| ()))?;
        let popped = process::pop().unwrap_or(0);
        if !pctx.is_null() {
            // SAFETY: `pctx` is non-NULL and writable (driver API contract).
            unsafe { ffi::write(pctx, as_ctx(popped)) }?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    entry(|| {
        let ordinal = process::with(|p| Ok(p.current_ctx()?.1.ordinal))?;
        // SAFETY: `device` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(device, ordinal as CUdevice) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    entry(|| {
        let f = process::with(|p| Ok(p.current_ctx()?.1.flags))?;
        // SAFETY: `flags` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(flags, f) }?)
    })
}

/// Waits until the kernels and copies this process queued on the context's device have
/// run.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    entry(|| {
        let deadline = process::with(|p| {
            let device = p.current_ctx()?.1.device;
            Ok(p.busy_until(device).max(p.copies_until(device)))
        })?;
        wait_until(deadline);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry(|| {
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = process::with(|p| {
            p.device_of(dev)?;
            let ordinal = dev as usize;
            let primary = p.primary[ordinal].clone();
            let ctx = if primary.refs == 0 || !p.contexts.contains_key(&primary.ctx) {
                p.create_context(dev, primary.flags, true)?
            } else {
                primary.ctx
            };
            let entry = &mut p.primary[ordinal];
            entry.ctx = ctx;
            entry.refs += 1;
            Ok(ctx)
        })?;
        // SAFETY: `pctx` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(pctx, as_ctx(ctx)) }?)
    })
}

fn primary_release(dev: CUdevice) -> CuResult {
    process::with(|p| {
        p.device_of(dev)?;
        let ordinal = dev as usize;
        let primary = p.primary[ordinal].clone();
        if primary.refs == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        p.primary[ordinal].refs -= 1;
        if primary.refs == 1 {
            p.primary[ordinal].ctx = 0;
            p.destroy_context(primary.ctx)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    entry(|| primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry(|| primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    entry(|| {
        let primary = process::with(|p| {
            p.device_of(dev)?;
            Ok(p.primary[dev as usize].clone())
        })?;
        // SAFETY: both are NULL or writable (driver API contract).
        unsafe {
            ffi::write(flags, primary.flags)?;
            ffi::write(active, c_int::from(primary.refs > 0))?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.device_of(dev)?;
            let primary = &mut p.primary[dev as usize];
            primary.flags = flags;
            let ctx = primary.ctx;
            if let Some(c) = p.contexts.get_mut(&ctx) {
                c.flags = flags;
            }
            Ok(())
        })
    })
}

/// Frees everything allocated in the primary context; the context stays retained.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.device_of(dev)?;
            let ctx = p.primary[dev as usize].ctx;
            if p.contexts.contains_key(&ctx) {
                p.free_context_resources(ctx);
            }
            Ok(())
        })
    })
}
