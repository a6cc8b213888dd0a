//! The one definition of a vGPU's on-disk state, shared by the shim (`libvgpu.so`) and the
//! `vgpu` CLI. Both files are memory-mapped `MAP_SHARED` and updated with atomics, so the
//! layout is the machine's native byte order and alignment (the files never leave the host).
//!
//! ```text
//! $VGPU_DIR/limits                   one per vGPU, root's (0644): the same layout as `usage`
//!                                    with LIMITS_MAGIC; only its limit fields mean anything
//! $VGPU_DIR/usage                    one per vGPU, the workload user's (0600, or 0660 for a
//!                                    group's partition): UsageHeader, then device_count ×
//!                                    DeviceRecord; only its counters mean anything
//! $VGPU_DIR/procs/<pid>-<start>      one per process that allocated (ProcHeader, then
//!                                    device_count × ProcDeviceRecord)
//! <state>/gpus/<uuid>/               one directory per physical GPU that vGPUs use (root, 0755)
//! <state>/gpus/<uuid>/<vgpu-id>      one per vGPU using the GPU (BoardHeader, then one
//!                                    BoardSlot), owned by the vGPU's user, 0644: how the
//!                                    vGPUs sharing the GPU see each other's compute demand
//!                                    (crate::board). Only its own vGPU maps it; the others
//!                                    read it with pread
//! ```
//!
//! `<start>` is the process start time in clock ticks since boot (`/proc/PID/stat` field 22),
//! so a recycled pid names a different file. Every file starts with a magic and
//! [`LAYOUT_VERSION`]; a reader refuses any other version instead of misreading it.
//!
//! Changing a field's meaning, offset or size requires bumping [`LAYOUT_VERSION`]. The
//! `reserved` words are zero today; giving one a meaning later that zero already describes
//! (e.g. "no compute tokens consumed") keeps the version, as `UsageHeader::registrations`
//! did (0: "registrations are not counted", which is what the files of older vgpus say).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Version of every file's layout. A build reads exactly this version.
/// 3: the limits moved out of the tenant-writable `usage` file into root's `limits` file.
pub const LAYOUT_VERSION: u32 = 3;

/// `usage` file magic.
pub const USAGE_MAGIC: [u8; 8] = *b"VGPUUSE\0";
/// `limits` file magic.
pub const LIMITS_MAGIC: [u8; 8] = *b"VGPULIM\0";
/// Per-process file magic.
pub const PROC_MAGIC: [u8; 8] = *b"VGPUPRC\0";

/// File name of the usage file inside a vGPU directory.
pub const USAGE_FILE: &str = "usage";
/// File name of the limits file inside a vGPU directory: the quota and compute share,
/// written only by root (`vgpu`), read (mapped read-only) by the shim.
pub const LIMITS_FILE: &str = "limits";
/// Directory of the per-process files inside a vGPU directory.
pub const PROCS_DIR: &str = "procs";
/// Board slot file magic.
pub const BOARD_MAGIC: [u8; 8] = *b"VGPUBRD\0";
/// Directory of the per-GPU boards (a directory of slot files each), beside the vGPUs'
/// directory (`<state>/gpus`).
pub const BOARDS_DIR: &str = "gpus";
/// Most other vGPUs on a GPU that one vGPU takes into account.
pub const BOARD_SLOTS: usize = 64;

/// Most devices one vGPU can span.
pub const MAX_DEVICES: usize = 64;
/// Longest device UUID (bytes, without the terminating NUL) a record can hold.
pub const MAX_UUID_LEN: usize = 63;

/// Head of the `usage` file: 64 bytes.
#[repr(C)]
pub struct UsageHeader {
    /// [`USAGE_MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// `size_of::<UsageHeader>()`: where the device records start.
    pub header_size: u32,
    /// Number of [`DeviceRecord`]s that follow (1..=[`MAX_DEVICES`]).
    pub device_count: u32,
    /// `size_of::<DeviceRecord>()`.
    pub device_record_size: u32,
    /// Total file length in bytes.
    pub file_size: u64,
    /// When `vgpu` created the file (Unix time, ns).
    pub created_unix_ns: u64,
    /// Non-zero (the reclaimer's pid) while a reclaim runs under the vGPU lock. Found
    /// non-zero by the next lock holder, it means a reclaimer died half-way: the totals may
    /// then be over-counted and are reconciled.
    pub reclaimer: AtomicU64,
    /// Non-zero when a total may be over-counted (a process died in the middle of an update,
    /// a reclaimer died, a damaged process file was removed). Cleared by a reconcile.
    pub needs_reconcile: AtomicU64,
    /// 1 + the number of per-process files published so far: a process adds 1 after
    /// publishing its file and before its first reservation, so a process that listed
    /// `procs/` when this read `n` knows, while it still reads `n`, that every process
    /// holding bytes is one it listed (`crate::usage::Peers`). 0: not counted (a file made
    /// by a vgpu older than this field, whose shims do not count): nobody relies on it.
    pub registrations: AtomicU64,
}

/// One device of the vGPU: 192 bytes. The `limits` file and the `usage` file hold the same
/// records; the limit fields (`quota_bytes`, `compute_pct`, `compute_policy`, `priority`,
/// `turn_max_us`)
/// are read from `limits` only (zero in `usage`, where the workload's user could rewrite
/// them), the counters and the ledger from `usage` only (zero in `limits`). `uuid` is in
/// both and must agree.
#[repr(C)]
pub struct DeviceRecord {
    /// The device UUID as NVML prints it (`GPU-…` or `MIG-…`), NUL-padded.
    pub uuid: [u8; MAX_UUID_LEN + 1],
    /// The memory quota in bytes (limit). Changed live by `vgpu update --mem` and `vgpu
    /// partition update --mem` (`UsageFile::set_quota`): processes read it at every
    /// reservation and every `cuMemGetInfo`/NVML answer, and a reservation re-reads it after
    /// its compare-and-swap, so a lowered quota is never exceeded (`crate::usage`).
    pub quota_bytes: AtomicU64,
    /// Bytes reserved by all processes of the vGPU: the shared counter. Changed only by the
    /// compare-and-swap loop of the reserve protocol, by releases, by reclaim and reconcile.
    pub used_bytes: AtomicU64,
    /// Highest `used_bytes` ever seen.
    pub peak_bytes: AtomicU64,
    /// Compute share in percent, 1..=100 (100 = unlimited). Changed live by `vgpu update`;
    /// running processes follow at their next launch.
    pub compute_pct: AtomicU32,
    /// [`crate::compute::Policy`] as its `u32` code. Changed live.
    pub compute_policy: AtomicU32,
    /// The workload's pool priority (0..=100): served first when the GPU is oversubscribed.
    pub priority: AtomicU32,
    /// The longest turn (`crate::turn`) the vGPU takes while a vGPU of higher priority is
    /// active on the GPU, µs (`[compute] turn`, `vgpu run --turn`); 0: none beyond its share
    /// of the cycle (what this word, padding before, says in files of older vgpus).
    pub turn_max_us: AtomicU32,
    /// The vGPU's GPU-time ledger on this device, shared by all its processes.
    pub ledger: ComputeLedger,
    /// Turns (`crate::board`, issue 27), counters in `usage` only: turns this vGPU took on
    /// the GPU while another vGPU had work there, …
    pub turns_taken: AtomicU64,
    /// … time its launches waited for a turn (ns), …
    pub turn_wait_ns: AtomicU64,
    /// … and context switches avoided: launches that would have queued behind another
    /// vGPU's work (a switch on the GPU) and waited for it to drain instead, plus turns
    /// kept because nobody else was waiting. (Were reserved, zero: "none yet".)
    pub switches_avoided: AtomicU64,
}

/// A vGPU's GPU-time account on one device: 64 bytes. Times are `CLOCK_MONOTONIC`
/// nanoseconds ([`now_mono_ns`]), the same clock in every process of the host.
#[repr(C)]
#[derive(Default)]
pub struct ComputeLedger {
    /// The budget's theoretical arrival time (GCRA): the vGPU may queue new work once
    /// `tat_ns` (plus what it has in flight, scaled by its share) is not in the future.
    /// Charging `t` ns of measured GPU time at share `P` advances it by `t / P`.
    pub tat_ns: AtomicU64,
    /// All GPU time charged (measured with events), ns.
    pub charged_ns: AtomicU64,
    /// The current measurement window (for `vgpu ps`): its start and the GPU time charged in it.
    pub window_start_ns: AtomicU64,
    pub window_charged_ns: AtomicU64,
    /// Share of the GPU's time used in the last complete window (parts per million) and when
    /// that window ended.
    pub last_share_ppm: AtomicU64,
    pub last_window_end_ns: AtomicU64,
    /// Time launching threads slept for the budget, ns, and how many launches waited.
    pub throttled_ns: AtomicU64,
    pub throttled_launches: AtomicU64,
}

/// Head of a per-process file: 64 bytes.
#[repr(C)]
pub struct ProcHeader {
    /// [`PROC_MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// Number of [`ProcDeviceRecord`]s that follow; equals the usage file's device count.
    pub device_count: u32,
    pub pid: u32,
    pub _pad: u32,
    /// Start time of `pid` in clock ticks since boot.
    pub start_time: u64,
    /// Updates of the shared counters this process has begun …
    pub ops_begun: AtomicU64,
    /// … and finished. `ops_begun != ops_ended` means an update is in flight (or the process
    /// died inside one, leaving its contribution to the totals uncertain).
    pub ops_ended: AtomicU64,
    /// Last change of this record (Unix time, ns).
    pub last_update_unix_ns: AtomicU64,
    /// When the record was created (Unix time, ns).
    pub created_unix_ns: u64,
}

/// One device's figures of one process: 32 bytes.
#[repr(C)]
pub struct ProcDeviceRecord {
    /// Bytes this process has reserved on the device (its share of `DeviceRecord::used_bytes`).
    pub used_bytes: AtomicU64,
    /// Highest `used_bytes` of this process.
    pub peak_bytes: AtomicU64,
    /// GPU time this process's work was charged on the device (measured), ns.
    pub compute_ns: AtomicU64,
    pub reserved: AtomicU64,
}

/// Head of a vGPU's slot file on a GPU's board: 64 bytes.
#[repr(C)]
pub struct BoardHeader {
    /// [`BOARD_MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// Slots that follow: 1.
    pub slot_count: u32,
    /// When `vgpu` created the file (Unix time, ns).
    pub created_unix_ns: u64,
    pub reserved: [u64; 5],
}

/// One vGPU's public compute figures on a GPU's board: 64 bytes. Written by the vGPU's
/// processes (through a mapping of its own slot file), read by every vGPU on the GPU (with
/// `pread`) to decide fair shares and priority.
#[repr(C)]
pub struct BoardSlot {
    /// Until when the vGPU holds the GPU's turn (monotonic ns); 0 or past: it does not
    /// (`crate::board`, turns). Was an unused word, 0, which says exactly that.
    pub turn_until_ns: AtomicU64,
    /// Last time a process of the vGPU wrote the slot (monotonic ns); 0 = never. A slot not
    /// written for [`crate::board::ACTIVE_NS`] is not competing.
    pub heartbeat_ns: AtomicU64,
    /// The vGPU's share (parts per million), priority, and policy code, as its processes
    /// see them. Informative only: the others read these from the vGPU's `limits` file,
    /// which its tenant cannot write.
    pub share_ppm: AtomicU32,
    pub priority: AtomicU32,
    pub policy: AtomicU32,
    /// Turns between the vGPU's own processes on this GPU (`crate::turn::processes`): which
    /// process holds the turn and which waits, written by the vGPU's processes only, read by
    /// nobody else. Was padding, 0: "nobody took part yet".
    pub process_turn: AtomicU32,
    /// Until when the vGPU is known to want more GPU time than it got (monotonic ns): it
    /// had to wait for its budget.
    pub hungry_until_ns: AtomicU64,
    /// The vGPU's recent use of the GPU (parts per million of its time).
    pub usage_ppm: AtomicU64,
    /// When the work the vGPU has queued on the GPU is expected to end (monotonic ns): the
    /// hand-over of a turn waits for it. Was reserved, 0: "nothing queued".
    pub queued_until_ns: AtomicU64,
    /// Since when the vGPU waits for a turn (monotonic ns); 0: it does not. Was reserved.
    pub waiting_since_ns: AtomicU64,
}

const _: () = {
    assert!(std::mem::size_of::<UsageHeader>() == 64);
    assert!(std::mem::size_of::<DeviceRecord>() == 192);
    assert!(std::mem::size_of::<ComputeLedger>() == 64);
    assert!(std::mem::size_of::<BoardHeader>() == 64);
    assert!(std::mem::size_of::<BoardSlot>() == 64);
    assert!(std::mem::size_of::<ProcHeader>() == 64);
    assert!(std::mem::size_of::<ProcDeviceRecord>() == 32);
    assert!(std::mem::align_of::<UsageHeader>() == 8);
    assert!(std::mem::align_of::<DeviceRecord>() == 8);
};

/// Length of a usage file with `devices` device records.
pub const fn usage_file_size(devices: usize) -> usize {
    std::mem::size_of::<UsageHeader>() + devices * std::mem::size_of::<DeviceRecord>()
}

/// Length of a per-process file with `devices` device records.
pub const fn proc_file_size(devices: usize) -> usize {
    std::mem::size_of::<ProcHeader>() + devices * std::mem::size_of::<ProcDeviceRecord>()
}

/// Raise `peak` to at least `value`; a plain load first keeps the common case write-free.
#[inline]
pub fn raise_peak(peak: &AtomicU64, value: u64) {
    if value > peak.load(Ordering::Relaxed) {
        peak.fetch_max(value, Ordering::Relaxed);
    }
}

/// Unix time in nanoseconds (0 if the clock is unreadable). No allocation; vDSO fast path.
pub fn now_unix_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_REALTIME is always supported.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the host (0 if
/// unreadable). No allocation; vDSO fast path.
#[inline]
pub fn now_mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Length of a board slot file: 128 bytes.
pub const fn slot_file_size() -> usize {
    std::mem::size_of::<BoardHeader>() + std::mem::size_of::<BoardSlot>()
}
