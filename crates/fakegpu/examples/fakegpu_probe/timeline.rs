//! Probes of the simulated timeline (for `tests/timeline.rs`): events, per-stream order,
//! every launch path's duration, graphs and stream capture, NVML utilization.
//!
//! Durations are checked exactly with events: a long kernel first fills the device's queue,
//! so an event recorded behind it is stamped when the queue reaches it and the kernel under
//! test starts exactly there (see the fake's `cuda/event.rs`). The parent test sets
//! `FAKEGPU_KERNELS=long=30ms,k=1ms`.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{
    CUDA_KERNEL_NODE_PARAMS_v2, CUgraphInstantiateResult, CUlaunchConfig, CUresult,
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUDA_LAUNCH_PARAMS,
};

use super::cuda::{Cu, Cuda};

type P = *mut c_void;
const NULL: P = std::ptr::null_mut();

fn code(r: CUresult) -> Cu {
    r as Cu
}

/// What every probe here uses: the driver, a context, functions `long`, `k` and an unnamed
/// one, and a stream.
struct Bench {
    cuda: Cuda,
    long: P,
    k: P,
    unnamed: P,
    stream: P,
}

impl Bench {
    fn new() -> Bench {
        let cuda = Cuda::load();
        assert_eq!(cuda.init(), 0);
        cuda.ctx_create(0).unwrap();
        let module = {
            let load: unsafe extern "C" fn(*mut P, *const c_void) -> Cu =
                cuda.sym("cuModuleLoadData");
            let mut m = NULL;
            // SAFETY: a valid out-pointer and a non-NULL image.
            assert_eq!(unsafe { load(&mut m, c"image".as_ptr().cast()) }, 0);
            m
        };
        let function = |name: &std::ffi::CStr| {
            let get: unsafe extern "C" fn(*mut P, P, *const c_char) -> Cu =
                cuda.sym("cuModuleGetFunction");
            let mut f = NULL;
            // SAFETY: valid out-pointer, module and C string.
            assert_eq!(unsafe { get(&mut f, module, name.as_ptr()) }, 0);
            f
        };
        let (long, k, unnamed) = (function(c"long"), function(c"k"), function(c"other"));
        let bench = Bench {
            cuda,
            long,
            k,
            unnamed,
            stream: NULL,
        };
        let stream = bench.new_stream();
        Bench { stream, ..bench }
    }

    fn new_stream(&self) -> P {
        let f: unsafe extern "C" fn(*mut P, c_uint) -> Cu = self.cuda.sym("cuStreamCreate");
        let mut s = NULL;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(&mut s, 0) }, 0);
        s
    }

    /// cuLaunchKernel of `f` with `blocks` blocks of 256 threads.
    fn launch(&self, f: P, blocks: c_uint, stream: P) -> Cu {
        self.launch_named("cuLaunchKernel", f, blocks, stream)
    }

    fn launch_named(&self, name: &str, f: P, blocks: c_uint, stream: P) -> Cu {
        type Launch = unsafe extern "C" fn(
            P,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            P,
            *mut P,
            *mut P,
        ) -> Cu;
        let launch: Launch = self.cuda.sym(name);
        // SAFETY: a function handle (or a deliberately bad one), no parameters.
        unsafe {
            launch(
                f,
                blocks,
                1,
                1,
                256,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    }

    fn event(&self, flags: c_uint) -> P {
        let f: unsafe extern "C" fn(*mut P, c_uint) -> Cu = self.cuda.sym("cuEventCreate");
        let mut e = NULL;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(&mut e, flags) }, 0);
        e
    }

    fn call1(&self, name: &str, a: P) -> Cu {
        let f: unsafe extern "C" fn(P) -> Cu = self.cuda.sym(name);
        // SAFETY: `name` takes one handle.
        unsafe { f(a) }
    }

    fn call2(&self, name: &str, a: P, b: P) -> Cu {
        let f: unsafe extern "C" fn(P, P) -> Cu = self.cuda.sym(name);
        // SAFETY: `name` takes two handles.
        unsafe { f(a, b) }
    }

    fn record(&self, event: P, stream: P) -> Cu {
        self.call2("cuEventRecord", event, stream)
    }

    fn elapsed(&self, name: &str, a: P, b: P) -> Result<f32, Cu> {
        let f: unsafe extern "C" fn(*mut f32, P, P) -> Cu = self.cuda.sym(name);
        let mut ms = f32::NAN;
        // SAFETY: valid out-pointer and event handles (or deliberately bad ones).
        match unsafe { f(&mut ms, a, b) } {
            0 => Ok(ms),
            e => Err(e),
        }
    }

    /// The simulated duration, in ms, of what `launch` queues on `stream`, measured exactly
    /// with two events behind a queue-filling `long` kernel.
    fn measure(&self, stream: P, launch: impl FnOnce() -> Cu) -> f32 {
        let (e0, e1) = (self.event(0), self.event(0));
        assert_eq!(self.launch(self.long, 1, stream), 0);
        assert_eq!(self.record(e0, stream), 0);
        assert_eq!(launch(), 0);
        assert_eq!(self.record(e1, stream), 0);
        assert_eq!(self.call1("cuEventSynchronize", e1), 0);
        let ms = self.elapsed("cuEventElapsedTime", e0, e1).unwrap();
        self.call1("cuEventDestroy_v2", e0);
        self.call1("cuEventDestroy_v2", e1);
        ms
    }

    /// cuGetProcAddress_v2 at CUDA 12.8 with `flags`.
    fn proc_address(&self, name: &std::ffi::CStr, flags: u64) -> P {
        type Get = unsafe extern "C" fn(*const c_char, *mut P, c_int, u64, *mut c_int) -> Cu;
        let get: Get = self.cuda.sym("cuGetProcAddress_v2");
        let (mut pfn, mut status) = (NULL, -1);
        // SAFETY: C string and writable out-pointers.
        assert_eq!(
            unsafe { get(name.as_ptr(), &mut pfn, 12080, flags, &mut status) },
            0,
            "{name:?}"
        );
        pfn
    }
}

pub fn events() {
    let b = Bench::new();
    let invalid_handle = code(CUresult::CUDA_ERROR_INVALID_HANDLE);
    let (e0, e1, untimed) = (b.event(0), b.event(0), b.event(2));
    assert_eq!(b.call1("cuEventQuery", e0), 0, "never recorded: complete");
    assert_eq!(b.call1("cuEventSynchronize", e0), 0);
    assert_eq!(
        b.elapsed("cuEventElapsedTime", e0, e1),
        Err(invalid_handle),
        "never recorded"
    );
    let bad = 0x1234 as P;
    assert_eq!(b.call1("cuEventQuery", bad), invalid_handle);
    assert_eq!(b.record(bad, b.stream), invalid_handle);
    assert_eq!(
        b.elapsed("cuEventElapsedTime", bad, e1),
        Err(invalid_handle)
    );
    let create: unsafe extern "C" fn(*mut P, c_uint) -> Cu = b.cuda.sym("cuEventCreate");
    let mut e = NULL;
    // SAFETY: valid out-pointer; unknown flag bits / NULL out-pointer are refused.
    unsafe {
        assert_eq!(
            create(&mut e, 0x80),
            code(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            create(std::ptr::null_mut(), 0),
            code(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
    }
    let elapsed: unsafe extern "C" fn(*mut f32, P, P) -> Cu = b.cuda.sym("cuEventElapsedTime");
    // SAFETY: NULL out-pointer is refused.
    assert_eq!(
        unsafe { elapsed(std::ptr::null_mut(), e0, e1) },
        code(CUresult::CUDA_ERROR_INVALID_VALUE)
    );

    // Pending: 30 ms of work queued between the two events.
    assert_eq!(b.record(e0, b.stream), 0);
    assert_eq!(b.record(untimed, b.stream), 0);
    assert_eq!(b.launch(b.long, 1, b.stream), 0);
    let with_flags: unsafe extern "C" fn(P, P, c_uint) -> Cu = b.cuda.sym("cuEventRecordWithFlags");
    // SAFETY: valid handles; flag 0.
    assert_eq!(unsafe { with_flags(e1, b.stream, 0) }, 0);
    assert_eq!(
        b.call1("cuEventQuery", e1),
        code(CUresult::CUDA_ERROR_NOT_READY)
    );
    assert_eq!(
        b.elapsed("cuEventElapsedTime", e0, e1),
        Err(code(CUresult::CUDA_ERROR_NOT_READY))
    );
    let start = Instant::now();
    assert_eq!(b.call1("cuEventSynchronize", e1), 0);
    assert!(
        start.elapsed() >= Duration::from_millis(25),
        "cuEventSynchronize waited"
    );
    assert_eq!(b.call1("cuEventQuery", e1), 0);
    assert_eq!(
        b.elapsed("cuEventElapsedTime", untimed, e1),
        Err(invalid_handle),
        "timing disabled"
    );
    let ms = b.elapsed("cuEventElapsedTime", e0, e1).unwrap();
    assert!(
        (30.0..31.0).contains(&ms),
        "elapsed {ms} ms around a 30 ms kernel on an idle device"
    );
    assert_eq!(
        b.elapsed("cuEventElapsedTime_v2", e1, e0),
        Ok(-ms),
        "negative when reversed"
    );

    // Exact: behind a busy queue, the events bracket exactly the kernel.
    assert_eq!(b.measure(b.stream, || b.launch(b.k, 132, b.stream)), 1.0);
    assert_eq!(
        b.measure(b.stream, || b.launch(b.k, 133, b.stream)),
        2.0,
        "two waves"
    );
    assert_eq!(
        b.measure(b.stream, || b.launch(b.unnamed, 1, b.stream)),
        0.1,
        "kernel_wave_us"
    );

    // The per-thread entry points, found through cuGetProcAddress_v2, on the per-thread stream.
    let record_ptsz = b.proc_address(c"cuEventRecord", 2);
    let record_legacy = b.proc_address(c"cuEventRecord", 0);
    assert_ne!(record_ptsz, record_legacy);
    // SAFETY: cuEventRecord_ptsz's signature.
    let record_ptsz: unsafe extern "C" fn(P, P) -> Cu = unsafe { std::mem::transmute(record_ptsz) };
    let per_thread = 0x2 as P;
    assert_eq!(b.launch(b.long, 1, per_thread), 0);
    // SAFETY: valid handles; NULL is the per-thread stream here.
    assert_eq!(unsafe { record_ptsz(e0, NULL) }, 0);
    assert_eq!(b.launch_named("cuLaunchKernel_ptsz", b.k, 1, NULL), 0);
    // SAFETY: as above.
    assert_eq!(unsafe { record_ptsz(e1, NULL) }, 0);
    assert_eq!(b.call1("cuEventSynchronize", e1), 0);
    assert_eq!(b.elapsed("cuEventElapsedTime", e0, e1), Ok(1.0));
    assert_eq!(b.call1("cuEventDestroy_v2", e0), 0);
    assert_eq!(b.call1("cuEventDestroy_v2", e0), invalid_handle);
}

pub fn streams() {
    let b = Bench::new();
    let other = b.new_stream();
    let not_ready = code(CUresult::CUDA_ERROR_NOT_READY);
    assert_eq!(b.launch(b.long, 1, b.stream), 0);
    assert_eq!(b.call1("cuStreamQuery", b.stream), not_ready);
    assert_eq!(
        b.call1("cuStreamQuery", other),
        0,
        "another stream has nothing queued"
    );
    assert_eq!(
        b.call1("cuStreamQuery", NULL),
        0,
        "nor has the legacy stream"
    );
    // An event recorded on the idle stream is stamped when the device reaches it.
    let (e0, e1) = (b.event(0), b.event(0));
    assert_eq!(b.record(e0, other), 0);
    assert_eq!(
        b.call1("cuEventQuery", e0),
        not_ready,
        "behind the queued kernel"
    );
    // A kernel on the other stream starts after the first stream's (one FIFO per device).
    assert_eq!(b.launch(b.k, 1, other), 0);
    assert_eq!(b.record(e1, other), 0);
    assert_eq!(b.call1("cuStreamQuery", other), not_ready);
    let start = Instant::now();
    assert_eq!(b.call1("cuStreamSynchronize", other), 0);
    assert!(
        start.elapsed() >= Duration::from_millis(25),
        "waited for the FIFO"
    );
    assert_eq!(b.call1("cuStreamQuery", b.stream), 0);
    assert_eq!(b.elapsed("cuEventElapsedTime", e0, e1), Ok(1.0));
    // cuStreamWaitEvent: the legacy stream waits for an event of a busy stream.
    assert_eq!(b.launch(b.long, 1, b.stream), 0);
    assert_eq!(b.record(e0, b.stream), 0);
    let wait: unsafe extern "C" fn(P, P, c_uint) -> Cu = b.cuda.sym("cuStreamWaitEvent");
    // SAFETY: valid handles; flags 0.
    assert_eq!(unsafe { wait(NULL, e0, 0) }, 0);
    // SAFETY: unknown flags are refused.
    assert_eq!(
        unsafe { wait(NULL, e0, 8) },
        code(CUresult::CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(b.call1("cuStreamQuery", NULL), not_ready);
    // cuCtxSynchronize waits for everything.
    assert_eq!(b.launch(b.k, 1, other), 0);
    assert_eq!(b.cuda.synchronize(), 0);
    for s in [b.stream, other, NULL, 0x1 as P, 0x2 as P] {
        assert_eq!(b.call1("cuStreamQuery", s), 0);
    }
    // Per-thread default streams are per thread.
    assert_eq!(b.launch_named("cuLaunchKernel_ptsz", b.long, 1, NULL), 0);
    assert_eq!(b.call1("cuStreamQuery_ptsz", NULL), not_ready);
    let ctx = {
        let f: unsafe extern "C" fn(*mut P) -> Cu = b.cuda.sym("cuCtxGetCurrent");
        let mut c = NULL;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(&mut c) }, 0);
        c as usize
    };
    let set_current: unsafe extern "C" fn(P) -> Cu = b.cuda.sym("cuCtxSetCurrent");
    let query_ptsz: unsafe extern "C" fn(P) -> Cu = b.cuda.sym("cuStreamQuery_ptsz");
    let (set_current, query_ptsz) = (set_current as usize, query_ptsz as usize);
    let other_thread = std::thread::spawn(move || {
        // SAFETY: the addresses of cuCtxSetCurrent and cuStreamQuery_ptsz, with their C
        // signatures; the library stays loaded (`b` outlives the join below).
        unsafe {
            let set_current: unsafe extern "C" fn(P) -> Cu = std::mem::transmute(set_current);
            let query_ptsz: unsafe extern "C" fn(P) -> Cu = std::mem::transmute(query_ptsz);
            assert_eq!(set_current(ctx as P), 0);
            query_ptsz(NULL)
        }
    })
    .join()
    .unwrap();
    assert_eq!(
        other_thread, 0,
        "another thread's per-thread stream is idle"
    );
    assert_eq!(b.call1("cuStreamSynchronize_ptsz", NULL), 0);
    assert_eq!(b.call1("cuStreamQuery_ptsz", NULL), 0);
    println!("pid={}", std::process::id());
}

pub fn launch_paths() {
    let b = Bench::new();
    let s = b.stream;
    assert_eq!(
        b.measure(s, || b.launch_named(
            "cuLaunchCooperativeKernel",
            b.k,
            132,
            s
        )),
        1.0
    );
    assert_eq!(
        b.launch_named("cuLaunchCooperativeKernel", b.k, 132 * 32 + 1, s),
        code(CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE)
    );
    let ex: unsafe extern "C" fn(*const CUlaunchConfig, P, *mut P, *mut P) -> Cu =
        b.cuda.sym("cuLaunchKernelEx");
    let config = CUlaunchConfig {
        gridDimX: 264,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 128,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: s.cast(),
        attrs: std::ptr::null_mut(),
        numAttrs: 0,
    };
    // SAFETY: a valid config and function.
    assert_eq!(
        b.measure(s, || unsafe {
            ex(&config, b.k, std::ptr::null_mut(), std::ptr::null_mut())
        }),
        2.0
    );

    // Legacy: a block shape is required, then grids of width × height.
    let grid_async: unsafe extern "C" fn(P, c_int, c_int, P) -> Cu =
        b.cuda.sym("cuLaunchGridAsync");
    // SAFETY: valid handles.
    assert_eq!(
        unsafe { grid_async(b.k, 1, 1, s) },
        code(CUresult::CUDA_ERROR_INVALID_VALUE),
        "no block shape yet"
    );
    let shape: unsafe extern "C" fn(P, c_int, c_int, c_int) -> Cu =
        b.cuda.sym("cuFuncSetBlockShape");
    // SAFETY: valid handle.
    assert_eq!(unsafe { shape(b.k, 256, 1, 1) }, 0);
    let seti: unsafe extern "C" fn(P, c_int, c_uint) -> Cu = b.cuda.sym("cuParamSeti");
    let setf: unsafe extern "C" fn(P, c_int, f32) -> Cu = b.cuda.sym("cuParamSetf");
    let setv: unsafe extern "C" fn(P, c_int, *mut c_void, c_uint) -> Cu = b.cuda.sym("cuParamSetv");
    let mut value = 7u64;
    // SAFETY: valid handles and an 8-byte buffer.
    unsafe {
        assert_eq!(b.call2("cuParamSetSize", b.k, 16 as P), 0);
        assert_eq!(seti(b.k, 0, 1), 0);
        assert_eq!(setf(b.k, 4, 1.5), 0);
        assert_eq!(setv(b.k, 8, (&mut value as *mut u64).cast(), 8), 0);
        assert_eq!(
            setv(0x99 as P, 8, (&mut value as *mut u64).cast(), 8),
            code(CUresult::CUDA_ERROR_INVALID_HANDLE)
        );
    }
    assert_eq!(b.call2("cuFuncSetSharedSize", b.k, NULL), 0);
    // SAFETY: valid handles.
    assert_eq!(b.measure(s, || unsafe { grid_async(b.k, 132, 3, s) }), 3.0);
    let grid: unsafe extern "C" fn(P, c_int, c_int) -> Cu = b.cuda.sym("cuLaunchGrid");
    // SAFETY: valid handle; the legacy stream.
    assert_eq!(b.measure(NULL, || unsafe { grid(b.k, 133, 1) }), 2.0);
    assert_eq!(b.measure(NULL, || b.call1("cuLaunch", b.k)), 1.0);

    // Multi-device: one entry, on a created stream only.
    let multi: unsafe extern "C" fn(*mut CUDA_LAUNCH_PARAMS, c_uint, c_uint) -> Cu =
        b.cuda.sym("cuLaunchCooperativeKernelMultiDevice");
    let mut params = CUDA_LAUNCH_PARAMS {
        function: b.k.cast(),
        gridDimX: 132,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 64,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: s.cast(),
        kernelParams: std::ptr::null_mut(),
    };
    // SAFETY: one valid entry.
    assert_eq!(b.measure(s, || unsafe { multi(&mut params, 1, 0) }), 1.0);
    params.hStream = NULL.cast();
    // SAFETY: as above; the NULL stream is refused.
    assert_eq!(
        unsafe { multi(&mut params, 1, 0) },
        code(CUresult::CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(b.cuda.synchronize(), 0);
}

pub fn graphs() {
    let b = Bench::new();
    let s = b.stream;
    let unsupported = code(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    let begin: unsafe extern "C" fn(P, c_uint) -> Cu = b.cuda.sym("cuStreamBeginCapture_v2");
    let end: unsafe extern "C" fn(P, *mut P) -> Cu = b.cuda.sym("cuStreamEndCapture");
    let is_capturing: unsafe extern "C" fn(P, *mut c_uint) -> Cu =
        b.cuda.sym("cuStreamIsCapturing");
    type Info =
        unsafe extern "C" fn(P, *mut c_uint, *mut u64, *mut P, *mut *const P, *mut usize) -> Cu;
    let info: Info = b.cuda.sym("cuStreamGetCaptureInfo_v2");
    let mut graph = NULL;
    // SAFETY: valid handles and out-pointers throughout.
    unsafe {
        assert_eq!(
            begin(NULL, 0),
            unsupported,
            "the legacy stream cannot capture"
        );
        assert_eq!(end(s, &mut graph), code(CUresult::CUDA_ERROR_ILLEGAL_STATE));
        assert_eq!(begin(s, 0), 0);
        assert_eq!(begin(s, 0), code(CUresult::CUDA_ERROR_ILLEGAL_STATE));
        let mut status = 9;
        assert_eq!(is_capturing(s, &mut status), 0);
        assert_eq!(status, 1, "active");
        assert_eq!(is_capturing(NULL, &mut status), 0);
        assert_eq!(status, 0, "the legacy stream is not capturing");
    }
    assert_eq!(b.launch(b.long, 1, s), 0, "captured, not run");
    assert_eq!(b.launch_named("cuLaunchCooperativeKernel", b.k, 132, s), 0);
    let e = b.event(0);
    assert_eq!(b.record(e, s), 0, "an event record joins the capture");
    assert_eq!(b.call1("cuEventQuery", e), 0, "and stamps nothing");
    assert_eq!(b.call1("cuStreamSynchronize", s), unsupported);
    assert_eq!(b.call1("cuStreamQuery", s), unsupported);
    let (mut status, mut id, mut captured, mut deps, mut count) =
        (0, 0u64, NULL, std::ptr::null(), 0usize);
    let last_node;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(
            info(
                s,
                &mut status,
                &mut id,
                &mut captured,
                &mut deps,
                &mut count
            ),
            0
        );
        assert_eq!((status, count), (1, 1));
        assert!(id > 0 && !captured.is_null() && !deps.is_null());
        last_node = deps.read(); // valid until the next call on the stream
        assert_eq!(end(s, &mut graph), 0);
        assert_eq!(graph, captured);
        assert_eq!(
            info(
                s,
                &mut status,
                &mut id,
                &mut captured,
                &mut deps,
                &mut count
            ),
            0
        );
        assert_eq!(status, 0);
    }
    assert_eq!(
        b.call1("cuStreamQuery", s),
        0,
        "nothing ran during the capture"
    );

    // Nodes: the two captured kernels, then an empty node and a two-wave kernel node.
    let get_nodes: unsafe extern "C" fn(P, *mut P, *mut usize) -> Cu =
        b.cuda.sym("cuGraphGetNodes");
    let add_empty: unsafe extern "C" fn(*mut P, P, *const P, usize) -> Cu =
        b.cuda.sym("cuGraphAddEmptyNode");
    let add_kernel: unsafe extern "C" fn(
        *mut P,
        P,
        *const P,
        usize,
        *const CUDA_KERNEL_NODE_PARAMS_v2,
    ) -> Cu = b.cuda.sym("cuGraphAddKernelNode_v2");
    let mut nodes = [NULL; 4];
    let mut n = 0usize;
    // SAFETY: valid handles, out-pointers and node arrays.
    unsafe {
        assert_eq!(get_nodes(graph, std::ptr::null_mut(), &mut n), 0);
        assert_eq!(n, 2);
        let mut empty = NULL;
        let mut all = [NULL; 2];
        n = 2;
        assert_eq!(get_nodes(graph, all.as_mut_ptr(), &mut n), 0);
        assert_eq!(
            all[1], last_node,
            "the capture's dependency is its last node"
        );
        assert_eq!(add_empty(&mut empty, graph, &last_node, 1), 0);
        assert_eq!(
            add_empty(&mut empty, graph, &(0x77 as P), 1),
            code(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        let params = CUDA_KERNEL_NODE_PARAMS_v2 {
            func: b.k.cast(),
            gridDimX: 200,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 32,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: std::ptr::null_mut(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        };
        let mut node = NULL;
        assert_eq!(add_kernel(&mut node, graph, &empty, 1, &params), 0);
        n = 4;
        assert_eq!(get_nodes(graph, nodes.as_mut_ptr(), &mut n), 0);
        assert_eq!(n, 4);
        assert_eq!(nodes[3], node);
    }
    // Launch: all kernels back to back (30 + 1 + 2 ms), once per launch.
    let instantiate: unsafe extern "C" fn(*mut P, P, u64) -> Cu =
        b.cuda.sym("cuGraphInstantiateWithFlags");
    let with_params: unsafe extern "C" fn(*mut P, P, *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> Cu =
        b.cuda.sym("cuGraphInstantiateWithParams");
    let (mut exec, mut exec2) = (NULL, NULL);
    // SAFETY: valid handles and out-pointers; the params struct is zeroed plain data.
    unsafe {
        assert_eq!(instantiate(&mut exec, graph, 0), 0);
        let mut p: CUDA_GRAPH_INSTANTIATE_PARAMS = std::mem::zeroed();
        p.result_out = CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR;
        assert_eq!(with_params(&mut exec2, graph, &mut p), 0);
        assert_eq!(p.result_out as u32, 0, "CUDA_GRAPH_INSTANTIATE_SUCCESS");
    }
    assert_eq!(b.measure(s, || b.call2("cuGraphLaunch", exec, s)), 33.0);
    assert_eq!(b.measure(s, || b.call2("cuGraphLaunch", exec2, s)), 33.0);
    // A graph launched into a capture adds its kernels to the capture.
    let mut outer = NULL;
    // SAFETY: valid handles.
    unsafe {
        assert_eq!(begin(s, 0), 0);
        assert_eq!(b.call2("cuGraphLaunch", exec, s), 0);
        assert_eq!(end(s, &mut outer), 0);
        n = 0;
        assert_eq!(get_nodes(outer, std::ptr::null_mut(), &mut n), 0);
    }
    assert_eq!(n, 3);
    assert_eq!(b.call1("cuGraphExecDestroy", exec), 0);
    assert_eq!(
        b.call2("cuGraphLaunch", exec, s),
        code(CUresult::CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(b.call1("cuGraphDestroy", graph), 0);
}

/// Launch `k` (5 ms) then idle about as long, for 1.2 s; then report NVML's utilization.
pub fn half_busy() {
    let b = Bench::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1200) {
        assert_eq!(b.launch(b.k, 132 * 5, b.stream), 0);
        assert_eq!(b.call1("cuStreamSynchronize", b.stream), 0);
        std::thread::sleep(Duration::from_millis(5));
    }
    let nvml = nvml_wrapper::Nvml::init().unwrap();
    let device = nvml.device_by_index(0).unwrap();
    let gpu = device.utilization_rates().unwrap().gpu;
    let samples = device.process_utilization_stats(None).unwrap();
    let mine: Vec<_> = samples
        .iter()
        .filter(|s| s.pid == std::process::id())
        .collect();
    assert_eq!(mine.len(), 1, "{samples:?}");
    println!("gpu={gpu}");
    println!("sm={}", mine[0].sm_util);
}

/// Queue 3 s of work at once, launch nothing more, and report NVML's view of it while it
/// still runs, for the last half second.
pub fn queued_then_quiet() {
    let b = Bench::new();
    for _ in 0..100 {
        assert_eq!(b.launch(b.long, 1, b.stream), 0);
    }
    std::thread::sleep(Duration::from_millis(1100));
    let nvml = nvml_wrapper::Nvml::init().unwrap();
    let device = nvml.device_by_index(0).unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let samples = device.process_utilization_stats(now_us - 500_000).unwrap();
    let mine: Vec<_> = samples
        .iter()
        .filter(|s| s.pid == std::process::id())
        .collect();
    assert_eq!(mine.len(), 1, "{samples:?}");
    println!("sm={}", mine[0].sm_util);
    println!("gpu={}", device.utilization_rates().unwrap().gpu);
    assert!(
        device
            .process_utilization_stats(now_us + 10_000_000)
            .is_err(),
        "an empty window has no samples"
    );
}

/// NVML's view of device 0 now, from a process that launches nothing: `gpu=N` (device
/// utilization) and one `pid=P sm=N` line per process sample of the last second.
pub fn utilization() {
    let nvml = nvml_wrapper::Nvml::init().unwrap();
    let device = nvml.device_by_index(0).unwrap();
    println!("gpu={}", device.utilization_rates().unwrap().gpu);
    for s in device.process_utilization_stats(None).unwrap_or_default() {
        println!("pid={} sm={}", s.pid, s.sm_util);
    }
}
