//! The CUDA driver API half (`libcuda.so.1`).
//!
//! Every exported function is a thin `extern "C"` shell around [`entry`], which turns a
//! `CuResult` into a `CUresult` and a panic into `CUDA_ERROR_UNKNOWN`. The work happens on
//! this process's [`process::Process`], behind one mutex; the calling thread's context stack
//! is thread-local, as in the real driver.

pub(crate) mod array;
pub(crate) mod checkpoint;
pub(crate) mod copy;
pub(crate) mod ctx;
pub(crate) mod error_names;
pub(crate) mod event;
pub(crate) mod graph;
pub(crate) mod init;
pub(crate) mod ipc;
pub(crate) mod launch;
pub(crate) mod library;
pub(crate) mod mem;
pub(crate) mod mempool;
pub(crate) mod occupancy;
pub(crate) mod pointer;
pub(crate) mod procaddr;
pub(crate) mod process;
pub(crate) mod queries;
pub(crate) mod stream;
pub(crate) mod unsupported;
pub(crate) mod visible;
pub(crate) mod vmm;

use cudarc::driver::sys::CUresult;

use crate::ffi::{self, CopyError, Null};

pub(crate) type CuResult<T = ()> = Result<T, CUresult>;

/// The body of every exported CUDA function. It passes the checkpoint gate first: while
/// a controller has this process locked or checkpointed, the call blocks.
pub(crate) fn entry(body: impl FnOnce() -> CuResult) -> CUresult {
    ffi::guard(CUresult::CUDA_ERROR_UNKNOWN, || {
        let _gate = process::gate();
        match body() {
            Ok(()) => CUresult::CUDA_SUCCESS,
            Err(e) => e,
        }
    })
}

/// The body of the checkpoint API's functions: not gated (a controller acts on other
/// processes; its own state does not stop it).
pub(crate) fn entry_ungated(body: impl FnOnce() -> CuResult) -> CUresult {
    ffi::guard(CUresult::CUDA_ERROR_UNKNOWN, || match body() {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(e) => e,
    })
}

impl From<Null> for CUresult {
    fn from(_: Null) -> CUresult {
        CUresult::CUDA_ERROR_INVALID_VALUE
    }
}

impl From<CopyError> for CUresult {
    fn from(_: CopyError) -> CUresult {
        CUresult::CUDA_ERROR_INVALID_VALUE
    }
}

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` (cuda.h: `((CUstream)0x1)`, `((CUstream)0x2)`;
/// macros with a cast, so bindgen does not carry them).
pub(crate) const CU_STREAM_LEGACY: usize = 0x1;
pub(crate) const CU_STREAM_PER_THREAD: usize = 0x2;
