//! The checkpoint tests' probes (`tests/checkpoint.rs`): a target that holds memory and
//! optionally works in a loop, and a controller that applies one checkpoint call to a pid.
//! Parameters come from the environment (a probe takes no arguments).

use std::ffi::{c_char, c_int, c_void};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{
    CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use super::cuda::{Cu, Cuda};
use super::MIB;

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{key}={v}: {e}")))
}

/// `ckpt_target`: cuInit, a context on device 0, `CKPT_ALLOC_MIB` MiB held, "pid=" and
/// "ready" printed. With `CKPT_PROGRESS=FILE` it then loops — allocate 1 MiB, launch one
/// wave of `kernel`, synchronize, free, cuMemGetInfo, an event recorded and synchronized —
/// writing the number of finished iterations to FILE (renamed into place) after each one;
/// without, it idles. Either way until stdin closes; then it checks that the held allocation
/// is still there at the same address with its size, frees it, and prints "iterations=N".
/// Every CUDA call must succeed.
pub fn target() {
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    cuda.ctx_create(0).expect("cuCtxCreate");
    let mib = env_u64("CKPT_ALLOC_MIB").unwrap_or(0) as usize;
    let held = (mib > 0).then(|| cuda.alloc(mib * MIB).expect("the held allocation"));
    let stop = Arc::new(AtomicBool::new(false));
    let stop_reader = stop.clone();
    std::thread::spawn(move || {
        use std::io::Read;
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop_reader.store(true, Ordering::SeqCst);
    });
    println!("pid={}", std::process::id());
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut iterations = 0u64;
    match std::env::var_os("CKPT_PROGRESS") {
        Some(progress) => {
            let progress = std::path::PathBuf::from(progress);
            let tmp = progress.with_extension("tmp");
            let function = cuda.function();
            let event_create: unsafe extern "C" fn(*mut *mut c_void, u32) -> Cu =
                cuda.sym("cuEventCreate");
            let event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> Cu =
                cuda.sym("cuEventRecord");
            let event_sync: unsafe extern "C" fn(*mut c_void) -> Cu =
                cuda.sym("cuEventSynchronize");
            let mut event = std::ptr::null_mut();
            // SAFETY: a valid out-pointer, flags 0.
            assert_eq!(unsafe { event_create(&mut event, 0) }, 0);
            while !stop.load(Ordering::SeqCst) {
                let p = cuda.alloc(MIB).expect("cuMemAlloc in the loop");
                assert_eq!(cuda.launch(function, 1), 0, "cuLaunchKernel");
                assert_eq!(cuda.synchronize(), 0, "cuCtxSynchronize");
                assert_eq!(cuda.free(p), 0, "cuMemFree");
                cuda.mem_info().expect("cuMemGetInfo");
                // SAFETY: an event of this context, the NULL stream.
                unsafe {
                    assert_eq!(event_record(event, std::ptr::null_mut()), 0);
                    assert_eq!(event_sync(event), 0);
                }
                iterations += 1;
                std::fs::write(&tmp, iterations.to_string()).expect("write progress");
                std::fs::rename(&tmp, &progress).expect("rename progress");
            }
        }
        None => {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
    if let Some(ptr) = held {
        let range: unsafe extern "C" fn(*mut u64, *mut usize, u64) -> Cu =
            cuda.sym("cuMemGetAddressRange_v2");
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { range(&mut base, &mut size, ptr) }, 0);
        assert_eq!((base, size), (ptr, mib * MIB), "the allocation survived");
        assert_eq!(cuda.free(ptr), 0);
    }
    println!("iterations={iterations}");
}

type GetProc = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> Cu;

/// `ckpt_ctl`: one checkpoint call `CKPT_OP` (get_state, tid, lock, checkpoint, restore,
/// unlock) on `CKPT_PID`, the function found with `cuGetProcAddress_v2(name, 12080)`.
/// Prints `getproc=CODE status=STATUS` for the lookup, `result=CODE` (the call through the
/// exported symbol when the lookup failed), `state=N` / `tid=N` on success, and NVML's view
/// of device 0 after the call: `nvml_used=BYTES` and `nvml_procs=pid:bytes,...`.
/// `call_us=N` is the time the call took (µs). `CKPT_NO_INIT=1` skips cuInit; `CKPT_TIMEOUT_MS` sets lock's timeout;
/// `CKPT_RESERVED=1` passes args with a reserved word set; `CKPT_NULL=1` passes NULL for
/// the out-pointer of get_state / tid.
pub fn controller() {
    let cuda = Cuda::load();
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CKPT_NO_INIT") != "1" {
        assert_eq!(cuda.init(), 0);
    }
    let op = var("CKPT_OP");
    let pid: c_int = var("CKPT_PID").parse().expect("CKPT_PID");
    let name = match op.as_str() {
        "get_state" => "cuCheckpointProcessGetState",
        "tid" => "cuCheckpointProcessGetRestoreThreadId",
        "lock" => "cuCheckpointProcessLock",
        "checkpoint" => "cuCheckpointProcessCheckpoint",
        "restore" => "cuCheckpointProcessRestore",
        "unlock" => "cuCheckpointProcessUnlock",
        other => panic!("CKPT_OP={other}"),
    };
    let get_proc: GetProc = cuda.sym("cuGetProcAddress_v2");
    let c_name = std::ffi::CString::new(name).expect("name");
    let (mut pfn, mut status) = (std::ptr::null_mut(), -1);
    // SAFETY: a C string and valid out-pointers.
    let found = unsafe { get_proc(c_name.as_ptr(), &mut pfn, 12080, 0, &mut status) };
    println!("getproc={found} status={status}");
    if pfn.is_null() {
        // The symbol's address (dlsym), as the exported function.
        pfn = cuda.sym::<*mut c_void>(name);
    }
    let reserved = var("CKPT_RESERVED") == "1";
    let null = var("CKPT_NULL") == "1";
    let call_started = std::time::Instant::now();
    // SAFETY (all arms): `pfn` is the named function with cuda.h's signature; the args are
    // valid zeroed structs (one reserved word set if asked) and the out-pointers valid or
    // NULL on purpose.
    let result = unsafe {
        match op.as_str() {
            "get_state" | "tid" => {
                let f: unsafe extern "C" fn(c_int, *mut c_int) -> Cu = std::mem::transmute(pfn);
                let mut out: c_int = -1;
                let ptr = if null { std::ptr::null_mut() } else { &mut out };
                let r = f(pid, ptr);
                if r == 0 {
                    let key = if op == "tid" { "tid" } else { "state" };
                    println!("{key}={out}");
                }
                r
            }
            "lock" => {
                let f: unsafe extern "C" fn(c_int, *mut CUcheckpointLockArgs) -> Cu =
                    std::mem::transmute(pfn);
                let mut args: CUcheckpointLockArgs = std::mem::zeroed();
                args.timeoutMs = env_u64("CKPT_TIMEOUT_MS").unwrap_or(0) as u32;
                args.reserved1[6] = u64::from(reserved);
                let none = args.timeoutMs == 0 && !reserved;
                let started = std::time::Instant::now();
                let r = f(
                    pid,
                    if none {
                        std::ptr::null_mut()
                    } else {
                        &mut args
                    },
                );
                println!("lock_ms={}", started.elapsed().as_millis());
                r
            }
            "checkpoint" => {
                let f: unsafe extern "C" fn(c_int, *mut CUcheckpointCheckpointArgs) -> Cu =
                    std::mem::transmute(pfn);
                let mut args: CUcheckpointCheckpointArgs = std::mem::zeroed();
                args.reserved[7] = u64::from(reserved);
                f(pid, &mut args)
            }
            "restore" => {
                let f: unsafe extern "C" fn(c_int, *mut CUcheckpointRestoreArgs) -> Cu =
                    std::mem::transmute(pfn);
                let mut args: CUcheckpointRestoreArgs = std::mem::zeroed();
                args.reserved[0] = u64::from(reserved);
                f(
                    pid,
                    if reserved {
                        &mut args
                    } else {
                        std::ptr::null_mut()
                    },
                )
            }
            "unlock" => {
                let f: unsafe extern "C" fn(c_int, *mut CUcheckpointUnlockArgs) -> Cu =
                    std::mem::transmute(pfn);
                let mut args: CUcheckpointUnlockArgs = std::mem::zeroed();
                args.reserved[3] = u64::from(reserved);
                f(pid, &mut args)
            }
            _ => unreachable!(),
        }
    };
    println!("call_us={}", call_started.elapsed().as_micros());
    println!("result={result}");
    let nvml = Nvml::init().expect("nvmlInit");
    let device = nvml.device_by_index(0).expect("device 0");
    println!(
        "nvml_used={}",
        device.memory_info().expect("memory info").used
    );
    let procs: Vec<String> = device
        .running_compute_processes()
        .expect("processes")
        .iter()
        .map(|p| {
            let bytes = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => u64::MAX,
            };
            format!("{}:{bytes}", p.pid)
        })
        .collect();
    println!("nvml_procs={}", procs.join(","));
}
