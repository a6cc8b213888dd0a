//! `dlsym` interposition.
//!
//! Programs and the CUDA runtime `dlopen("libcuda.so.1")` and look functions up through that
//! handle, which `LD_PRELOAD` alone does not catch. The shim's `dlsym` hands out its own
//! wrapper for every governed function and forwards everything else to glibc's `dlsym`.
//!
//! Forwarding must keep the caller. glibc resolves `RTLD_NEXT` (and the namespace of
//! `RTLD_DEFAULT`) from the *return address* of the `dlsym` call. A wrapper that calls the
//! real `dlsym` from Rust makes that address point into `libvgpu.so`, so `RTLD_NEXT` then
//! means "after libvgpu.so" instead of "after the caller": LLVM OpenMP's
//! `dlsym(RTLD_NEXT, "ompt_start_tool")` finds itself again and loops (HAMi-core broke
//! `import torch` that way). So on x86-64 and AArch64 the exported `dlsym` is a few
//! instructions of assembly: it asks [`dlsym_override`] whether the name is governed and,
//! if not, *jumps* (no call, so the caller's return address stays on the stack / in the
//! link register) to the real `dlsym`. glibc then sees exactly the original call.
//!
//! The real `dlsym` is found with `dlvsym(RTLD_NEXT, "dlsym", <version>)`, trying the
//! version glibc 2.34+ defines and then the architecture's original one.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use super::exports;
use crate::log::vgpu_log_once;

/// glibc's `dlsym`; read by the assembly trampoline, so a plain pointer-sized static.
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

#[cfg(target_arch = "x86_64")]
const ORIGINAL_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const ORIGINAL_VERSION: &CStr = c"GLIBC_2.17";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ORIGINAL_VERSION: &CStr = c"GLIBC_2.0";

/// glibc's `dlsym`, resolved on first use.
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

/// Called by the trampoline: the shim's wrapper if `name` is a governed function that
/// `handle` really provides, else NULL ("forward to glibc unchanged"). Never panics out.
extern "C" fn dlsym_override(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    if real_dlsym().is_none() || name.is_null() {
        return std::ptr::null_mut();
    }
    // Cheap filter first: every dlsym of the process comes through here.
    // SAFETY: `name` is a non-NULL C string (dlsym's contract); reading its first byte is
    // in bounds (at least the terminator).
    let first = unsafe { *name } as u8;
    if first != b'c' && first != b'n' {
        return std::ptr::null_mut();
    }
    crate::guard::guard(
        "dlsym",
        |_| {
            // SAFETY: as above, a C string.
            let name = unsafe { CStr::from_ptr(name) };
            let Some(export) = exports::find(name.to_bytes()) else {
                return std::ptr::null_mut();
            };
            // Does the scope the caller asked for have the function? For the pseudo-handles
            // ask the driver library itself (this frame is not the caller's).
            let scope = if handle == libc::RTLD_NEXT || handle == libc::RTLD_DEFAULT {
                export.library.handle_if_loaded()
            } else {
                handle
            };
            if !scope.is_null() && lookup(scope, name).is_null() {
                return std::ptr::null_mut();
            }
            export.wrapper
        },
        std::ptr::null_mut,
    )
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: rsp ≡ 8 (mod 16). Two pushes and 8 bytes keep the call aligned.
    core::arch::naked_asm!(
        "endbr64",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {over}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        // Tail jump: the real dlsym returns straight to our caller and sees its address.
        "jmp rax",
        "2:",
        "ret",
        over = sym dlsym_override,
        real = sym REAL_DLSYM,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "hint #34", // bti c
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {over}",
        "mov x9, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbnz x9, 2f",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        // Tail branch with the caller's link register restored.
        "br x16",
        "2:",
        "mov x0, x9",
        "ret",
        "3:",
        "mov x0, xzr",
        "ret",
        over = sym dlsym_override,
        real = sym REAL_DLSYM,
    )
}

/// Other architectures: a plain wrapper. `RTLD_NEXT` lookups then resolve relative to
/// libvgpu.so, not to the caller (documented limitation).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let wrapper = dlsym_override(handle, symbol);
    if !wrapper.is_null() {
        return wrapper;
    }
    match real_dlsym() {
        // SAFETY: forwarding the caller's arguments unchanged.
        Some(f) => unsafe { f(handle, symbol) },
        None => std::ptr::null_mut(),
    }
}
