//! The CUDA checkpoint API (driver 570 and later, CUDA 12.8): a root process locks another
//! process's CUDA work (`cuCheckpointProcessLock`), moves its device memory to host memory
//! and releases the GPU (`…Checkpoint`), maps it back at the same addresses (`…Restore`) and
//! lets it run again (`…Unlock`). vgpu uses it to suspend workloads without holding their
//! device memory (issue 12).
//!
//! The functions are resolved the way cudart resolves driver functions: `dlopen` of
//! `libcuda.so.1`, then `cuGetProcAddress_v2(name, 12080)` after `cuInit(0)`. A driver that
//! does not know them (older than 570) answers "not found", which [`Checkpointer::open`]
//! reports as `Ok(None)`. Nothing of NVIDIA's is linked: the binary still runs without it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::Path;
use std::time::Duration;

use cudarc::driver::sys::{CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs, CUcheckpointUnlockArgs};
use thiserror::Error;

/// The CUDA version whose ABI the functions are asked for.
const CUDA_VERSION: c_int = 12080;
const CUDA_SUCCESS: u32 = 0;
/// `CUDA_ERROR_NOT_FOUND`: what `cuGetProcAddress` says of a function the driver lacks.
const CUDA_ERROR_NOT_FOUND: u32 = 500;

/// `CUprocessState`, read as a raw integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    /// A value this vgpu does not know (a later driver).
    Other(u32),
}

impl ProcessState {
    fn from_raw(raw: u32) -> ProcessState {
        match raw {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            3 => ProcessState::Failed,
            other => ProcessState::Other(other),
        }
    }
}

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("cannot load the CUDA driver ({library}): {message}")]
    Load { library: String, message: String },
    #[error("{call} failed: {name} ({code})")]
    Driver { call: String, code: u32, name: String },
}

impl CheckpointError {
    /// The driver's code, when the driver refused.
    pub fn code(&self) -> Option<u32> {
        match self {
            CheckpointError::Driver { code, .. } => Some(*code),
            CheckpointError::Load { .. } => None,
        }
    }
}

type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> u32;
type Init = unsafe extern "C" fn(c_uint) -> u32;
type GetErrorName = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;
type GetState = unsafe extern "C" fn(c_int, *mut c_uint) -> u32;
type Lock = unsafe extern "C" fn(c_int, *mut CUcheckpointLockArgs) -> u32;
type Checkpoint = unsafe extern "C" fn(c_int, *mut CUcheckpointCheckpointArgs) -> u32;
type Restore = unsafe extern "C" fn(c_int, *mut CUcheckpointRestoreArgs) -> u32;
type Unlock = unsafe extern "C" fn(c_int, *mut CUcheckpointUnlockArgs) -> u32;
type GetRestoreThreadId = unsafe extern "C" fn(c_int, *mut c_int) -> u32;

/// The checkpoint functions of a loaded driver.
pub struct Checkpointer {
    _lib: libloading::Library,
    error_name: Option<GetErrorName>,
    get_state: GetState,
    lock: Lock,
    checkpoint: Checkpoint,
    restore: Restore,
    unlock: Unlock,
    restore_thread: Option<GetRestoreThreadId>,
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checkpointer")
    }
}

impl Checkpointer {
    /// Load the driver (`library`, default `libcuda.so.1` through the dynamic linker) and
    /// find the checkpoint functions. `Ok(None)`: the driver has no checkpoint API.
    pub fn open(library: Option<&Path>) -> Result<Option<Checkpointer>, CheckpointError> {
        let name = library.map(|p| p.display().to_string()).unwrap_or_else(|| crate::CUDA_SONAME.to_string());
        let load_error = |message: String| CheckpointError::Load { library: name.clone(), message };
        let path = library.map(|p| p.as_os_str().to_owned()).unwrap_or_else(|| crate::CUDA_SONAME.into());
        // SAFETY: loading NVIDIA's driver library (or the simulated one), whose initialisers
        // are meant to run in any process.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| load_error(e.to_string()))?;
        // SAFETY: cuGetProcAddress_v2 has this signature in cuda.h.
        let get_proc: GetProcAddress = *unsafe { lib.get::<GetProcAddress>(b"cuGetProcAddress_v2\0") }
            .map_err(|e| load_error(format!("no cuGetProcAddress_v2 (a driver older than CUDA 12): {e}")))?;
        let find = |symbol: &CStr| -> Result<Option<*mut c_void>, CheckpointError> {
            let (mut pfn, mut status): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
            // SAFETY: a NUL-terminated name and writable out-pointers.
            let code = unsafe { get_proc(symbol.as_ptr(), &mut pfn, CUDA_VERSION, 0, &mut status) };
            match code {
                CUDA_SUCCESS if !pfn.is_null() => Ok(Some(pfn)),
                CUDA_SUCCESS | CUDA_ERROR_NOT_FOUND => Ok(None),
                code => Err(CheckpointError::Driver { call: format!("cuGetProcAddress({})", symbol.to_string_lossy()), code, name: String::new() }),
            }
        };
        let Some(init) = find(c"cuInit")? else { return Err(load_error("no cuInit".into())) };
        // SAFETY: cuInit(unsigned int) as in cuda.h; `init` came from the driver for that name.
        let code = unsafe { std::mem::transmute::<*mut c_void, Init>(init)(0) };
        if code != CUDA_SUCCESS {
            return Err(CheckpointError::Driver { call: "cuInit".into(), code, name: String::new() });
        }
        // SAFETY (each transmute below): the pointer is what the driver returned for exactly
        // that function name at CUDA 12.8, whose signature cuda.h gives as the type.
        let error_name = find(c"cuGetErrorName")?.map(|p| unsafe { std::mem::transmute::<*mut c_void, GetErrorName>(p) });
        let names = [c"cuCheckpointProcessGetState", c"cuCheckpointProcessLock", c"cuCheckpointProcessCheckpoint", c"cuCheckpointProcessRestore", c"cuCheckpointProcessUnlock"];
        let mut found = Vec::with_capacity(names.len());
        for n in names {
            match find(n)? {
                Some(p) => found.push(p),
                None => return Ok(None),
            }
        }
        // SAFETY: see above.
        let restore_thread = find(c"cuCheckpointProcessGetRestoreThreadId")?.map(|p| unsafe { std::mem::transmute::<*mut c_void, GetRestoreThreadId>(p) });
        // SAFETY: see above.
        let checkpointer = unsafe {
            Checkpointer {
                error_name,
                get_state: std::mem::transmute::<*mut c_void, GetState>(found[0]),
                lock: std::mem::transmute::<*mut c_void, Lock>(found[1]),
                checkpoint: std::mem::transmute::<*mut c_void, Checkpoint>(found[2]),
                restore: std::mem::transmute::<*mut c_void, Restore>(found[3]),
                unlock: std::mem::transmute::<*mut c_void, Unlock>(found[4]),
                restore_thread,
                _lib: lib,
            }
        };
        Ok(Some(checkpointer))
    }

    fn check(&self, call: &str, pid: u32, code: u32) -> Result<(), CheckpointError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        let name = self
            .error_name
            .and_then(|f| {
                let mut out: *const c_char = std::ptr::null();
                // SAFETY: a writable out-pointer; the driver hands back a static string.
                let ok = unsafe { f(code, &mut out) } == CUDA_SUCCESS && !out.is_null();
                // SAFETY: non-NULL, NUL-terminated, static (cuda.h).
                ok.then(|| unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "an unknown error".into());
        Err(CheckpointError::Driver { call: format!("{call}(pid {pid})"), code, name })
    }

    fn pid(pid: u32) -> c_int {
        c_int::try_from(pid).unwrap_or(c_int::MAX)
    }

    pub fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
        let mut raw: c_uint = 0;
        // SAFETY: a writable out-pointer.
        let code = unsafe { (self.get_state)(Self::pid(pid), &mut raw) };
        self.check("cuCheckpointProcessGetState", pid, code)?;
        Ok(ProcessState::from_raw(raw))
    }

    /// The thread of the process through which the driver does the checkpoint API's work
    /// (it must be able to run while the process is locked, checkpointed or restored);
    /// `Ok(None)` when the driver does not say.
    pub fn restore_thread_id(&self, pid: u32) -> Result<Option<u32>, CheckpointError> {
        let Some(get) = self.restore_thread else { return Ok(None) };
        let mut tid: c_int = 0;
        // SAFETY: a writable out-pointer.
        let code = unsafe { get(Self::pid(pid), &mut tid) };
        self.check("cuCheckpointProcessGetRestoreThreadId", pid, code)?;
        Ok(u32::try_from(tid).ok().filter(|&t| t > 0))
    }

    /// Block the process's CUDA calls once its work in flight has finished; gives up after
    /// `timeout` (`CUDA_ERROR_NOT_READY`; the process keeps running). Zero: no limit.
    pub fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CheckpointError> {
        // SAFETY: the all-zero pattern is the documented default of these argument structs.
        let mut args: CUcheckpointLockArgs = unsafe { std::mem::zeroed() };
        args.timeoutMs = c_uint::try_from(timeout.as_millis()).unwrap_or(c_uint::MAX);
        // SAFETY: valid arguments, reserved fields zero.
        let code = unsafe { (self.lock)(Self::pid(pid), &mut args) };
        self.check("cuCheckpointProcessLock", pid, code)
    }

    /// Copy a locked process's device memory to host memory and release the GPU.
    pub fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError> {
        // SAFETY: zeroed arguments are the defaults; reserved fields must be zero.
        let mut args: CUcheckpointCheckpointArgs = unsafe { std::mem::zeroed() };
        // SAFETY: valid arguments.
        let code = unsafe { (self.checkpoint)(Self::pid(pid), &mut args) };
        self.check("cuCheckpointProcessCheckpoint", pid, code)
    }

    /// Map a checkpointed process's memory back (it stays locked).
    pub fn restore(&self, pid: u32) -> Result<(), CheckpointError> {
        // SAFETY: zeroed arguments are the defaults; reserved fields must be zero.
        let mut args: CUcheckpointRestoreArgs = unsafe { std::mem::zeroed() };
        // SAFETY: valid arguments.
        let code = unsafe { (self.restore)(Self::pid(pid), &mut args) };
        self.check("cuCheckpointProcessRestore", pid, code)
    }

    /// Let a locked process's CUDA calls proceed.
    pub fn unlock(&self, pid: u32) -> Result<(), CheckpointError> {
        // SAFETY: zeroed arguments are the defaults; reserved fields must be zero.
        let mut args: CUcheckpointUnlockArgs = unsafe { std::mem::zeroed() };
        // SAFETY: valid arguments.
        let code = unsafe { (self.unlock)(Self::pid(pid), &mut args) };
        self.check("cuCheckpointProcessUnlock", pid, code)
    }

    /// Lock then checkpoint; a process that locked but could not be checkpointed is
    /// unlocked again, so a failure leaves it running as it was.
    pub fn suspend(&self, pid: u32, lock_timeout: Duration) -> Result<(), CheckpointError> {
        self.lock(pid, lock_timeout)?;
        if let Err(e) = self.checkpoint(pid) {
            let _ = self.unlock(pid);
            return Err(e);
        }
        Ok(())
    }

    /// Restore then unlock. A restore that fails (its memory no longer fits) leaves the
    /// process checkpointed, to be tried again.
    pub fn resume(&self, pid: u32) -> Result<(), CheckpointError> {
        self.restore(pid)?;
        self.unlock(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_read_as_raw_integers() {
        assert_eq!(ProcessState::from_raw(0), ProcessState::Running);
        assert_eq!(ProcessState::from_raw(2), ProcessState::Checkpointed);
        assert_eq!(ProcessState::from_raw(77), ProcessState::Other(77));
    }

    #[test]
    fn a_missing_library_is_one_line() {
        let err = Checkpointer::open(Some(Path::new("/nonexistent/libcuda.so.1"))).unwrap_err().to_string();
        assert!(err.starts_with("cannot load the CUDA driver (/nonexistent/libcuda.so.1)") && !err.contains('\n'), "{err}");
    }
}
