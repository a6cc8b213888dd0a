//! CUDA 12's context-independent loading: libraries and kernels (`cuLibrary*`,
//! `cuKernel*`).
//!
//! Any image loads, as with modules. A PTX image (text) declares its kernels with `.entry
//! NAME`: those are the library's kernels from the start (`cuLibraryGetKernelCount`,
//! `cuLibraryEnumerateKernels`); any other name still resolves and joins them. A kernel
//! launches like a `cuModuleGetFunction` function of the same name, directly (a `CUkernel`
//! passed as a `CUfunction`, as CUDA 12 allows) or through `cuKernelGetFunction`, with its
//! wave time from `FAKEGPU_KERNELS`. Each context that uses the library gets its own module
//! (`cuLibraryGetModule`), destroyed with the context.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};

use cudarc::driver::sys::{
    CUdevice, CUfunc_cache, CUfunction, CUfunction_attribute, CUjit_option, CUkernel, CUlibrary,
    CUlibraryOption, CUmodule, CUresult,
};

use super::launch::{kernel_table, out_handle, Function};
use super::occupancy::{check_cache_config, get_attribute, set_attribute};
use super::process::{self, Process};
use super::{entry, CuResult};
use crate::ffi;

/// A loaded library.
#[derive(Debug, Default)]
pub(crate) struct Library {
    /// Its kernels, in the order they became known: name → kernel handle.
    pub kernels: Vec<(String, u64)>,
    /// Per context: the module it has there.
    pub modules: HashMap<u64, u64>,
    /// Per (context, kernel): its function there.
    pub functions: HashMap<(u64, u64), u64>,
}

/// A kernel of a library.
#[derive(Debug)]
pub(crate) struct LibKernel {
    pub library: u64,
    pub name: CString,
}

/// The `.entry` names a PTX image declares (nothing for a binary image).
fn ptx_entries(image: &[u8]) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(image) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut words = text.split(|c: char| c.is_whitespace() || c == '(');
    while let Some(word) = words.next() {
        if word == ".entry" {
            if let Some(name) = words.find(|w| !w.is_empty()) {
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
            }
        }
    }
    names
}

impl Process {
    fn library(&mut self, library: CUlibrary) -> CuResult<&mut Library> {
        self.libraries
            .get_mut(&(library as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Kernel `name` of `library`, made on first use: a handle that is also a function (so
    /// it launches as one).
    fn library_kernel(&mut self, library: u64, name: &str) -> CuResult<u64> {
        let wave_ns = kernel_table()?.get(name).copied();
        let known = self
            .libraries
            .get(&library)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .kernels
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, k)| k);
        if let Some(kernel) = known {
            return Ok(kernel);
        }
        let name_c = CString::new(name).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let handle = self.new_handle();
        self.kernels.insert(
            handle,
            LibKernel {
                library,
                name: name_c,
            },
        );
        self.functions.insert(
            handle,
            Function {
                module: library,
                wave_ns,
                block: None,
                attrs: Default::default(),
            },
        );
        if let Some(lib) = self.libraries.get_mut(&library) {
            lib.kernels.push((name.to_string(), handle));
        }
        Ok(handle)
    }

    /// The library's module in the current context.
    fn library_module(&mut self, library: u64) -> CuResult<(u64, u64)> {
        let (ctx, _) = self.current_ctx()?;
        let existing = self
            .libraries
            .get(&library)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .modules
            .get(&ctx)
            .copied();
        if let Some(module) = existing.filter(|m| self.modules.contains_key(m)) {
            return Ok((ctx, module));
        }
        let module = self.new_handle();
        self.modules.insert(module, ctx);
        if let Some(lib) = self.libraries.get_mut(&library) {
            lib.modules.insert(ctx, module);
        }
        Ok((ctx, module))
    }

    /// The function of kernel `kernel` in the current context.
    fn kernel_function(&mut self, kernel: u64) -> CuResult<u64> {
        let library = self
            .kernels
            .get(&kernel)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .library;
        let (ctx, module) = self.library_module(library)?;
        let existing = self
            .libraries
            .get(&library)
            .and_then(|l| l.functions.get(&(ctx, kernel)))
            .copied();
        if let Some(f) = existing.filter(|f| self.functions.contains_key(f)) {
            return Ok(f);
        }
        let template = self
            .functions
            .get(&kernel)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let handle = self.new_handle();
        self.functions
            .insert(handle, Function { module, ..template });
        if let Some(lib) = self.libraries.get_mut(&library) {
            lib.functions.insert((ctx, kernel), handle);
        }
        Ok(handle)
    }

    fn unload_library(&mut self, library: u64) -> CuResult {
        let lib = self
            .libraries
            .remove(&library)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let modules: Vec<u64> = lib.modules.values().copied().collect();
        for m in &modules {
            self.modules.remove(m);
        }
        self.functions
            .retain(|_, f| f.module != library && !modules.contains(&f.module));
        self.kernels.retain(|_, k| k.library != library);
        Ok(())
    }
}

/// Options are checked for shape (arrays present when counted) and ignored.
fn load(
    library: *mut CUlibrary,
    image: Option<Vec<u8>>,
    jit: (c_uint, *mut CUjit_option, *mut *mut c_void),
    lib_opts: (c_uint, *mut CUlibraryOption, *mut *mut c_void),
) -> CuResult {
    let Some(image) = image else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    if library.is_null()
        || (jit.0 > 0 && (jit.1.is_null() || jit.2.is_null()))
        || (lib_opts.0 > 0 && (lib_opts.1.is_null() || lib_opts.2.is_null()))
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = process::with(|p| {
        let handle = p.new_handle();
        p.libraries.insert(handle, Library::default());
        for name in ptx_entries(&image) {
            p.library_kernel(handle, &name)?;
        }
        Ok(handle)
    })?;
    out_handle(library, handle)
}

/// The bytes of an in-memory image: a PTX text up to its NUL, else the first 64 KiB at
/// most of what is readable as text (a cubin's kernels are not read).
///
/// # Safety
/// `code` is NULL or points to an image (driver API contract).
unsafe fn image_bytes(code: *const c_void) -> Option<Vec<u8>> {
    if code.is_null() {
        return None;
    }
    // SAFETY: by this function's contract; an ELF image starts with 4 readable bytes.
    let head = unsafe { std::slice::from_raw_parts(code.cast::<u8>(), 4) };
    if head == b"\x7fELF" {
        return Some(head.to_vec());
    }
    // SAFETY: a non-ELF image is PTX, a NUL-terminated string (cuda.h).
    let text = unsafe { std::ffi::CStr::from_ptr(code.cast::<c_char>()) };
    Some(text.to_bytes().to_vec())
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    jit_options: *mut CUjit_option,
    jit_options_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut CUlibraryOption,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    entry(|| {
        process::with(|_| Ok(()))?;
        // SAFETY: `code` is NULL or an image (driver API contract).
        let image = unsafe { image_bytes(code) };
        load(
            library,
            image,
            (num_jit_options, jit_options, jit_options_values),
            (num_library_options, library_options, library_option_values),
        )
    })
}

/// A missing or unreadable file is CUDA_ERROR_FILE_NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut CUlibrary,
    file_name: *const c_char,
    jit_options: *mut CUjit_option,
    jit_options_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut CUlibraryOption,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    entry(|| {
        process::with(|_| Ok(()))?;
        // SAFETY: `file_name` is NULL or a C string (driver API contract).
        let Some(path) = (unsafe { ffi::c_str(file_name) }) else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let image = std::fs::read(path).map_err(|_| CUresult::CUDA_ERROR_FILE_NOT_FOUND)?;
        load(
            library,
            Some(image),
            (num_jit_options, jit_options, jit_options_values),
            (num_library_options, library_options, library_option_values),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    entry(|| process::with(|p| p.unload_library(library as u64)))
}

/// Any name resolves (the same handle for the same name).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    entry(|| {
        // SAFETY: `name` is NULL or a C string (driver API contract).
        let Some(name) = (unsafe { ffi::c_str(name) }) else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        if kernel.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| p.library_kernel(library as u64, name))?;
        out_handle(kernel, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(module: *mut CUmodule, library: CUlibrary) -> CUresult {
    entry(|| {
        if module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (_, handle) = process::with(|p| {
            p.library(library)?;
            p.library_module(library as u64)
        })?;
        out_handle(module, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut c_uint, lib: CUlibrary) -> CUresult {
    entry(|| {
        let n = process::with(|p| Ok(p.library(lib)?.kernels.len()))?;
        // SAFETY: `count` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(count, n as c_uint) }?)
    })
}

/// The first `num_kernels` kernels (fewer if the library has fewer).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut CUkernel,
    num_kernels: c_uint,
    lib: CUlibrary,
) -> CUresult {
    entry(|| {
        if kernels.is_null() && num_kernels > 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handles: Vec<u64> =
            process::with(|p| Ok(p.library(lib)?.kernels.iter().map(|&(_, k)| k).collect()))?;
        for (i, h) in handles.into_iter().take(num_kernels as usize).enumerate() {
            // SAFETY: `kernels` holds `num_kernels` writable entries (driver API contract).
            unsafe { ffi::write(kernels.add(i), h as usize as CUkernel) }?;
        }
        Ok(())
    })
}

/// The kernel's function in the current context.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel) -> CUresult {
    entry(|| {
        if func.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| p.kernel_function(kernel as u64))?;
        out_handle(func, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetLibrary(lib: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    entry(|| {
        if lib.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let library = process::with(|p| {
            p.kernels
                .get(&(kernel as u64))
                .map(|k| k.library)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
        })?;
        out_handle(lib, library)
    })
}

/// The name stays valid while the library is loaded.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, kernel: CUkernel) -> CUresult {
    entry(|| {
        if name.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = process::with(|p| {
            p.kernels
                .get(&(kernel as u64))
                .map(|k| k.name.as_ptr())
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
        })?;
        // SAFETY: `name` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(name, ptr) }?)
    })
}

/// The kernel's attributes on device `dev` (one set for all devices).
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: `attrib` is a local copy of the argument; read as a raw integer.
    let attrib = unsafe { ffi::read_enum(&attrib) };
    entry(|| {
        if pi.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = process::with(|p| {
            let device = p.device_of(dev)?;
            let config = &p.device(device)?.config;
            if !p.kernels.contains_key(&(kernel as u64)) {
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            let attrs = p
                .functions
                .get(&(kernel as u64))
                .map(|f| f.attrs)
                .unwrap_or_default();
            get_attribute(config, &attrs, attrib)
        })?;
        // SAFETY: `pi` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(pi, v) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attrib: CUfunction_attribute,
    val: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: `attrib` is a local copy of the argument; read as a raw integer.
    let attrib = unsafe { ffi::read_enum(&attrib) };
    entry(|| {
        process::with(|p| {
            let device = p.device_of(dev)?;
            let config = &p.device(device)?.config;
            if !p.kernels.contains_key(&(kernel as u64)) {
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            let f = p
                .functions
                .get_mut(&(kernel as u64))
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            set_attribute(config, &mut f.attrs, attrib, val)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelSetCacheConfig(
    kernel: CUkernel,
    config: CUfunc_cache,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: `config` is a local copy of the argument; read as a raw integer.
    let config = unsafe { ffi::read_enum(&config) };
    entry(|| {
        check_cache_config(config)?;
        process::with(|p| {
            p.device_of(dev)?;
            if !p.kernels.contains_key(&(kernel as u64)) {
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            if let Some(f) = p.functions.get_mut(&(kernel as u64)) {
                f.attrs.cache_config = config;
            }
            Ok(())
        })
    })
}
