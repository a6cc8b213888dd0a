//! This process's CUDA state: contexts, allocations and other handles, the device address
//! space, and the slot it holds in each device's shared state file.
//!
//! One mutex guards it all; no call holds it while sleeping. A `fork`ed child sees its
//! parent's state as foreign (the pid differs) and must call `cuInit` again.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Mutex, Once, PoisonError, TryLockError};

use cudarc::driver::sys::CUresult;
use vgpu_abi::process::ProcessId;

use super::event::Event;
use super::graph::{Exec, Graph};
use super::ipc::Import;
use super::launch::{kernel_table, Function};
use super::library::{LibKernel, Library};
use super::mempool::Pool;
use super::stream::{StreamKey, StreamState};
use super::{visible, CuResult};
use crate::config::MAX_DEVICES;
use crate::driver::{self, Driver};
use crate::ffi::{self, getpid};

/// A context created by cuCtxCreate or a retained primary context.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub ordinal: usize,
    pub device: usize,
    pub primary: bool,
    pub flags: u32,
    /// Device memory charged for the context itself (`context_overhead`).
    pub overhead: u64,
    /// cuCtxSetLimit values, by `CUlimit`.
    pub limits: super::queries::Limits,
    /// cuCtxSetCacheConfig (`CUfunc_cache`).
    pub cache_config: u32,
    /// cuCtxGetId: unique over the process's lifetime.
    pub id: u64,
}

/// A device's primary context: created on the first retain, destroyed on the last release.
#[derive(Debug, Clone, Default)]
pub(crate) struct Primary {
    pub ctx: u64,
    pub refs: u32,
    pub flags: u32,
}

/// Device memory charged to the device, owned by a context (destroying the context frees it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Alloc {
    pub device: usize,
    pub size: u64,
    pub ctx: u64,
    /// cuMemAllocManaged.
    pub managed: bool,
    /// The memory pool it came from (0: none, a plain cuMemAlloc).
    pub pool: u64,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique over the process's lifetime.
    pub id: u64,
}

/// A cuMemCreate handle. Its memory is given back when it is released and unmapped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Physical {
    /// The device charged, or `None` for host-located memory.
    pub device: Option<usize>,
    pub size: u64,
    pub ctx: u64,
    pub released: bool,
    pub maps: u32,
}

/// A cuMemMap of (part of) a physical allocation into a reserved range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mapping {
    pub size: u64,
    pub handle: u64,
}

pub(crate) struct Process {
    pub pid: u32,
    pub me: Option<ProcessId>,
    pub driver: &'static Driver,
    /// CUDA ordinal → driver device index (after CUDA_VISIBLE_DEVICES).
    pub visible: Vec<usize>,
    pub contexts: HashMap<u64, Context>,
    /// Per ordinal.
    pub primary: Vec<Primary>,
    /// Driver device index → slot in its state file.
    slots: HashMap<usize, usize>,
    /// Device pointers of cuMemAlloc* / cuMemAllocManaged / async and pool allocations.
    pub allocs: BTreeMap<u64, Alloc>,
    /// Pinned host allocations (not device memory): address → (size, context).
    pub host: BTreeMap<usize, (usize, u64)>,
    /// CUarray handles.
    pub arrays: HashMap<u64, Alloc>,
    /// CUmipmappedArray handles.
    pub mipmaps: HashMap<u64, Alloc>,
    pub physical: HashMap<u64, Physical>,
    /// cuMemAddressReserve ranges: start → size.
    pub reservations: BTreeMap<u64, u64>,
    /// cuMemMap mappings: address → mapping.
    pub mappings: BTreeMap<u64, Mapping>,
    /// Memory pools (created and default ones).
    pub pools: HashMap<u64, Pool>,
    /// Per ordinal: the current pool of cuMemAllocAsync (0: the default pool).
    pub current_pool: Vec<u64>,
    /// Per ordinal: the default pool, once asked for (0: not yet).
    pub default_pool: Vec<u64>,
    /// IPC mappings opened here (cuIpcOpenMemHandle): address → the exporter's allocation.
    pub imports: BTreeMap<u64, Import>,
    /// Per stream handle: its flags and priority.
    pub stream_info: HashMap<u64, (u32, i32)>,
    /// Libraries (cuLibraryLoad*).
    pub libraries: HashMap<u64, Library>,
    /// Kernels (cuLibraryGetKernel): handle → its library and name.
    pub kernels: HashMap<u64, LibKernel>,
    /// Per driver device index: when the copies this process queued there end.
    pub copies_until: HashMap<usize, u64>,
    /// Events shared with other processes (exported or opened): event → its shared stamp.
    pub shared_events: HashMap<u64, std::path::PathBuf>,
    /// Allocations exported with cuIpcGetMemHandle: buffer id → its marker file.
    pub exports: HashMap<u64, std::path::PathBuf>,
    /// Last buffer id handed out.
    pub next_buffer_id: u64,
    /// Stream → context.
    pub streams: HashMap<u64, u64>,
    /// Module → context.
    pub modules: HashMap<u64, u64>,
    pub functions: HashMap<u64, Function>,
    pub graphs: HashMap<u64, Graph>,
    pub graph_execs: HashMap<u64, Exec>,
    pub events: HashMap<u64, Event>,
    /// Every stream's queue and capture state.
    pub timelines: HashMap<StreamKey, StreamState>,
    pub next_capture_id: u64,
    next_handle: u64,
    /// Device address ranges in use: start → length.
    va: BTreeMap<u64, u64>,
    next_va: u64,
}

/// Device virtual addresses handed out: a window where no host mapping lives in practice
/// (addresses are never dereferenced by the fake; clients must not either).
pub(crate) const VA_START: u64 = 0x7000_0000_0000;
pub(crate) const VA_END: u64 = 0x7f00_0000_0000;
/// Handles are distinct, pointer-looking values that are never dereferenced.
const HANDLE_BASE: u64 = 0x5a00_0000_0000;

static PROCESS: Mutex<Option<Process>> = Mutex::new(None);
static AT_EXIT: Once = Once::new();

thread_local! {
    /// The calling thread's context stack; the current context is the last.
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// Exported functions this thread is inside (only the outermost passes the gate).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Per driver device index: the slot this process holds there + 1, 0 for none. A lock-free
/// copy of `Process::slots` for the checkpoint gate, which must not take the process mutex
/// (a blocked call would hold it). A `fork`ed child inherits it, but the slots' pid is the
/// parent's, so the gate ignores them.
static HELD: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

/// How long a blocked call sleeps on the futex before looking again (the controller wakes
/// it on every transition; this only bounds a missed wake).
const GATE_RECHECK_NS: u64 = 20_000_000;

/// A CUDA call of this process in flight, as the checkpoint API sees it: counted in each
/// slot this process holds (so `cuCheckpointProcessLock` can wait for it), and only created
/// once no slot is locked or checkpointed (so a locked process's calls block).
pub(crate) struct Gate {
    /// Driver device indices (bits) whose slot this call is counted in.
    mask: u64,
    /// Per driver device index: that slot.
    slots: [u32; MAX_DEVICES],
    pid: u32,
}

/// Pass the checkpoint gate: wait while this process is locked or checkpointed on any
/// device, then count the call. Nested calls (an export calling another) pass freely.
pub(crate) fn gate() -> Gate {
    let nested = DEPTH
        .try_with(|d| {
            let depth = d.get();
            d.set(depth.saturating_add(1));
            depth > 0
        })
        .unwrap_or(true);
    let mut gate = Gate {
        mask: 0,
        slots: [0; MAX_DEVICES],
        pid: 0,
    };
    if nested {
        return gate;
    }
    let Some(driver) = driver::loaded() else {
        return gate;
    };
    if HELD
        .iter()
        .take(driver.devices.len())
        .all(|h| h.load(SeqCst) == 0)
    {
        return gate; // no slot: nothing a controller could lock
    }
    let pid = getpid();
    gate.pid = pid;
    let devices = driver.devices.len().min(MAX_DEVICES);
    loop {
        let mut blocked = None;
        for (index, held) in HELD[..devices].iter().enumerate() {
            let held = held.load(SeqCst);
            if held == 0 {
                continue;
            }
            let slot = held - 1;
            if let Some(running) = driver.devices[index].state.enter_call(slot as usize, pid) {
                gate.mask |= 1 << index;
                gate.slots[index] = slot;
                if !running {
                    blocked = Some((index, slot as usize));
                }
            }
        }
        let Some((index, slot)) = blocked else {
            return gate;
        };
        gate.leave(driver, pid);
        driver.devices[index]
            .state
            .wait_running(slot, pid, GATE_RECHECK_NS);
    }
}

impl Gate {
    fn leave(&mut self, driver: &Driver, pid: u32) {
        while self.mask != 0 {
            let index = self.mask.trailing_zeros() as usize;
            self.mask &= self.mask - 1;
            if let Some(device) = driver.device(index) {
                device.state.leave_call(self.slots[index] as usize, pid);
            }
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        if self.mask != 0 {
            if let Some(driver) = driver::loaded() {
                self.leave(driver, self.pid);
            }
        }
    }
}

fn set_held(device: usize, slot: Option<usize>) {
    if let Some(held) = HELD.get(device) {
        held.store(slot.map_or(0, |s| s as u32 + 1), SeqCst);
    }
}

/// cuInit: load the driver, read FAKEGPU_KERNELS, apply CUDA_VISIBLE_DEVICES, reclaim dead
/// processes' memory.
pub(crate) fn init() -> CuResult {
    let mut guard = PROCESS.lock().unwrap_or_else(PoisonError::into_inner);
    if guard.as_ref().is_some_and(|p| p.pid == getpid()) {
        return Ok(());
    }
    let driver = driver::load().ok_or(CUresult::CUDA_ERROR_NO_DEVICE)?;
    kernel_table()?;
    driver.reclaim_dead();
    let uuids: Vec<&str> = driver
        .devices
        .iter()
        .map(|d| d.config.uuid.as_str())
        .collect();
    let spec = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let visible = visible::parse(spec.as_deref(), &uuids);
    if visible.is_empty() {
        return Err(CUresult::CUDA_ERROR_NO_DEVICE);
    }
    let _ = STACK.try_with(|s| s.borrow_mut().clear());
    *guard = Some(Process::new(driver, visible));
    AT_EXIT.call_once(|| {
        // SAFETY: registering a plain extern "C" fn with no arguments; it stays valid for as
        // long as the library is loaded, and glibc runs it at dlclose time otherwise.
        unsafe { libc::atexit(release_at_exit) };
    });
    Ok(())
}

/// Run `f` on this process's CUDA state; `CUDA_ERROR_NOT_INITIALIZED` before cuInit.
pub(crate) fn with<T>(f: impl FnOnce(&mut Process) -> CuResult<T>) -> CuResult<T> {
    let mut guard = PROCESS.lock().unwrap_or_else(PoisonError::into_inner);
    match guard.as_mut() {
        Some(p) if p.pid == getpid() => f(p),
        _ => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// At exit the real driver tears down the process's contexts; do the same for its memory.
extern "C" fn release_at_exit() {
    ffi::guard((), || {
        let mut guard = match PROCESS.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Another thread is inside the driver; the next reclaim will see us dead.
            Err(TryLockError::WouldBlock) => return,
        };
        if let Some(p) = guard.as_mut().filter(|p| p.pid == getpid()) {
            p.release_all_slots();
        }
    })
}

/// The calling thread's current context (0 for none).
pub(crate) fn current() -> u64 {
    STACK
        .try_with(|s| s.borrow().last().copied().unwrap_or(0))
        .unwrap_or(0)
}

/// cuCtxSetCurrent: replace the top of the stack; NULL pops it.
pub(crate) fn set_current(ctx: u64) {
    let _ = STACK.try_with(|s| {
        let mut s = s.borrow_mut();
        match s.last_mut() {
            _ if ctx == 0 => {
                s.pop();
            }
            Some(top) => *top = ctx,
            None => s.push(ctx),
        }
    });
}

pub(crate) fn push(ctx: u64) {
    let _ = STACK.try_with(|s| s.borrow_mut().push(ctx));
}

pub(crate) fn pop() -> Option<u64> {
    STACK.try_with(|s| s.borrow_mut().pop()).ok().flatten()
}

/// Drop a destroyed context from this thread's stack.
pub(crate) fn forget(ctx: u64) {
    let _ = STACK.try_with(|s| s.borrow_mut().retain(|&c| c != ctx));
}

impl Process {
    fn new(driver: &'static Driver, visible: Vec<usize>) -> Process {
        let ordinals = visible.len();
        Process {
            pid: getpid(),
            me: ProcessId::current(),
            driver,
            visible,
            contexts: HashMap::new(),
            primary: vec![Primary::default(); ordinals],
            slots: HashMap::new(),
            allocs: BTreeMap::new(),
            host: BTreeMap::new(),
            arrays: HashMap::new(),
            mipmaps: HashMap::new(),
            physical: HashMap::new(),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            pools: HashMap::new(),
            current_pool: vec![0; ordinals],
            default_pool: vec![0; ordinals],
            imports: BTreeMap::new(),
            stream_info: HashMap::new(),
            libraries: HashMap::new(),
            kernels: HashMap::new(),
            copies_until: HashMap::new(),
            shared_events: HashMap::new(),
            exports: HashMap::new(),
            next_buffer_id: 0,
            streams: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            graphs: HashMap::new(),
            graph_execs: HashMap::new(),
            events: HashMap::new(),
            timelines: HashMap::new(),
            next_capture_id: 0,
            next_handle: 0,
            va: BTreeMap::new(),
            next_va: VA_START,
        }
    }

    /// The driver device index of CUDA ordinal `dev`.
    pub fn device_of(&self, dev: i32) -> CuResult<usize> {
        usize::try_from(dev)
            .ok()
            .and_then(|ordinal| self.visible.get(ordinal).copied())
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }

    pub fn device(&self, index: usize) -> CuResult<&'static crate::driver::Device> {
        self.driver
            .device(index)
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }

    /// The calling thread's current context.
    pub fn current_ctx(&self) -> CuResult<(u64, &Context)> {
        let handle = current();
        self.contexts
            .get(&handle)
            .map(|c| (handle, c))
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }

    /// A fresh handle value.
    pub fn new_handle(&mut self) -> u64 {
        self.next_handle += 1;
        HANDLE_BASE + self.next_handle * 0x40
    }

    /// Reserve `size` bytes of device address space aligned to `align` (a power of two).
    pub fn alloc_va(&mut self, size: u64, align: u64) -> CuResult<u64> {
        let oom = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        let align = align.max(256).checked_next_power_of_two().ok_or(oom)?;
        let len = size.max(1).checked_next_multiple_of(align).ok_or(oom)?;
        let fits = |start: u64, limit: u64| start.checked_add(len).is_some_and(|end| end <= limit);
        let bump = self.next_va.checked_next_multiple_of(align).ok_or(oom)?;
        let start = if fits(bump, VA_END) {
            bump
        } else {
            // The bump pointer ran out: first fit among the gaps freed since.
            let mut cursor = VA_START;
            let mut found = None;
            for (&start, &length) in &self.va {
                let candidate = cursor.checked_next_multiple_of(align).ok_or(oom)?;
                if fits(candidate, start) {
                    found = Some(candidate);
                    break;
                }
                cursor = cursor.max(start.saturating_add(length));
            }
            match found {
                Some(start) => start,
                None => {
                    let candidate = cursor.checked_next_multiple_of(align).ok_or(oom)?;
                    if !fits(candidate, VA_END) {
                        return Err(oom);
                    }
                    candidate
                }
            }
        };
        self.va.insert(start, len);
        self.next_va = self.next_va.max(start + len);
        Ok(start)
    }

    pub fn free_va(&mut self, start: u64) {
        self.va.remove(&start);
    }

    /// The slot this process holds on `device`, if any.
    pub fn slot(&self, device: usize) -> Option<usize> {
        self.slots.get(&device).copied()
    }

    /// Hold a slot on `device` (the process then shows in NVML's process list).
    pub fn ensure_slot(&mut self, device: usize) -> CuResult<usize> {
        if let Some(slot) = self.slot(device) {
            return Ok(slot);
        }
        let me = self.me.ok_or(CUresult::CUDA_ERROR_OPERATING_SYSTEM)?;
        let slot = self
            .device(device)?
            .state
            .claim_slot(me)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        self.slots.insert(device, slot);
        set_held(device, Some(slot));
        Ok(slot)
    }

    /// Charge `bytes` of `device`'s memory to this process, or fail with
    /// CUDA_ERROR_OUT_OF_MEMORY (after reclaiming dead processes and retrying once).
    pub fn charge(&mut self, device: usize, bytes: u64) -> CuResult {
        let slot = self.ensure_slot(device)?;
        let dev = self.device(device)?;
        let total = dev.config.memory;
        if !dev.state.try_reserve(bytes, total) {
            dev.state.reclaim_dead();
            if !dev.state.try_reserve(bytes, total) {
                return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        dev.state.slot_add(slot, bytes);
        Ok(())
    }

    /// Give back what [`charge`](Self::charge) took: off the slot first, so that dying in
    /// between leaves the device total too high rather than too low.
    pub fn uncharge(&mut self, device: usize, bytes: u64) {
        let Ok(dev) = self.device(device) else { return };
        if let Some(slot) = self.slot(device) {
            dev.state.slot_sub(slot, bytes);
        }
        dev.state.unreserve(bytes);
    }

    /// Give up the slot on `device` once no context or charged memory of this process uses
    /// it.
    pub fn release_slot_if_unused(&mut self, device: usize) {
        let in_use = self.contexts.values().any(|c| c.device == device)
            || self.allocs.values().any(|a| a.device == device)
            || self
                .arrays
                .values()
                .chain(self.mipmaps.values())
                .any(|a| a.device == device)
            || self.physical.values().any(|p| p.device == Some(device))
            || self
                .pools
                .values()
                .any(|p| p.device == device && p.reserved > 0);
        if in_use {
            return;
        }
        if let (Some(slot), Some(me)) = (self.slots.remove(&device), self.me) {
            set_held(device, None);
            if let Ok(dev) = self.device(device) {
                dev.state.release_slot(slot, me);
            }
        }
    }

    fn release_all_slots(&mut self) {
        let Some(me) = self.me else { return };
        for (device, slot) in std::mem::take(&mut self.slots) {
            set_held(device, None);
            if let Some(dev) = self.driver.device(device) {
                dev.state.release_slot(slot, me);
            }
        }
    }
}
