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

use super::exports;
use crate::real::dlsym::{lookup, real_dlsym, REAL_DLSYM};

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
