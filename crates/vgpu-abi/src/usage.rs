//! The per-vGPU usage file and the protocol every process of the vGPU and every `vgpu`
//! command follows on it. Layout: [`crate::layout`]. Design and proofs: `crates/vgpu-shim/README.md`.
//!
//! Hot path (no lock, no allocation, no system call but `clock_gettime`):
//! - [`UsageFile::try_reserve`]: one compare-and-swap loop on the device's `used_bytes`
//!   checks the quota and adds in one atomic step, then re-reads the quota (which `vgpu
//!   update --mem` may lower live: [`UsageFile::lower_quota`]) and undoes the step if it no
//!   longer fits; then the process's own record is raised.
//! - [`UsageFile::release`]: the reverse.
//!
//! Both are bracketed by the process's `ops_begun`/`ops_ended` counters, so anyone can tell
//! whether a process (alive or dead) was in the middle of an update.
//!
//! Slow path (under the vGPU lock, [`crate::vgpu_lock`]): [`UsageFile::reclaim_dead`] (give
//! back what dead processes held) and reconcile (recompute a total from the live records
//! when a death left it uncertain). Registering a process's file takes no lock unless a
//! reclaim is under way ([`UsageFile::register`]); a refusal asks [`Peers`] first whether a
//! reclaim could help at all ([`UsageFile::nothing_to_reclaim`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::compute::Policy;
pub use crate::error::LayoutError;
use crate::layout::{
    now_mono_ns, now_unix_ns, raise_peak, usage_file_size, ComputeLedger, DeviceRecord, UsageHeader, LAYOUT_VERSION, LIMITS_FILE,
    LIMITS_MAGIC, MAX_DEVICES, MAX_UUID_LEN, PROCS_DIR, USAGE_MAGIC,
};
use crate::mapping::SharedMapping;
use crate::process::ProcessId;
use crate::procfile::{self, ProcFile};
pub use crate::procfile::RegisterStep;
use crate::vgpu_lock::VgpuLock;

mod peers;
pub use peers::{Peers, MAX_LISTING_AGE, MAX_PEERS};
use peers::Listing;

/// How long slow paths wait for the vGPU lock before giving up.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// The lock wait and the reconcile attempts of a reclaim at a hot moment (the shim, before
/// refusing an allocation).
const QUICK_LOCK_TIMEOUT: Duration = Duration::from_millis(50);
const QUICK_RECONCILE_ATTEMPTS: usize = 3;
/// A damaged per-process file of a live process is left alone; one whose owner is gone (or
/// unknown) is removed once it is older than this (it may be a file being created).
const DAMAGED_GRACE: Duration = Duration::from_secs(10);
/// Attempts of a reconcile to find all live processes between two updates.
const RECONCILE_ATTEMPTS: usize = 200;

/// One device of a vGPU, as `vgpu` creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceQuota {
    /// `GPU-…` (or `MIG-…`) as NVML and `CUDA_VISIBLE_DEVICES` print it.
    pub uuid: String,
    pub quota_bytes: u64,
    /// 1..=100; 100 = unlimited.
    pub compute_pct: u32,
    /// How the share is applied.
    pub policy: Policy,
    /// Pool priority (0..=100).
    pub priority: u32,
    /// The longest turn while a higher priority is active, µs (0: no bound beyond the
    /// share's part of the cycle; see `crate::turn`).
    pub turn_max_us: u32,
}

/// One device's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceUsage {
    pub uuid: String,
    pub quota_bytes: u64,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    pub compute_pct: u32,
    pub policy: Policy,
    pub priority: u32,
    /// GPU time charged to the vGPU on this device since it was created, ns.
    pub charged_ns: u64,
    /// Share of the device's time the vGPU used in its last measurement window (about one
    /// second), parts per million; `None` if no window ended in the last few seconds (idle).
    pub measured_share_ppm: Option<u64>,
    /// Time launching threads slept waiting for the budget, ns.
    pub throttled_ns: u64,
    /// Turns (`crate::turn`): turns taken while other vGPUs had work on the device, time
    /// launches waited for a turn (ns), context switches avoided.
    pub turns_taken: u64,
    pub turn_wait_ns: u64,
    pub switches_avoided: u64,
}

/// One process's figures (from its per-process file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUsage {
    pub pid: u32,
    pub start_time: u64,
    /// This exact process (pid + start time) still runs.
    pub alive: bool,
    /// Per device index of [`UsageFile::devices`].
    pub used_bytes: Vec<u64>,
    pub peak_bytes: Vec<u64>,
    /// GPU time its work was charged, ns, per device.
    pub compute_ns: Vec<u64>,
    pub last_update_unix_ns: u64,
}

/// What [`UsageFile::reclaim_dead`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Dead processes whose records were removed.
    pub processes: usize,
    /// Bytes given back to the totals (summed over devices).
    pub bytes: u64,
    /// A total was recomputed from the live records (after an uncertain death).
    pub reconciled: bool,
    /// The totals may still be over-counted (never under-counted): a reconcile is pending
    /// because some live process was always in the middle of an update. The next reclaim
    /// retries.
    pub reconcile_pending: bool,
    /// Problems met, one line each, naming the file (damaged records, lock busy, I/O).
    pub errors: Vec<String>,
}

/// A reservation refused by the quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverQuota {
    pub quota_bytes: u64,
    pub used_bytes: u64,
}

/// Where [`UsageFile::reconcile_observed`] calls its observer.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReconcileStep {
    /// The records are listed (and opened); the totals not yet read.
    Listed,
    /// Record `i`'s bytes are read (after the totals).
    RecordRead(usize),
}

/// Who may write a vGPU's shared counters (its `usage` file and `procs/`): the workload's
/// user, and for a partition shared by a group, that group. Nobody else; and the limits
/// (the `limits` file) only root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    pub uid: u32,
    pub gid: u32,
    /// The group may write too (a partition shared by a group).
    pub group_writable: bool,
}

impl Tenant {
    /// The calling process's effective user and group, not group-writable.
    pub fn current() -> Tenant {
        // SAFETY: geteuid/getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Tenant { uid, gid, group_writable: false }
    }

    /// Mode of the files the tenant writes: 0600, or 0660 for a group.
    pub fn file_mode(&self) -> u32 {
        if self.group_writable {
            0o660
        } else {
            0o600
        }
    }

    /// Mode of the directories the tenant creates files in (`procs/`): 0700, or 0770.
    pub fn dir_mode(&self) -> u32 {
        if self.group_writable {
            0o770
        } else {
            0o700
        }
    }
}

/// Mode of a vGPU's `limits` file (root's; everybody reads it).
pub const LIMITS_MODE: u32 = 0o644;

/// A mapped usage file, with its vGPU's limits beside it.
pub struct UsageFile {
    path: PathBuf,
    procs_dir: PathBuf,
    /// `usage`: the counters, read-write.
    map: SharedMapping,
    /// `limits`: read-write for root, read-only for everybody else (the shim of a workload
    /// that does not run as root).
    limits: SharedMapping,
    device_count: usize,
}

impl UsageFile {
    /// Write a fresh vGPU's `limits` and `usage` files (`path` is the usage file; the limits
    /// go beside it), owned by the caller: [`UsageFile::create_for`] with [`Tenant::current`].
    pub fn create(path: &Path, devices: &[DeviceQuota]) -> io::Result<()> {
        UsageFile::create_for(path, devices, Tenant::current())
    }

    /// Write a fresh vGPU's files (each through a temporary + rename: readers never see a
    /// partial file): `limits` beside `path`, owned by the caller (root) with mode 0644, then
    /// the `usage` file at `path`, owned by `tenant` with its [`Tenant::file_mode`]. The
    /// directory (and its `procs/`) must exist and be writable only by root.
    pub fn create_for(path: &Path, devices: &[DeviceQuota], tenant: Tenant) -> io::Result<()> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
        if devices.is_empty() || devices.len() > MAX_DEVICES {
            return Err(invalid(format!(
                "a vGPU needs 1 to {MAX_DEVICES} devices, got {}",
                devices.len()
            )));
        }
        for dev in devices {
            if dev.uuid.is_empty() || dev.uuid.len() > MAX_UUID_LEN || !dev.uuid.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(format!(
                    "device UUID {:?} is not 1..={MAX_UUID_LEN} printable ASCII characters",
                    dev.uuid
                )));
            }
            if !(1..=100).contains(&dev.compute_pct) {
                return Err(invalid(format!(
                    "compute share {} of {} is not 1..=100",
                    dev.compute_pct, dev.uuid
                )));
            }
        }
        let created = now_unix_ns();
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let limits = layout_bytes(LIMITS_MAGIC, created, devices, true);
        crate::mapping::write_new(&dir.join(LIMITS_FILE), &limits, None, LIMITS_MODE)?;
        let usage = layout_bytes(USAGE_MAGIC, created, devices, false);
        crate::mapping::write_new(path, &usage, Some((tenant.uid, tenant.gid)), tenant.file_mode())
    }

    /// Map the usage file at `path` read-write and its vGPU's `limits` beside it (read-write
    /// when the caller may write it, i.e. root; else read-only), and check both layouts and
    /// that they describe the same devices. Its per-process files are in `procs/` beside it.
    pub fn open(path: &Path) -> Result<UsageFile, LayoutError> {
        UsageFile::open_as(path, Access::Map)
    }

    /// [`UsageFile::open`], both files read into copies of this moment instead of mapped:
    /// for one look (a row of `vgpu ps`). Reads only: what it would write (a reclaim, a
    /// limit) is lost with the copy, so a caller that must write opens the files.
    pub fn open_copy(path: &Path) -> Result<UsageFile, LayoutError> {
        UsageFile::open_as(path, Access::Copy)
    }

    fn open_as(path: &Path, access: Access) -> Result<UsageFile, LayoutError> {
        let (map, device_count) = map_layout(path, USAGE_MAGIC, "vgpu usage file", access)?;
        let limits_path = path.parent().unwrap_or(Path::new(".")).join(LIMITS_FILE);
        let (limits, limits_count) = match map_layout(&limits_path, LIMITS_MAGIC, "vgpu limits file", access) {
            Err(LayoutError::Io { source, .. }) if access == Access::Map && source.kind() == io::ErrorKind::PermissionDenied => {
                map_layout(&limits_path, LIMITS_MAGIC, "vgpu limits file", Access::MapReadOnly)?
            }
            other => other?,
        };
        let corrupt = |reason: String| LayoutError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if limits_count != device_count {
            return Err(corrupt(format!(
                "{device_count} devices, but {} has {limits_count}",
                limits_path.display()
            )));
        }
        let usage = UsageFile {
            path: path.to_path_buf(),
            procs_dir: path.parent().unwrap_or(Path::new(".")).join(PROCS_DIR),
            map,
            limits,
            device_count,
        };
        for i in 0..device_count {
            let Some(uuid) = uuid_str(&usage.limit(i).uuid) else {
                return Err(LayoutError::Corrupt {
                    path: limits_path,
                    reason: format!("device {i} has no valid UUID"),
                });
            };
            if uuid_str(&usage.record(i).uuid) != Some(uuid) {
                return Err(corrupt(format!("device {i} is not {uuid} as in {}", limits_path.display())));
            }
            let pct = usage.limit(i).compute_pct.load(Ordering::Relaxed);
            if !(1..=100).contains(&pct) {
                return Err(LayoutError::Corrupt {
                    path: limits_path,
                    reason: format!("device {i} compute share {pct}"),
                });
            }
        }
        Ok(usage)
    }

    /// Whether this process may change the limits (it mapped `limits` read-write: root).
    pub fn limits_writable(&self) -> bool {
        self.limits.is_writable()
    }

    fn check_limits_writable(&self) -> io::Result<()> {
        if self.limits.is_writable() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: the limits are root's", self.path.display()),
            ))
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the per-process files are: `procs/` beside the usage file.
    pub fn procs_dir(&self) -> &Path {
        &self.procs_dir
    }

    pub fn device_count(&self) -> usize {
        self.device_count
    }

    /// When `vgpu` created the file (Unix ns): with a device index, the vGPU's key on a
    /// GPU's board.
    pub fn created_unix_ns(&self) -> u64 {
        self.header().created_unix_ns
    }

    fn header(&self) -> &UsageHeader {
        // SAFETY: validated in open(); the non-atomic fields are immutable after creation.
        unsafe { self.map.at(0) }
    }

    /// Device `index`'s counters (in `usage`).
    fn record(&self, index: usize) -> &DeviceRecord {
        assert!(index < self.device_count, "device index {index} out of range");
        // SAFETY: in range of the validated length; DeviceRecord is plain data and atomics,
        // and its non-atomic fields are immutable after creation.
        unsafe { self.map.at(device_offset(index)) }
    }

    /// Device `index`'s limits (in `limits`). Through a read-only mapping: only loads.
    fn limit(&self, index: usize) -> &DeviceRecord {
        assert!(index < self.device_count, "device index {index} out of range");
        // SAFETY: as record(); `limits` was validated with the same device count. Stores go
        // only through the setters, which check that the mapping is writable.
        unsafe { self.limits.at(device_offset(index)) }
    }

    /// The UUID of device `index` as stored (`GPU-…`). No allocation.
    pub fn device_uuid(&self, index: usize) -> &str {
        uuid_str(&self.limit(index).uuid).unwrap_or("")
    }

    pub fn quota_bytes(&self, index: usize) -> u64 {
        self.limit(index).quota_bytes.load(Ordering::SeqCst)
    }

    /// Change the memory quota of device `index` live. Root only (the limits file).
    ///
    /// Running processes see it at their next reservation and in `cuMemGetInfo`/NVML. A
    /// lowered quota is safe against reservations in flight: [`UsageFile::try_reserve`]
    /// re-reads the quota after its compare-and-swap and gives the bytes back if they no
    /// longer fit, so once this store is done, any reservation whose compare-and-swap comes
    /// later either fits the new quota or is undone (all `SeqCst`). What was reserved
    /// before is in `used_bytes`: a caller that lowers the quota reads it after this store
    /// and, finding it above the new quota, puts the old quota back
    /// ([`UsageFile::lower_quota`] does both).
    pub fn set_quota(&self, index: usize, bytes: u64) -> io::Result<()> {
        self.check_limits_writable()?;
        self.limit(index).quota_bytes.store(bytes, Ordering::SeqCst);
        Ok(())
    }

    /// Lower (or set) the quota of device `index` to `bytes` unless more than that is in use:
    /// store the new quota, then read the shared counter; above the new quota (in use
    /// before, or a reservation that slipped in between), the old quota goes back and the
    /// use is returned as the error. Root only.
    pub fn lower_quota(&self, index: usize, bytes: u64) -> io::Result<Result<(), u64>> {
        self.check_limits_writable()?;
        let limit = &self.limit(index).quota_bytes;
        let old = limit.swap(bytes, Ordering::SeqCst);
        let used = self.record(index).used_bytes.load(Ordering::SeqCst);
        if used > bytes {
            // Only a quota another root writer set in between is kept as it is.
            let _ = limit.compare_exchange(bytes, old, Ordering::SeqCst, Ordering::SeqCst);
            return Ok(Err(used));
        }
        Ok(Ok(()))
    }

    pub fn used_bytes(&self, index: usize) -> u64 {
        self.record(index).used_bytes.load(Ordering::SeqCst)
    }

    /// The compute share in percent (1..=100; 100 = unlimited). Out-of-range values a
    /// damaged or hostile write left are clamped.
    #[inline]
    pub fn compute_pct(&self, index: usize) -> u32 {
        self.limit(index).compute_pct.load(Ordering::Relaxed).clamp(1, 100)
    }

    /// Whether any device has a compute limit now (a share below 100 %). The launch hot
    /// path: a load per device, no checks beyond those done when the file was opened.
    #[inline(always)]
    pub fn any_compute_limited(&self) -> bool {
        (0..self.device_count).any(|i| {
            // SAFETY: `i < device_count`, whose records open() validated to lie within the
            // mapping at their (8-aligned) offsets; DeviceRecord is plain data and atomics.
            let record: &DeviceRecord = unsafe { self.limits.at_unchecked(device_offset(i)) };
            record.compute_pct.load(Ordering::Relaxed) < 100
        })
    }

    /// Change the compute share of device `index` (1..=100) live: running processes follow
    /// at their next launch. Root only (the limits file).
    pub fn set_compute_pct(&self, index: usize, pct: u32) -> io::Result<()> {
        if !(1..=100).contains(&pct) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("compute share {pct} is not 1..=100")));
        }
        self.check_limits_writable()?;
        self.limit(index).compute_pct.store(pct, Ordering::SeqCst);
        Ok(())
    }

    #[inline]
    pub fn policy(&self, index: usize) -> Policy {
        Policy::from_code(self.limit(index).compute_policy.load(Ordering::Relaxed))
    }

    /// Change the policy of device `index` live. Root only (the limits file).
    pub fn set_policy(&self, index: usize, policy: Policy) -> io::Result<()> {
        self.check_limits_writable()?;
        self.limit(index).compute_policy.store(policy.code(), Ordering::SeqCst);
        Ok(())
    }

    #[inline]
    pub fn priority(&self, index: usize) -> u32 {
        self.limit(index).priority.load(Ordering::Relaxed).min(100)
    }

    /// The longest turn of the vGPU on device `index` while a higher priority is active
    /// there (ns; 0: no bound beyond its share of the cycle).
    #[inline]
    pub fn turn_max_ns(&self, index: usize) -> u64 {
        u64::from(self.limit(index).turn_max_us.load(Ordering::Relaxed)) * 1000
    }

    /// Change the priority of device `index` live. Root only (the limits file).
    pub fn set_priority(&self, index: usize, priority: u32) -> io::Result<()> {
        self.check_limits_writable()?;
        self.limit(index).priority.store(priority.min(100), Ordering::SeqCst);
        Ok(())
    }

    /// Change the longest turn of device `index` beside a higher priority (`crate::turn`),
    /// µs (0: none beyond its share of the cycle) live: its processes read it at their next
    /// claim of a turn. Root only (the limits file).
    pub fn set_turn_max_us(&self, index: usize, us: u32) -> io::Result<()> {
        self.check_limits_writable()?;
        self.limit(index).turn_max_us.store(us, Ordering::SeqCst);
        Ok(())
    }

    /// The vGPU's GPU-time ledger on device `index` (shared by all its processes).
    #[inline]
    pub fn ledger(&self, index: usize) -> &ComputeLedger {
        &self.record(index).ledger
    }

    /// The turn counters of device `index` (`crate::turn`): turns taken, ns waited for a
    /// turn, switches avoided (in `usage`; zero in `limits`).
    pub fn turn_counters(&self, index: usize) -> [&AtomicU64; 3] {
        let r = self.record(index);
        [&r.turns_taken, &r.turn_wait_ns, &r.switches_avoided]
    }

    /// Charge `ns` of measured GPU time on device `dev` to `proc` (its per-process figure).
    #[inline]
    pub fn charge_process(&self, proc: &ProcFile, dev: usize, ns: u64) {
        proc.device(dev).compute_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The device whose UUID is these 16 bytes (as `cuDeviceGetUuid` returns them), whatever
    /// the textual prefix (`GPU-`/`MIG-`). No allocation.
    pub fn find_device(&self, uuid: &[u8; 16]) -> Option<usize> {
        (0..self.device_count).find(|&i| parse_uuid_bytes(self.device_uuid(i)).as_ref() == Some(uuid))
    }

    /// The device whose UUID string is `uuid` (exact, or the same 16 bytes).
    pub fn find_device_str(&self, uuid: &str) -> Option<usize> {
        (0..self.device_count)
            .find(|&i| self.device_uuid(i) == uuid)
            .or_else(|| {
                let bytes = parse_uuid_bytes(uuid)?;
                self.find_device(&bytes)
            })
    }

    pub fn devices(&self) -> Vec<DeviceUsage> {
        (0..self.device_count)
            .map(|i| {
                let r = self.record(i);
                DeviceUsage {
                    uuid: self.device_uuid(i).to_string(),
                    quota_bytes: self.quota_bytes(i),
                    used_bytes: r.used_bytes.load(Ordering::SeqCst),
                    peak_bytes: r.peak_bytes.load(Ordering::SeqCst),
                    compute_pct: self.compute_pct(i),
                    policy: self.policy(i),
                    priority: self.priority(i),
                    charged_ns: r.ledger.charged_ns.load(Ordering::Relaxed),
                    measured_share_ppm: crate::compute::recent_share_ppm(&r.ledger, now_mono_ns()),
                    throttled_ns: r.ledger.throttled_ns.load(Ordering::Relaxed),
                    turns_taken: r.turns_taken.load(Ordering::Relaxed),
                    turn_wait_ns: r.turn_wait_ns.load(Ordering::Relaxed),
                    switches_avoided: r.switches_avoided.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// The processes that have a per-process file (alive or not yet reclaimed), by pid.
    /// Damaged files are skipped here; [`UsageFile::reclaim_dead`] reports them.
    pub fn processes(&self) -> Vec<ProcessUsage> {
        let mut out: Vec<ProcessUsage> = self
            .proc_entries()
            .into_iter()
            .filter_map(|(id, path)| {
                let file = ProcFile::open(&path)
                    .ok()
                    .filter(|f| f.id() == id && f.device_count() == self.device_count)?;
                Some(ProcessUsage {
                    pid: id.pid,
                    start_time: id.start_time,
                    alive: id.is_alive(),
                    used_bytes: file.used(),
                    peak_bytes: file.peaks(),
                    compute_ns: file.compute_ns(),
                    last_update_unix_ns: file.header().last_update_unix_ns.load(Ordering::Relaxed),
                })
            })
            .collect();
        out.sort_by_key(|p| (p.pid, p.start_time));
        out
    }

    /// Create and publish the per-process file of `id`, then count it in `registrations`;
    /// reservations may begin once this returns. No lock, unless a reclaim is under way.
    ///
    /// A reconcile must see every record that holds bytes when it reads the totals. A
    /// reclaim sets `reclaimer` before it lists `procs/` (and reads the records it finds);
    /// this makes its file whole under its record's name (`ProcFile::create`), then — after
    /// a full barrier (the count's read-modify-write, or a fence) — reads `reclaimer`.
    /// Either the reclaim lists and reads after the file was whole, and counts it, or this
    /// read comes after the reclaim's store and sees it set, and then this waits for the
    /// vGPU lock (the reclaim's end) before returning: no reservation of this process falls
    /// inside a reconcile that does not count it. (A `reclaimer` left set by a dead
    /// reclaimer costs one uncontended lock.)
    pub fn register(&self, id: ProcessId) -> io::Result<ProcFile> {
        self.register_observed(id, &mut |_| {})
    }

    /// [`UsageFile::register`], calling `observe` at each step (tests stop or kill the
    /// process there, or interleave a reclaim).
    pub fn register_observed(&self, id: ProcessId, observe: &mut dyn FnMut(RegisterStep)) -> io::Result<ProcFile> {
        let file = ProcFile::create(&self.procs_dir, id, self.device_count, observe)?;
        observe(RegisterStep::Published);
        let header = self.header();
        // 0 (a file of an older vgpu) stays 0: its other processes do not count themselves.
        if header.registrations.load(Ordering::SeqCst) != 0 {
            header.registrations.fetch_add(1, Ordering::SeqCst);
        } else {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        if header.reclaimer.load(Ordering::SeqCst) != 0 {
            observe(RegisterStep::WaitingForReclaim);
            if let Err(e) = VgpuLock::acquire(&self.path, LOCK_TIMEOUT) {
                // A reclaim that does not end (a frozen holder) may have listed the records
                // without this one: no reservation may be made. Unpublish; a later call
                // registers again.
                let _ = std::fs::remove_file(file.path());
                return Err(e);
            }
        }
        observe(RegisterStep::Ready);
        Ok(file)
    }

    /// Reserve `bytes` on device `dev` for `proc` (this process's own, writable file): one
    /// compare-and-swap on the shared total checks the quota and adds at once, so no
    /// interleaving of processes can take the total past the quota.
    #[inline]
    pub fn try_reserve(&self, proc: &ProcFile, dev: usize, bytes: u64) -> Result<(), OverQuota> {
        debug_assert!(proc.is_writable());
        let total = self.record(dev);
        let quota = self.limit(dev).quota_bytes.load(Ordering::SeqCst);
        let mine = proc.device(dev);
        let header = proc.header();
        header.ops_begun.fetch_add(1, Ordering::SeqCst);
        let mut current = total.used_bytes.load(Ordering::SeqCst);
        let result = loop {
            let Some(next) = current.checked_add(bytes).filter(|&n| n <= quota) else {
                break Err(OverQuota {
                    quota_bytes: quota,
                    used_bytes: current,
                });
            };
            match total
                .used_bytes
                .compare_exchange_weak(current, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    // The quota may have been lowered since it was read: read again after
                    // the compare-and-swap. A `set_quota` that this load does not see comes
                    // after it, so its caller's read of the counter sees these bytes.
                    let now = self.limit(dev).quota_bytes.load(Ordering::SeqCst);
                    if next > now {
                        saturating_sub(&total.used_bytes, bytes);
                        break Err(OverQuota {
                            quota_bytes: now,
                            used_bytes: current,
                        });
                    }
                    let own = mine.used_bytes.fetch_add(bytes, Ordering::SeqCst).wrapping_add(bytes);
                    raise_peak(&mine.peak_bytes, own);
                    raise_peak(&total.peak_bytes, next);
                    break Ok(());
                }
                Err(actual) => current = actual,
            }
        };
        if result.is_ok() {
            header.last_update_unix_ns.store(now_unix_ns(), Ordering::Relaxed);
        }
        header.ops_ended.fetch_add(1, Ordering::SeqCst);
        result
    }

    /// Give back `bytes` on device `dev` that `proc` reserved earlier.
    #[inline]
    pub fn release(&self, proc: &ProcFile, dev: usize, bytes: u64) {
        debug_assert!(proc.is_writable());
        let header = proc.header();
        header.ops_begun.fetch_add(1, Ordering::SeqCst);
        saturating_sub(&proc.device(dev).used_bytes, bytes);
        if !saturating_sub(&self.record(dev).used_bytes, bytes) {
            // The total was lower than what a live process holds: someone under-counted.
            self.header().needs_reconcile.store(1, Ordering::SeqCst);
        }
        header.last_update_unix_ns.store(now_unix_ns(), Ordering::Relaxed);
        header.ops_ended.fetch_add(1, Ordering::SeqCst);
    }

    /// Give back what dead processes held (pid + start time decide, so a recycled pid is
    /// not mistaken for its predecessor), remove their files, and reconcile the totals if a
    /// death left them uncertain. Safe to call from any number of processes at once.
    pub fn reclaim_dead(&self) -> ReclaimReport {
        self.reclaim(LOCK_TIMEOUT, RECONCILE_ATTEMPTS)
    }

    /// [`UsageFile::reclaim_dead`], skipped — no lock taken — when it would find nothing to
    /// do: [`UsageFile::never_registered`] and `procs/` empty. A listing of many vGPUs
    /// (`vgpu ps`) then costs one look at the directory for each vGPU no CUDA process ever
    /// used; a vGPU whose processes counted themselves is reclaimed as ever, with no look
    /// more, and so is anything found in `procs/` (a registration killed before counting
    /// itself, or what its tenant put there: reported and removed as a reclaim does).
    pub fn reclaim_dead_if_any(&self) -> ReclaimReport {
        if self.nothing_listed_to_reclaim() {
            return ReclaimReport::default();
        }
        self.reclaim_dead()
    }

    /// Whether a reclaim would find nothing to do: [`UsageFile::never_registered`] and
    /// `procs/` empty (see [`UsageFile::reclaim_dead_if_any`]). True of a copy
    /// ([`UsageFile::open_copy`]) as of the files: a listing looks at a copy first and opens
    /// the files to reclaim only where this is false.
    pub fn nothing_listed_to_reclaim(&self) -> bool {
        let empty = || match std::fs::read_dir(&self.procs_dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(_) => false,
        };
        self.never_registered() && empty()
    }

    /// Whether no process ever counted itself in this vGPU (`registrations` still 1, as
    /// made), no reconcile is pending and no reclaim is under way or died half-way: then no
    /// process holds bytes (a process counts itself before its first reservation), and a
    /// reclaim could only remove what `procs/` holds. A file of an older vgpu (0: not
    /// counted) never qualifies.
    pub fn never_registered(&self) -> bool {
        let header = self.header();
        header.registrations.load(Ordering::SeqCst) == 1
            && header.needs_reconcile.load(Ordering::SeqCst) == 0
            && header.reclaimer.load(Ordering::SeqCst) == 0
    }

    /// [`UsageFile::reclaim_dead`] for a hot moment (the shim, before refusing an
    /// allocation): waits at most 50 ms for the lock and tries a pending reconcile only a
    /// few times, without sleeping. Whatever it leaves is over-counted, never under-counted,
    /// and the next full reclaim finishes it.
    pub fn reclaim_dead_quick(&self) -> ReclaimReport {
        self.reclaim(QUICK_LOCK_TIMEOUT, QUICK_RECONCILE_ATTEMPTS)
    }

    fn reclaim(&self, lock_timeout: Duration, reconcile_attempts: usize) -> ReclaimReport {
        self.reclaim_with(lock_timeout, reconcile_attempts, None)
    }

    /// A reclaim that also lists the live processes (see [`Peers`]).
    fn reclaim_listing(&self, lock_timeout: Duration, reconcile_attempts: usize) -> (ReclaimReport, Peers) {
        let mut peers = Peers::new();
        let report = self.reclaim_with(lock_timeout, reconcile_attempts, Some(&mut peers));
        (report, peers)
    }

    fn reclaim_with(&self, lock_timeout: Duration, reconcile_attempts: usize, peers: Option<&mut Peers>) -> ReclaimReport {
        let mut report = ReclaimReport::default();
        let _lock = match VgpuLock::acquire(&self.path, lock_timeout) {
            Ok(lock) => lock,
            Err(e) => {
                report
                    .errors
                    .push(format!("{}: cannot lock for reclaim: {e}", self.path.display()));
                return report;
            }
        };
        let header = self.header();
        let me = u64::from(std::process::id());
        // Non-zero here means the previous holder died mid-reclaim: it may have given back
        // some of a dead record's bytes without removing the record, so records are removed
        // without giving back this time and the totals are recomputed instead.
        let previous_died = header.reclaimer.swap(me, Ordering::SeqCst) != 0;
        if previous_died {
            header.needs_reconcile.store(1, Ordering::SeqCst);
        }
        let mut listing = peers.is_some().then(|| Listing::start(self));
        self.reclaim_records(!previous_died, &mut report, listing.as_mut());
        if header.needs_reconcile.load(Ordering::SeqCst) != 0 {
            report.reconciled = self.reconcile(&mut report, reconcile_attempts);
            report.reconcile_pending = !report.reconciled;
        }
        header.reclaimer.store(0, Ordering::SeqCst);
        if let (Some(peers), Some(listing)) = (peers, listing) {
            *peers = listing.finish();
        }
        report
    }

    /// Under the lock: remove the records of dead processes, giving their bytes back if
    /// `give_back`; the live ones go into `listing`, if one is being made.
    fn reclaim_records(&self, give_back: bool, report: &mut ReclaimReport, mut listing: Option<&mut Listing>) {
        let header = self.header();
        let entries = match std::fs::read_dir(&self.procs_dir) {
            Ok(entries) => entries,
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    report.errors.push(format!("{}: {e}", self.procs_dir.display()));
                    if let Some(listing) = listing {
                        listing.dead_left_behind();
                    }
                }
                return;
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            if let Some(id) = procfile::parse_temp_name(name) {
                // A registration that died between create and rename: it never reserved.
                if !id.is_alive() {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let Some(id) = procfile::parse_file_name(name) else {
                continue;
            };
            // The entry's type from the directory (never follows a link, opens nothing):
            // a record is always a regular file (created under a temporary name, renamed).
            if let Ok(kind) = entry.file_type() {
                if !kind.is_file() {
                    not_a_record(&path, crate::mapping::kind_name(&kind), report);
                    continue;
                }
            }
            let alive = match listing.as_mut() {
                Some(listing) => listing.is_alive(id),
                None => id.is_alive(),
            };
            if alive {
                continue;
            }
            // Whatever keeps this dead process's file from being removed below may be acted
            // on by a later reclaim: the listing cannot promise there is nothing to reclaim.
            let mut left_behind = || {
                if let Some(listing) = listing.as_mut() {
                    listing.dead_left_behind();
                }
            };
            let file = match ProcFile::open(&path) {
                Ok(f) if f.id() == id && f.device_count() == self.device_count => f,
                // Replaced between the listing and the open.
                Err(LayoutError::NotRegular { kind, .. }) => {
                    not_a_record(&path, kind, report);
                    continue;
                }
                Ok(_) | Err(_) => {
                    // Its usage cannot be read: remove it once surely not being written, and
                    // let a reconcile recompute the totals from the live records.
                    if older_than(&path, DAMAGED_GRACE) {
                        report.errors.push(format!(
                            "{}: damaged per-process file of a dead process removed",
                            path.display()
                        ));
                        if std::fs::remove_file(&path).is_err() {
                            left_behind();
                        }
                        header.needs_reconcile.store(1, Ordering::SeqCst);
                    } else {
                        left_behind();
                    }
                    continue;
                }
            };
            if file.quiescent_ops().is_none() {
                // Died inside an update: whether that update reached the total is unknown.
                header.needs_reconcile.store(1, Ordering::SeqCst);
            }
            let used = file.used();
            // Remove first, give back second: a record that cannot be removed (permissions)
            // must not be given back now and again by the next reclaim. A death between the
            // two leaves `reclaimer` set, and the next holder reconciles.
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    report.errors.push(format!(
                        "{}: cannot remove the record of a dead process: {e}",
                        path.display()
                    ));
                    left_behind();
                    continue;
                }
            }
            if give_back {
                for (dev, &bytes) in used.iter().enumerate() {
                    if bytes > 0 {
                        if !saturating_sub(&self.record(dev).used_bytes, bytes) {
                            header.needs_reconcile.store(1, Ordering::SeqCst);
                        }
                        // A record's figures are its process's to write: never trusted to add up.
                        report.bytes = report.bytes.saturating_add(bytes);
                    }
                }
            }
            report.processes += 1;
        }
    }

    /// Under the lock: set each total to the sum of the live records, at a moment when no
    /// process is in the middle of an update. Returns whether it got such a moment.
    ///
    /// The records that can hold bytes are fixed here: a record made whole before the
    /// reclaim began is listed, and a process whose record was not waits for the reclaim's
    /// end before its first reservation ([`UsageFile::register`]). Pass one reads every
    /// record's update counters (all quiescent), then the totals, then the per-process
    /// bytes, then the counters again: equal counters prove that no update ran in between,
    /// so the totals read equal the sum read unless a past death leaked bytes.
    /// The compare-and-swap from the total read to the sum then only succeeds if no update
    /// changed the total since; updates that changed it and changed it back (an ABA) left the
    /// records' sum changed by the same net amount, zero, so the sum is still right.
    fn reconcile(&self, report: &mut ReclaimReport, attempts: usize) -> bool {
        self.reconcile_observed(report, attempts, &mut |_| {})
    }

    /// [`Self::reconcile`], calling `observe` once the records are listed and once each
    /// record's bytes are read (tests interleave updates and registrations there).
    fn reconcile_observed(
        &self,
        report: &mut ReclaimReport,
        attempts: usize,
        observe: &mut dyn FnMut(ReconcileStep),
    ) -> bool {
        for attempt in 0..attempts {
            if attempt > 0 && attempts > 3 {
                std::thread::sleep(Duration::from_micros(if attempt < 20 { 10 } else { 200 }));
            }
            let records: Vec<ProcFile> = self
                .proc_entries()
                .into_iter()
                .filter_map(|(id, path)| ProcFile::open(&path).ok().filter(|f| f.id() == id))
                .filter(|f| f.device_count() == self.device_count)
                .collect();
            observe(ReconcileStep::Listed);
            let Some(before) = records
                .iter()
                .map(ProcFile::quiescent_ops)
                .collect::<Option<Vec<u64>>>()
            else {
                continue;
            };
            let totals: Vec<u64> = (0..self.device_count).map(|d| self.used_bytes(d)).collect();
            let mut sums = vec![0u64; self.device_count];
            for (i, file) in records.iter().enumerate() {
                for (dev, sum) in sums.iter_mut().enumerate() {
                    *sum = sum.saturating_add(file.device(dev).used_bytes.load(Ordering::SeqCst));
                }
                observe(ReconcileStep::RecordRead(i));
            }
            let after = records
                .iter()
                .map(ProcFile::quiescent_ops)
                .collect::<Option<Vec<u64>>>();
            if after.as_ref() != Some(&before) {
                continue;
            }
            let mut all_set = true;
            for dev in 0..self.device_count {
                if totals[dev] == sums[dev] {
                    continue;
                }
                let total = &self.record(dev).used_bytes;
                if total
                    .compare_exchange(totals[dev], sums[dev], Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    all_set = false;
                }
            }
            if all_set {
                self.header().needs_reconcile.store(0, Ordering::SeqCst);
                return true;
            }
        }
        report.errors.push(format!(
            "{}: totals not reconciled yet (processes kept updating); they may be over-counted until the next reclaim",
            self.path.display()
        ));
        false
    }

    /// `(process, path)` of every well-named per-process file.
    fn proc_entries(&self) -> Vec<(ProcessId, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.procs_dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let id = procfile::parse_file_name(e.file_name().to_str()?)?;
                // Only regular files are records; others are reported by reclaim. (The type
                // comes from the directory: nothing is opened or followed here.)
                if !e.file_type().ok()?.is_file() {
                    return None;
                }
                Some((id, e.path()))
            })
            .collect()
    }

    /// Ask the next [`UsageFile::reclaim_dead`] to recompute the totals from the live records.
    pub fn request_reconcile(&self) {
        self.header().needs_reconcile.store(1, Ordering::SeqCst);
    }

    /// Whether a reconcile is pending (the totals may be over-counted).
    pub fn needs_reconcile(&self) -> bool {
        self.header().needs_reconcile.load(Ordering::SeqCst) != 0
    }
}

/// A `limits` (`limits = true`: the limit fields set, counters zero) or `usage` (the
/// counters zero, limit fields zero) file's bytes.
fn layout_bytes(magic: [u8; 8], created_unix_ns: u64, devices: &[DeviceQuota], limits: bool) -> Vec<u8> {
    let mut bytes = vec![0u8; usage_file_size(devices.len())];
    let header = UsageHeader {
        magic,
        version: LAYOUT_VERSION,
        header_size: std::mem::size_of::<UsageHeader>() as u32,
        device_count: devices.len() as u32,
        device_record_size: std::mem::size_of::<DeviceRecord>() as u32,
        file_size: bytes.len() as u64,
        created_unix_ns,
        reclaimer: AtomicU64::new(0),
        needs_reconcile: AtomicU64::new(0),
        // The usage file counts its registrations (see the field); `limits` has none.
        registrations: AtomicU64::new(if limits { 0 } else { 1 }),
    };
    put(&mut bytes, 0, &header);
    for (i, dev) in devices.iter().enumerate() {
        let mut uuid = [0u8; MAX_UUID_LEN + 1];
        let len = dev.uuid.len().min(MAX_UUID_LEN);
        uuid[..len].copy_from_slice(&dev.uuid.as_bytes()[..len]);
        let limit = |v: u32| if limits { v } else { 0 };
        let record = DeviceRecord {
            uuid,
            quota_bytes: AtomicU64::new(if limits { dev.quota_bytes } else { 0 }),
            used_bytes: AtomicU64::new(0),
            peak_bytes: AtomicU64::new(0),
            compute_pct: AtomicU32::new(limit(dev.compute_pct)),
            compute_policy: AtomicU32::new(limit(dev.policy.code())),
            priority: AtomicU32::new(limit(dev.priority.min(100))),
            turn_max_us: AtomicU32::new(limit(dev.turn_max_us)),
            ledger: ComputeLedger::default(),
            turns_taken: AtomicU64::new(0),
            turn_wait_ns: AtomicU64::new(0),
            switches_avoided: AtomicU64::new(0),
        };
        put(&mut bytes, device_offset(i), &record);
    }
    bytes
}

/// How [`map_layout`] gets a file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Mapped read-write.
    Map,
    /// Mapped read-only.
    MapReadOnly,
    /// Read into a copy (`SharedMapping::copy_of`).
    Copy,
}

/// Open `path` (never through a link, never blocking) and map it (or copy it, `access`),
/// checking the common header of `usage` and `limits` files (`magic`) and the length its
/// device count implies.
fn map_layout(path: &Path, magic: [u8; 8], what: &'static str, access: Access) -> Result<(SharedMapping, usize), LayoutError> {
    let err_path = || path.to_path_buf();
    let writable = access == Access::Map;
    let (file, len) = crate::mapping::open_regular(path, writable).map_err(|e| LayoutError::from_open(path, e))?;
    let len = len as usize;
    let header_size = std::mem::size_of::<UsageHeader>();
    if len < header_size {
        // Too short to hold a magic: either a foreign file or a truncated one.
        return Err(LayoutError::Truncated {
            path: err_path(),
            len,
            expected: header_size,
        });
    }
    let map = match access {
        Access::Copy => SharedMapping::copy_of(&file, len),
        _ => SharedMapping::new(&file, len, writable),
    }
    .map_err(|e| LayoutError::Io { path: err_path(), source: e })?;
    // SAFETY: UsageHeader is plain data valid for any bytes, at page-aligned offset 0.
    let header: &UsageHeader = unsafe { map.at(0) };
    if header.magic != magic {
        return Err(LayoutError::BadMagic { path: err_path(), what });
    }
    if header.version != LAYOUT_VERSION {
        return Err(LayoutError::Version {
            path: err_path(),
            found: header.version,
        });
    }
    let corrupt = |reason: String| LayoutError::Corrupt { path: err_path(), reason };
    if header.header_size as usize != header_size || header.device_record_size as usize != std::mem::size_of::<DeviceRecord>() {
        return Err(corrupt(format!(
            "record sizes {}/{} (expected {header_size}/{})",
            header.header_size,
            header.device_record_size,
            std::mem::size_of::<DeviceRecord>()
        )));
    }
    let device_count = header.device_count as usize;
    if device_count == 0 || device_count > MAX_DEVICES {
        return Err(corrupt(format!("device count {device_count} (allowed 1..={MAX_DEVICES})")));
    }
    let expected = usage_file_size(device_count);
    if len != expected || header.file_size != expected as u64 {
        return Err(LayoutError::Truncated {
            path: err_path(),
            len,
            expected,
        });
    }
    Ok((map, device_count))
}

fn device_offset(index: usize) -> usize {
    std::mem::size_of::<UsageHeader>() + index * std::mem::size_of::<DeviceRecord>()
}

/// Subtract without wrapping; `false` if it had to stop at zero.
fn saturating_sub(counter: &AtomicU64, bytes: u64) -> bool {
    let mut exact = true;
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
        exact = v >= bytes;
        Some(v.saturating_sub(bytes))
    });
    exact
}

fn put<T>(bytes: &mut [u8], offset: usize, value: &T) {
    // SAFETY: T is one of the repr(C) plain-data layout structs; viewing it as bytes is sound.
    let raw = unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>()) };
    bytes[offset..offset + raw.len()].copy_from_slice(raw);
}

fn uuid_str(raw: &[u8; MAX_UUID_LEN + 1]) -> Option<&str> {
    let len = raw.iter().position(|&b| b == 0)?;
    let s = std::str::from_utf8(&raw[..len]).ok()?;
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())).then_some(s)
}

/// The 16 bytes of `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (any 3-letter prefix, or none).
pub fn parse_uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
    let hex = match uuid.as_bytes() {
        [a, b, c, b'-', ..] if [a, b, c].iter().all(|x| x.is_ascii_alphabetic()) => &uuid[4..],
        _ => uuid,
    };
    let mut out = [0u8; 16];
    let mut n = 0;
    let mut high: Option<u8> = None;
    for c in hex.bytes() {
        if c == b'-' {
            continue;
        }
        let v = (c as char).to_digit(16)? as u8;
        match high.take() {
            None => high = Some(v),
            Some(h) => {
                *out.get_mut(n)? = h << 4 | v;
                n += 1;
            }
        }
    }
    (n == 16 && high.is_none()).then_some(out)
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from 16 bytes (`prefix` = `GPU`).
pub fn format_uuid(prefix: &str, bytes: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| bytes[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// An entry of `procs/` named like a per-process file that is not a regular file (a FIFO,
/// symbolic link, directory… that some user put there): never opened. Root removes it
/// (unlink, or rmdir for an empty directory: nothing it points to or contains is touched);
/// anyone else leaves it. Either way it is reported, named.
fn not_a_record(path: &Path, kind: &str, report: &mut ReclaimReport) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let what = format!(
        "{}: a {kind} named like a per-process file is not a record (not opened)",
        path.display()
    );
    if !root {
        report.errors.push(format!("{what}; skipped"));
        return;
    }
    let removed = if kind == "directory" {
        std::fs::remove_dir(path)
    } else {
        std::fs::remove_file(path)
    };
    match removed {
        Ok(()) => report.errors.push(format!("{what}; removed")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => report.errors.push(format!("{what}; cannot remove it: {e}")),
    }
}

/// Whether the entry at `path` (not what a link points to) was last modified `age` ago.
fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .map(|t| t.elapsed().map(|e| e >= age).unwrap_or(false))
        .unwrap_or(true)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod safety_tests {
    use super::*;
    use crate::compute::Policy;
    use crate::layout::USAGE_FILE;
    use crate::procfile::tests::{mkfifo, without_blocking};

    fn make(dir: &Path) -> PathBuf {
        std::fs::create_dir(dir.join(PROCS_DIR)).unwrap();
        let path = dir.join(USAGE_FILE);
        UsageFile::create(
            &path,
            &[DeviceQuota {
                uuid: "GPU-8f3c9a2e-1b7d-4c55-9e0a-3d2f6b1c7e90".into(),
                quota_bytes: 1 << 30,
                compute_pct: 100,
                policy: Policy::Strict,
                priority: 50,
                turn_max_us: 0,
            }],
        )
        .unwrap();
        path
    }

    /// A copy holds what the files held when it was read: the same figures as the mapping,
    /// none of the later changes, nothing it can change; a file truncated since is an
    /// error to it, never a fault.
    #[test]
    fn a_copy_reads_the_files_as_they_were_and_cannot_be_faulted() {
        let dir = tempfile::tempdir().unwrap();
        let path = make(dir.path());
        let live = UsageFile::open(&path).unwrap();
        live.set_quota(0, 2 << 30).unwrap();
        let copy = UsageFile::open_copy(&path).unwrap();
        assert_eq!(copy.devices(), live.devices());
        assert_eq!((copy.quota_bytes(0), copy.device_uuid(0)), (2 << 30, live.device_uuid(0)));
        live.set_quota(0, 3 << 30).unwrap();
        assert_eq!(copy.quota_bytes(0), 2 << 30, "a copy of that moment");
        assert!(!copy.limits_writable());
        assert!(copy.set_quota(0, 1).is_err());
        assert_eq!(live.quota_bytes(0), 3 << 30);
        assert!(copy.nothing_listed_to_reclaim(), "nobody registered, procs/ empty");
        // Truncated between the size check and the read: an error.
        let file = std::fs::File::open(&path).unwrap();
        let len = file.metadata().unwrap().len() as usize;
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8).unwrap();
        let err = crate::mapping::SharedMapping::copy_of(&file, len).err().expect("a short file");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(UsageFile::open_copy(&path).is_err());
    }

    #[test]
    fn open_refuses_a_fifo_or_symlink_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let real = make(dir.path());
        let fifo = dir.path().join("fifo-usage");
        mkfifo(&fifo);
        let f = fifo.clone();
        let result = without_blocking("UsageFile::open of a FIFO", move || UsageFile::open(&f).map(|_| ()));
        assert!(matches!(result, Err(LayoutError::NotRegular { kind: "FIFO", .. })), "{result:?}");
        let link = dir.path().join("link-usage");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let l = link.clone();
        let result = without_blocking("UsageFile::open of a symlink", move || UsageFile::open(&l).map(|_| ()));
        assert!(
            matches!(result, Err(LayoutError::NotRegular { kind: "symbolic link", .. })),
            "{result:?}"
        );
        UsageFile::open(&real).unwrap();
    }

    #[test]
    fn reclaim_and_listing_skip_fifos_symlinks_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let usage = UsageFile::open(&make(dir.path())).unwrap();
        let procs = usage.procs_dir().to_path_buf();
        let target = dir.path().join("target");
        std::fs::write(&target, b"untouched").unwrap();
        let me = ProcessId::current().unwrap();
        let live_fifo = procs.join(procfile::file_name(me)); // named like a live process
        mkfifo(&live_fifo);
        mkfifo(&procs.join("999999-1"));
        std::os::unix::fs::symlink(&target, procs.join("999998-1")).unwrap();
        std::fs::create_dir(procs.join("999997-1")).unwrap();
        let (report, listed) = without_blocking("reclaim over non-regular entries", move || {
            let report = usage.reclaim_dead();
            (report, usage.processes())
        });
        assert!(listed.is_empty(), "{listed:?}");
        assert_eq!(report.processes, 0);
        assert_eq!(std::fs::read(&target).unwrap(), b"untouched");
        for name in ["999999-1", "999998-1", "999997-1", &procfile::file_name(me)] {
            assert!(
                report.errors.iter().any(|e| e.contains(name) && e.contains("not a record")),
                "{name} not reported: {:?}",
                report.errors
            );
        }
        // SAFETY: no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        for name in ["999999-1", "999998-1", "999997-1"] {
            assert_eq!(
                std::fs::symlink_metadata(procs.join(name)).is_ok(),
                !root,
                "{name}: root removes non-regular entries, others leave them"
            );
        }
    }
}
