//! Crossing the C boundary: no panic escapes, and every pointer from the caller is checked
//! for NULL before it is read or written.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Run the body of an exported function; a panic becomes `on_panic` instead of unwinding
/// into C (which would abort the caller).
pub(crate) fn guard<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

/// A NULL pointer where the API requires one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Null;

/// Store `value` through an out-parameter.
///
/// # Safety
/// `ptr` is NULL or valid for a write of `T` (the C API's contract with its caller).
pub(crate) unsafe fn write<T>(ptr: *mut T, value: T) -> Result<(), Null> {
    if ptr.is_null() {
        return Err(Null);
    }
    // SAFETY: non-NULL, and valid for writes by this function's contract. Unaligned writes
    // are allowed for: C callers may pack out-parameters oddly (ctypes buffers).
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Load an in-parameter.
///
/// # Safety
/// `ptr` is NULL or valid for a read of `T`, and the bytes there are a valid `T` (only
/// used with plain integer/struct types whose every bit pattern is valid).
pub(crate) unsafe fn read<T: Copy>(ptr: *const T) -> Result<T, Null> {
    if ptr.is_null() {
        return Err(Null);
    }
    // SAFETY: non-NULL and readable by this function's contract.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Read a `u32` at `field`, a pointer to a C enum field inside a caller's struct. C enums
/// may hold any value; reading them through the Rust enum type would be undefined behaviour
/// for values the binding does not know, so they are read as raw integers.
///
/// # Safety
/// `field` points to 4 readable bytes (it was derived from a valid struct pointer).
pub(crate) unsafe fn read_enum<E>(field: *const E) -> u32 {
    debug_assert_eq!(std::mem::size_of::<E>(), 4);
    // SAFETY: C enums are 4 bytes on this ABI (checked against cuda.h by tests/abi.rs) and
    // `field` is readable by this function's contract.
    unsafe { field.cast::<u32>().read_unaligned() }
}

/// A caller's NUL-terminated string as UTF-8 (`None` for NULL or non-UTF-8).
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn c_str<'a>(ptr: *const c_char) -> Option<&'a str> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated by this function's contract.
    unsafe { CStr::from_ptr(ptr) }.to_str().ok()
}

/// Why a string could not be copied into a caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyError {
    Null,
    TooSmall,
}

/// Copy `text` and its NUL into `buf[..len]`. With `truncate`, a short buffer gets as much
/// as fits (CUDA's behaviour); without, it is an error (NVML's).
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes.
pub(crate) unsafe fn copy_c_string(
    buf: *mut c_char,
    len: usize,
    text: &str,
    truncate: bool,
) -> Result<(), CopyError> {
    if buf.is_null() {
        return Err(CopyError::Null);
    }
    let bytes = text.as_bytes();
    if len == 0 || (bytes.len() + 1 > len && !truncate) {
        return Err(CopyError::TooSmall);
    }
    let n = bytes.len().min(len - 1);
    // SAFETY: `buf` is valid for `len` bytes by this function's contract, n + 1 <= len, and a
    // caller's buffer cannot overlap our string.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// Nanoseconds since the Unix epoch. CLOCK_REALTIME is shared by every process, which the
/// cross-process state needs; a clock before 1970 reads as 0.
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
        .unwrap_or(0)
}

/// This process's pid.
pub(crate) fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The calling thread's id.
pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_truncates() {
        let mut buf = [0x55 as c_char; 6];
        // SAFETY: buf is 6 writable bytes.
        unsafe {
            assert_eq!(
                copy_c_string(buf.as_mut_ptr(), 6, "hello world", false),
                Err(CopyError::TooSmall)
            );
            copy_c_string(buf.as_mut_ptr(), 6, "hello world", true).unwrap();
        }
        assert_eq!(buf.map(|c| c as u8), *b"hello\0");
        // SAFETY: NULL is allowed by the contract.
        unsafe {
            assert_eq!(
                copy_c_string(std::ptr::null_mut(), 6, "x", true),
                Err(CopyError::Null)
            );
        }
    }

    #[test]
    fn guard_catches_panics() {
        assert_eq!(guard(7, || panic!("boom")), 7);
        assert_eq!(guard(7, || 1), 1);
    }
}
