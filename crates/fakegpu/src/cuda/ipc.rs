//! CUDA IPC between processes of the same host: memory handles (`cuIpcGetMemHandle`,
//! `cuIpcOpenMemHandle_v2`, `cuIpcCloseMemHandle`) and event handles
//! (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`).
//!
//! A handle names its exporter (pid and start time, so a recycled pid does not pass for
//! it), the allocation's buffer id, size and device. While an exported allocation lives,
//! a marker file `ipc/mem-<pid>-<start>-<id>` in the state directory says so (the
//! exporter removes it when it frees the allocation); an exported event's file
//! `ipc/ev-<pid>-<start>-<handle>` holds its latest stamp, which both sides read and
//! write. Files rather than the per-device state file: IPC objects are few, short-lived and
//! named by their exporter, and the state file's fixed layout (shared with running
//! processes) need not change for them.
//!
//! The importer maps the exporter's memory at an address of its own, of the same size,
//! and is charged nothing: the device counts the memory once, as the real driver does.

use std::ffi::c_uint;
use std::path::PathBuf;

use cudarc::driver::sys::{
    CUdeviceptr, CUevent, CUevent_flags, CUipcEventHandle, CUipcMemHandle, CUresult,
};
use vgpu_abi::process::ProcessId;

use super::event::Event;
use super::launch::out_handle;
use super::mem::LARGE_PAGE;
use super::process::{self, Process};
use super::{entry, CuResult};
use crate::ffi;

/// An IPC mapping opened in this process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Import {
    /// The context it was opened in (destroying it closes the mapping).
    pub ctx: u64,
    /// The exporter's driver device index.
    pub device: usize,
    pub size: u64,
    pub exporter: ProcessId,
    /// The exporter's buffer id.
    pub id: u64,
    /// cuIpcOpenMemHandle calls not yet closed.
    pub refs: u32,
}

const MEM_MAGIC: [u8; 4] = *b"fIPM";
const EVENT_MAGIC: [u8; 4] = *b"fIPE";
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// What a memory handle carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MemHandle {
    exporter: ProcessId,
    id: u64,
    size: u64,
    device: u32,
}

fn put(bytes: &mut [u8; 64], at: usize, field: &[u8]) {
    bytes[at..at + field.len()].copy_from_slice(field);
}

fn get8(bytes: &[u8; 64], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

fn get4(bytes: &[u8; 64], at: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

impl MemHandle {
    fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        put(&mut b, 0, &MEM_MAGIC);
        put(&mut b, 4, &self.exporter.pid.to_le_bytes());
        put(&mut b, 8, &self.exporter.start_time.to_le_bytes());
        put(&mut b, 16, &self.id.to_le_bytes());
        put(&mut b, 24, &self.size.to_le_bytes());
        put(&mut b, 32, &self.device.to_le_bytes());
        b
    }

    fn decode(b: &[u8; 64]) -> Option<MemHandle> {
        (b[..4] == MEM_MAGIC).then(|| MemHandle {
            exporter: ProcessId {
                pid: get4(b, 4),
                start_time: get8(b, 8),
            },
            id: get8(b, 16),
            size: get8(b, 24),
            device: get4(b, 32),
        })
    }
}

fn ipc_dir() -> PathBuf {
    crate::state::state_dir().join("ipc")
}

fn mem_marker(exporter: ProcessId, id: u64) -> PathBuf {
    ipc_dir().join(format!("mem-{}-{}-{id}", exporter.pid, exporter.start_time))
}

fn event_file(exporter: ProcessId, event: u64) -> PathBuf {
    ipc_dir().join(format!(
        "ev-{}-{}-{event:x}",
        exporter.pid, exporter.start_time
    ))
}

/// Create `path` (and the directory, world-writable like the state directory) holding
/// `contents`, atomically (written aside, then renamed).
fn write_shared(path: &std::path::Path, contents: &[u8]) -> CuResult {
    use std::os::unix::fs::PermissionsExt;
    let fail = |_| CUresult::CUDA_ERROR_OPERATING_SYSTEM;
    let dir = ipc_dir();
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).map_err(fail)?;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("x");
    let aside = dir.join(format!(".{name}.{}", ffi::gettid()));
    std::fs::write(&aside, contents).map_err(fail)?;
    let _ = std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o666));
    std::fs::rename(&aside, path).map_err(fail)
}

/// The latest stamp of a shared event (0: never recorded, or unreadable).
pub(crate) fn read_shared_stamp(path: &std::path::Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let stamp = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    (stamp != 0).then_some(stamp)
}

/// Publish a shared event's new stamp.
pub(crate) fn write_shared_stamp(path: &std::path::Path, stamp: u64) {
    let _ = write_shared(path, &stamp.to_le_bytes());
}

impl Process {
    /// The allocation at `ptr` was freed: if exported, its handles no longer open.
    pub(crate) fn ipc_forget_export(&mut self, _ptr: u64, id: u64) {
        if let Some(marker) = self.exports.remove(&id) {
            let _ = std::fs::remove_file(marker);
        }
    }

    /// Close the IPC mappings opened in context `ctx` (it is being destroyed).
    pub(crate) fn close_imports_of(&mut self, ctx: u64) {
        let owned: Vec<u64> = self
            .imports
            .iter()
            .filter(|(_, i)| i.ctx == ctx)
            .map(|(&a, _)| a)
            .collect();
        for address in owned {
            self.imports.remove(&address);
            self.free_va(address);
        }
    }

    fn export(&mut self, dptr: u64) -> CuResult<MemHandle> {
        self.current_ctx()?;
        let me = self.me.ok_or(CUresult::CUDA_ERROR_OPERATING_SYSTEM)?;
        // Only whole cuMemAlloc allocations (not pool, managed or mapped memory).
        let alloc = match self.allocs.get(&dptr) {
            Some(a) if !a.managed && a.pool == 0 => *a,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        if let std::collections::hash_map::Entry::Vacant(e) = self.exports.entry(alloc.id) {
            let marker = mem_marker(me, alloc.id);
            write_shared(&marker, b"")?;
            e.insert(marker);
        }
        Ok(MemHandle {
            exporter: me,
            id: alloc.id,
            size: alloc.size,
            device: alloc.device as u32,
        })
    }

    fn import(&mut self, h: MemHandle) -> CuResult<u64> {
        let (ctx, _) = self.current_ctx()?;
        if h.exporter.pid == self.pid {
            // The exporting process cannot open its own handle.
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        if self.driver.device(h.device as usize).is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !h.exporter.is_alive() || !mem_marker(h.exporter, h.id).exists() {
            // The exporter died or freed the allocation.
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        if let Some((&address, import)) = self
            .imports
            .iter_mut()
            .find(|(_, i)| i.exporter == h.exporter && i.id == h.id && i.ctx == ctx)
        {
            import.refs += 1;
            return Ok(address);
        }
        let align = if h.size >= LARGE_PAGE {
            LARGE_PAGE
        } else {
            512
        };
        let address = self.alloc_va(h.size, align)?;
        self.imports.insert(
            address,
            Import {
                ctx,
                device: h.device as usize,
                size: h.size,
                exporter: h.exporter,
                id: h.id,
                refs: 1,
            },
        );
        Ok(address)
    }

    fn close_import(&mut self, address: u64) -> CuResult {
        self.current_ctx()?;
        let import = self
            .imports
            .get_mut(&address)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        import.refs -= 1;
        if import.refs == 0 {
            self.imports.remove(&address);
            self.free_va(address);
        }
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    entry(|| {
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let h = process::with(|p| p.export(dptr))?;
        // SAFETY: `handle` is non-NULL and points to a 64-byte CUipcMemHandle (driver API
        // contract); every byte pattern is a valid one.
        unsafe { ffi::write(handle.cast::<[u8; 64]>(), h.encode()) }?;
        Ok(())
    })
}

fn open_mem(dptr: *mut CUdeviceptr, handle: &CUipcMemHandle, flags: c_uint) -> CuResult {
    if dptr.is_null() || flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: CUipcMemHandle is 64 plain bytes (checked against cuda.h by tests/abi.rs).
    let bytes: [u8; 64] = unsafe { std::mem::transmute_copy(handle) };
    let h = MemHandle::decode(&bytes).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let address = process::with(|p| p.import(h))?;
    // SAFETY: `dptr` is non-NULL and writable (driver API contract).
    Ok(unsafe { ffi::write(dptr, address) }?)
}

/// The exporter's allocation, mapped here at an address of this process with the same
/// size; charged nothing (the exporter's allocation is the memory). Errors: the exporter's
/// own process → CUDA_ERROR_INVALID_CONTEXT; a freed allocation or a dead exporter →
/// CUDA_ERROR_INVALID_HANDLE; not a handle → CUDA_ERROR_INVALID_VALUE. Opening a handle
/// again in the same context returns the same address (closed as often as opened).
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    entry(|| open_mem(pdptr, &handle, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    entry(|| process::with(|p| p.close_import(dptr)))
}

const INTERPROCESS: u32 = CUevent_flags::CU_EVENT_INTERPROCESS as u32;
const DISABLE_TIMING: u32 = CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;

/// Only events created with `CU_EVENT_INTERPROCESS` (CUDA_ERROR_INVALID_VALUE otherwise).
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(
    handle: *mut CUipcEventHandle,
    event: CUevent,
) -> CUresult {
    entry(|| {
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (me, ev) = process::with(|p| {
            let ev = p
                .events
                .get(&(event as u64))
                .copied()
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            if ev.flags & INTERPROCESS == 0 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let me = p.me.ok_or(CUresult::CUDA_ERROR_OPERATING_SYSTEM)?;
            if let std::collections::hash_map::Entry::Vacant(e) =
                p.shared_events.entry(event as u64)
            {
                let path = event_file(me, event as u64);
                write_shared(&path, &ev.stamp_ns.unwrap_or(0).to_le_bytes())?;
                e.insert(path);
            }
            Ok((me, event as u64))
        })?;
        let mut b = [0u8; 64];
        put(&mut b, 0, &EVENT_MAGIC);
        put(&mut b, 4, &me.pid.to_le_bytes());
        put(&mut b, 8, &me.start_time.to_le_bytes());
        put(&mut b, 16, &ev.to_le_bytes());
        // SAFETY: `handle` is non-NULL and points to a 64-byte CUipcEventHandle (driver API
        // contract).
        unsafe { ffi::write(handle.cast::<[u8; 64]>(), b) }?;
        Ok(())
    })
}

/// An event of this process's current context that shares the exporter's stamps: a record
/// on either side is seen by queries, synchronizes and stream waits on both.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(
    ph_event: *mut CUevent,
    handle: CUipcEventHandle,
) -> CUresult {
    entry(|| {
        if ph_event.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: CUipcEventHandle is 64 plain bytes (checked against cuda.h by tests/abi.rs).
        let b: [u8; 64] = unsafe { std::mem::transmute_copy(&handle) };
        if b[..4] != EVENT_MAGIC {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let exporter = ProcessId {
            pid: get4(&b, 4),
            start_time: get8(&b, 8),
        };
        let path = event_file(exporter, get8(&b, 16));
        let handle = process::with(|p| {
            let (ctx, _) = p.current_ctx()?;
            if exporter.pid == p.pid {
                return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
            }
            if !exporter.is_alive() || !path.exists() {
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            let handle = p.new_handle();
            p.events.insert(
                handle,
                Event {
                    ctx,
                    flags: INTERPROCESS | DISABLE_TIMING,
                    stamp_ns: read_shared_stamp(&path),
                },
            );
            p.shared_events.insert(handle, path);
            Ok(handle)
        })?;
        out_handle(ph_event, handle)
    })
}
