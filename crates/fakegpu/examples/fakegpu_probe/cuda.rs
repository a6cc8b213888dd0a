//! A small client of the CUDA driver API over `dlopen`, as the probes use it: the function
//! pointers are looked up by name in `libcuda.so.1` (the fake, through LD_LIBRARY_PATH) and
//! called with cuda.h's C signatures; results are raw `CUresult` integers.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// `CUresult` as the raw integer the C API returns.
pub type Cu = u32;

/// libcuda.so.1 loaded the way a runtime loads it: `dlopen` by soname.
pub struct Cuda {
    pub lib: libloading::Library,
}

impl Cuda {
    /// `dlopen("libcuda.so.1")`, found through LD_LIBRARY_PATH.
    pub fn load() -> Cuda {
        // SAFETY: loading the fake driver runs no initializers beyond Rust's own.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.expect("dlopen libcuda.so.1");
        Cuda { lib }
    }

    /// The function `name`, typed as the caller says.
    pub fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller names the C signature of `name` as cuda.h declares it.
        unsafe {
            *self
                .lib
                .get::<T>(name.as_bytes())
                .unwrap_or_else(|e| panic!("dlsym {name}: {e}"))
        }
    }

    pub fn init(&self) -> Cu {
        let f: unsafe extern "C" fn(c_uint) -> Cu = self.sym("cuInit");
        // SAFETY: cuInit(0).
        unsafe { f(0) }
    }

    pub fn device_count(&self) -> Result<c_int, Cu> {
        let f: unsafe extern "C" fn(*mut c_int) -> Cu = self.sym("cuDeviceGetCount");
        let mut n = 0;
        // SAFETY: valid out-pointer.
        wrap(unsafe { f(&mut n) }, n)
    }

    pub fn device_name(&self, dev: c_int) -> String {
        let f: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Cu = self.sym("cuDeviceGetName");
        let mut buf = [0 as c_char; 128];
        // SAFETY: 128 writable bytes.
        assert_eq!(unsafe { f(buf.as_mut_ptr(), 128, dev) }, 0);
        // SAFETY: the fake NUL-terminates within the buffer.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn device_uuid(&self, dev: c_int) -> [u8; 16] {
        let f: unsafe extern "C" fn(*mut [u8; 16], c_int) -> Cu = self.sym("cuDeviceGetUuid_v2");
        let mut uuid = [0u8; 16];
        // SAFETY: a 16-byte CUuuid.
        assert_eq!(unsafe { f(&mut uuid, dev) }, 0);
        uuid
    }

    /// cuCtxCreate_v2 on `dev`; the context becomes current.
    pub fn ctx_create(&self, dev: c_int) -> Result<*mut c_void, Cu> {
        let f: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> Cu =
            self.sym("cuCtxCreate_v2");
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        wrap(unsafe { f(&mut ctx, 0, dev) }, ctx)
    }

    pub fn ctx_destroy(&self, ctx: *mut c_void) -> Cu {
        let f: unsafe extern "C" fn(*mut c_void) -> Cu = self.sym("cuCtxDestroy_v2");
        // SAFETY: a handle from ctx_create.
        unsafe { f(ctx) }
    }

    pub fn alloc(&self, bytes: usize) -> Result<u64, Cu> {
        let f: unsafe extern "C" fn(*mut u64, usize) -> Cu = self.sym("cuMemAlloc_v2");
        let mut ptr = 0;
        // SAFETY: valid out-pointer.
        wrap(unsafe { f(&mut ptr, bytes) }, ptr)
    }

    pub fn free(&self, ptr: u64) -> Cu {
        let f: unsafe extern "C" fn(u64) -> Cu = self.sym("cuMemFree_v2");
        // SAFETY: plain value argument.
        unsafe { f(ptr) }
    }

    /// (free, total).
    pub fn mem_info(&self) -> Result<(usize, usize), Cu> {
        let f: unsafe extern "C" fn(*mut usize, *mut usize) -> Cu = self.sym("cuMemGetInfo_v2");
        let (mut free, mut total) = (0, 0);
        // SAFETY: valid out-pointers.
        wrap(unsafe { f(&mut free, &mut total) }, (free, total))
    }

    /// Load any image and get a function handle.
    pub fn function(&self) -> *mut c_void {
        let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> Cu =
            self.sym("cuModuleLoadData");
        let get: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> Cu =
            self.sym("cuModuleGetFunction");
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        let image = b"fake cubin\0";
        // SAFETY: valid out-pointers, a non-NULL image and a C string name.
        unsafe {
            assert_eq!(load(&mut module, image.as_ptr().cast()), 0);
            assert_eq!(get(&mut function, module, c"kernel".as_ptr()), 0);
        }
        function
    }

    /// cuLaunchKernel with `blocks` blocks of 256 threads on the NULL stream.
    pub fn launch(&self, function: *mut c_void, blocks: c_uint) -> Cu {
        self.launch_on(function, blocks, std::ptr::null_mut())
    }

    /// cuLaunchKernel with `blocks` blocks of 256 threads on `stream`.
    pub fn launch_on(&self, function: *mut c_void, blocks: c_uint, stream: *mut c_void) -> Cu {
        type Launch = unsafe extern "C" fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> Cu;
        let f: Launch = self.sym("cuLaunchKernel");
        // SAFETY: a function handle and a stream (or NULL); params/extra may be NULL for the fake.
        unsafe {
            f(
                function,
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

    pub fn synchronize(&self) -> Cu {
        let f: unsafe extern "C" fn() -> Cu = self.sym("cuCtxSynchronize");
        // SAFETY: no arguments.
        unsafe { f() }
    }
}

fn wrap<T>(code: Cu, value: T) -> Result<T, Cu> {
    if code == 0 {
        Ok(value)
    } else {
        Err(code)
    }
}
