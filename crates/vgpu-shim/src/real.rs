//! The real driver functions behind the wrappers, resolved from `libcuda.so.1` /
//! `libnvidia-ml.so.1` on first use (never at load time) with glibc's `dlsym` on the
//! library's own handle, so the lookup cannot find the shim's exports.
//!
//! Each function has its own slot: one atomic load and a predictable branch, then an
//! indirect call. Resolution is lock-free and idempotent (threads racing to resolve store
//! the same pointer), so no lock exists that a `fork` could leave held.
//!
//! The governed functions' slots and their C signatures ([`sig`]) are generated from THE
//! list (`crate::governed`); the functions the shim only calls are declared here with
//! `real_functions!`. glibc's own `dlsym`, which every lookup goes through, is [`dlsym`].

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::ffi::*;

/// glibc's `dlsym`, found once with `dlvsym` (never the shim's own exported `dlsym`): for
/// every lookup of a real function, and the exported `dlsym`'s forward
/// (`crate::interpose::dlsym`, whose assembly trampoline reads [`dlsym::REAL_DLSYM`]).
pub mod dlsym {
    use std::ffi::{c_char, c_void, CStr};
    use std::sync::atomic::{AtomicPtr, Ordering};

    use crate::log::vgpu_log_once;

    /// glibc's `dlsym`; read by the assembly trampoline, so a plain pointer-sized static.
    pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

    type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

    #[cfg(target_arch = "x86_64")]
    const ORIGINAL_VERSION: &CStr = c"GLIBC_2.2.5";
    #[cfg(target_arch = "aarch64")]
    const ORIGINAL_VERSION: &CStr = c"GLIBC_2.17";
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const ORIGINAL_VERSION: &CStr = c"GLIBC_2.0";

    /// glibc's `dlsym`, resolved on first use.
    #[inline]
    pub fn real_dlsym() -> Option<DlsymFn> {
        let mut p = REAL_DLSYM.load(Ordering::Acquire);
        if p.is_null() {
            p = resolve_real_dlsym();
            if p.is_null() {
                return None;
            }
            REAL_DLSYM.store(p, Ordering::Release);
        }
        // SAFETY: `p` is glibc's dlsym, whose C signature DlsymFn matches.
        Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
    }

    /// Look `name` up in `handle` with glibc's `dlsym` (called from the shim: use only real
    /// library handles here, never `RTLD_NEXT`).
    pub fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
        match real_dlsym() {
            // SAFETY: a valid handle and a NUL-terminated name, as dlsym requires.
            Some(f) => unsafe { f(handle, name.as_ptr()) },
            None => std::ptr::null_mut(),
        }
    }

    fn resolve_real_dlsym() -> *mut c_void {
        // Neither scope contains libvgpu.so, so neither can hand back the shim's own dlsym.
        // RTLD_NEXT first (it respects another interposer loaded after us); when the shim was
        // dlopen'ed rather than preloaded, "next" may be empty, so libc's own handle second.
        // SAFETY: dlopen with RTLD_NOLOAD of a NUL-terminated name only returns an existing handle.
        let libc_handle = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        for scope in [libc::RTLD_NEXT, libc_handle] {
            if scope.is_null() {
                continue;
            }
            for version in [c"GLIBC_2.34", ORIGINAL_VERSION] {
                // SAFETY: dlvsym with a valid scope and NUL-terminated strings; called from this
                // library, so RTLD_NEXT means the objects after libvgpu.so.
                let p = unsafe { libc::dlvsym(scope, c"dlsym".as_ptr(), version.as_ptr()) };
                if !p.is_null() {
                    return p;
                }
            }
        }
        vgpu_log_once!(
            "cannot find glibc's dlsym (dlvsym GLIBC_2.34 / {}); dlsym lookups fail",
            ORIGINAL_VERSION.to_string_lossy()
        );
        std::ptr::null_mut()
    }
}

/// A driver library, opened on first use.
pub struct Library {
    name: &'static CStr,
    handle: AtomicPtr<c_void>,
}

pub static CUDA: Library = Library::new(c"libcuda.so.1");
pub static NVML: Library = Library::new(c"libnvidia-ml.so.1");

impl Library {
    const fn new(name: &'static CStr) -> Library {
        Library {
            name,
            handle: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The library's handle, loading it if the program has not (NULL if it cannot be loaded).
    pub fn handle(&self) -> *mut c_void {
        let h = self.handle.load(Ordering::Acquire);
        if !h.is_null() {
            return h;
        }
        // SAFETY: dlopen with a NUL-terminated name; NOLOAD first takes the copy the
        // program already uses.
        let mut h = unsafe { libc::dlopen(self.name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            // SAFETY: as above.
            h = unsafe { libc::dlopen(self.name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        }
        if !h.is_null() {
            self.handle.store(h, Ordering::Release);
        }
        h
    }

    /// The handle if the program has loaded the library; never loads it.
    pub fn handle_if_loaded(&self) -> *mut c_void {
        let h = self.handle.load(Ordering::Acquire);
        if !h.is_null() {
            return h;
        }
        // SAFETY: dlopen with RTLD_NOLOAD only returns an existing handle.
        let h = unsafe { libc::dlopen(self.name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if !h.is_null() {
            self.handle.store(h, Ordering::Release);
        }
        h
    }

    /// Address of `symbol` in the library, NULL if absent.
    pub fn symbol(&self, symbol: &CStr) -> *mut c_void {
        let h = self.handle();
        if h.is_null() {
            return std::ptr::null_mut();
        }
        dlsym::lookup(h, symbol)
    }
}

/// One real function: NULL = not resolved yet, [`MISSING`] = the library lacks it.
pub struct Slot {
    ptr: AtomicPtr<c_void>,
    name: &'static CStr,
    library: &'static Library,
}

const MISSING: *mut c_void = std::ptr::dangling_mut::<c_void>();

impl Slot {
    pub const fn new(library: &'static Library, name: &'static CStr) -> Slot {
        Slot {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            name,
            library,
        }
    }

    /// The function's address, or `None` if the driver does not have it.
    #[inline(always)]
    pub fn get(&self) -> Option<*mut c_void> {
        let p = self.ptr.load(Ordering::Relaxed);
        if p.is_null() {
            return self.resolve();
        }
        (p != MISSING).then_some(p)
    }

    #[cold]
    fn resolve(&self) -> Option<*mut c_void> {
        let p = self.library.symbol(self.name);
        if p.is_null() {
            // Not cached as missing while the library itself cannot be loaded yet.
            if !self.library.handle.load(Ordering::Acquire).is_null() {
                self.ptr.store(MISSING, Ordering::Relaxed);
            }
            return None;
        }
        self.ptr.store(p, Ordering::Relaxed);
        Some(p)
    }
}

/// Declares `real::NAME(args)`, one driver function: the real function, or `$missing` when
/// the driver lacks it. Governed functions get theirs from THE list (`crate::governed`,
/// expanded below); [`real_functions!`] below declares the ones the shim only calls.
macro_rules! real_function {
    ($library:ident, $missing:expr; $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty) => {
        // dead_code: real-only functions may be declared ahead of their use (the compute
        // governor's event functions).
        #[allow(non_snake_case, dead_code, clippy::too_many_arguments, clippy::missing_safety_doc)]
        #[inline(always)]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static SLOT: $crate::real::Slot = $crate::real::Slot::new(&$crate::real::$library, {
                const NAME: &str = concat!(stringify!($name), "\0");
                match ::std::ffi::CStr::from_bytes_with_nul(NAME.as_bytes()) { Ok(c) => c, Err(_) => panic!() }
            });
            match SLOT.get() {
                Some(p) => {
                    // SAFETY: `p` is the driver's function of this exact name, whose C
                    // signature this declaration copies from the headers.
                    let f = unsafe { ::std::mem::transmute::<*mut ::std::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(p) };
                    // SAFETY: the caller passes the arguments it got from the program.
                    unsafe { f($($arg),*) }
                }
                None => $missing,
            }
        }
    };
}

/// Declares several real-only driver functions of one library (see [`real_function!`]).
macro_rules! real_functions {
    ($library:ident, $missing:expr; $( fn $name:ident $args:tt -> $ret:ty ; )*) => {
        $( real_function!($library, $missing; $name $args -> $ret); )*
    };
}

/// Declares the governed functions' real ones (one [`real_function!`] per name, twins
/// included) and their C signatures ([`sig`]), from THE list: expanded by
/// `crate::governed::governed_functions!`. The hooks and fast-path predicates of the list are
/// the exports' business (`crate::interpose::exports`).
macro_rules! governed_real_functions {
    (
        $( $library:ident, $missing:expr => {
            $( fn $first:ident $(| $twin:ident)* ( $($args:tt)* ) -> $ret:ty => $hook:path $(, fast if $fast:path)?; )*
        } )*
    ) => {
        $( $(
            governed_real_functions!(@real $library, $missing; [$first $($twin)*] ($($args)*) -> $ret);
        )* )*

        /// C signatures of the governed functions, as the hooks receive the real one (one
        /// type per line of the list, named after its first name).
        #[allow(non_camel_case_types)]
        pub mod sig {
            #[allow(unused_imports)]
            use super::*;
            $( $( pub type $first = unsafe fn($($args)*) -> $ret; )* )*
        }
    };

    (@real $library:ident, $missing:expr; [$($name:ident)+] $args:tt -> $ret:ty) => {
        $( real_function!($library, $missing; $name $args -> $ret); )+
    };
}

// The governed functions' real ones.
crate::governed::governed_functions!(governed_real_functions);

// Real-only: functions the shim calls but does not govern.
real_functions! { CUDA, CUDA_ERROR_NOT_FOUND;
    fn cuDeviceGetCount(count: *mut c_int) -> CuResult;
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CuResult;
    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], device: CUdevice) -> CuResult;
    fn cuDeviceGetUuid(uuid: *mut [u8; 16], device: CUdevice) -> CuResult;
    fn cuCtxGetDevice(device: *mut CUdevice) -> CuResult;
    fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CuResult;
    fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CuResult;
    fn cuEventDestroy_v2(event: CUevent) -> CuResult;
    fn cuEventRecord(event: CUevent, stream: CUstream) -> CuResult;
    fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) -> CuResult;
    fn cuEventQuery(event: CUevent) -> CuResult;
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CuResult;
    fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint) -> CuResult;
    fn cuStreamIsCapturing_ptsz(stream: CUstream, status: *mut c_uint) -> CuResult;
}

real_functions! { NVML, NVML_ERROR_FUNCTION_NOT_FOUND;
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> NvmlReturn;
    fn nvmlInit_v2() -> NvmlReturn;
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> NvmlReturn;
    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, last_seen_us: u64) -> NvmlReturn;
}
