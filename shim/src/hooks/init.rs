//! `cuInit`: where the shim joins its vGPU (reads `VGPU_DIR` once, maps the usage file,
//! matches the visible devices by UUID). Nothing happens before the program calls it.

use std::ffi::c_uint;

use crate::config::{self, Mode};
use crate::ffi::*;
use crate::governor::devices;
use crate::guard::guard;
use crate::hooks::driver;

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CuResult {
    guard(
        "cuInit",
        || {
            let rc = driver!(cuInit(flags));
            if rc == CUDA_SUCCESS {
                if let Mode::Enforce(vgpu) = config::mode() {
                    devices::map(vgpu);
                }
            }
            rc
        },
        || driver!(cuInit(flags)),
    )
}
