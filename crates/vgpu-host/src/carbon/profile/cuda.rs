//! The calibration load: a small FMA-loop kernel run through the CUDA driver API
//! (`libcuda.so.1`, loaded at run time), launched in batches that keep the GPU's queue
//! never empty.
//!
//! The kernel is embedded PTX (ISA 7.0, target sm_50: every driver since CUDA 11 JITs it
//! for the GPU at hand). Each thread runs eight independent chains of `fma.rn.f32` for `n`
//! iterations; the result is stored only if it is exactly 0 (never), so the JIT cannot drop
//! the loop, and the store's address is a real 4-byte allocation all the same.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::Path;
use std::time::Instant;

use thiserror::Error;

/// The calibration kernel.
pub const PTX: &CStr = c".version 7.0
.target sm_50
.address_size 64

.visible .entry vgpu_calibrate(
    .param .u64 vgpu_calibrate_out,
    .param .u32 vgpu_calibrate_n
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<8>;
    .reg .f32 %f<16>;
    .reg .b64 %rd<2>;

    ld.param.u64 %rd1, [vgpu_calibrate_out];
    ld.param.u32 %r1, [vgpu_calibrate_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    cvt.rn.f32.s32 %f1, %r5;
    mul.f32 %f1, %f1, 0f3A83126F;
    add.f32 %f2, %f1, 0f3F800000;
    add.f32 %f3, %f1, 0f40000000;
    add.f32 %f4, %f1, 0f40400000;
    add.f32 %f5, %f1, 0f40800000;
    add.f32 %f6, %f1, 0f40A00000;
    add.f32 %f7, %f1, 0f40C00000;
    add.f32 %f8, %f1, 0f40E00000;
    mov.f32 %f9, 0f3F7FBE77;
    mov.f32 %f10, 0f3A83126F;
    mov.u32 %r6, 0;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra DONE;
LOOP:
    fma.rn.f32 %f1, %f1, %f9, %f10;
    fma.rn.f32 %f2, %f2, %f9, %f10;
    fma.rn.f32 %f3, %f3, %f9, %f10;
    fma.rn.f32 %f4, %f4, %f9, %f10;
    fma.rn.f32 %f5, %f5, %f9, %f10;
    fma.rn.f32 %f6, %f6, %f9, %f10;
    fma.rn.f32 %f7, %f7, %f9, %f10;
    fma.rn.f32 %f8, %f8, %f9, %f10;
    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra LOOP;
DONE:
    add.f32 %f11, %f1, %f2;
    add.f32 %f12, %f3, %f4;
    add.f32 %f13, %f5, %f6;
    add.f32 %f14, %f7, %f8;
    add.f32 %f11, %f11, %f12;
    add.f32 %f13, %f13, %f14;
    add.f32 %f15, %f11, %f13;
    setp.eq.f32 %p2, %f15, 0f00000000;
    @%p2 st.global.f32 [%rd1], %f15;
    ret;
}
";

/// The kernel's name in [`PTX`].
pub const KERNEL: &CStr = c"vgpu_calibrate";
/// Iterations of the loop per launch: about half a millisecond on an H100 at full clock.
pub const ITERATIONS: u32 = 16384;
/// Threads per block.
pub const BLOCK: u32 = 256;
/// Blocks per SM in one launch.
pub const BLOCKS_PER_SM: u32 = 4;
/// How long one batch of launches should keep the GPU busy.
pub const BATCH_SECONDS: f64 = 0.05;
/// Batches kept queued: the GPU has this many batches of work ahead (0.2 s) when the host
/// is late (a busy CPU), so it never idles during a measure.
pub const DEPTH: usize = 4;

#[derive(Debug, Error)]
pub enum CudaError {
    #[error("cannot load the CUDA driver {library}: {message}")]
    Load { library: String, message: String },
    #[error("{call} failed: {name} ({code})")]
    Call { call: &'static str, code: u32, name: String },
    #[error("no CUDA device has UUID {0}")]
    NoDevice(String),
}

type Cu = u32;
type Ptr = *mut c_void;

/// The driver functions the load uses (cuda.h signatures).
struct Api {
    init: unsafe extern "C" fn(c_uint) -> Cu,
    get_error_name: unsafe extern "C" fn(Cu, *mut *const c_char) -> Cu,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> Cu,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> Cu,
    device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> Cu,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> Cu,
    ctx_create: unsafe extern "C" fn(*mut Ptr, c_uint, c_int) -> Cu,
    ctx_destroy: unsafe extern "C" fn(Ptr) -> Cu,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> Cu,
    module_load_data: unsafe extern "C" fn(*mut Ptr, *const c_void) -> Cu,
    module_get_function: unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> Cu,
    launch_kernel: unsafe extern "C" fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Ptr, *mut Ptr, *mut Ptr) -> Cu,
    event_create: unsafe extern "C" fn(*mut Ptr, c_uint) -> Cu,
    event_record: unsafe extern "C" fn(Ptr, Ptr) -> Cu,
    event_synchronize: unsafe extern "C" fn(Ptr) -> Cu,
    ctx_synchronize: unsafe extern "C" fn() -> Cu,
}

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
const ATTRIBUTE_SM_COUNT: c_int = 16;
/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: c_uint = 2;

/// A context on one GPU with the calibration kernel loaded.
pub struct Calibrator {
    api: Api,
    ctx: Ptr,
    function: Ptr,
    out: u64,
    sm_count: u32,
    events: [Ptr; DEPTH],
    /// Launches per batch.
    batch: u32,
    _lib: libloading::Library,
}

/// Kernels completed over a measured stretch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Run {
    pub kernels: u64,
    pub seconds: f64,
}

impl Calibrator {
    /// Load the driver (`library`, default `libcuda.so.1`), make a context on the GPU whose
    /// UUID NVML gives (`GPU-…`: CUDA's device order may differ from NVML's) and load the
    /// kernel.
    pub fn open(library: Option<&Path>, uuid: &str) -> Result<Calibrator, CudaError> {
        let name = library.map(|p| p.display().to_string()).unwrap_or_else(|| crate::paths::CUDA_SONAME.to_string());
        let load_error = |message: String| CudaError::Load { library: name.clone(), message };
        let path = library.map(|p| p.as_os_str().to_owned()).unwrap_or_else(|| crate::paths::CUDA_SONAME.into());
        // SAFETY: loading NVIDIA's driver library (or the simulated one), whose initialisers
        // are meant to run in any process.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| load_error(e.to_string()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the driver's function of that name, whose cuda.h
                // signature is the field's type.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| load_error(format!("no {}: {e}", $name)))?
            };
        }
        let api = Api {
            init: sym!("cuInit"),
            get_error_name: sym!("cuGetErrorName"),
            device_get_count: sym!("cuDeviceGetCount"),
            device_get: sym!("cuDeviceGet"),
            device_get_uuid: sym!("cuDeviceGetUuid"),
            device_get_attribute: sym!("cuDeviceGetAttribute"),
            ctx_create: sym!("cuCtxCreate_v2"),
            ctx_destroy: sym!("cuCtxDestroy_v2"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            module_load_data: sym!("cuModuleLoadData"),
            module_get_function: sym!("cuModuleGetFunction"),
            launch_kernel: sym!("cuLaunchKernel"),
            event_create: sym!("cuEventCreate"),
            event_record: sym!("cuEventRecord"),
            event_synchronize: sym!("cuEventSynchronize"),
            ctx_synchronize: sym!("cuCtxSynchronize"),
        };
        // SAFETY (every driver call below): arguments as cuda.h documents them, out-pointers
        // to live locals, handles the driver returned.
        unsafe {
            check(&api, "cuInit", (api.init)(0))?;
            let mut count: c_int = 0;
            check(&api, "cuDeviceGetCount", (api.device_get_count)(&mut count))?;
            let mut found = None;
            for ordinal in 0..count {
                let mut dev: c_int = 0;
                check(&api, "cuDeviceGet", (api.device_get)(&mut dev, ordinal))?;
                let mut raw = [0u8; 16];
                check(&api, "cuDeviceGetUuid", (api.device_get_uuid)(&mut raw, dev))?;
                if format_uuid(&raw).eq_ignore_ascii_case(uuid) {
                    found = Some(dev);
                    break;
                }
            }
            let dev = found.ok_or_else(|| CudaError::NoDevice(uuid.to_string()))?;
            let mut sms: c_int = 0;
            check(&api, "cuDeviceGetAttribute", (api.device_get_attribute)(&mut sms, ATTRIBUTE_SM_COUNT, dev))?;
            let mut ctx: Ptr = std::ptr::null_mut();
            check(&api, "cuCtxCreate", (api.ctx_create)(&mut ctx, 0, dev))?;
            // From here the context is destroyed on every path (Drop).
            let mut cal = Calibrator {
                api,
                ctx,
                function: std::ptr::null_mut(),
                out: 0,
                sm_count: u32::try_from(sms).unwrap_or(1).max(1),
                events: [std::ptr::null_mut(); DEPTH],
                batch: 1,
                _lib: lib,
            };
            let api = &cal.api;
            let mut module: Ptr = std::ptr::null_mut();
            check(&cal.api, "cuModuleLoadData", (api.module_load_data)(&mut module, PTX.as_ptr().cast()))?;
            let mut function: Ptr = std::ptr::null_mut();
            check(&cal.api, "cuModuleGetFunction", (api.module_get_function)(&mut function, module, KERNEL.as_ptr()))?;
            let mut out = 0u64;
            check(&cal.api, "cuMemAlloc", (api.mem_alloc)(&mut out, 4))?;
            let mut events = [std::ptr::null_mut(); DEPTH];
            for e in &mut events {
                check(&cal.api, "cuEventCreate", (api.event_create)(e, EVENT_DISABLE_TIMING))?;
            }
            cal.function = function;
            cal.out = out;
            cal.events = events;
            Ok(cal)
        }
    }

    fn launch_batch(&self) -> Result<(), CudaError> {
        let mut out = self.out;
        let mut n = ITERATIONS;
        let mut params: [Ptr; 2] = [(&raw mut out).cast(), (&raw mut n).cast()];
        for _ in 0..self.batch {
            // SAFETY: a function of this context; `params` points at one value per kernel
            // parameter (.u64, .u32), live for the call; the default stream.
            let code = unsafe {
                (self.api.launch_kernel)(
                    self.function,
                    self.sm_count * BLOCKS_PER_SM,
                    1,
                    1,
                    BLOCK,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            check(&self.api, "cuLaunchKernel", code)?;
        }
        Ok(())
    }

    fn record(&self, event: usize) -> Result<(), CudaError> {
        // SAFETY: an event of this context, the default stream.
        check(&self.api, "cuEventRecord", unsafe { (self.api.event_record)(self.events[event], std::ptr::null_mut()) })
    }

    fn wait(&self, event: usize) -> Result<(), CudaError> {
        // SAFETY: an event of this context.
        check(&self.api, "cuEventSynchronize", unsafe { (self.api.event_synchronize)(self.events[event]) })
    }

    /// Wait for all queued work.
    pub fn drain(&self) -> Result<(), CudaError> {
        // SAFETY: the calling thread's context is this one (made current by cuCtxCreate).
        check(&self.api, "cuCtxSynchronize", unsafe { (self.api.ctx_synchronize)() })
    }

    /// Size the batch so that one keeps the GPU busy for about [`BATCH_SECONDS`] at the
    /// clock now (run once per clock, before measuring).
    pub fn warm_up(&mut self) -> Result<(), CudaError> {
        self.batch = 4;
        let start = Instant::now();
        self.launch_batch()?;
        self.drain()?;
        let per_kernel = start.elapsed().as_secs_f64() / 4.0;
        self.batch = ((BATCH_SECONDS / per_kernel.max(1e-6)).ceil() as u32).clamp(1, 2000);
        Ok(())
    }

    /// Keep the GPU saturated for about `seconds`: [`DEPTH`] batches are kept queued, one
    /// added as each completes. `start` is called once the first batch has completed (the
    /// queue still holds the others), `tick` after every completed batch (`false`: stop
    /// early). Returns the kernels completed between the two and the time they took; the
    /// batches still queued at the end are drained and not counted.
    pub fn saturate(
        &mut self,
        seconds: f64,
        start: &mut dyn FnMut(),
        tick: &mut dyn FnMut() -> bool,
    ) -> Result<Run, CudaError> {
        for slot in 0..DEPTH {
            self.launch_batch()?;
            self.record(slot)?;
        }
        self.wait(0)?;
        let t0 = Instant::now();
        start();
        let mut kernels = 0u64;
        let mut done = 0;
        let result = loop {
            // Refill the slot just completed, then wait for the oldest in flight.
            self.launch_batch()?;
            self.record(done % DEPTH)?;
            done += 1;
            self.wait(done % DEPTH)?;
            kernels += u64::from(self.batch);
            let elapsed = t0.elapsed().as_secs_f64();
            let go_on = tick();
            if elapsed >= seconds || !go_on {
                break Run { kernels, seconds: elapsed };
            }
        };
        self.drain()?;
        Ok(result)
    }
}

impl Drop for Calibrator {
    fn drop(&mut self) {
        // SAFETY: the context this calibrator made; destroying it frees its module, memory
        // and events.
        unsafe {
            (self.api.ctx_destroy)(self.ctx);
        }
    }
}

fn check(api: &Api, call: &'static str, code: Cu) -> Result<(), CudaError> {
    if code == 0 {
        return Ok(());
    }
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: a writable out-pointer; the driver hands back a static string.
    let ok = unsafe { (api.get_error_name)(code, &mut name) } == 0 && !name.is_null();
    // SAFETY: non-NULL and NUL-terminated (cuda.h: a static string).
    let name = if ok { unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned() } else { "unknown error".into() };
    Err(CudaError::Call { call, code, name })
}

/// NVML's form of a CUDA device UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(raw: &[u8; 16]) -> String {
    let hex: Vec<String> = raw.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_formatted_as_nvml_does() {
        let raw = [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
        assert_eq!(format_uuid(&raw), "GPU-12345678-9abc-def0-0123-456789abcdef");
    }

    #[test]
    fn the_ptx_names_its_kernel_and_targets_an_old_isa() {
        let text = PTX.to_str().unwrap();
        assert!(text.starts_with(".version 7.0\n.target sm_50\n"));
        assert!(text.contains(&format!(".visible .entry {}(", KERNEL.to_str().unwrap())));
        // Balanced braces and parentheses.
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert_eq!(text.matches('(').count(), text.matches(')').count());
    }
}
