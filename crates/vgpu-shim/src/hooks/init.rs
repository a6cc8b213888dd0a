//! `cuInit`: where the shim joins its vGPU (reads `VGPU_DIR` once, maps the usage file,
//! matches the visible devices by UUID). Nothing happens before the program calls it.

use std::ffi::c_uint;

use crate::config;
use crate::ffi::*;
use crate::governor::devices;
use crate::guard::Call;
use crate::real::sig;
use crate::state::Mode;

pub unsafe fn init(call: &Call<CuResult>, real: sig::cuInit, flags: c_uint) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(flags) });
    if rc == CUDA_SUCCESS {
        if let Mode::Enforce(vgpu) = config::mode() {
            devices::map(vgpu);
        }
    }
    rc
}
