//! `cuGetProcAddress` (CUDA 11.3 signature) and `cuGetProcAddress_v2` (CUDA 12): how cudart
//! and modern programs reach every driver function.
//!
//! The real driver answers first (so the return code, `*pfn` and `symbolStatus` are exactly
//! its own: versions, flags and misses behave as without the shim). If it found a function,
//! the table generated from NVIDIA's headers (`vgpu_abi::cuda_procs`) says which exported
//! symbol that base name, version and per-thread flag stand for; if the shim governs that
//! symbol *and* the driver's pointer is that symbol's, the shim's wrapper replaces it —
//! including for `cuGetProcAddress` itself, so lookups through the returned pointer stay
//! governed. A pointer the table does not explain (a driver newer than the headers, with a
//! new ABI) is named with `dladdr`: governed under that name, or left alone with one line
//! on stderr.

use std::ffi::{c_char, c_int, c_void, CStr};

use vgpu_abi::cuda_procs::{resolve, Resolution};

use super::exports;
use crate::ffi::*;
use crate::guard::Call;
use crate::log::vgpu_log_once;
use crate::real::{self, sig};

/// Replace the driver's answer `*pfn` by the shim's wrapper where the shim governs it.
///
/// # Safety
/// `symbol` is NULL or a C string; `pfn` is NULL or valid (the driver just succeeded).
unsafe fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: by the contract.
    let (name, found) = unsafe { (CStr::from_ptr(symbol), pfn.read()) };
    if found.is_null() {
        return;
    }
    let Ok(name) = name.to_str() else { return };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let Resolution::Found(entry) = resolve(name, cuda_version, per_thread) else {
        return;
    };
    let Some(export) = exports::find(entry.symbol.as_bytes()) else {
        return;
    };
    let replacement = if real_address(entry.symbol) == found {
        Some(export.wrapper)
    } else {
        governed_by_address(found)
    };
    match replacement {
        // SAFETY: `pfn` is valid (contract).
        Some(wrapper) => unsafe { pfn.write(wrapper) },
        None => vgpu_log_once!(
            "cuGetProcAddress(\"{name}\", {cuda_version}) returned an entry point this shim does not know (a driver newer than its headers?); calls through it are not governed"
        ),
    }
}

/// The driver's exported `symbol` (NULL if absent).
fn real_address(symbol: &str) -> *mut c_void {
    let mut buf = [0u8; 96];
    if symbol.len() >= buf.len() {
        return std::ptr::null_mut();
    }
    buf[..symbol.len()].copy_from_slice(symbol.as_bytes());
    match CStr::from_bytes_until_nul(&buf) {
        Ok(c) => real::CUDA.symbol(c),
        Err(_) => std::ptr::null_mut(),
    }
}

/// The wrapper of the governed function that starts exactly at `address`, by its name.
fn governed_by_address(address: *mut c_void) -> Option<*mut c_void> {
    // SAFETY: Dl_info is plain C data; dladdr fills it or returns 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about; `info` is writable.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_sname.is_null() || info.dli_saddr != address {
        return None;
    }
    // SAFETY: dladdr returned a symbol name, a C string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_sname) };
    exports::find(name.to_bytes()).map(|e| e.wrapper)
}

pub unsafe fn get_proc_address_v2(
    call: &Call<CuResult>,
    real: sig::cuGetProcAddress_v2,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut c_int,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(symbol, pfn, cuda_version, flags, status) });
    if rc == CUDA_SUCCESS {
        // SAFETY: the driver succeeded with these pointers.
        unsafe { substitute(symbol, pfn, cuda_version, flags) };
    }
    rc
}

pub unsafe fn get_proc_address(
    call: &Call<CuResult>,
    real: sig::cuGetProcAddress,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(symbol, pfn, cuda_version, flags) });
    if rc == CUDA_SUCCESS {
        // SAFETY: the driver succeeded with these pointers.
        unsafe { substitute(symbol, pfn, cuda_version, flags) };
    }
    rc
}
