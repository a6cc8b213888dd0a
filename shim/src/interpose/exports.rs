//! The functions the shim governs: exported symbol name → the shim's wrapper. `dlsym` and
//! `cuGetProcAddress` hand these out; everything else reaches the driver untouched.

use std::ffi::c_void;

use crate::hooks::{arrays, info, init, launch, memory, nvml, pools, vmm};
use crate::interpose::procaddr;
use crate::real::{Library, CUDA, NVML};

/// One governed function.
pub struct Export {
    /// The exported symbol (`cuMemAlloc_v2`).
    pub name: &'static str,
    /// The shim's wrapper.
    pub wrapper: *mut c_void,
    /// The driver library that has the real one.
    pub library: &'static Library,
}

// SAFETY: the table is immutable; the pointers are addresses of functions of this library.
unsafe impl Sync for Export {}

macro_rules! exports {
    ($( $library:ident $module:ident :: $name:ident ),* $(,)?) => {
        /// Sorted by name (checked by a test); [`find`] relies on it.
        pub static EXPORTS: &[Export] = &[
            $( Export { name: stringify!($name), wrapper: $module::$name as *mut c_void, library: &$library } ),*
        ];
    };
}

exports! {
    CUDA arrays::cuArray3DCreate_v2,
    CUDA arrays::cuArrayCreate_v2,
    CUDA arrays::cuArrayDestroy,
    CUDA info::cuDeviceTotalMem_v2,
    CUDA procaddr::cuGetProcAddress,
    CUDA procaddr::cuGetProcAddress_v2,
    CUDA init::cuInit,
    CUDA launch::cuLaunchKernel,
    CUDA launch::cuLaunchKernel_ptsz,
    CUDA memory::cuMemAllocAsync,
    CUDA memory::cuMemAllocAsync_ptsz,
    CUDA memory::cuMemAllocFromPoolAsync,
    CUDA memory::cuMemAllocFromPoolAsync_ptsz,
    CUDA memory::cuMemAllocManaged,
    CUDA memory::cuMemAllocPitch_v2,
    CUDA memory::cuMemAlloc_v2,
    CUDA vmm::cuMemCreate,
    CUDA memory::cuMemFreeAsync,
    CUDA memory::cuMemFreeAsync_ptsz,
    CUDA memory::cuMemFree_v2,
    CUDA info::cuMemGetInfo_v2,
    CUDA pools::cuMemPoolCreate,
    CUDA pools::cuMemPoolDestroy,
    CUDA vmm::cuMemRelease,
    CUDA arrays::cuMipmappedArrayCreate,
    CUDA arrays::cuMipmappedArrayDestroy,
    NVML nvml::nvmlDeviceGetMemoryInfo,
    NVML nvml::nvmlDeviceGetMemoryInfo_v2,
}

/// The governed function exported as `name`.
pub fn find(name: &[u8]) -> Option<&'static Export> {
    EXPORTS
        .binary_search_by(|e| e.name.as_bytes().cmp(name))
        .ok()
        .map(|i| &EXPORTS[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_abi::cuda_procs::by_symbol;

    #[test]
    fn sorted_and_found() {
        for pair in EXPORTS.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} must sort before {}",
                pair[0].name,
                pair[1].name
            );
        }
        for e in EXPORTS {
            assert_eq!(find(e.name.as_bytes()).map(|f| f.name), Some(e.name));
        }
        assert!(find(b"cuMemAlloc").is_none(), "the legacy 32-bit ABI is not governed");
        assert!(find(b"cuMemcpy").is_none());
    }

    #[test]
    fn every_cuda_export_is_a_driver_symbol() {
        for e in EXPORTS.iter().filter(|e| e.name.starts_with("cu")) {
            assert!(by_symbol(e.name).is_some(), "{} is not in cuda_procs", e.name);
        }
    }
}
