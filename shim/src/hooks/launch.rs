//! Kernel launches. Without a compute limit a launch is forwarded at once: the wrapper is a
//! load of the resolved pointer and an indirect call (nothing here can panic, so no guard).
//! The compute governor hooks in here.

use std::ffi::{c_uint, c_void};

use crate::ffi::*;
use crate::hooks::driver;

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    driver!(cuLaunchKernel(
        f,
        grid_x,
        grid_y,
        grid_z,
        block_x,
        block_y,
        block_z,
        shared_bytes,
        stream,
        params,
        extra
    ))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    driver!(cuLaunchKernel_ptsz(
        f,
        grid_x,
        grid_y,
        grid_z,
        block_x,
        block_y,
        block_z,
        shared_bytes,
        stream,
        params,
        extra
    ))
}
