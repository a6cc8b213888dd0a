//! What every process sees of a simulated device: one fixed-layout file per device (by UUID)
//! in the state directory, memory-mapped by every process that uses the driver.
//!
//! The directory is `$FAKEGPU_STATE`, default `/tmp/fakegpu`, created with mode 1777 so root
//! and non-root processes share it; files are 0666. Every field is an atomic; no lock is
//! ever held across processes (a SIGKILLed process could hold it forever), except `flock`
//! while a file is first created, which the kernel releases when its holder dies.
//!
//! Memory accounting: `used` is the authority. An allocation is one compare-and-swap on
//! `used` that fails instead of passing the device size, then the bytes are attributed to
//! the process's slot; a free takes them off the slot first, then off `used`. A process that
//! dies between the two steps leaves `used` too high, never too low. `peak` is raised after
//! every successful reservation to the value `used` reached, so it is the true maximum of
//! `used` over time (until [`DeviceState::reset_peak`]).
//!
//! Dead processes (pid + start time, so pid reuse cannot fool it) are reclaimed by whoever
//! notices first: the slot's pid is swapped to a "reclaiming" marker with a CAS, so its bytes
//! are subtracted exactly once.
//!
//! The device timeline: `record_launch` decides when each kernel runs (one FIFO per device:
//! behind whatever is queued, not before its stream is ready) and records the busy interval
//! `[start, end)` and whose it is, from which NVML's utilization is computed
//! (`driver::Device::utilization`, `process_busy_ns`). Intervals go into a ring of
//! [`TIMELINE`] entries, a process's back-to-back kernels sharing one. An entry is reused
//! only once no reader can want it any more (it ended more than [`KEEP_NS`] before the
//! writer's now: readers look back one sample window). When every entry is still wanted —
//! processes that launch without synchronising queue kernels far into the future, and
//! alternate owners entry by entry — an interval is added to its process's **spill span**
//! instead (one per slot, beside the ring: `[start, end)` and the busy time within it,
//! `busy_ns ≤ end − start`), which readers count in proportion to its overlap with their
//! window. So in-flight work is never lost to a full ring and utilization stays right under
//! any launch rate (exact while the ring suffices; a span's time is taken as spread evenly
//! over it). Writers never wait on another process: claiming an entry is a CAS on the head,
//! a span is a seqlock only its own process writes (bounded spin, taken over if a writer
//! died mid-write).
//!
//! Time-slicing: the timeline records *when each context was busy*. `record_launch` charges
//! a context switch (`model::slice_start`: the device's `timeslice` and `context_switch`)
//! when an item follows another context's queued work; the switch is nobody's interval, so
//! NVML's figures leave it out. Whose item is last in the queue and when its run began are
//! two words of the header (taken from the reserved ones: a file of layout 5 made before
//! them holds 0 there, "none", so the layout number did not change).

use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use vgpu_abi::process::ProcessId;

use crate::config::Config;
use crate::model::{self, Slicing};

/// Environment variable naming the state directory.
pub const STATE_ENV: &str = "FAKEGPU_STATE";
/// The state directory when `FAKEGPU_STATE` is unset.
pub const DEFAULT_STATE_DIR: &str = "/tmp/fakegpu";

/// "FAKEGPU" + layout number; a file with anything else at its start is recreated.
pub const MAGIC: u64 = u64::from_le_bytes(*b"FAKEGPU\x01");
/// Bumped whenever [`Layout`] changes.
pub const LAYOUT_VERSION: u32 = 5;
/// Processes that can hold memory on one device at the same time.
pub const SLOTS: usize = 512;
/// Kernel intervals remembered for utilization (a ring; a process's back-to-back kernels
/// share one entry, and what does not fit goes to the processes' spill spans: see the
/// module's documentation).
pub const TIMELINE: usize = 65_536;
/// How long after it ended an interval may still be wanted by a reader (NVML's sample
/// window, and a margin for readers whose clock read came a little earlier).
pub const KEEP_NS: u64 = crate::model::SAMPLE_WINDOW_NS + 100_000_000;
/// How many times a span writer spins on another writer before taking the span over (only
/// a writer that died mid-write holds it that long).
const SPAN_SPINS: u32 = 1 << 20;
/// Entries older than this (ended before `now − SAMPLE_WINDOW − this`) stop a backward scan.
const SCAN_SLACK_NS: u64 = 1_000_000_000;
/// A slot's pid while some process is reclaiming it.
const RECLAIMING: u32 = u32::MAX;
/// Bits of a pid in a [`Slot::ckpt_owner`] word (Linux's `PID_MAX_LIMIT` is 2^22).
const OWNER_PID_BITS: u32 = 22;

/// The state directory in use: `$FAKEGPU_STATE` or [`DEFAULT_STATE_DIR`].
pub fn state_dir() -> PathBuf {
    match std::env::var_os(STATE_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(DEFAULT_STATE_DIR),
    }
}

/// The file of the device with `uuid` in `dir`.
pub fn device_file(dir: &Path, uuid: &str) -> PathBuf {
    dir.join(format!("{uuid}.state"))
}

/// One process's share of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUsage {
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_time: u64,
    /// Device memory it holds, in bytes.
    pub bytes: u64,
    /// Kernels it launched.
    pub launches: u64,
    /// Its checkpoint state (`CUprocessState`: running, locked, checkpointed).
    pub checkpoint: CheckpointState,
}

/// A process's state in the checkpoint API (cuda.h's `CUprocessState`), as kept in its
/// slot. The transitional states of one controller's operation are reported as the state
/// the operation started from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointState {
    Running,
    Locked,
    Checkpointed,
}

impl CheckpointState {
    /// The `CUprocessState` value.
    pub fn cu_value(self) -> u32 {
        match self {
            CheckpointState::Running => 0,
            CheckpointState::Locked => 1,
            CheckpointState::Checkpointed => 2,
        }
    }
}

/// Slot checkpoint states. The first three are cuda.h's `CUprocessState` values; the
/// others are a controller's operation in progress (the target's calls block in all but
/// RUNNING).
pub(crate) mod ckpt {
    pub const RUNNING: u32 = 0;
    pub const LOCKED: u32 = 1;
    pub const CHECKPOINTED: u32 = 2;
    /// Lock requested: the target's new calls block; its in-flight calls and queued
    /// kernels are being waited for. Reported as RUNNING (a timed-out lock leaves it so).
    pub const LOCKING: u32 = 0x10;
    /// Checkpoint under way (LOCKED → CHECKPOINTED); reported as LOCKED.
    pub const CHECKPOINTING: u32 = 0x11;
    /// Restore under way (CHECKPOINTED → LOCKED); reported as CHECKPOINTED.
    pub const RESTORING: u32 = 0x12;
}

/// A controller's operation under way on a process (a transient slot state), as tests see
/// it in [`DeviceState::checkpoint_op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointOp {
    /// `cuCheckpointProcessLock` waiting for the process's calls and kernels.
    Locking,
    /// `cuCheckpointProcessCheckpoint` copying device memory to the host.
    Checkpointing,
    /// `cuCheckpointProcessRestore` copying it back.
    Restoring,
}

/// The owner word of controller `id`: `start_time << 22 | pid`, one word so that taking
/// over a dead owner is one compare-and-swap that a later process with the same pid cannot
/// pass. `None` for a pid or start time out of range (never on Linux).
pub(crate) fn owner_word(id: ProcessId) -> Option<u64> {
    (id.pid != 0 && id.pid < 1 << OWNER_PID_BITS && id.start_time < 1 << (64 - OWNER_PID_BITS))
        .then(|| id.start_time << OWNER_PID_BITS | u64::from(id.pid))
}

/// The controller an owner word names.
fn owner_id(word: u64) -> ProcessId {
    ProcessId {
        pid: (word & ((1 << OWNER_PID_BITS) - 1)) as u32,
        start_time: word >> OWNER_PID_BITS,
    }
}

/// Whether the controller `word` names is gone (0, no owner, is never dead).
fn owner_dead(word: u64) -> bool {
    word != 0 && !owner_id(word).is_alive()
}

/// What [`DeviceState::ckpt_claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The slot's operations are the caller's until [`DeviceState::ckpt_release`].
    Taken,
    /// A live controller's operation is under way.
    Busy,
    /// The process no longer holds the slot.
    Gone,
}

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    /// Checkpoint state, one of [`ckpt`]; a futex word the blocked process waits on.
    ckpt_state: AtomicU32,
    start_time: AtomicU64,
    /// Device memory held (0 while checkpointed).
    bytes: AtomicU64,
    launches: AtomicU64,
    /// Device memory a checkpoint took off the device, to be restored.
    ckpt_bytes: AtomicU64,
    /// When the kernels this process queued on the device end.
    busy_until_ns: AtomicU64,
    last_launch_ns: AtomicU64,
    /// CUDA calls of this process under way (that passed the checkpoint gate).
    in_calls: AtomicU32,
    /// The thread that took the slot (`cuCheckpointProcessGetRestoreThreadId`).
    restore_tid: AtomicU32,
    /// The controller whose checkpoint operation this slot is in ([`owner_word`]: pid and
    /// start time), 0 for none. Claimed with a CAS from 0 *before* the state leaves a
    /// stable state and released after it reaches one, so a transient state always has its
    /// owner recorded; a dead owner's operation is resolved by whoever notices it.
    ckpt_owner: AtomicU64,
    /// This process's kernels that did not fit in the timeline's ring.
    spill: Span,
}

/// Busy time of one owner that the ring could not hold: within `[start, end)`, `busy_ns`
/// of it. `seq` is a seqlock: even when stable, odd while a writer changes the fields.
#[repr(C)]
struct Span {
    seq: AtomicU64,
    start_ns: AtomicU64,
    end_ns: AtomicU64,
    busy_ns: AtomicU64,
}

impl Span {
    /// Add `[start, end)` (busy throughout); a span that ended more than [`KEEP_NS`] before
    /// `now` starts afresh.
    fn add(&self, start: u64, end: u64, now: u64) {
        let mut spins = 0u32;
        let held = loop {
            let seq = self.seq.load(Acquire);
            if seq & 1 == 0 {
                if self.seq.compare_exchange(seq, seq + 1, AcqRel, Acquire).is_ok() {
                    break seq + 1;
                }
            } else if spins >= SPAN_SPINS {
                // Its writer died mid-write (another thread of a live process takes
                // nanoseconds): take the span over, still odd.
                if self.seq.compare_exchange(seq, seq + 2, AcqRel, Acquire).is_ok() {
                    break seq + 2;
                }
            }
            spins = spins.saturating_add(1);
            std::hint::spin_loop();
        };
        let (old_start, old_end) = (self.start_ns.load(Relaxed), self.end_ns.load(Relaxed));
        let busy = end.saturating_sub(start);
        if self.busy_ns.load(Relaxed) == 0 || old_end.saturating_add(KEEP_NS) < now {
            self.start_ns.store(start, Relaxed);
            self.end_ns.store(end, Relaxed);
            self.busy_ns.store(busy, Relaxed);
        } else {
            self.start_ns.store(old_start.min(start), Relaxed);
            self.end_ns.store(old_end.max(end), Relaxed);
            self.busy_ns.fetch_add(busy, Relaxed);
        }
        self.seq.store(held + 1, Release);
    }

    /// `(start, end, busy)`, None when empty or being written.
    fn read(&self) -> Option<(u64, u64, u64)> {
        for _ in 0..8 {
            let seq = self.seq.load(Acquire);
            if seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let read = (self.start_ns.load(Relaxed), self.end_ns.load(Relaxed), self.busy_ns.load(Relaxed));
            std::sync::atomic::fence(Acquire);
            if self.seq.load(Relaxed) == seq {
                return (read.2 > 0).then_some(read);
            }
        }
        None
    }

    fn clear(&self) {
        self.seq.store(0, SeqCst);
        self.start_ns.store(0, SeqCst);
        self.end_ns.store(0, SeqCst);
        self.busy_ns.store(0, SeqCst);
    }
}

/// One interval of the device's timeline: a kernel, or a process's kernels back to back.
/// `seq` is the ring index + 1 once the other fields are written, 0 while they are.
#[repr(C)]
struct Interval {
    seq: AtomicU64,
    start_ns: AtomicU64,
    end_ns: AtomicU64,
    pid: AtomicU64,
}

/// One interval of the device's timeline, as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    /// The process whose kernel(s) ran (0: not attributed).
    pub pid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// How much of `[start, end)` it was busy: all of it for an entry of the ring, less
    /// for a spill span (see the module's documentation).
    pub busy_ns: u64,
}

impl Busy {
    /// Whether it is busy throughout (an entry of the ring).
    pub fn is_solid(&self) -> bool {
        self.busy_ns >= self.end_ns.saturating_sub(self.start_ns)
    }
}

/// The file's layout. Zero-filled is the initial state of every field but the header.
#[repr(C)]
struct Layout {
    magic: AtomicU64,
    version: AtomicU32,
    slot_count: AtomicU32,
    created_ns: AtomicU64,
    /// Device memory size when the file was created (informational; the config decides).
    total_bytes: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    /// Locked graphics clock range in MHz; 0 = not locked.
    locked_min_mhz: AtomicU32,
    locked_max_mhz: AtomicU32,
    /// Power limit in mW; 0 = the default limit.
    power_limit_mw: AtomicU32,
    persistence: AtomicU32,
    launches: AtomicU64,
    /// When the device's queue of simulated kernels drains.
    busy_until_ns: AtomicU64,
    /// Sum of all kernel durations credited so far (including queued ones).
    busy_total_ns: AtomicU64,
    /// Dynamic (above-idle) energy of all kernels credited so far, in µJ.
    dyn_energy_uj: AtomicU64,
    /// The largest energy reading handed out, so readings never go backwards.
    energy_reported_mj: AtomicU64,
    timeline_head: AtomicU64,
    /// Kernels of no process (no slot) that did not fit in the ring.
    spill: Span,
    /// Whose item is last in the device's queue: its slot + 1, 0 for none (time-slicing;
    /// a file of layout 5 made before it has 0 here, which is right).
    tail_owner: AtomicU64,
    /// When that context's run of back-to-back items at the end of the queue started.
    run_start_ns: AtomicU64,
    /// Context switches the device paid (`model::slice_start`) and their time in all (ns).
    switches: AtomicU64,
    switch_ns: AtomicU64,
    _reserved: [AtomicU64; 8],
    slots: [Slot; SLOTS],
    timeline: [Interval; TIMELINE],
}

const FILE_SIZE: usize = std::mem::size_of::<Layout>();

/// One device's shared state, mapped into this process.
pub struct DeviceState {
    map: NonNull<Layout>,
    path: PathBuf,
}

// SAFETY: the mapping is only ever accessed through atomics, from any thread.
unsafe impl Send for DeviceState {}
// SAFETY: as above; &DeviceState hands out no non-atomic access.
unsafe impl Sync for DeviceState {}

impl Drop for DeviceState {
    fn drop(&mut self) {
        // SAFETY: `map` is a FILE_SIZE mapping this value owns; nothing borrows it past drop.
        unsafe { libc::munmap(self.map.as_ptr().cast(), FILE_SIZE) };
    }
}

impl std::fmt::Debug for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceState")
            .field("path", &self.path)
            .field("used", &self.used())
            .finish()
    }
}

/// Open the state of every device of `config` in `dir`.
pub fn open_all(config: &Config, dir: &Path) -> io::Result<Vec<DeviceState>> {
    config
        .devices
        .iter()
        .map(|d| DeviceState::open(dir, &d.uuid, d.memory))
        .collect()
}

impl DeviceState {
    /// Map the state of device `uuid` in `dir`, creating the directory (mode 1777) and the
    /// file (mode 0666) if needed, and recreating a file of another layout. `total_bytes`
    /// is recorded in a new file for people reading it; limits come from the config.
    pub fn open(dir: &Path, uuid: &str, total_bytes: u64) -> io::Result<DeviceState> {
        ensure_dir(dir)?;
        let path = device_file(dir, uuid);
        if let Some(state) = Self::map_existing(&path)? {
            return Ok(state);
        }
        let _lock = DirLock::acquire(dir)?;
        if let Some(state) = Self::map_existing(&path)? {
            return Ok(state);
        }
        create_file(dir, &path, total_bytes)?;
        Self::map_existing(&path)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: not a fakegpu state file after creating it",
                    path.display()
                ),
            )
        })
    }

    /// The file behind this state.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn map_existing(path: &Path) -> io::Result<Option<DeviceState>> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        };
        if file.metadata()?.len() != FILE_SIZE as u64 {
            return Ok(None);
        }
        let map = map_file(&file)?;
        let state = DeviceState {
            map,
            path: path.to_path_buf(),
        };
        let l = state.layout();
        if l.magic.load(Acquire) != MAGIC
            || l.version.load(Acquire) != LAYOUT_VERSION
            || l.slot_count.load(Acquire) != SLOTS as u32
        {
            return Ok(None);
        }
        Ok(Some(state))
    }

    fn layout(&self) -> &Layout {
        // SAFETY: `map` is a live shared mapping of FILE_SIZE bytes, page-aligned, and
        // Layout consists of atomics only, for which every bit pattern is valid.
        unsafe { self.map.as_ref() }
    }

    /// Device memory in use by all processes, in bytes.
    pub fn used(&self) -> u64 {
        self.layout().used.load(SeqCst)
    }

    /// The most device memory ever in use at one instant since creation or the last
    /// [`reset_peak`](Self::reset_peak).
    pub fn peak(&self) -> u64 {
        self.layout().peak.load(SeqCst)
    }

    /// Start a new peak measurement from the current usage.
    pub fn reset_peak(&self) {
        let l = self.layout();
        l.peak.store(l.used.load(SeqCst), SeqCst);
        l.peak.fetch_max(l.used.load(SeqCst), SeqCst);
    }

    /// The processes holding a slot (memory or a context) on this device.
    pub fn processes(&self) -> Vec<ProcessUsage> {
        self.layout()
            .slots
            .iter()
            .filter_map(|s| {
                let pid = s.pid.load(Acquire);
                (pid != 0 && pid != RECLAIMING).then(|| ProcessUsage {
                    pid,
                    start_time: s.start_time.load(Acquire),
                    bytes: s.bytes.load(Acquire),
                    launches: s.launches.load(Acquire),
                    checkpoint: reported_state(s.ckpt_state.load(SeqCst)),
                })
            })
            .collect()
    }

    /// Bytes held by process `pid` (0 if it holds no slot).
    pub fn bytes_of(&self, pid: u32) -> u64 {
        self.processes()
            .iter()
            .filter(|p| p.pid == pid)
            .map(|p| p.bytes)
            .sum()
    }

    /// Locked graphics clocks `(min, max)` in MHz, if locked.
    pub fn locked_clocks(&self) -> Option<(u32, u32)> {
        let l = self.layout();
        let (min, max) = (l.locked_min_mhz.load(SeqCst), l.locked_max_mhz.load(SeqCst));
        (max != 0).then_some((min, max))
    }

    /// The power limit set through NVML in mW; `None` means the default limit.
    pub fn power_limit_mw(&self) -> Option<u32> {
        Some(self.layout().power_limit_mw.load(SeqCst)).filter(|&mw| mw != 0)
    }

    pub fn persistence_mode(&self) -> bool {
        self.layout().persistence.load(SeqCst) != 0
    }

    /// Kernel launches recorded on this device since the file was created.
    pub fn launches(&self) -> u64 {
        self.layout().launches.load(SeqCst)
    }

    /// Context switches the device paid so far, and their time in all (ns).
    pub fn switches(&self) -> (u64, u64) {
        let l = self.layout();
        (l.switches.load(SeqCst), l.switch_ns.load(SeqCst))
    }

    /// When the device's simulated work queue drains (ns since the epoch).
    pub fn busy_until_ns(&self) -> u64 {
        self.layout().busy_until_ns.load(SeqCst)
    }

    /// When this file was created (ns since the epoch): the origin of the energy counter.
    pub fn created_ns(&self) -> u64 {
        self.layout().created_ns.load(SeqCst)
    }

    /// Give back the memory of every dead process, and resolve the checkpoint operations of
    /// dead controllers ([`resolve_abandoned`](Self::resolve_abandoned)); returns the bytes
    /// that left the device.
    pub fn reclaim_dead(&self) -> u64 {
        let mut reclaimed = self.resolve_abandoned();
        for slot in &self.layout().slots {
            let pid = slot.pid.load(Acquire);
            if pid == 0 || pid == RECLAIMING {
                continue;
            }
            let start_time = slot.start_time.load(Acquire);
            let alive = if start_time == 0 {
                // Claimed a moment ago and its start time not yet written: trust the pid.
                Path::new(&format!("/proc/{pid}")).exists()
            } else {
                ProcessId { pid, start_time }.is_alive()
            };
            if !alive {
                reclaimed += self.free_slot(slot, pid);
            }
        }
        reclaimed
    }

    /// Free `slot` if it still belongs to `pid`; returns the bytes given back.
    fn free_slot(&self, slot: &Slot, pid: u32) -> u64 {
        if slot
            .pid
            .compare_exchange(pid, RECLAIMING, SeqCst, SeqCst)
            .is_err()
        {
            return 0;
        }
        // A checkpointed process's memory already left `used` (ckpt_bytes is host memory).
        let bytes = slot.bytes.swap(0, SeqCst);
        self.unreserve(bytes);
        for field in [
            &slot.launches,
            &slot.busy_until_ns,
            &slot.last_launch_ns,
            &slot.ckpt_bytes,
        ] {
            field.store(0, SeqCst);
        }
        slot.in_calls.store(0, SeqCst);
        slot.restore_tid.store(0, SeqCst);
        slot.ckpt_owner.store(0, SeqCst);
        slot.spill.clear();
        slot.start_time.store(0, SeqCst);
        slot.ckpt_state.store(ckpt::RUNNING, SeqCst);
        futex_wake(&slot.ckpt_state);
        slot.pid.store(0, Release);
        bytes
    }

    // ----- crate-internal: what the driver does to the state -----

    /// Reserve `bytes` unless that would pass `total`; returns whether it did.
    pub(crate) fn try_reserve(&self, bytes: u64, total: u64) -> bool {
        let l = self.layout();
        match l.used.fetch_update(SeqCst, SeqCst, |used| {
            used.checked_add(bytes).filter(|&n| n <= total)
        }) {
            Ok(before) => {
                l.peak.fetch_max(before + bytes, SeqCst);
                true
            }
            Err(_) => false,
        }
    }

    pub(crate) fn unreserve(&self, bytes: u64) {
        let _ = self
            .layout()
            .used
            .fetch_update(SeqCst, SeqCst, |used| Some(used.saturating_sub(bytes)));
    }

    /// Claim a free slot for `me`; `None` if all are taken.
    pub(crate) fn claim_slot(&self, me: ProcessId) -> Option<usize> {
        let slots = &self.layout().slots;
        for pass in 0..2 {
            for (index, slot) in slots.iter().enumerate() {
                if slot.pid.compare_exchange(0, me.pid, SeqCst, SeqCst).is_ok() {
                    slot.spill.clear();
                    slot.bytes.store(0, SeqCst);
                    slot.ckpt_bytes.store(0, SeqCst);
                    slot.ckpt_owner.store(0, SeqCst);
                    slot.ckpt_state.store(ckpt::RUNNING, SeqCst);
                    slot.restore_tid.store(crate::ffi::gettid(), SeqCst);
                    slot.start_time.store(me.start_time, Release);
                    return Some(index);
                }
            }
            if pass == 0 && self.reclaim_dead() == 0 && !self.any_free() {
                break;
            }
        }
        None
    }

    fn any_free(&self) -> bool {
        self.layout().slots.iter().any(|s| s.pid.load(Acquire) == 0)
    }

    /// Give slot `index` back if `me` still owns it; its remaining bytes leave `used`.
    pub(crate) fn release_slot(&self, index: usize, me: ProcessId) -> u64 {
        match self.layout().slots.get(index) {
            Some(slot) if slot.start_time.load(Acquire) == me.start_time => {
                self.free_slot(slot, me.pid)
            }
            _ => 0,
        }
    }

    pub(crate) fn slot_add(&self, index: usize, bytes: u64) {
        if let Some(slot) = self.layout().slots.get(index) {
            slot.bytes.fetch_add(bytes, SeqCst);
        }
    }

    pub(crate) fn slot_sub(&self, index: usize, bytes: u64) {
        if let Some(slot) = self.layout().slots.get(index) {
            let _ = slot
                .bytes
                .fetch_update(SeqCst, SeqCst, |b| Some(b.saturating_sub(bytes)));
        }
    }

    pub(crate) fn set_locked_clocks(&self, range: Option<(u32, u32)>) {
        let l = self.layout();
        let (min, max) = range.unwrap_or((0, 0));
        // max first when unlocking and last when locking, so a reader never sees max == 0
        // with a stale min taken as locked.
        if max == 0 {
            l.locked_max_mhz.store(0, SeqCst);
            l.locked_min_mhz.store(0, SeqCst);
        } else {
            l.locked_min_mhz.store(min, SeqCst);
            l.locked_max_mhz.store(max, SeqCst);
        }
    }

    pub(crate) fn set_power_limit_mw(&self, limit: Option<u32>) {
        self.layout()
            .power_limit_mw
            .store(limit.unwrap_or(0), SeqCst);
    }

    pub(crate) fn set_persistence_mode(&self, on: bool) {
        self.layout().persistence.store(u32::from(on), SeqCst);
    }

    /// When an item (an event's stamp) of the process holding `slot` that may start at
    /// `floor` would start now: behind the queue, after a context switch if another
    /// context's work is queued (`model::slice_start`).
    pub(crate) fn item_start(&self, slot: Option<usize>, floor: u64, slicing: Slicing) -> u64 {
        let l = self.layout();
        model::slice_start(
            floor,
            l.busy_until_ns.load(SeqCst),
            l.tail_owner.load(SeqCst),
            l.run_start_ns.load(SeqCst),
            slot.map_or(0, |i| i as u64 + 1),
            slot.and_then(|i| l.slots.get(i)).map_or(0, |s| s.busy_until_ns.load(SeqCst)),
            0,
            slicing,
        )
    }

    /// Queue a kernel of `duration_ns` in the device's FIFO, behind whatever the device runs
    /// and not before `not_before` (the stream's ready time), after a context switch if it
    /// follows another context's queued work (`model::slice_start`; the switch is no one's
    /// busy time); returns `(start, end)`. `dyn_energy_uj` is its energy above idle power.
    ///
    /// The queue's end is claimed with a CAS; whose item is last (for the next switch) is
    /// stored just after, so a launch of another process in between may read the previous
    /// owner and misjudge one switch: a race of nanoseconds, not worth a lock.
    pub(crate) fn record_launch(
        &self,
        slot: Option<usize>,
        now: u64,
        not_before: u64,
        duration_ns: u64,
        dyn_energy_uj: u64,
        slicing: Slicing,
    ) -> (u64, u64) {
        let l = self.layout();
        let floor = now.max(not_before);
        let me = slot.map_or(0, |i| i as u64 + 1);
        let own = slot.and_then(|i| l.slots.get(i));
        let (start, end) = loop {
            let before = l.busy_until_ns.load(SeqCst);
            let tail = l.tail_owner.load(SeqCst);
            let run_start = l.run_start_ns.load(SeqCst);
            let own_until = own.map_or(0, |s| s.busy_until_ns.load(SeqCst));
            let start = model::slice_start(floor, before, tail, run_start, me, own_until, duration_ns, slicing);
            let end = start.saturating_add(duration_ns);
            if l
                .busy_until_ns
                .compare_exchange(before, end.max(before), SeqCst, SeqCst)
                .is_ok()
            {
                let free = floor.max(before);
                if start > free {
                    l.switches.fetch_add(1, SeqCst);
                    l.switch_ns.fetch_add(start - free, SeqCst);
                }
                let continues = tail == me && before >= start;
                l.run_start_ns
                    .store(if continues { run_start } else { start }, SeqCst);
                l.tail_owner.store(me, SeqCst);
                break (start, end);
            }
        };
        l.launches.fetch_add(1, SeqCst);
        l.busy_total_ns.fetch_add(duration_ns, SeqCst);
        l.dyn_energy_uj.fetch_add(dyn_energy_uj, SeqCst);
        let slot = slot.and_then(|i| l.slots.get(i));
        let pid = slot.map_or(0, |s| s.pid.load(Acquire));
        self.append_interval(pid, slot.map_or(&l.spill, |s| &s.spill), start, end, now);
        if let Some(slot) = slot {
            slot.launches.fetch_add(1, SeqCst);
            slot.last_launch_ns.store(now, SeqCst);
            slot.busy_until_ns.fetch_max(end, SeqCst);
        }
        (start, end)
    }

    /// Add `[start, end)` of `pid` to the timeline: extend the newest entry if it is the same
    /// process's and ends exactly at `start`; else take the next entry of the ring if no
    /// reader can still want what it holds; else add it to `spill`, the process's span.
    fn append_interval(&self, pid: u32, spill: &Span, start: u64, end: u64, now: u64) {
        let l = self.layout();
        loop {
            let head = l.timeline_head.load(SeqCst);
            if head > 0 {
                let last = &l.timeline[((head - 1) % TIMELINE as u64) as usize];
                if last.seq.load(Acquire) == head
                    && last.pid.load(SeqCst) == u64::from(pid)
                    && last
                        .end_ns
                        .compare_exchange(start, end, SeqCst, SeqCst)
                        .is_ok()
                {
                    return;
                }
            }
            let entry = &l.timeline[(head % TIMELINE as u64) as usize];
            if head >= TIMELINE as u64 && !reusable(entry, head - TIMELINE as u64, now) {
                // Every entry is still wanted (queued, or within a reader's window).
                spill.add(start, end, now);
                return;
            }
            if l
                .timeline_head
                .compare_exchange(head, head + 1, SeqCst, SeqCst)
                .is_err()
            {
                continue; // another writer took it: look again
            }
            entry.seq.store(0, SeqCst);
            entry.start_ns.store(start, SeqCst);
            entry.end_ns.store(end, SeqCst);
            entry.pid.store(u64::from(pid), SeqCst);
            entry.seq.store(head + 1, Release);
            return;
        }
    }

    /// The timeline's intervals that may overlap `[since, ∞)`, newest first: a backward scan
    /// of the ring that stops at entries long finished before `since`, then every spill span
    /// that reaches past `since`.
    pub fn timeline_since(&self, since: u64) -> Vec<Busy> {
        let l = self.layout();
        let head = l.timeline_head.load(SeqCst);
        let oldest = head.saturating_sub(TIMELINE as u64);
        let mut out = Vec::new();
        for index in (oldest..head).rev() {
            let entry = &l.timeline[(index % TIMELINE as u64) as usize];
            if entry.seq.load(Acquire) != index + 1 {
                continue; // being written (or already overwritten)
            }
            let (start_ns, end_ns, pid) = (
                entry.start_ns.load(SeqCst),
                entry.end_ns.load(SeqCst),
                entry.pid.load(SeqCst) as u32,
            );
            if entry.seq.load(Acquire) != index + 1 {
                continue;
            }
            if end_ns.saturating_add(SCAN_SLACK_NS) < since {
                break;
            }
            if end_ns > since {
                out.push(Busy {
                    pid,
                    start_ns,
                    end_ns,
                    busy_ns: end_ns.saturating_sub(start_ns),
                });
            }
        }
        let spans = l
            .slots
            .iter()
            .map(|s| (s.pid.load(Acquire), &s.spill))
            .filter(|(pid, _)| *pid != 0 && *pid != RECLAIMING)
            .chain(std::iter::once((0, &l.spill)));
        for (pid, span) in spans {
            if let Some((start_ns, end_ns, busy_ns)) = span.read() {
                if end_ns > since {
                    out.push(Busy {
                        pid,
                        start_ns,
                        end_ns,
                        busy_ns: busy_ns.min(end_ns.saturating_sub(start_ns)),
                    });
                }
            }
        }
        out
    }

    /// When this process's kernels on the device finish (0 if it has none).
    pub(crate) fn slot_busy_until(&self, index: usize) -> u64 {
        self.layout()
            .slots
            .get(index)
            .map_or(0, |s| s.busy_until_ns.load(SeqCst))
    }

    // ----- the checkpoint API: the controller's side -----

    /// The slots of live-or-not process `pid`: `(index, start_time)`.
    pub(crate) fn slots_of(&self, pid: u32) -> Vec<(usize, u64)> {
        self.layout()
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| pid != 0 && pid != RECLAIMING && s.pid.load(Acquire) == pid)
            .map(|(i, s)| (i, s.start_time.load(Acquire)))
            .collect()
    }

    fn owned_slot(&self, index: usize, pid: u32) -> Option<&Slot> {
        self.layout()
            .slots
            .get(index)
            .filter(|s| s.pid.load(SeqCst) == pid)
    }

    /// The raw checkpoint state of slot `index` if `pid` still owns it.
    pub(crate) fn ckpt_state(&self, index: usize, pid: u32) -> Option<u32> {
        self.owned_slot(index, pid)
            .map(|s| s.ckpt_state.load(SeqCst))
    }

    /// Move slot `index` of `pid` from checkpoint state `from` to `to`; whether it did.
    pub(crate) fn ckpt_transition(&self, index: usize, pid: u32, from: u32, to: u32) -> bool {
        let Some(slot) = self.owned_slot(index, pid) else {
            return false;
        };
        let moved = slot
            .ckpt_state
            .compare_exchange(from, to, SeqCst, SeqCst)
            .is_ok();
        if moved {
            futex_wake(&slot.ckpt_state);
        }
        moved
    }

    /// Take slot `index` of `pid` for an operation of controller `me` (an [`owner_word`]):
    /// a CAS of the owner from 0. A dead controller's leftover operation is resolved first
    /// and its ownership taken over; a live one's makes it [`Claim::Busy`].
    pub(crate) fn ckpt_claim(&self, index: usize, pid: u32, me: u64) -> Claim {
        loop {
            let Some(slot) = self.owned_slot(index, pid) else {
                return Claim::Gone;
            };
            let owner = slot.ckpt_owner.load(SeqCst);
            if owner == 0 {
                if slot
                    .ckpt_owner
                    .compare_exchange(0, me, SeqCst, SeqCst)
                    .is_ok()
                {
                    return Claim::Taken;
                }
            } else if owner != me && owner_dead(owner) {
                if self.take_over(slot, owner, me) {
                    return Claim::Taken;
                }
            } else {
                return Claim::Busy;
            }
        }
    }

    /// Give slot `index` back after an operation of `me` (nothing if `me` no longer owns it).
    pub(crate) fn ckpt_release(&self, index: usize, pid: u32, me: u64) {
        if let Some(slot) = self.owned_slot(index, pid) {
            let _ = slot.ckpt_owner.compare_exchange(me, 0, SeqCst, SeqCst);
        }
    }

    /// Resolve the operations of dead controllers on every slot, as the driver would have
    /// finished them on the target's side: an abandoned lock ends like a timed-out one
    /// (LOCKING → RUNNING), an abandoned checkpoint is finished (its memory leaves the
    /// device, → CHECKPOINTED), an abandoned restore is undone (what it put back leaves the
    /// device again, → CHECKPOINTED). Returns the bytes that left the device.
    pub(crate) fn resolve_abandoned(&self) -> u64 {
        let mut me = None;
        let mut freed = 0;
        for slot in &self.layout().slots {
            let owner = slot.ckpt_owner.load(SeqCst);
            if !owner_dead(owner) {
                continue;
            }
            let me = *me.get_or_insert_with(|| ProcessId::current().and_then(owner_word));
            let Some(me) = me else {
                return freed; // cannot name ourselves: leave it to another process
            };
            let before = self.used();
            if self.take_over(slot, owner, me) {
                let _ = slot.ckpt_owner.compare_exchange(me, 0, SeqCst, SeqCst);
            }
            freed += before.saturating_sub(self.used());
        }
        freed
    }

    /// Take `slot`'s operations over from dead controller `dead` for `me` and resolve the
    /// transient state it left (see [`resolve_abandoned`](Self::resolve_abandoned));
    /// `false` if another process took it first. Every step can be repeated, so a resolver
    /// killed half-way is resolved in turn.
    fn take_over(&self, slot: &Slot, dead: u64, me: u64) -> bool {
        if slot
            .ckpt_owner
            .compare_exchange(dead, me, SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
        let state = slot.ckpt_state.load(SeqCst);
        let to = match state {
            ckpt::LOCKING => ckpt::RUNNING,
            ckpt::CHECKPOINTING | ckpt::RESTORING => {
                // Finishing a checkpoint and undoing a restore are the same move: the
                // slot's device memory goes to the host.
                self.slot_to_host(slot);
                ckpt::CHECKPOINTED
            }
            _ => return true, // it died before or after its transient state
        };
        if slot
            .ckpt_state
            .compare_exchange(state, to, SeqCst, SeqCst)
            .is_ok()
        {
            futex_wake(&slot.ckpt_state);
        }
        true
    }

    /// The checkpoint operation under way on `pid` (on its first slot in one) and the pid
    /// of the controller that owns it (0 if it is not recorded).
    pub fn checkpoint_op(&self, pid: u32) -> Option<(CheckpointOp, u32)> {
        self.layout()
            .slots
            .iter()
            .filter(|s| pid != 0 && pid != RECLAIMING && s.pid.load(Acquire) == pid)
            .find_map(|s| {
                let op = match s.ckpt_state.load(SeqCst) {
                    ckpt::LOCKING => CheckpointOp::Locking,
                    ckpt::CHECKPOINTING => CheckpointOp::Checkpointing,
                    ckpt::RESTORING => CheckpointOp::Restoring,
                    _ => return None,
                };
                let owner = s.ckpt_owner.load(SeqCst);
                Some((op, if owner == 0 { 0 } else { owner_id(owner).pid }))
            })
    }

    /// `(device bytes, checkpointed bytes)` of slot `index` (zeros if `pid` no longer owns
    /// it).
    pub(crate) fn slot_bytes(&self, index: usize, pid: u32) -> (u64, u64) {
        self.owned_slot(index, pid).map_or((0, 0), |s| {
            (s.bytes.load(SeqCst), s.ckpt_bytes.load(SeqCst))
        })
    }

    /// Calls of slot `index`'s process in flight (0 if `pid` no longer owns it).
    pub(crate) fn in_calls(&self, index: usize, pid: u32) -> u32 {
        self.owned_slot(index, pid)
            .map_or(0, |s| s.in_calls.load(SeqCst))
    }

    /// The thread id recorded when `pid` took slot `index`.
    pub(crate) fn restore_tid(&self, index: usize, pid: u32) -> Option<u32> {
        self.owned_slot(index, pid)
            .map(|s| s.restore_tid.load(SeqCst))
    }

    /// Checkpoint: the process's device memory leaves the device (`used`), kept in the slot
    /// as host memory. Off the slot first, then off `used`: a controller dying in between
    /// leaves `used` too high, never too low.
    pub(crate) fn checkpoint_memory(&self, index: usize, pid: u32) {
        if let Some(slot) = self.owned_slot(index, pid) {
            self.slot_to_host(slot);
        }
    }

    /// [`checkpoint_memory`](Self::checkpoint_memory) of one slot; repeating it is harmless.
    fn slot_to_host(&self, slot: &Slot) {
        let bytes = slot.bytes.swap(0, SeqCst);
        slot.ckpt_bytes.fetch_add(bytes, SeqCst);
        self.unreserve(bytes);
    }

    /// Restore: put the checkpointed memory back with the allocation's CAS (reclaiming dead
    /// processes and retrying once); `false` (nothing changed) if it does not fit in
    /// `total`.
    pub(crate) fn restore_memory(&self, index: usize, pid: u32, total: u64) -> bool {
        let Some(slot) = self.owned_slot(index, pid) else {
            return false;
        };
        let bytes = slot.ckpt_bytes.load(SeqCst);
        if !self.try_reserve(bytes, total) {
            self.reclaim_dead();
            if !self.try_reserve(bytes, total) {
                return false;
            }
        }
        slot.bytes.fetch_add(bytes, SeqCst);
        slot.ckpt_bytes.fetch_sub(bytes, SeqCst);
        true
    }

    /// Undo a [`restore_memory`](Self::restore_memory) (another device's did not fit).
    pub(crate) fn unrestore_memory(&self, index: usize, pid: u32) {
        self.checkpoint_memory(index, pid);
    }

    // ----- the checkpoint API: the target's side -----

    /// A call of `pid` starts: count it in slot `index`, then report whether the process
    /// may proceed (RUNNING). The count comes first so a controller that sets LOCKING and
    /// then reads the count cannot miss a call (both sequentially consistent).
    pub(crate) fn enter_call(&self, index: usize, pid: u32) -> Option<bool> {
        let slot = self.owned_slot(index, pid)?;
        slot.in_calls.fetch_add(1, SeqCst);
        Some(slot.ckpt_state.load(SeqCst) == ckpt::RUNNING)
    }

    /// A call of `pid` counted in slot `index` ends (or backs out to wait).
    pub(crate) fn leave_call(&self, index: usize, pid: u32) {
        if let Some(slot) = self.owned_slot(index, pid) {
            let _ = slot
                .in_calls
                .fetch_update(SeqCst, SeqCst, |n| Some(n.saturating_sub(1)));
        }
    }

    /// Block while slot `index`'s state is not RUNNING, for at most `timeout_ns` (a futex
    /// wait on the shared word; the controller wakes it on every transition).
    pub(crate) fn wait_running(&self, index: usize, pid: u32, timeout_ns: u64) {
        let Some(slot) = self.owned_slot(index, pid) else {
            return;
        };
        let state = slot.ckpt_state.load(SeqCst);
        if state != ckpt::RUNNING {
            futex_wait(&slot.ckpt_state, state, timeout_ns);
        }
    }

    /// `(busy_total_ns, busy_until_ns, dyn_energy_uj)` for the energy counter.
    pub(crate) fn energy_counters(&self) -> (u64, u64, u64) {
        let l = self.layout();
        (
            l.busy_total_ns.load(SeqCst),
            l.busy_until_ns.load(SeqCst),
            l.dyn_energy_uj.load(SeqCst),
        )
    }

    /// Hand out `mj` unless a larger reading was handed out already; returns the reading.
    pub(crate) fn monotonic_energy_mj(&self, mj: u64) -> u64 {
        let previous = self.layout().energy_reported_mj.fetch_max(mj, SeqCst);
        previous.max(mj)
    }
}

/// Whether ring entry `entry`, last written as index `previous`, may be reused at `now`:
/// it ended long enough ago that no reader wants it, or it was never completed (its writer
/// died, or is so late that the ring went round: then its interval is lost, not the ring).
fn reusable(entry: &Interval, previous: u64, now: u64) -> bool {
    if entry.seq.load(Acquire) != previous + 1 {
        return true;
    }
    entry.end_ns.load(SeqCst).saturating_add(KEEP_NS) < now
}

/// The state a reader sees for a raw slot state: transitional states read as the state
/// the operation started from.
fn reported_state(raw: u32) -> CheckpointState {
    match raw {
        ckpt::LOCKED | ckpt::CHECKPOINTING => CheckpointState::Locked,
        ckpt::CHECKPOINTED | ckpt::RESTORING => CheckpointState::Checkpointed,
        _ => CheckpointState::Running,
    }
}

/// `FUTEX_WAIT` on a word of the shared mapping (not `_PRIVATE`: other processes wake it)
/// while it holds `expected`, for at most `timeout_ns`.
fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let timeout = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 4-byte atomic in a shared mapping; the kernel only
    // compares it with `expected` and sleeps; `timeout` outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &timeout as *const libc::timespec,
        )
    };
}

/// Wake every process waiting on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 4-byte atomic; FUTEX_WAKE only reads its address.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

fn map_file(file: &std::fs::File) -> io::Result<NonNull<Layout>> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of a file we hold open with read/write access; the
    // kernel picks the address. The file is FILE_SIZE bytes (checked or just truncated).
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<Layout>()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

/// Create `dir` with mode 1777 (and its parents) unless it exists.
fn ensure_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    // Best effort: another user may have created it in the meantime.
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    Ok(())
}

/// Write a fresh state file under a temporary name, then rename it into place: a process
/// that still maps an old-layout file keeps its own copy instead of seeing it change shape.
fn create_file(dir: &Path, path: &Path, total_bytes: u64) -> io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(&tmp)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o666))?;
    file.set_len(FILE_SIZE as u64)?;
    let map = map_file(&file)?;
    let state = DeviceState {
        map,
        path: tmp.clone(),
    };
    let l = state.layout();
    l.created_ns.store(crate::ffi::now_ns(), SeqCst);
    l.total_bytes.store(total_bytes, SeqCst);
    l.version.store(LAYOUT_VERSION, SeqCst);
    l.slot_count.store(SLOTS as u32, SeqCst);
    l.magic.store(MAGIC, Release);
    drop(state);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `flock` on `DIR/.lock`, held only while a state file is created.
struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    fn acquire(dir: &Path) -> io::Result<DirLock> {
        let path = dir.join(".lock");
        let file = open_shared(&path)?;
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: flock on an fd we own; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(DirLock { _file: file });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Open a file every user may use. Opening an existing file without O_CREAT first matters:
/// with `fs.protected_regular`, O_CREAT on another user's file in a sticky directory fails.
fn open_shared(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    loop {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => return other,
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(path)
        {
            Ok(file) => {
                file.set_permissions(std::fs::Permissions::from_mode(0o666))?;
                return Ok(file);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No switching cost: the FIFO alone (what the tests below were written for).
    const SLICING: Slicing = Slicing {
        timeslice_ns: 1_000_000,
        context_switch_ns: 0,
    };

    fn me() -> ProcessId {
        ProcessId::current().unwrap()
    }

    /// Two contexts taking turns kernel by kernel pay a switch at each change, which is
    /// nobody's busy time; one alone, and one that reaches an idle device, pay nothing.
    #[test]
    fn a_change_of_context_behind_queued_work_costs_a_switch() {
        let dir = tempfile::tempdir().unwrap();
        let s = DeviceState::open(dir.path(), "GPU-x", 1).unwrap();
        let a = s.claim_slot(me()).unwrap();
        let b = s
            .claim_slot(ProcessId {
                pid: me().pid + 1,
                start_time: me().start_time,
            })
            .unwrap();
        let sw = Slicing {
            timeslice_ns: 1_000_000,
            context_switch_ns: 75_000,
        };
        let t0 = 10_000_000_000u64;
        // A alone, back to back: no gaps.
        assert_eq!(s.record_launch(Some(a), t0, 0, 1_000_000, 0, sw), (t0, t0 + 1_000_000));
        assert_eq!(
            s.record_launch(Some(a), t0 + 10, 0, 1_000_000, 0, sw),
            (t0 + 1_000_000, t0 + 2_000_000)
        );
        // B queues behind A's run (it waits 2 ms − 20 ns: one whole slice): a switch and a
        // round trip.
        let (b_start, _) = s.record_launch(Some(b), t0 + 20, 0, 1_000_000, 0, sw);
        assert_eq!(b_start, t0 + 2_000_000 + 3 * 75_000);
        // A queues behind B's kernel (less than a slice): one switch.
        let (a_start, _) = s.record_launch(Some(a), t0 + 30, 0, 1_000_000, 0, sw);
        assert_eq!(a_start, b_start + 1_000_000 + 75_000);
        // An event of A recorded now is stamped behind its own work; one of B, whose kernel
        // is still queued, behind A's with no switch of its own (it is a zero-length part
        // of B's slice).
        assert_eq!(s.item_start(Some(a), t0 + 40, sw), a_start + 1_000_000);
        assert_eq!(s.item_start(Some(b), t0 + 40, sw), a_start + 1_000_000);
        // Once B's work is done, an event of B waits for a switch, like its next kernel.
        assert_eq!(s.item_start(Some(b), a_start + 10, sw), a_start + 1_000_000 + 75_000);
        // B reaching the idle device later pays nothing.
        let idle = a_start + 5_000_000;
        assert_eq!(s.record_launch(Some(b), idle, 0, 10, 0, sw), (idle, idle + 10));
        assert_eq!(s.switches(), (2, 4 * 75_000));
        // The switches are nobody's busy time: the timeline holds the kernels only.
        let busy: u64 = s.timeline_since(t0).iter().map(|x| x.busy_ns).sum();
        assert_eq!(busy, 4_000_000 + 10);
    }

    #[test]
    fn layout_is_stable() {
        assert_eq!(std::mem::size_of::<Slot>(), 104);
        assert_eq!(std::mem::size_of::<Span>(), 32);
        // Read raw by tests of vgpu (tests/carbon_profile.rs, tests/watch_offences.rs),
        // which do not link this crate: keep these where they are, or update them there.
        use std::mem::offset_of;
        assert_eq!((offset_of!(Layout, locked_min_mhz), offset_of!(Layout, locked_max_mhz)), (48, 52));
        assert_eq!(offset_of!(Layout, spill), 112);
        // Read raw by tests of vgpu (tests/host/turns.rs).
        assert_eq!((offset_of!(Layout, switches), offset_of!(Layout, switch_ns)), (160, 168));
        assert_eq!(offset_of!(Layout, slots), 240);
        assert_eq!(offset_of!(Slot, spill), 72);
        assert_eq!(offset_of!(Span, busy_ns), 24);
        assert_eq!(LAYOUT_VERSION, 5, "bump it with every change of Layout");
        assert_eq!(std::mem::size_of::<Interval>(), 32);
        assert_eq!(FILE_SIZE % 8, 0);
    }

    #[test]
    fn reserve_respects_total_and_tracks_peak() {
        let dir = tempfile::tempdir().unwrap();
        let s = DeviceState::open(dir.path(), "GPU-test", 1000).unwrap();
        assert!(s.try_reserve(600, 1000));
        assert!(!s.try_reserve(401, 1000));
        assert!(s.try_reserve(400, 1000));
        s.unreserve(700);
        assert_eq!((s.used(), s.peak()), (300, 1000));
        s.reset_peak();
        assert_eq!(s.peak(), 300);
        s.unreserve(10_000);
        assert_eq!(s.used(), 0, "never below zero");
    }

    #[test]
    fn shared_between_mappings_and_recreated_on_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let a = DeviceState::open(dir.path(), "GPU-x", 1).unwrap();
        let b = DeviceState::open(dir.path(), "GPU-x", 1).unwrap();
        assert!(a.try_reserve(5, 100));
        assert_eq!(b.used(), 5);
        std::fs::write(device_file(dir.path(), "GPU-y"), b"garbage").unwrap();
        let c = DeviceState::open(dir.path(), "GPU-y", 1).unwrap();
        assert_eq!(c.used(), 0);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(c.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
    }

    #[test]
    fn slots_attribute_and_dead_processes_are_reclaimed_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = DeviceState::open(dir.path(), "GPU-z", 1).unwrap();
        let slot = s.claim_slot(me()).unwrap();
        assert!(s.try_reserve(100, 1000));
        s.slot_add(slot, 100);
        assert_eq!(s.bytes_of(me().pid), 100);

        // A "process" that died: a real child, reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = ProcessId {
            pid: child.id(),
            start_time: vgpu_abi::process::start_time(child.id()).unwrap_or(1),
        };
        child.wait().unwrap();
        let dead_slot = s.claim_slot(dead).unwrap();
        assert!(s.try_reserve(50, 1000));
        s.slot_add(dead_slot, 50);
        assert_eq!(s.used(), 150);
        assert_eq!(s.reclaim_dead(), 50);
        assert_eq!(s.reclaim_dead(), 0);
        assert_eq!(s.used(), 100);
        assert_eq!(s.processes().len(), 1);

        assert_eq!(s.release_slot(slot, me()), 100);
        assert_eq!((s.used(), s.processes().len()), (0, 0));
    }

    #[test]
    fn launches_queue_in_one_fifo_and_form_a_timeline() {
        let dir = tempfile::tempdir().unwrap();
        let s = DeviceState::open(dir.path(), "GPU-l", 1).unwrap();
        let slot = s.claim_slot(me()).unwrap();
        let first = s.record_launch(Some(slot), 1_000_000, 0, 500, 0, SLICING);
        let second = s.record_launch(Some(slot), 1_000_100, 0, 500, 0, SLICING);
        assert_eq!(
            (first, second),
            ((1_000_000, 1_000_500), (1_000_500, 1_001_000)),
            "the second waits for the first"
        );
        let other = s.record_launch(None, 1_000_200, 0, 100, 0, SLICING);
        assert_eq!(
            other,
            (1_001_000, 1_001_100),
            "another process queues behind"
        );
        let later = s.record_launch(Some(slot), 1_000_300, 5_000_000, 10, 0, SLICING);
        assert_eq!(
            later,
            (5_000_000, 5_000_010),
            "not before its stream is ready"
        );
        assert_eq!(s.busy_until_ns(), 5_000_010);
        assert_eq!(s.slot_busy_until(slot), 5_000_010);
        let pid = me().pid;
        let busy = |pid, start_ns, end_ns| Busy {
            pid,
            start_ns,
            end_ns,
            busy_ns: end_ns - start_ns,
        };
        assert_eq!(
            s.timeline_since(0),
            vec![
                busy(pid, 5_000_000, 5_000_010),
                busy(0, 1_001_000, 1_001_100),
                busy(pid, 1_000_000, 1_001_000),
            ],
            "back-to-back kernels of one process share an entry"
        );
        assert_eq!(s.timeline_since(1_001_050).len(), 2);
        assert_eq!(s.launches(), 4);
    }

    /// Issue 24 (item 8): two processes launching without synchronising queue far more
    /// kernels than the ring holds, owners alternating entry by entry. The ring used to be
    /// overwritten with future kernels, and the window that NVML reads (the last second)
    /// came out empty: 0 %. Now what does not fit goes to each process's spill span, and the
    /// device and both processes read busy.
    #[test]
    fn a_launch_storm_beyond_the_ring_loses_no_work() {
        let dir = tempfile::tempdir().unwrap();
        let s = DeviceState::open(dir.path(), "GPU-s", 1).unwrap();
        let a = s.claim_slot(me()).unwrap();
        let other = ProcessId {
            pid: me().pid + 1,
            start_time: me().start_time,
        };
        let b = s.claim_slot(other).unwrap();
        // 200 000 kernels of 10 µs each, alternating, all launched at t0: 2 s of work.
        let t0 = 10_000_000_000u64;
        for i in 0..200_000u64 {
            s.record_launch(Some(if i % 2 == 0 { a } else { b }), t0 + i, 0, 10_000, 0, SLICING);
        }
        assert_eq!(s.busy_until_ns(), t0 + 2_000_000_000);
        let window = |now: u64| {
            let from = now - crate::model::SAMPLE_WINDOW_NS;
            let items = s.timeline_since(from);
            let all = crate::model::timeline_busy_ns(items.iter().map(|x| (x.start_ns, x.end_ns, x.busy_ns)), from, now);
            let of = |pid: u32| {
                crate::model::timeline_busy_ns(items.iter().filter(|x| x.pid == pid).map(|x| (x.start_ns, x.end_ns, x.busy_ns)), from, now)
            };
            (all, of(me().pid), of(other.pid))
        };
        // Half-way through: the last second was all busy, half each.
        for now in [t0 + 1_000_000_000, t0 + 1_500_000_000, t0 + 2_000_000_000] {
            let (all, mine, theirs) = window(now);
            assert!((999_000_000..=1_000_000_000).contains(&all), "the device at {now}: {all} ns of 1 s");
            for share in [mine, theirs] {
                assert!((450_000_000..=550_000_000).contains(&share), "a process at {now}: {share} ns of 1 s ({mine}, {theirs})");
            }
        }
        // The ring holds the first 65 536 kernels exactly; the rest are in the two spans.
        let spans: Vec<Busy> = s.timeline_since(0).into_iter().filter(|x| !x.is_solid()).collect();
        assert_eq!(spans.len(), 2, "{spans:?}");
        assert_eq!(spans.iter().map(|x| x.busy_ns).sum::<u64>(), (200_000 - TIMELINE as u64) * 10_000);
        // Once it is long over, the ring is reused and the spans start afresh.
        let later = t0 + 10_000_000_000;
        s.record_launch(Some(a), later, 0, 10_000, 0, SLICING);
        let recent = s.timeline_since(later - 1);
        assert_eq!(recent.len(), 1, "{recent:?}");
        assert!(recent[0].is_solid() && recent[0].start_ns == later);
    }

    #[test]
    fn checkpoint_moves_memory_off_the_device_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = DeviceState::open(dir.path(), "GPU-c", 1).unwrap();
        let pid = me().pid;
        let slot = s.claim_slot(me()).unwrap();
        assert!(s.try_reserve(600, 1000));
        s.slot_add(slot, 600);
        assert_eq!(s.enter_call(slot, pid), Some(true));
        assert!(s.ckpt_transition(slot, pid, ckpt::RUNNING, ckpt::LOCKING));
        assert_eq!(s.in_calls(slot, pid), 1, "a call in flight is seen");
        assert_eq!(s.enter_call(slot, pid), Some(false), "new calls must wait");
        s.leave_call(slot, pid);
        s.leave_call(slot, pid);
        assert_eq!(s.in_calls(slot, pid), 0);
        assert!(s.ckpt_transition(slot, pid, ckpt::LOCKING, ckpt::LOCKED));
        assert!(!s.ckpt_transition(slot, pid, ckpt::RUNNING, ckpt::LOCKING));
        s.checkpoint_memory(slot, pid);
        assert_eq!((s.used(), s.bytes_of(pid)), (0, 0));
        assert!(s.try_reserve(500, 1000), "another process takes the memory");
        assert!(!s.restore_memory(slot, pid, 1000), "600 no longer fit");
        assert_eq!(s.used(), 500);
        s.unreserve(500);
        assert!(s.restore_memory(slot, pid, 1000));
        assert_eq!((s.used(), s.bytes_of(pid)), (600, 600));
        s.checkpoint_memory(slot, pid);
        assert!(s.ckpt_transition(slot, pid, ckpt::LOCKED, ckpt::CHECKPOINTED));
        assert_eq!(s.processes()[0].checkpoint, CheckpointState::Checkpointed);
        assert_eq!(
            s.release_slot(slot, me()),
            0,
            "checkpointed memory is not on the device"
        );
        assert_eq!((s.used(), s.processes().len()), (0, 0));
        assert_eq!(s.ckpt_state(slot, pid), None);
    }

    #[test]
    fn a_dead_controllers_operations_are_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let s = DeviceState::open(dir.path(), "GPU-o", 1).unwrap();
        let pid = me().pid;
        let slot = s.claim_slot(me()).unwrap();
        assert!(s.try_reserve(600, 1000));
        s.slot_add(slot, 600);
        let live = owner_word(me()).unwrap();
        // This process's pid with another start time: a controller whose pid was recycled.
        let dead = owner_word(ProcessId {
            pid,
            start_time: me().start_time + 1,
        })
        .unwrap();
        let begin = |owner, from, to| {
            assert_eq!(s.ckpt_claim(slot, pid, owner), Claim::Taken);
            assert!(s.ckpt_transition(slot, pid, from, to));
        };

        begin(dead, ckpt::RUNNING, ckpt::LOCKING);
        assert_eq!(s.checkpoint_op(pid), Some((CheckpointOp::Locking, pid)));
        assert_eq!(s.reclaim_dead(), 0);
        assert_eq!(
            s.ckpt_state(slot, pid),
            Some(ckpt::RUNNING),
            "lock abandoned"
        );
        assert_eq!(s.checkpoint_op(pid), None);

        begin(live, ckpt::RUNNING, ckpt::LOCKING);
        s.reclaim_dead();
        assert_eq!(
            s.ckpt_state(slot, pid),
            Some(ckpt::LOCKING),
            "a live owner's stays"
        );
        assert_eq!(s.ckpt_claim(slot, pid, live), Claim::Busy);
        assert!(s.ckpt_transition(slot, pid, ckpt::LOCKING, ckpt::LOCKED));
        s.ckpt_release(slot, pid, live);

        begin(dead, ckpt::LOCKED, ckpt::CHECKPOINTING);
        assert_eq!(s.reclaim_dead(), 600, "an abandoned checkpoint is finished");
        assert_eq!(s.ckpt_state(slot, pid), Some(ckpt::CHECKPOINTED));
        assert_eq!((s.used(), s.slot_bytes(slot, pid)), (0, (0, 600)));

        begin(dead, ckpt::CHECKPOINTED, ckpt::RESTORING);
        assert!(s.restore_memory(slot, pid, 1000));
        assert_eq!(s.used(), 600);
        // The next controller's claim resolves it first (an abandoned restore is undone).
        assert_eq!(s.ckpt_claim(slot, pid, live), Claim::Taken);
        assert_eq!(s.ckpt_state(slot, pid), Some(ckpt::CHECKPOINTED));
        assert_eq!((s.used(), s.slot_bytes(slot, pid)), (0, (0, 600)));
        s.ckpt_release(slot, pid, live);
        assert_eq!(s.release_slot(slot, me()), 0);
    }

    #[test]
    fn owner_words_round_trip() {
        let id = ProcessId {
            pid: (1 << 22) - 1,
            start_time: (1 << 42) - 1,
        };
        assert_eq!(owner_id(owner_word(id).unwrap()), id);
        assert_eq!(
            owner_word(ProcessId {
                pid: 1 << 22,
                start_time: 1
            }),
            None
        );
        assert_eq!(
            owner_word(ProcessId {
                pid: 0,
                start_time: 1
            }),
            None
        );
        assert!(!owner_dead(0), "no owner is not a dead one");
        assert!(!owner_dead(owner_word(me()).unwrap()));
    }

    #[test]
    fn checkpoint_states_are_cuda_h_values() {
        use cudarc::driver::sys::CUprocessState as P;
        assert_eq!(ckpt::RUNNING, P::CU_PROCESS_STATE_RUNNING as u32);
        assert_eq!(ckpt::LOCKED, P::CU_PROCESS_STATE_LOCKED as u32);
        assert_eq!(ckpt::CHECKPOINTED, P::CU_PROCESS_STATE_CHECKPOINTED as u32);
        for s in [
            CheckpointState::Running,
            CheckpointState::Locked,
            CheckpointState::Checkpointed,
        ] {
            assert_eq!(reported_state(s.cu_value()), s);
        }
    }
}
