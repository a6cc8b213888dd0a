//! A GPU workload for benchmarks and tests of compute limiters.
//!
//!     gpu_workload SHAPE SECONDS [--kernel-us N] [--batch N] [--device N] [--ready FILE]
//!                  [--window-ms N] [--go FILE]
//!
//! It reaches the driver the way cudart does: `dlopen("libcuda.so.1")`, `dlsym` of
//! `cuGetProcAddress_v2` only, and every other function through
//! `cuGetProcAddress_v2(name, &pfn, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &status)` — so a
//! shim that interposes either path sees every call. It works on a stream made with
//! `cuStreamCreate`, with a function named `k` whose wave takes `--kernel-us` µs (default
//! 100; set through `FAKEGPU_KERNELS=k=Nus` in its own environment before loading the
//! driver) and a grid of one wave (as many blocks as the device has SMs).
//!
//! SHAPE: `sync` (cuLaunchKernel, cuStreamSynchronize, repeat), `storm` (--batch launches,
//! default 1000, then synchronize), `ex` (cuLaunchKernelEx + sync), `coop`
//! (cuLaunchCooperativeKernel + sync), `legacy` (cuLaunchGridAsync + sync), `graph` (--batch
//! kernels, default 20, captured once into a graph; cuGraphLaunch + sync), `multi`
//! (cuLaunchCooperativeKernelMultiDevice with one entry + sync).
//!
//! After SECONDS of wall time it prints one JSON line:
//! `{"kernels":N,"seconds":wall,"kernels_per_s":x,"windows":[kernels completed in each
//! 1 s window],"launch_ns":mean ns inside one launch call,"gpu_ns":kernels × kernel time}`
//! and exits 0. A driver error prints one line naming the call and the code, and exits 1.
//!
//! `idle` launches nothing (it sleeps in 10 ms steps): with `--alloc-mib N` it just holds
//! memory. `churn` allocates `--churn-mib` MiB (default 64) and frees it again, every step.
//! `--progress FILE`: after every step, FILE holds the number of steps done so far.
//! `--stop FILE`: end (as after SECONDS) once FILE exists. At the
//! end, the `--alloc-mib` allocation is freed (a driver that lost it fails the run). `--alloc-mib N` allocates N MiB with `cuMemAlloc_v2` once set up (before
//! `--ready`). `--real-dlsym` resolves `cuGetProcAddress_v2` with glibc's own `dlsym` (taken
//! with `dlvsym` from libc's handle), not the `dlsym` the program links to: the way a program
//! escapes a shim that interposes `dlsym` — for tests of `vgpu watch`.
//!
//! `--window-ms N` makes the `windows` N ms long instead of 1 s (for finer time series).
//! `--go FILE`: once set up (and after writing `--ready`), wait until FILE exists before
//! starting the clock, so that several workloads can start their timed loops together.
//! `--period-us N`: start each step on a boundary of N µs (a latency-sensitive service's
//! requests) and add `"latency_p50_us"` and `"latency_p99_us"` to the JSON: the median and
//! 99th percentile of a step's time from its start to its synchronize's return.
//! `--trace FILE` (with `--period-us`): write each step's start and end to FILE, a line
//! each, in ns of the realtime clock (the simulated GPU's timeline's), to find why a
//! request was slow.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUlaunchConfig, CUDA_LAUNCH_PARAMS};

type Cu = u32;
type Ptr = *mut c_void;
type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> Cu;

const CUDA_VERSION: c_int = 12080;
/// CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
const ATTRIBUTE_SMS: c_int = 16;
/// CU_STREAM_CAPTURE_MODE_GLOBAL.
const CAPTURE_GLOBAL: c_uint = 0;
const BLOCK_THREADS: c_uint = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Sync,
    Storm,
    Ex,
    Coop,
    Legacy,
    Graph,
    Multi,
    Idle,
    Churn,
}

struct Args {
    shape: Shape,
    seconds: f64,
    kernel_us: u64,
    batch: Option<u64>,
    device: c_int,
    ready: Option<String>,
    window_ms: u64,
    go: Option<String>,
    alloc_mib: u64,
    churn_mib: u64,
    progress: Option<String>,
    stop: Option<String>,
    real_dlsym: bool,
    period_us: u64,
    trace: Option<String>,
}

const USAGE: &str = "usage: gpu_workload sync|storm|ex|coop|legacy|graph|multi|idle|churn SECONDS \
                     [--kernel-us N] [--batch N] [--device N] [--ready FILE] \
                     [--window-ms N] [--go FILE] [--alloc-mib N] [--churn-mib N] [--period-us N] \
                     [--trace FILE] [--progress FILE] [--stop FILE] [--real-dlsym]";

fn parse_args(args: &[String]) -> Result<Args, String> {
    let [shape, seconds, rest @ ..] = args else {
        return Err("expected SHAPE and SECONDS".into());
    };
    let shape = match shape.as_str() {
        "sync" => Shape::Sync,
        "storm" => Shape::Storm,
        "ex" => Shape::Ex,
        "coop" => Shape::Coop,
        "legacy" => Shape::Legacy,
        "graph" => Shape::Graph,
        "multi" => Shape::Multi,
        "idle" => Shape::Idle,
        "churn" => Shape::Churn,
        other => return Err(format!("unknown shape `{other}`")),
    };
    let seconds: f64 = seconds
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s > 0.0)
        .ok_or_else(|| format!("SECONDS must be a positive number, not `{seconds}`"))?;
    let mut parsed = Args {
        shape,
        seconds,
        kernel_us: 100,
        batch: None,
        device: 0,
        ready: None,
        window_ms: 1000,
        period_us: 0,
        trace: None,
        go: None,
        alloc_mib: 0,
        churn_mib: 64,
        progress: None,
        stop: None,
        real_dlsym: false,
    };
    let mut rest = rest.iter();
    while let Some(flag) = rest.next() {
        if flag == "--real-dlsym" {
            parsed.real_dlsym = true;
            continue;
        }
        let value = rest.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{flag} needs a positive integer, not `{value}`"))
        };
        match flag.as_str() {
            "--kernel-us" => parsed.kernel_us = number()?,
            "--batch" => parsed.batch = Some(number()?),
            "--device" => {
                parsed.device = value
                    .parse()
                    .map_err(|_| format!("--device needs an ordinal, not `{value}`"))?
            }
            "--ready" => parsed.ready = Some(value.clone()),
            "--window-ms" => parsed.window_ms = number()?,
            "--go" => parsed.go = Some(value.clone()),
            "--alloc-mib" => parsed.alloc_mib = number()?,
            "--churn-mib" => parsed.churn_mib = number()?,
            "--progress" => parsed.progress = Some(value.clone()),
            "--stop" => parsed.stop = Some(value.clone()),
            "--period-us" => parsed.period_us = number()?,
            "--trace" => parsed.trace = Some(value.clone()),
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    Ok(parsed)
}

/// A driver call that failed: its name and code.
struct Failure(&'static str, Cu);

/// The driver, every function resolved through cuGetProcAddress_v2.
struct Driver {
    _lib: libloading::Library,
    get_proc: GetProcAddress,
}

impl Driver {
    fn load(real_dlsym: bool) -> Result<Driver, String> {
        // SAFETY: loading the CUDA driver library by soname, as cudart does.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }
            .map_err(|e| format!("dlopen libcuda.so.1: {e}"))?;
        let get_proc = if real_dlsym {
            glibc_dlsym_get_proc()?
        } else {
            // SAFETY: cuGetProcAddress_v2 has this C signature in cuda.h.
            unsafe { lib.get::<GetProcAddress>(b"cuGetProcAddress_v2") }
                .map(|s| *s)
                .map_err(|e| format!("dlsym cuGetProcAddress_v2: {e}"))?
        };
        Ok(Driver {
            _lib: lib,
            get_proc,
        })
    }

    /// `name` through cuGetProcAddress_v2 at CUDA 12.8, default stream semantics.
    fn proc_address(&self, name: &'static str) -> Result<Ptr, Failure> {
        let symbol = CString::new(name).map_err(|_| Failure(name, u32::MAX))?;
        let (mut pfn, mut status) = (std::ptr::null_mut(), 0);
        // SAFETY: a C string, writable out-pointers.
        let code =
            unsafe { (self.get_proc)(symbol.as_ptr(), &mut pfn, CUDA_VERSION, 0, &mut status) };
        if code != 0 || pfn.is_null() {
            return Err(Failure(name, code.max(1)));
        }
        Ok(pfn)
    }

    fn error_name(&self, code: Cu) -> String {
        let Ok(pfn) = self.proc_address("cuGetErrorName") else {
            return String::from("?");
        };
        // SAFETY: cuGetErrorName(CUresult, const char **).
        let f: unsafe extern "C" fn(Cu, *mut *const c_char) -> Cu =
            unsafe { std::mem::transmute(pfn) };
        let mut name = std::ptr::null();
        // SAFETY: a writable out-pointer; the driver hands back a static C string.
        if unsafe { f(code, &mut name) } != 0 || name.is_null() {
            return String::from("?");
        }
        // SAFETY: non-NULL, NUL-terminated, static.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}

/// `cuGetProcAddress_v2` of the driver library itself, looked up with glibc's `dlsym` (taken
/// from libc's own handle by version), so that no interposed `dlsym` sees the lookup. The
/// library stays loaded for the life of the process.
fn glibc_dlsym_get_proc() -> Result<GetProcAddress, String> {
    type Dlsym = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
    // SAFETY: RTLD_NOLOAD only returns a handle of the already loaded libc.
    let libc_handle = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if libc_handle.is_null() {
        return Err("dlopen libc.so.6 (RTLD_NOLOAD) failed".into());
    }
    let real = [c"GLIBC_2.34", c"GLIBC_2.2.5"]
        .iter()
        // SAFETY: a valid handle and NUL-terminated strings.
        .map(|version| unsafe { libc::dlvsym(libc_handle, c"dlsym".as_ptr(), version.as_ptr()) })
        .find(|p| !p.is_null())
        .ok_or("dlvsym(libc, dlsym) found nothing")?;
    // SAFETY: glibc's dlsym has this signature.
    let dlsym: Dlsym = unsafe { std::mem::transmute::<*mut c_void, Dlsym>(real) };
    // SAFETY: loading the CUDA driver library by soname; never closed.
    let cuda = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if cuda.is_null() {
        return Err("dlopen libcuda.so.1 failed".into());
    }
    // SAFETY: a valid handle and a NUL-terminated name.
    let pfn = unsafe { dlsym(cuda, c"cuGetProcAddress_v2".as_ptr()) };
    if pfn.is_null() {
        return Err("glibc's dlsym found no cuGetProcAddress_v2".into());
    }
    // SAFETY: cuGetProcAddress_v2 has this C signature in cuda.h.
    Ok(unsafe { std::mem::transmute::<*mut c_void, GetProcAddress>(pfn) })
}

/// Resolve `name` as a function of type `$t`.
macro_rules! proc_fn {
    ($driver:expr, $name:literal, $t:ty) => {{
        let pfn = $driver.proc_address($name)?;
        // SAFETY: `$t` is the C signature cuda.h gives `$name` at CUDA 12.8.
        (unsafe { std::mem::transmute::<Ptr, $t>(pfn) }, $name)
    }};
}

/// Call a resolved function; a non-zero code is a [`Failure`] naming it.
macro_rules! call {
    ($f:expr $(, $arg:expr)* $(,)?) => {{
        let (f, name) = $f;
        // SAFETY: arguments as cuda.h documents them (valid handles, writable out-pointers).
        let code = unsafe { f($($arg),*) };
        if code != 0 {
            return Err(Failure(name, code));
        }
    }};
}

type LaunchKernel = unsafe extern "C" fn(
    Ptr,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Ptr,
    *mut Ptr,
    *mut Ptr,
) -> Cu;
type LaunchCooperative = unsafe extern "C" fn(
    Ptr,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Ptr,
    *mut Ptr,
) -> Cu;

/// One iteration of a shape (its launches); returns the kernels it queued.
type Step<'a> = Box<dyn FnMut(&mut Stats) -> Result<u64, Failure> + 'a>;

/// What the timed loop measured.
#[derive(Default)]
struct Stats {
    window_ms: u64,
    kernels: u64,
    windows: Vec<u64>,
    launch_calls: u64,
    launch_ns: u128,
    /// With `--period-us`: each step's time from its start to its synchronize's return, ns.
    latencies: Vec<u64>,
}

impl Stats {
    /// Time one launch call.
    fn timed<T>(&mut self, call: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = call();
        self.launch_ns += start.elapsed().as_nanos();
        self.launch_calls += 1;
        out
    }

    fn completed(&mut self, kernels: u64, since_start: Duration) {
        self.kernels += kernels;
        let window = (since_start.as_millis() / u128::from(self.window_ms.max(1))) as usize;
        if self.windows.len() <= window {
            self.windows.resize(window + 1, 0);
        }
        self.windows[window] += kernels;
    }
}

fn run(driver: &Driver, args: &Args) -> Result<(Stats, f64), Failure> {
    let init = proc_fn!(driver, "cuInit", unsafe extern "C" fn(c_uint) -> Cu);
    call!(init, 0);
    let mut dev: c_int = 0;
    call!(
        proc_fn!(
            driver,
            "cuDeviceGet",
            unsafe extern "C" fn(*mut c_int, c_int) -> Cu
        ),
        &mut dev,
        args.device
    );
    let mut sms: c_int = 0;
    call!(
        proc_fn!(
            driver,
            "cuDeviceGetAttribute",
            unsafe extern "C" fn(*mut c_int, c_int, c_int) -> Cu
        ),
        &mut sms,
        ATTRIBUTE_SMS,
        dev
    );
    let grid = c_uint::try_from(sms).unwrap_or(1).max(1);
    let mut ctx: Ptr = std::ptr::null_mut();
    call!(
        proc_fn!(
            driver,
            "cuDevicePrimaryCtxRetain",
            unsafe extern "C" fn(*mut Ptr, c_int) -> Cu
        ),
        &mut ctx,
        dev
    );
    call!(
        proc_fn!(driver, "cuCtxSetCurrent", unsafe extern "C" fn(Ptr) -> Cu),
        ctx
    );
    let (mut module, mut function, mut stream): (Ptr, Ptr, Ptr) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let image = b"gpu_workload image\0";
    call!(
        proc_fn!(
            driver,
            "cuModuleLoadData",
            unsafe extern "C" fn(*mut Ptr, *const c_void) -> Cu
        ),
        &mut module,
        image.as_ptr().cast()
    );
    call!(
        proc_fn!(
            driver,
            "cuModuleGetFunction",
            unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> Cu
        ),
        &mut function,
        module,
        c"k".as_ptr()
    );
    call!(
        proc_fn!(
            driver,
            "cuStreamCreate",
            unsafe extern "C" fn(*mut Ptr, c_uint) -> Cu
        ),
        &mut stream,
        0
    );
    let sync = proc_fn!(
        driver,
        "cuStreamSynchronize",
        unsafe extern "C" fn(Ptr) -> Cu
    );
    let launch_kernel = proc_fn!(driver, "cuLaunchKernel", LaunchKernel);
    let null = std::ptr::null_mut();
    let launch = |stats: &mut Stats| -> Result<(), Failure> {
        let code = stats.timed(|| {
            // SAFETY: a function and stream of this context; no parameters.
            unsafe {
                (launch_kernel.0)(
                    function,
                    grid,
                    1,
                    1,
                    BLOCK_THREADS,
                    1,
                    1,
                    0,
                    stream,
                    null,
                    null,
                )
            }
        });
        if code != 0 {
            return Err(Failure(launch_kernel.1, code));
        }
        Ok(())
    };

    // One iteration of the shape: launches, then a synchronize; returns the kernels it ran.
    let mut step: Step = match args.shape {
        Shape::Sync => Box::new(|stats| {
            launch(stats)?;
            Ok(1)
        }),
        Shape::Storm => {
            let batch = args.batch.unwrap_or(1000);
            Box::new(move |stats| {
                for _ in 0..batch {
                    launch(stats)?;
                }
                Ok(batch)
            })
        }
        Shape::Ex => {
            let f = proc_fn!(
                driver,
                "cuLaunchKernelEx",
                unsafe extern "C" fn(*const CUlaunchConfig, Ptr, *mut Ptr, *mut Ptr) -> Cu
            );
            let config = CUlaunchConfig {
                gridDimX: grid,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: BLOCK_THREADS,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: stream.cast(),
                attrs: std::ptr::null_mut(),
                numAttrs: 0,
            };
            Box::new(move |stats| {
                // SAFETY: a valid config and function; no parameters.
                let code = stats.timed(|| unsafe { (f.0)(&config, function, null, null) });
                if code != 0 {
                    return Err(Failure(f.1, code));
                }
                Ok(1)
            })
        }
        Shape::Coop => {
            let f = proc_fn!(driver, "cuLaunchCooperativeKernel", LaunchCooperative);
            Box::new(move |stats| {
                // SAFETY: a function and stream of this context; no parameters.
                let code = stats.timed(|| unsafe {
                    (f.0)(function, grid, 1, 1, BLOCK_THREADS, 1, 1, 0, stream, null)
                });
                if code != 0 {
                    return Err(Failure(f.1, code));
                }
                Ok(1)
            })
        }
        Shape::Legacy => {
            let shape = proc_fn!(
                driver,
                "cuFuncSetBlockShape",
                unsafe extern "C" fn(Ptr, c_int, c_int, c_int) -> Cu
            );
            call!(shape, function, BLOCK_THREADS as c_int, 1, 1);
            let f = proc_fn!(
                driver,
                "cuLaunchGridAsync",
                unsafe extern "C" fn(Ptr, c_int, c_int, Ptr) -> Cu
            );
            let width = c_int::try_from(grid).unwrap_or(1);
            Box::new(move |stats| {
                // SAFETY: a function with its block shape set, and a stream of this context.
                let code = stats.timed(|| unsafe { (f.0)(function, width, 1, stream) });
                if code != 0 {
                    return Err(Failure(f.1, code));
                }
                Ok(1)
            })
        }
        Shape::Graph => {
            let batch = args.batch.unwrap_or(20);
            let begin = proc_fn!(
                driver,
                "cuStreamBeginCapture",
                unsafe extern "C" fn(Ptr, c_uint) -> Cu
            );
            let end = proc_fn!(
                driver,
                "cuStreamEndCapture",
                unsafe extern "C" fn(Ptr, *mut Ptr) -> Cu
            );
            let instantiate = proc_fn!(
                driver,
                "cuGraphInstantiate",
                unsafe extern "C" fn(*mut Ptr, Ptr, c_ulonglong) -> Cu
            );
            let graph_launch = proc_fn!(
                driver,
                "cuGraphLaunch",
                unsafe extern "C" fn(Ptr, Ptr) -> Cu
            );
            call!(begin, stream, CAPTURE_GLOBAL);
            let mut capture_stats = Stats::default();
            for _ in 0..batch {
                launch(&mut capture_stats)?;
            }
            let (mut graph, mut exec): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
            call!(end, stream, &mut graph);
            call!(instantiate, &mut exec, graph, 0);
            Box::new(move |stats| {
                // SAFETY: an executable graph and a stream of this context.
                let code = stats.timed(|| unsafe { (graph_launch.0)(exec, stream) });
                if code != 0 {
                    return Err(Failure(graph_launch.1, code));
                }
                Ok(batch)
            })
        }
        Shape::Idle => Box::new(|_stats| {
            std::thread::sleep(Duration::from_millis(10));
            Ok(0)
        }),
        Shape::Churn => {
            let alloc = proc_fn!(driver, "cuMemAlloc", unsafe extern "C" fn(*mut c_ulonglong, usize) -> Cu);
            let free = proc_fn!(driver, "cuMemFree", unsafe extern "C" fn(c_ulonglong) -> Cu);
            let bytes = (args.churn_mib as usize) << 20;
            Box::new(move |_stats| {
                let mut ptr: c_ulonglong = 0;
                call!(alloc, &mut ptr, bytes);
                call!(free, ptr);
                Ok(0)
            })
        }
        Shape::Multi => {
            let f = proc_fn!(
                driver,
                "cuLaunchCooperativeKernelMultiDevice",
                unsafe extern "C" fn(*mut CUDA_LAUNCH_PARAMS, c_uint, c_uint) -> Cu
            );
            Box::new(move |stats| {
                let mut params = CUDA_LAUNCH_PARAMS {
                    function: function.cast(),
                    gridDimX: grid,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: BLOCK_THREADS,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: 0,
                    hStream: stream.cast(),
                    kernelParams: std::ptr::null_mut(),
                };
                // SAFETY: one valid entry.
                let code = stats.timed(|| unsafe { (f.0)(&mut params, 1, 0) });
                if code != 0 {
                    return Err(Failure(f.1, code));
                }
                Ok(1)
            })
        }
    };

    let mut held: c_ulonglong = 0;
    if args.alloc_mib > 0 {
        let alloc = proc_fn!(driver, "cuMemAlloc", unsafe extern "C" fn(*mut c_ulonglong, usize) -> Cu);
        call!(alloc, &mut held, (args.alloc_mib as usize) << 20);
    }
    if let Some(path) = &args.ready {
        if let Err(e) = std::fs::write(path, b"ready\n") {
            eprintln!("gpu_workload: cannot create {path}: {e}");
        }
    }
    if let Some(path) = &args.go {
        while !std::path::Path::new(path).exists() {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    let mut stats = Stats {
        window_ms: args.window_ms,
        ..Stats::default()
    };
    let limit = Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let mut steps: u64 = 0;
    let stopped = || args.stop.as_deref().is_some_and(|f| std::path::Path::new(f).exists());
    let period = Duration::from_micros(args.period_us);
    let realtime = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut trace = String::new();
    while start.elapsed() < limit && !stopped() {
        let began = if period.is_zero() {
            None
        } else {
            // The next period boundary (a latency-sensitive service's requests).
            let due = period * (start.elapsed().as_nanos() / period.as_nanos()) as u32 + period;
            if due >= limit {
                break;
            }
            std::thread::sleep(due.saturating_sub(start.elapsed()));
            Some((Instant::now(), realtime()))
        };
        let kernels = step(&mut stats)?;
        call!(sync, stream);
        if let Some((t, wall)) = began {
            stats.latencies.push(t.elapsed().as_nanos() as u64);
            if args.trace.is_some() {
                trace.push_str(&format!("{wall} {}\n", realtime()));
            }
        }
        stats.completed(kernels, start.elapsed());
        steps += 1;
        if let Some(path) = &args.progress {
            // Written whole then renamed: a reader never sees a partial number.
            let tmp = format!("{path}.tmp");
            if std::fs::write(&tmp, format!("{steps}\n")).and_then(|()| std::fs::rename(&tmp, path)).is_err() {
                eprintln!("gpu_workload: cannot write {path}");
            }
        }
    }
    if let Some(path) = &args.trace {
        if std::fs::write(path, trace).is_err() {
            eprintln!("gpu_workload: cannot write {path}");
        }
    }
    // The allocation held all along is still valid: freeing it proves it came back intact
    // after a checkpoint (a driver that lost it answers CUDA_ERROR_INVALID_VALUE).
    if held != 0 {
        let free = proc_fn!(driver, "cuMemFree", unsafe extern "C" fn(c_ulonglong) -> Cu);
        call!(free, held);
    }
    Ok((stats, start.elapsed().as_secs_f64()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu_workload: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The driver reads FAKEGPU_KERNELS once, at cuInit: name the kernel before loading it.
    let mut kernels = std::env::var("FAKEGPU_KERNELS").unwrap_or_default();
    if !kernels.is_empty() {
        kernels.push(',');
    }
    kernels.push_str(&format!("k={}us", args.kernel_us));
    std::env::set_var("FAKEGPU_KERNELS", kernels);
    let driver = match Driver::load(args.real_dlsym) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gpu_workload: {e}");
            return ExitCode::from(1);
        }
    };
    match run(&driver, &args) {
        Ok((stats, seconds)) => {
            let launch_ns = if stats.launch_calls == 0 {
                0
            } else {
                stats.launch_ns / u128::from(stats.launch_calls)
            };
            let windows: Vec<String> = stats.windows.iter().map(u64::to_string).collect();
            let mut latencies = stats.latencies.clone();
            latencies.sort_unstable();
            let pct = |p: f64| latencies.get(((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len().max(1)) - 1).map_or(0, |ns| ns / 1000);
            let latency = if latencies.is_empty() {
                String::new()
            } else {
                format!(",\"latency_p50_us\":{},\"latency_p99_us\":{}", pct(0.50), pct(0.99))
            };
            println!(
                "{{\"kernels\":{},\"seconds\":{:.6},\"kernels_per_s\":{:.3},\"windows\":[{}],\"launch_ns\":{},\"gpu_ns\":{}{latency}}}",
                stats.kernels,
                seconds,
                stats.kernels as f64 / seconds,
                windows.join(","),
                launch_ns,
                stats.kernels * args.kernel_us * 1000,
            );
            ExitCode::SUCCESS
        }
        Err(Failure(call, code)) => {
            eprintln!(
                "gpu_workload: {call} failed: {code} ({})",
                driver.error_name(code)
            );
            ExitCode::from(1)
        }
    }
}
