//! A GPU's board: how the vGPUs sharing one physical GPU see each other's compute demand.
//!
//! `<state>/gpus/<uuid>/` is a directory (owned by root, mode 0755) holding one small slot
//! file per vGPU using the GPU, `<state>/gpus/<uuid>/<vgpu-id>` ([`BoardHeader`] + one
//! [`BoardSlot`], [`slot_file_size`] bytes), where `<vgpu-id>` is the name of the vGPU's
//! directory (`<state>/vgpus/<vgpu-id>`). The `vgpu` CLI creates the slot file when it
//! creates the vGPU, owned by the vGPU's user, mode 0644 (0664 for a partition shared by a
//! group): only the vGPU's own processes can write it, everybody can read it, and nobody
//! but root can add, replace or remove files in the directory.
//!
//! The shim of a vGPU maps only its own slot file read-write and publishes its share,
//! priority, policy, whether it wants more and how much it uses there ([`Board::publish`]).
//! It reads the other vGPUs' slot files with `pread`, never through a mapping (a file its
//! owner can truncate must never be mapped by anybody else: the mapping would fault), and
//! turns what they show into [`Competitor`]s ([`Board::snapshot`]) for
//! [`crate::compute::allowance_ppm`]: work-conserving in `fair` mode, priority order when
//! the GPU is oversubscribed. What a vGPU is entitled to (its share, policy and priority) is
//! read from its root-owned `limits` file (`<state>/vgpus/<vgpu-id>/limits`), never from
//! the slot its tenant writes; the slot only tells whether and how much it wants (its
//! heartbeat, hunger and use). A slot not published for [`ACTIVE_NS`] is not competing; one
//! that is short, has another magic or layout version, or is not a regular file is
//! ignored. The directory is listed again at most every [`RELIST_NS`] to find vGPUs that
//! came or went; between listings a refresh is one `pread` per other vGPU and allocates
//! nothing.
//!
//! A missing or damaged own slot only means "no competitors known": the vGPU then keeps
//! exactly its own share. A tenant can damage only its own slot (then it is ignored by the
//! others) and can only lie about its own demand, never about its entitlement. Another vGPU
//! without a valid limits file with a record of this GPU is ignored too.
//!
//! When `vgpu` removes a vGPU it unlinks its slot files ([`release_vgpu`]).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::compute::{Competitor, Policy};
use crate::layout::{
    now_unix_ns, slot_file_size, usage_file_size, BoardHeader, BoardSlot, DeviceRecord, UsageHeader, BOARDS_DIR, BOARD_MAGIC,
    BOARD_SLOTS, LAYOUT_VERSION, LIMITS_FILE, LIMITS_MAGIC, MAX_DEVICES, MAX_UUID_LEN,
};
use crate::mapping::SharedMapping;
use crate::usage::LayoutError;

/// A vGPU whose processes have not published for this long is not competing for the GPU
/// now (it stopped launching, or it is gone): others do not count it (ns).
pub const ACTIVE_NS: u64 = 1_000_000_000;
/// How often a [`Board`] lists the GPU's directory again for vGPUs that came or went (ns).
pub const RELIST_NS: u64 = 1_000_000_000;
/// Most competitors a [`Board::snapshot`] yields: the vGPU itself and [`BOARD_SLOTS`] others.
pub const MAX_COMPETITORS: usize = BOARD_SLOTS + 1;

/// Mode of the per-GPU directories (and of `<state>/gpus`): only root adds or removes slots.
const DIR_MODE: u32 = 0o755;

/// Whether `name` may name a slot file: non-empty, not `.` or `..`, no `/`, printable ASCII
/// (no space), at most 255 bytes. (The CLI's `state::is_plain_name`, on bytes.)
pub fn is_plain_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name != b"."
        && name != b".."
        && name.len() <= 255
        && name.iter().all(|&b| b.is_ascii_graphic() && b != b'/')
}

/// A vGPU id that names a slot: plain, and not hidden (temporary files start with a dot).
fn is_slot_name(name: &[u8]) -> bool {
    is_plain_name(name) && name[0] != b'.'
}

fn is_uuid(uuid: &str) -> bool {
    !uuid.is_empty()
        && uuid.len() <= crate::layout::MAX_UUID_LEN
        && uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `<state>/gpus/<uuid>`, the directory of GPU `uuid`'s slot files, if `uuid` is a safe
/// file name.
pub fn dir_in_state(state_dir: &Path, uuid: &str) -> Option<PathBuf> {
    is_uuid(uuid).then(|| state_dir.join(BOARDS_DIR).join(uuid))
}

/// The state directory and the vGPU id of the vGPU directory `vgpu_dir`
/// (`<state>/vgpus/<id>`), if its name is a plain name.
fn split_vgpu_dir(vgpu_dir: &Path) -> Option<(&Path, &OsStr)> {
    let id = vgpu_dir.file_name()?;
    let state = vgpu_dir.parent()?.parent()?;
    is_slot_name(id.as_bytes()).then_some((state, id))
}

/// Where the vGPU in `vgpu_dir` (`<state>/vgpus/<id>`) publishes on GPU `uuid`:
/// `<state>/gpus/<uuid>/<id>`. `None` for a UUID or id that is not a plain file name.
pub fn slot_path_for_vgpu(vgpu_dir: &Path, uuid: &str) -> Option<PathBuf> {
    let (state, id) = split_vgpu_dir(vgpu_dir)?;
    Some(dir_in_state(state, uuid)?.join(id))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---- the CLI's side: creating and removing slots ------------------------------------------

/// What [`ensure_slot`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ensured {
    /// The slot file was created (it was missing or damaged); otherwise a valid one was
    /// left as it was.
    pub created: bool,
    /// `<state>/gpus/<uuid>` was a board file of an earlier vgpu (one shared file per GPU),
    /// replaced by the directory.
    pub replaced_old_board: bool,
}

/// Make sure the vGPU `vgpu_id` has its slot file on GPU `uuid`:
/// `<state>/gpus/<uuid>/<vgpu_id>`, owned by `owner` (uid, gid), mode 0644 (0664 when
/// `group_writable`). The directories are created (mode 0755, owned by this process) unless
/// there; a board file of an earlier version in place of the GPU's directory is removed.
/// Nothing is followed through a symbolic link; a directory owned by another user or
/// writable by others is refused. A valid slot file already there is left alone; a damaged
/// one is replaced. The file is written whole before it appears (temporary + rename).
pub fn ensure_slot(
    state_dir: &Path,
    uuid: &str,
    vgpu_id: &str,
    owner: (u32, u32),
    group_writable: bool,
) -> Result<Ensured, LayoutError> {
    let gpu_dir = dir_in_state(state_dir, uuid).ok_or_else(|| LayoutError::Unsafe {
        path: state_dir.join(BOARDS_DIR),
        reason: format!("GPU UUID {uuid:?} is not a plain file name"),
    })?;
    if !is_slot_name(vgpu_id.as_bytes()) {
        return Err(LayoutError::Unsafe {
            path: gpu_dir,
            reason: format!("vGPU id {vgpu_id:?} is not a plain file name"),
        });
    }
    ensure_dir(&state_dir.join(BOARDS_DIR))?;
    let mut ensured = Ensured {
        created: false,
        replaced_old_board: false,
    };
    if let Ok(meta) = std::fs::symlink_metadata(&gpu_dir) {
        if meta.file_type().is_file() {
            // One shared board file per GPU, from an earlier vgpu: every vGPU could write it.
            std::fs::remove_file(&gpu_dir).map_err(io_err(&gpu_dir))?;
            ensured.replaced_old_board = true;
        }
    }
    ensure_dir(&gpu_dir)?;
    let path = gpu_dir.join(vgpu_id);
    if read_header(&path).is_ok() {
        return Ok(ensured);
    }
    create_slot(&gpu_dir, &path, owner, if group_writable { 0o664 } else { 0o644 })?;
    ensured.created = true;
    Ok(ensured)
}

/// Create the directory `path` (mode [`DIR_MODE`], this process's) unless it is there;
/// either way it must be a real directory of this process's user ([`crate::mapping::ensure_dir`]).
fn ensure_dir(path: &Path) -> Result<(), LayoutError> {
    crate::mapping::ensure_dir(path, DIR_MODE, None).map_err(|e| match e {
        crate::mapping::DirError::Io(e) => io_err(path)(e),
        crate::mapping::DirError::Unsafe(reason) => LayoutError::Unsafe { path: path.to_path_buf(), reason },
    })
}

/// Write a fresh slot file at `path` (in `dir`): temporary file, owner, mode, content, rename.
fn create_slot(dir: &Path, path: &Path, owner: (u32, u32), mode: u32) -> Result<(), LayoutError> {
    let mut bytes = vec![0u8; slot_file_size()];
    let header = BoardHeader {
        magic: BOARD_MAGIC,
        version: LAYOUT_VERSION,
        slot_count: 1,
        created_unix_ns: now_unix_ns(),
        reserved: [0; 5],
    };
    // SAFETY: BoardHeader is repr(C) plain data without padding (64 bytes, asserted in
    // layout.rs); the slice covers exactly it and lives no longer than `header`.
    let raw = unsafe { std::slice::from_raw_parts((&header as *const BoardHeader).cast::<u8>(), size_of::<BoardHeader>()) };
    bytes[..raw.len()].copy_from_slice(raw);
    debug_assert_eq!(path.parent(), Some(dir));
    crate::mapping::write_new(path, &bytes, Some(owner), mode).map_err(io_err(path))
}

/// Remove the slot file of the vGPU in `vgpu_dir` (`<state>/vgpus/<id>`) on every GPU it
/// uses (its workload ended; the directory is about to be removed): the others stop
/// counting it at once. The GPUs are those of its usage file; without a readable one, every
/// GPU directory is looked at. Best effort: a missing slot has nothing to give up.
pub fn release_vgpu(vgpu_dir: &Path) {
    let Some((state, id)) = split_vgpu_dir(vgpu_dir) else { return };
    // Read into a copy: only the GPUs are looked at (no mapping to make and unmap).
    match crate::usage::UsageFile::open_copy(&vgpu_dir.join(crate::layout::USAGE_FILE)) {
        Ok(usage) => {
            for device in 0..usage.device_count() {
                if let Some(dir) = dir_in_state(state, usage.device_uuid(device)) {
                    remove_slot(&dir, id);
                }
            }
        }
        Err(_) => {
            let Ok(entries) = std::fs::read_dir(state.join(BOARDS_DIR)) else { return };
            for entry in entries.flatten() {
                if is_uuid(&entry.file_name().to_string_lossy()) {
                    remove_slot(&entry.path(), id);
                }
            }
        }
    }
}

/// Remove every slot file under `<state>/gpus/` whose vGPU directory `<vgpus_dir>/<id>` is
/// gone (a `vgpu run` killed between making the slot and the vGPU): such a slot never
/// competes, but it would take a place among the [`BOARD_SLOTS`] others that are read. Call
/// with the store lock held (slots are made under it). Best effort.
pub fn remove_orphan_slots(state_dir: &Path, vgpus_dir: &Path) {
    let Ok(gpus) = std::fs::read_dir(state_dir.join(BOARDS_DIR)) else { return };
    for gpu in gpus.flatten() {
        if !is_uuid(&gpu.file_name().to_string_lossy()) || !gpu.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(slots) = std::fs::read_dir(gpu.path()) else { continue };
        for slot in slots.flatten() {
            let id = slot.file_name();
            if is_slot_name(id.as_bytes())
                && matches!(std::fs::symlink_metadata(vgpus_dir.join(&id)), Err(e) if e.kind() == io::ErrorKind::NotFound)
            {
                remove_slot(&gpu.path(), &id);
            }
        }
    }
}

/// Unlink `<gpu_dir>/<id>` if `gpu_dir` is a real directory (not a symbolic link, not an
/// old board file). `unlink` never follows a link in the last component.
fn remove_slot(gpu_dir: &Path, id: &OsStr) {
    if std::fs::symlink_metadata(gpu_dir).is_ok_and(|m| m.file_type().is_dir()) {
        let _ = std::fs::remove_file(gpu_dir.join(id));
    }
}

// ---- reading a slot file ------------------------------------------------------------------

/// A slot file's bytes as one `pread` returns them (one byte more than a slot file has).
struct Image([u8; slot_file_size() + 1]);

impl Image {
    const fn new() -> Image {
        Image([0; slot_file_size() + 1])
    }

    fn u32_at(&self, offset: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[offset..offset + 4]);
        u32::from_ne_bytes(b)
    }

    fn u64_at(&self, offset: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[offset..offset + 8]);
        u64::from_ne_bytes(b)
    }

    fn slot_u32(&self, field: usize) -> u32 {
        self.u32_at(size_of::<BoardHeader>() + field)
    }

    fn slot_u64(&self, field: usize) -> u64 {
        self.u64_at(size_of::<BoardHeader>() + field)
    }

    /// Read the slot file `file` whole: `false` unless it is exactly [`slot_file_size`]
    /// bytes long with the board magic, this layout version and one slot. One `pread`, no
    /// allocation.
    fn read(&mut self, file: &File) -> bool {
        // One byte more than the file has: a longer file is as foreign as a shorter one.
        matches!(file.read_at(&mut self.0, 0), Ok(n) if n == slot_file_size())
            && self.0[offset_of!(BoardHeader, magic)..][..BOARD_MAGIC.len()] == BOARD_MAGIC
            && self.u32_at(offset_of!(BoardHeader, version)) == LAYOUT_VERSION
            && self.u32_at(offset_of!(BoardHeader, slot_count)) == 1
    }

    /// The slot's figures, if it was published within [`ACTIVE_NS`] of `now_mono`.
    fn competitor(&self, now_mono: u64) -> Option<Competitor> {
        let heartbeat = self.slot_u64(offset_of!(BoardSlot, heartbeat_ns));
        // Never published (0), long ago, or impossibly far ahead (garbage): not competing.
        if heartbeat == 0 || now_mono.saturating_sub(heartbeat) > ACTIVE_NS || heartbeat.saturating_sub(now_mono) > ACTIVE_NS {
            return None;
        }
        Some(Competitor {
            share_ppm: u64::from(self.slot_u32(offset_of!(BoardSlot, share_ppm))),
            priority: self.slot_u32(offset_of!(BoardSlot, priority)),
            policy: Policy::from_code(self.slot_u32(offset_of!(BoardSlot, policy))),
            hungry: self.slot_u64(offset_of!(BoardSlot, hungry_until_ns)) > now_mono,
            usage_ppm: self.slot_u64(offset_of!(BoardSlot, usage_ppm)),
        })
    }
}

/// Open the slot file at `path` read-only (never through a symbolic link, never blocking on
/// a FIFO) and check its header.
fn read_header(path: &Path) -> Result<File, LayoutError> {
    let (file, _) = crate::mapping::open_regular(path, false).map_err(|e| LayoutError::from_open(path, e))?;
    let mut image = Image::new();
    if image.read(&file) {
        Ok(file)
    } else {
        Err(LayoutError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("not a vgpu board slot of layout version {LAYOUT_VERSION} ({} bytes)", slot_file_size()),
        })
    }
}

// ---- the shim's side ----------------------------------------------------------------------

/// Another vGPU's slot file, open read-only, and its limits on this GPU as of the last
/// listing.
struct Other {
    name: OsString,
    dev: u64,
    ino: u64,
    file: File,
    limits: Option<Limits>,
}

/// What another vGPU is entitled to on this GPU, from its record in its root-owned `limits`
/// file, which its tenant cannot change: its share (ppm), policy and priority.
#[derive(Clone, Copy)]
struct Limits {
    share_ppm: u64,
    policy: Policy,
    priority: u32,
}

fn ne_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_ne_bytes(b)
}

impl Limits {
    /// The limits on GPU `uuid` in the limits file of the vGPU directory `vgpu_dir`. `None`:
    /// no such file (never through a link, never a FIFO), not a limits file of this layout,
    /// no record of this GPU, or a share out of range. Slow path (the listing): open, fstat,
    /// a few `pread`s, close (no descriptor is kept: a process has one per other vGPU and
    /// device already).
    fn read(vgpu_dir: &Path, uuid: &[u8]) -> Option<Limits> {
        let (file, len) = crate::mapping::open_regular(&vgpu_dir.join(LIMITS_FILE), false).ok()?;
        let mut head = [0u8; size_of::<UsageHeader>()];
        if file.read_at(&mut head, 0).ok()? != head.len() || head[..LIMITS_MAGIC.len()] != LIMITS_MAGIC {
            return None;
        }
        let count = ne_u32(&head, offset_of!(UsageHeader, device_count)) as usize;
        let valid = ne_u32(&head, offset_of!(UsageHeader, version)) == LAYOUT_VERSION
            && ne_u32(&head, offset_of!(UsageHeader, header_size)) as usize == size_of::<UsageHeader>()
            && ne_u32(&head, offset_of!(UsageHeader, device_record_size)) as usize == size_of::<DeviceRecord>()
            && (1..=MAX_DEVICES).contains(&count)
            && len == usage_file_size(count) as u64;
        if !valid {
            return None;
        }
        for i in 0..count {
            let record = (size_of::<UsageHeader>() + i * size_of::<DeviceRecord>()) as u64;
            let mut id = [0u8; MAX_UUID_LEN + 1];
            if file.read_at(&mut id, record + offset_of!(DeviceRecord, uuid) as u64).ok()? != id.len() {
                return None;
            }
            let end = id.iter().position(|&b| b == 0).unwrap_or(id.len());
            if id[..end] == *uuid {
                return Limits::figures(&file, record);
            }
        }
        None
    }

    /// The share, policy and priority of the record at `record`.
    fn figures(file: &File, record: u64) -> Option<Limits> {
        const FROM: usize = offset_of!(DeviceRecord, compute_pct);
        const LEN: usize = offset_of!(DeviceRecord, priority) + 4 - FROM;
        let mut b = [0u8; LEN];
        if file.read_at(&mut b, record + FROM as u64).ok()? != LEN {
            return None;
        }
        let pct = ne_u32(&b, 0);
        if !(1..=100).contains(&pct) {
            return None;
        }
        Some(Limits {
            share_ppm: crate::compute::pct_to_ppm(pct),
            policy: Policy::from_code(ne_u32(&b, offset_of!(DeviceRecord, compute_policy) - FROM)),
            priority: ne_u32(&b, offset_of!(DeviceRecord, priority) - FROM),
        })
    }
}

/// One vGPU's view of a GPU's board: its own slot, mapped read-write, and the other
/// vGPUs' slot files, open read-only.
pub struct Board {
    own: SharedMapping,
    dir: PathBuf,
    /// `<state>/vgpus`, where the others' limits files are.
    vgpus_dir: PathBuf,
    uuid: String,
    own_name: OsString,
    others: Vec<Other>,
    next_list_ns: u64,
    relist_ns: u64,
    /// The directory's modification time at the last listing (ns since the epoch): a vGPU
    /// made or removed since changes it, and the next [`Board::snapshot`] lists again.
    listed_mtime_ns: i128,
}

impl Board {
    /// The board of GPU `uuid` for the vGPU in `vgpu_dir` (`<state>/vgpus/<id>`): maps its
    /// slot file `<state>/gpus/<uuid>/<id>` read-write. The others are found at the first
    /// [`Board::snapshot`].
    pub fn open(vgpu_dir: &Path, uuid: &str) -> Result<Board, LayoutError> {
        let (state, id) = split_vgpu_dir(vgpu_dir).ok_or_else(|| LayoutError::Unsafe {
            path: vgpu_dir.to_path_buf(),
            reason: "not a vGPU directory with a plain name".to_string(),
        })?;
        let dir = dir_in_state(state, uuid).ok_or_else(|| LayoutError::Unsafe {
            path: state.join(BOARDS_DIR),
            reason: format!("GPU UUID {uuid:?} is not a plain file name"),
        })?;
        let vgpus_dir = vgpu_dir.parent().unwrap_or(state).to_path_buf();
        let path = dir.join(id);
        let (file, len) = crate::mapping::open_regular(&path, true).map_err(|e| LayoutError::from_open(&path, e))?;
        if len as usize != slot_file_size() {
            return Err(LayoutError::Truncated {
                path,
                len: len as usize,
                expected: slot_file_size(),
            });
        }
        let mut image = Image::new();
        if !image.read(&file) {
            return Err(if image.0[..BOARD_MAGIC.len()] != BOARD_MAGIC {
                LayoutError::BadMagic {
                    path,
                    what: "vgpu GPU board slot",
                }
            } else if image.u32_at(offset_of!(BoardHeader, version)) != LAYOUT_VERSION {
                LayoutError::Version {
                    path,
                    found: image.u32_at(offset_of!(BoardHeader, version)),
                }
            } else {
                LayoutError::Corrupt {
                    path,
                    reason: "not one slot".to_string(),
                }
            });
        }
        let own = SharedMapping::new(&file, slot_file_size(), true).map_err(io_err(&path))?;
        Ok(Board {
            own,
            dir,
            vgpus_dir,
            uuid: uuid.to_string(),
            own_name: id.to_os_string(),
            others: Vec::with_capacity(BOARD_SLOTS),
            next_list_ns: 0,
            relist_ns: RELIST_NS,
            listed_mtime_ns: 0,
        })
    }

    /// List the directory again at most every `ns` instead of [`RELIST_NS`] (tests).
    pub fn set_relist_interval(&mut self, ns: u64) {
        self.relist_ns = ns;
    }

    fn slot(&self) -> &BoardSlot {
        // SAFETY: the mapping is slot_file_size() bytes (checked at open); the slot follows
        // the 64-byte header, 8-aligned; BoardSlot is atomics and padding, valid for any bytes.
        unsafe { self.own.at(size_of::<BoardHeader>()) }
    }

    /// Publish this vGPU's figures (every process of the vGPU writes the same slot: the
    /// latest figures win, `hungry_until` only grows).
    pub fn publish(&self, figures: Competitor, hungry_until: u64, now_mono: u64) {
        let slot = self.slot();
        slot.share_ppm.store(figures.share_ppm.min(u64::from(u32::MAX)) as u32, Ordering::Relaxed);
        slot.priority.store(figures.priority, Ordering::Relaxed);
        slot.policy.store(figures.policy.code(), Ordering::Relaxed);
        slot.usage_ppm.store(figures.usage_ppm, Ordering::Relaxed);
        slot.hungry_until_ns.fetch_max(hungry_until, Ordering::Relaxed);
        slot.heartbeat_ns.store(now_mono, Ordering::Release);
    }

    /// This vGPU's turn words as its slot holds them now.
    pub fn own_turn(&self, priority: u32) -> crate::turn::Me {
        let slot = self.slot();
        crate::turn::Me {
            priority,
            turn_until_ns: slot.turn_until_ns.load(Ordering::Acquire),
            waiting_since_ns: slot.waiting_since_ns.load(Ordering::Acquire),
            queued_until_ns: slot.queued_until_ns.load(Ordering::Acquire),
        }
    }

    /// Claim the turn until `until` (its queued work counts from `queue_from`, now or the
    /// end of the work it follows, `crate::turn::queue_start`, so that the grace of an idle
    /// holder starts at the claim); no longer waiting.
    pub fn claim_turn(&self, until: u64, queue_from: u64) {
        let slot = self.slot();
        slot.queued_until_ns.fetch_max(queue_from, Ordering::AcqRel);
        slot.waiting_since_ns.store(0, Ordering::Release);
        slot.turn_until_ns.store(until, Ordering::Release);
    }

    /// Give the turn up (if held).
    pub fn release_turn(&self) {
        self.slot().turn_until_ns.store(0, Ordering::Release);
    }

    /// Mark the vGPU as waiting for a turn since `since` (kept if already waiting).
    pub fn wait_for_turn(&self, since: u64) {
        let _ = self.slot().waiting_since_ns.compare_exchange(0, since, Ordering::AcqRel, Ordering::Acquire);
    }

    /// No longer waiting for a turn.
    pub fn stop_waiting(&self) {
        self.slot().waiting_since_ns.store(0, Ordering::Release);
    }

    /// The word of turns between the vGPU's own processes (`crate::turn::processes`), in
    /// its own slot's mapping (which lives as long as this board).
    pub fn process_turn(&self) -> &std::sync::atomic::AtomicU32 {
        &self.slot().process_turn
    }

    /// When the work the vGPU queued on the GPU is expected to end (monotonic ns).
    pub fn queued_until(&self) -> u64 {
        self.slot().queued_until_ns.load(Ordering::Acquire)
    }

    /// `gpu_ns` more work queued at `now`: the vGPU's queue on the GPU ends that much later.
    /// Returns when it ends now.
    pub fn queue(&self, gpu_ns: u64, now_mono: u64) -> u64 {
        let next = |q: u64| q.max(now_mono).saturating_add(gpu_ns);
        match self.slot().queued_until_ns.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| Some(next(q))) {
            Ok(q) | Err(q) => next(q),
        }
    }

    /// The vGPU's queue on the GPU runs `late_ns` behind what it published (a kernel of its
    /// that was expected to end by now has not): it ends that much later.
    pub fn queue_late(&self, late_ns: u64) {
        self.slot().queued_until_ns.fetch_add(late_ns, Ordering::AcqRel);
    }

    /// The turn states of the other vGPUs on the GPU (with a limits record of this GPU) into
    /// `out`, with their priority from their limits; returns how many. One that has not
    /// published within [`ACTIVE_NS`] (idle, or not started yet) is listed with no turn,
    /// queue or wait: only its priority counts (a vGPU of higher priority that exists keeps a
    /// lower one's queue short, so that its first request after a rest is served at once).
    /// One `pread` per other vGPU known at the last listing ([`Board::snapshot`] lists), no
    /// allocation.
    pub fn turn_peers(&self, now_mono: u64, out: &mut [crate::turn::Peer]) -> usize {
        let mut n = 0;
        let mut image = Image::new();
        for other in &self.others {
            if n == out.len() {
                break;
            }
            let Some(limits) = other.limits else { continue };
            let active = image.read(&other.file) && image.competitor(now_mono).is_some();
            let word = |offset: usize| if active { image.slot_u64(offset) } else { 0 };
            out[n] = crate::turn::Peer {
                priority: limits.priority,
                before_me: other.name < self.own_name,
                turn_until_ns: word(offset_of!(BoardSlot, turn_until_ns)),
                queued_until_ns: word(offset_of!(BoardSlot, queued_until_ns)),
                waiting_since_ns: word(offset_of!(BoardSlot, waiting_since_ns)),
            };
            n += 1;
        }
        n
    }

    /// Whether another vGPU of higher priority than `priority` is on the GPU (at the last
    /// listing), active or not.
    pub fn outranked(&self, priority: u32) -> bool {
        self.others.iter().any(|o| o.limits.is_some_and(|l| l.priority > priority))
    }

    /// The vGPUs competing for the GPU into `out`: `me` first (index 0), then every other
    /// vGPU that published within [`ACTIVE_NS`] of `now_mono`, with the share, policy and
    /// priority of its limits file (read at the last listing: a `vgpu update` of another
    /// vGPU is seen within [`RELIST_NS`]). Returns how many. Lists the directory again when
    /// [`RELIST_NS`] has passed or the directory changed (a vGPU made or removed: its
    /// modification time, one `lstat`), which may allocate; otherwise one `pread` per other
    /// vGPU and no allocation.
    pub fn snapshot(&mut self, me: Competitor, now_mono: u64, out: &mut [Competitor; MAX_COMPETITORS]) -> usize {
        // A vGPU made or removed since the last listing (the directory changed): list now.
        let mtime = std::fs::symlink_metadata(&self.dir).map_or(0, |m| i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()));
        if now_mono >= self.next_list_ns || mtime != self.listed_mtime_ns {
            self.next_list_ns = now_mono.saturating_add(self.relist_ns);
            self.listed_mtime_ns = mtime;
            self.relist();
        }
        out[0] = me;
        let mut n = 1;
        let mut image = Image::new();
        for other in &self.others {
            if n == MAX_COMPETITORS {
                break;
            }
            let Some(limits) = other.limits else { continue };
            if !image.read(&other.file) {
                continue;
            }
            let Some(mut c) = image.competitor(now_mono) else { continue };
            // What it is entitled to: root's word, not its tenant's.
            (c.share_ppm, c.policy, c.priority) = (limits.share_ppm, limits.policy, limits.priority);
            out[n] = c;
            n += 1;
        }
        n
    }

    /// List the GPU's directory: keep the files already open that are still there (same
    /// inode), open the new ones, forget the gone ones; find each one's limits again (its
    /// vGPU may have been made again). At most [`BOARD_SLOTS`] others.
    fn relist(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            self.others.clear();
            return;
        };
        let mut kept: Vec<Other> = Vec::with_capacity(BOARD_SLOTS);
        for entry in entries.flatten() {
            if kept.len() == BOARD_SLOTS {
                break;
            }
            let name = entry.file_name();
            if !is_slot_name(name.as_bytes()) || name == self.own_name {
                continue;
            }
            let path = entry.path();
            // Its own type, not its target's: a symbolic link is never followed.
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if !meta.file_type().is_file() {
                continue;
            }
            let limits = Limits::read(&self.vgpus_dir.join(&name), self.uuid.as_bytes());
            if let Some(i) = self.others.iter().position(|o| o.name == name && o.dev == meta.dev() && o.ino == meta.ino()) {
                let mut other = self.others.swap_remove(i);
                other.limits = limits;
                kept.push(other);
                continue;
            }
            // Regular file checked again on the descriptor (it may have been replaced).
            let Ok((file, _)) = crate::mapping::open_regular(&path, false) else { continue };
            let Ok(meta) = file.metadata() else { continue };
            kept.push(Other {
                name,
                dev: meta.dev(),
                ino: meta.ino(),
                file,
                limits,
            });
        }
        self.others = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::PPM;

    fn fig(share: u64) -> Competitor {
        Competitor {
            share_ppm: share,
            priority: 50,
            policy: Policy::Fair,
            hungry: false,
            usage_ppm: 0,
        }
    }

    fn me() -> (u32, u32) {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        unsafe { (libc::getuid(), libc::getgid()) }
    }

    /// `<state>/vgpus/<id>` with its limits and usage files: a share of `pct` % (fair,
    /// priority 50) on each GPU of `gpus`.
    fn make_vgpu(state: &Path, id: &str, gpus: &[(&str, u32)]) -> PathBuf {
        let dir = state.join("vgpus").join(id);
        std::fs::create_dir_all(dir.join(crate::layout::PROCS_DIR)).unwrap();
        let quotas: Vec<_> = gpus
            .iter()
            .map(|&(uuid, pct)| crate::usage::DeviceQuota {
                uuid: uuid.into(),
                quota_bytes: 1 << 30,
                compute_pct: pct,
                policy: Policy::Fair,
                priority: 50,
                turn_max_us: 0,
            })
            .collect();
        crate::usage::UsageFile::create(&dir.join(crate::layout::USAGE_FILE), &quotas).unwrap();
        dir
    }

    /// A state directory with a vGPU for each (id, share %) on GPU-x, and their slots there.
    fn state_with(ids: &[(&str, u32)]) -> (tempfile::TempDir, Vec<PathBuf>) {
        let state = tempfile::tempdir().unwrap();
        let dirs = ids
            .iter()
            .map(|&(id, pct)| {
                let dir = make_vgpu(state.path(), id, &[("GPU-x", pct)]);
                let e = ensure_slot(state.path(), "GPU-x", id, me(), false).unwrap();
                assert!(e.created && !e.replaced_old_board);
                dir
            })
            .collect();
        (state, dirs)
    }

    fn gpu_dir(state: &tempfile::TempDir) -> PathBuf {
        state.path().join(BOARDS_DIR).join("GPU-x")
    }

    /// A valid slot file's bytes, published at `heartbeat` with share `share`.
    fn slot_bytes(heartbeat: u64, share: u32) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        create_slot(dir.path(), &dir.path().join("s"), me(), 0o644).unwrap();
        let mut bytes = std::fs::read(dir.path().join("s")).unwrap();
        let base = size_of::<BoardHeader>();
        bytes[base + offset_of!(BoardSlot, heartbeat_ns)..][..8].copy_from_slice(&heartbeat.to_ne_bytes());
        bytes[base + offset_of!(BoardSlot, share_ppm)..][..4].copy_from_slice(&share.to_ne_bytes());
        bytes
    }

    #[test]
    fn paths_are_validated() {
        let vgpu = Path::new("/run/vgpu/vgpus/abc");
        assert_eq!(
            slot_path_for_vgpu(vgpu, "GPU-1234").unwrap(),
            PathBuf::from("/run/vgpu/gpus/GPU-1234/abc")
        );
        assert!(slot_path_for_vgpu(vgpu, "../etc").is_none());
        assert!(slot_path_for_vgpu(vgpu, "a/b").is_none());
        assert!(slot_path_for_vgpu(vgpu, "").is_none());
        assert!(slot_path_for_vgpu(Path::new("/run/vgpu/vgpus/.."), "GPU-1").is_none());
        assert!(slot_path_for_vgpu(Path::new("/run/vgpu/vgpus/.hidden"), "GPU-1").is_none());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a b", b"a\n", &[b'a'; 256]] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
        assert!(is_plain_name(b"p-svc") && is_plain_name(&[b'a'; 255]));
        let state = tempfile::tempdir().unwrap();
        assert!(ensure_slot(state.path(), "../evil", "a", me(), false).is_err());
        assert!(ensure_slot(state.path(), "GPU-x", "../a", me(), false).is_err());
        assert!(ensure_slot(state.path(), "GPU-x", ".a", me(), false).is_err());
        assert!(!state.path().join("evil").exists() && !state.path().join(BOARDS_DIR).join("a").exists());
    }

    #[test]
    fn slots_are_one_file_per_vgpu_with_explicit_modes() {
        let (state, _) = state_with(&[("a", 30)]);
        let dir = gpu_dir(&state);
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert!(std::fs::symlink_metadata(&dir).unwrap().is_dir());
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&state.path().join(BOARDS_DIR)), 0o755);
        assert_eq!(mode(&dir.join("a")), 0o644);
        assert_eq!(std::fs::metadata(dir.join("a")).unwrap().len() as usize, slot_file_size());
        assert_eq!(std::fs::metadata(dir.join("a")).unwrap().uid(), me().0);
        // Idempotent: a valid slot is left alone (same inode); a group's slot is 0664.
        let ino = std::fs::metadata(dir.join("a")).unwrap().ino();
        let e = ensure_slot(state.path(), "GPU-x", "a", me(), false).unwrap();
        assert!(!e.created);
        assert_eq!(std::fs::metadata(dir.join("a")).unwrap().ino(), ino);
        ensure_slot(state.path(), "GPU-x", "p-team", me(), true).unwrap();
        assert_eq!(mode(&dir.join("p-team")), 0o664);
        // A damaged slot is replaced; no temporary file is left behind.
        std::fs::write(dir.join("a"), b"junk").unwrap();
        assert!(ensure_slot(state.path(), "GPU-x", "a", me(), false).unwrap().created);
        assert!(read_header(&dir.join("a")).is_ok());
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        // The owner is the one given, not the creator (root can give it away).
        if me().0 == 0 {
            ensure_slot(state.path(), "GPU-x", "n", (65534, 65534), false).unwrap();
            let meta = std::fs::metadata(dir.join("n")).unwrap();
            assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (65534, 65534, 0o644));
        }
    }

    #[test]
    fn an_old_board_file_is_replaced_and_links_are_refused() {
        let state = tempfile::tempdir().unwrap();
        let gpus = state.path().join(BOARDS_DIR);
        std::fs::create_dir(&gpus).unwrap();
        std::fs::write(gpus.join("GPU-old"), vec![0u8; 4160]).unwrap();
        let e = ensure_slot(state.path(), "GPU-old", "a", me(), false).unwrap();
        assert!(e.replaced_old_board && e.created);
        assert!(std::fs::symlink_metadata(gpus.join("GPU-old")).unwrap().is_dir());
        // A symbolic link in place of the GPU's directory is not followed, nor replaced.
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), gpus.join("GPU-link")).unwrap();
        let err = ensure_slot(state.path(), "GPU-link", "a", me(), false).unwrap_err();
        assert!(matches!(err, LayoutError::Unsafe { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
        // A slot name that is a symbolic link is replaced, its target untouched.
        let target = elsewhere.path().join("t");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, gpus.join("GPU-old").join("b")).unwrap();
        assert!(ensure_slot(state.path(), "GPU-old", "b", me(), false).unwrap().created);
        assert!(std::fs::symlink_metadata(gpus.join("GPU-old").join("b")).unwrap().is_file());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }

    #[test]
    fn publish_and_snapshot_across_two_slot_files() {
        let (_state, dirs) = state_with(&[("a", 30), ("b", 70)]);
        let mut a = Board::open(&dirs[0], "GPU-x").unwrap();
        let mut b = Board::open(&dirs[1], "GPU-x").unwrap();
        let now = 10 * ACTIVE_NS;
        let mut mine = fig(300_000);
        mine.hungry = true;
        a.publish(mine, now + 5, now);
        b.publish(fig(700_000), 0, now);
        let mut out = [fig(0); MAX_COMPETITORS];
        let n = a.snapshot(mine, now + 1, &mut out);
        assert_eq!(n, 2, "itself and b");
        assert_eq!(out[0].share_ppm, 300_000);
        assert!(out[0].hungry);
        assert_eq!(out[1].share_ppm, 700_000);
        assert!(!out[1].hungry);
        assert_eq!(out[..n].iter().map(|c| c.share_ppm).sum::<u64>(), PPM);
        // b sees a as a publishes it, hungry until now + 5.
        let n = b.snapshot(fig(700_000), now + 1, &mut out);
        assert_eq!(n, 2);
        assert_eq!((out[1].share_ppm, out[1].hungry, out[1].policy), (300_000, true, Policy::Fair));
        // Several processes of one vGPU write one slot: hungry_until only grows.
        let a2 = Board::open(&dirs[0], "GPU-x").unwrap();
        a2.publish(fig(300_000), 0, now + 2);
        b.snapshot(fig(700_000), now + 3, &mut out);
        assert!(out[1].hungry, "a later publish without hunger does not end a's");
        // What a vGPU is entitled to comes from its limits (root's), not from its slot: b
        // claiming the whole GPU at top priority, strict, changes nothing a sees but b's demand.
        b.publish(
            Competitor {
                share_ppm: PPM,
                priority: 100,
                policy: Policy::Strict,
                hungry: true,
                usage_ppm: 5,
            },
            now + 10,
            now + 3,
        );
        a.snapshot(mine, now + 4, &mut out);
        assert_eq!((out[1].share_ppm, out[1].priority, out[1].policy), (700_000, 50, Policy::Fair));
        assert_eq!((out[1].hungry, out[1].usage_ppm), (true, 5));
        // A live `vgpu update` of b's share is seen at a's next listing.
        let usage = crate::usage::UsageFile::open(&dirs[1].join(crate::layout::USAGE_FILE)).unwrap();
        usage.set_compute_pct(0, 50).unwrap();
        a.snapshot(mine, now + 5, &mut out);
        assert_eq!(out[1].share_ppm, 700_000, "not before");
        b.publish(fig(0), 0, now + 1 + RELIST_NS);
        a.snapshot(mine, now + 1 + RELIST_NS, &mut out);
        assert_eq!(out[1].share_ppm, 500_000);
        // The mapping is shared with the file.
        let bytes = std::fs::read(slot_path_for_vgpu(&dirs[0], "GPU-x").unwrap()).unwrap();
        let hb = size_of::<BoardHeader>() + offset_of!(BoardSlot, heartbeat_ns);
        assert_eq!(u64::from_ne_bytes(bytes[hb..hb + 8].try_into().unwrap()), now + 2);
    }

    #[test]
    fn a_vgpu_that_stopped_publishing_does_not_compete() {
        let (_state, dirs) = state_with(&[("a", 30), ("b", 70)]);
        let mut a = Board::open(&dirs[0], "GPU-x").unwrap();
        let b = Board::open(&dirs[1], "GPU-x").unwrap();
        let now = 10 * ACTIVE_NS;
        b.publish(fig(700_000), 0, now);
        let mut out = [fig(0); MAX_COMPETITORS];
        assert_eq!(a.snapshot(fig(300_000), now + ACTIVE_NS, &mut out), 2);
        assert_eq!(a.snapshot(fig(300_000), now + ACTIVE_NS + 1, &mut out), 1, "b is stale");
        // A heartbeat far in the future is garbage, not "active forever".
        b.publish(fig(700_000), 0, now + 100 * ACTIVE_NS);
        assert_eq!(a.snapshot(fig(300_000), now + 2 * ACTIVE_NS, &mut out), 1);
        // Never published: not competing.
        let (_s, dirs) = state_with(&[("c", 30), ("d", 70)]);
        let mut c = Board::open(&dirs[0], "GPU-x").unwrap();
        assert_eq!(c.snapshot(fig(1), now, &mut out), 1);
    }

    /// `snapshot` on another thread, failing the test if it does not return within 10 s.
    fn snapshot_in_time(board: Board, now: u64) -> (Board, usize, [Competitor; MAX_COMPETITORS]) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut board = board;
            let mut out = [fig(0); MAX_COMPETITORS];
            let n = board.snapshot(fig(1), now, &mut out);
            let _ = tx.send((board, n, out));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("snapshot blocked")
    }

    #[test]
    fn damaged_foreign_and_special_slots_are_ignored_without_blocking() {
        let (state, dirs) = state_with(&[("a", 30), ("b", 70)]);
        let dir = gpu_dir(&state);
        let now = 10 * ACTIVE_NS;
        let b = Board::open(&dirs[1], "GPU-x").unwrap();
        b.publish(fig(200_000), 0, now);
        let good = slot_bytes(now, 100_000);
        // Every name below is a vGPU with valid limits (10 % on GPU-x): only its slot is bad.
        for name in ["short", "long", "garbage", "version", "slots", "link", "fifo", "subdir", "valid"] {
            make_vgpu(state.path(), name, &[("GPU-x", 10)]);
        }
        // Short, long, garbage, another version, several slots: all published "now".
        std::fs::write(dir.join("short"), &good[..good.len() - 1]).unwrap();
        let mut long = good.clone();
        long.push(0);
        std::fs::write(dir.join("long"), &long).unwrap();
        let mut garbage = good.clone();
        garbage[..8].copy_from_slice(b"NOTABRD\0");
        std::fs::write(dir.join("garbage"), &garbage).unwrap();
        let mut version = good.clone();
        version[offset_of!(BoardHeader, version)..][..4].copy_from_slice(&(LAYOUT_VERSION + 1).to_ne_bytes());
        std::fs::write(dir.join("version"), &version).unwrap();
        let mut slots = good.clone();
        slots[offset_of!(BoardHeader, slot_count)..][..4].copy_from_slice(&2u32.to_ne_bytes());
        std::fs::write(dir.join("slots"), &slots).unwrap();
        // A symbolic link to a valid, active slot file; a FIFO; a directory.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("valid"), &good).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("valid"), dir.join("link")).unwrap();
        let fifo = std::ffi::CString::new(dir.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        std::fs::create_dir(dir.join("subdir")).unwrap();
        // A valid one, to be sure the others are not ignored for another reason.
        std::fs::write(dir.join("valid"), &good).unwrap();
        // Valid, active slots whose vGPU has no limits, no record of this GPU, or limits that
        // are a link to valid ones: what they are entitled to is unknown, they are ignored.
        std::fs::write(dir.join("nolimits"), &good).unwrap();
        make_vgpu(state.path(), "elsewhere", &[("GPU-q", 10)]);
        std::fs::write(dir.join("elsewhere"), &good).unwrap();
        let linked = state.path().join("vgpus").join("linked");
        std::fs::create_dir_all(&linked).unwrap();
        std::os::unix::fs::symlink(state.path().join("vgpus/valid").join(LIMITS_FILE), linked.join(LIMITS_FILE)).unwrap();
        std::fs::write(dir.join("linked"), &good).unwrap();

        let a = Board::open(&dirs[0], "GPU-x").unwrap();
        let (a, n, out) = snapshot_in_time(a, now);
        let mut shares: Vec<u64> = out[1..n].iter().map(|c| c.share_ppm).collect();
        shares.sort();
        assert_eq!(shares, [100_000, 700_000], "only b and valid count, with their limits' shares");

        // b's owner truncates its slot file, then fills it with garbage: a reader that had
        // mapped it would fault; a pread sees a short or foreign file and ignores it.
        let b_path = dir.join("b");
        let file = std::fs::OpenOptions::new().write(true).open(&b_path).unwrap();
        file.set_len(0).unwrap();
        let (a, n, _) = snapshot_in_time(a, now);
        assert_eq!(n, 2, "truncated b is ignored");
        file.set_len(slot_file_size() as u64).unwrap();
        let (a, n, _) = snapshot_in_time(a, now);
        assert_eq!(n, 2, "zeroed b is ignored");
        // Restored whole, b counts again (the same open file).
        file.write_all_at(&slot_bytes(now, 200_000), 0).unwrap();
        let (_a, n, _) = snapshot_in_time(a, now);
        assert_eq!(n, 3);
    }

    /// Set the GPU directory's modification time back to 1970: the next change of its
    /// entries gives it a different one, however coarse the filesystem's clock.
    fn age_dir(dir: &Path) {
        let old = std::fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1));
        std::fs::File::open(dir).unwrap().set_times(old).unwrap();
    }

    #[test]
    fn vgpus_that_come_and_go_are_seen_at_the_next_snapshot() {
        let (state, dirs) = state_with(&[("a", 30)]);
        let dir = gpu_dir(&state);
        let mut a = Board::open(&dirs[0], "GPU-x").unwrap();
        a.set_relist_interval(50_000_000);
        let t0 = 10 * ACTIVE_NS;
        let mut out = [fig(0); MAX_COMPETITORS];
        age_dir(&dir);
        assert_eq!(a.snapshot(fig(1), t0, &mut out), 1);
        // c arrives and publishes: its slot changes the directory, which is listed again.
        let c_dir = make_vgpu(state.path(), "c", &[("GPU-x", 40)]);
        ensure_slot(state.path(), "GPU-x", "c", me(), false).unwrap();
        let c = Board::open(&c_dir, "GPU-x").unwrap();
        c.publish(fig(400_000), 0, t0 + 10_000_000);
        assert_eq!(a.snapshot(fig(1), t0 + 10_000_000, &mut out), 2, "found at once");
        assert_eq!(out[1].share_ppm, 400_000);
        // Nothing changed: no listing before the interval (a file put back under the same
        // modification time is not seen until then).
        age_dir(&dir);
        assert_eq!(a.snapshot(fig(1), t0 + 20_000_000, &mut out), 2);
        let extra = make_vgpu(state.path(), "d", &[("GPU-x", 10)]);
        ensure_slot(state.path(), "GPU-x", "d", me(), false).unwrap();
        Board::open(&extra, "GPU-x").unwrap().publish(fig(100_000), 0, t0 + 30_000_000);
        age_dir(&dir);
        assert_eq!(a.snapshot(fig(1), t0 + 30_000_000, &mut out), 2, "not listed again yet");
        assert_eq!(a.snapshot(fig(1), t0 + 70_000_000, &mut out), 3, "found at the next listing");
        std::fs::remove_file(dir.join("d")).unwrap();
        age_dir(&dir);
        assert_eq!(a.snapshot(fig(1), t0 + 130_000_000, &mut out), 2);
        // c's slot is removed (its vGPU is gone) and made again (a new vGPU of that name,
        // at 60 %): the old file, still open, is forgotten; the new one is read.
        std::fs::remove_file(dir.join("c")).unwrap();
        std::fs::remove_dir_all(&c_dir).unwrap();
        make_vgpu(state.path(), "c", &[("GPU-x", 60)]);
        ensure_slot(state.path(), "GPU-x", "c", me(), false).unwrap();
        let c2 = Board::open(&c_dir, "GPU-x").unwrap();
        c2.publish(fig(600_000), 0, t0 + 140_000_000);
        c.publish(fig(400_000), t0 + 200_000_000, t0 + 140_000_000);
        assert_eq!(a.snapshot(fig(1), t0 + 140_000_000, &mut out), 2);
        assert!(!out[1].hungry, "the new file");
        assert_eq!(out[1].share_ppm, 600_000, "with the new vGPU's limits");
        // Removed for good: gone at once, though its old file is still fresh.
        age_dir(&dir);
        assert_eq!(a.snapshot(fig(1), t0 + 145_000_000, &mut out), 2);
        std::fs::remove_file(dir.join("c")).unwrap();
        c.publish(fig(400_000), 0, t0 + 150_000_000);
        c2.publish(fig(600_000), 0, t0 + 150_000_000);
        assert_eq!(a.snapshot(fig(1), t0 + 150_000_000, &mut out), 1);
    }

    #[test]
    fn every_vgpu_on_the_gpu_is_a_turn_peer_and_a_resting_one_only_by_its_priority() {
        let (state, dirs) = state_with(&[("a", 30), ("b", 70)]);
        let mut a = Board::open(&dirs[0], "GPU-x").unwrap();
        let b = Board::open(&dirs[1], "GPU-x").unwrap();
        let now = 10 * ACTIVE_NS;
        let mut out = [fig(0); MAX_COMPETITORS];
        a.snapshot(fig(300_000), now, &mut out);
        let mut peers = [crate::turn::Peer::default(); MAX_COMPETITORS];
        // b never published (its process has not launched yet): listed, with no turn words.
        b.claim_turn(now + 5_000_000, now);
        b.queue(1_000_000, now);
        assert_eq!(a.turn_peers(now, &mut peers), 1);
        assert_eq!(peers[0], crate::turn::Peer { priority: 50, before_me: false, ..Default::default() });
        // Published: its words.
        b.publish(fig(700_000), 0, now);
        assert_eq!(a.turn_peers(now + 1, &mut peers), 1);
        assert_eq!((peers[0].turn_until_ns, peers[0].queued_until_ns), (now + 5_000_000, now + 1_000_000));
        // Resting for longer than ACTIVE_NS: its priority only again.
        assert_eq!(a.turn_peers(now + ACTIVE_NS + 1, &mut peers), 1);
        assert_eq!((peers[0].turn_until_ns, peers[0].queued_until_ns), (0, 0));
        // Outranked by a vGPU of higher priority on the GPU, resting or not (its limits).
        assert!(!a.outranked(50));
        let usage = crate::usage::UsageFile::open(&dirs[1].join(crate::layout::USAGE_FILE)).unwrap();
        usage.set_priority(0, 90).unwrap();
        a.snapshot(fig(300_000), now + 2 * ACTIVE_NS, &mut out);
        assert!(a.outranked(50) && !a.outranked(90));
        assert_eq!(a.turn_peers(now + 2 * ACTIVE_NS, &mut peers), 1);
        assert_eq!(peers[0].priority, 90);
        drop(state);
    }

    #[test]
    fn at_most_board_slots_others_are_read() {
        let (state, dirs) = state_with(&[("a", 30)]);
        let dir = gpu_dir(&state);
        let now = 10 * ACTIVE_NS;
        let good = slot_bytes(now, 1000);
        for i in 0..BOARD_SLOTS + 5 {
            make_vgpu(state.path(), &format!("v{i}"), &[("GPU-x", 1)]);
            std::fs::write(dir.join(format!("v{i}")), &good).unwrap();
        }
        let mut a = Board::open(&dirs[0], "GPU-x").unwrap();
        let mut out = [fig(0); MAX_COMPETITORS];
        assert_eq!(a.snapshot(fig(1), now, &mut out), MAX_COMPETITORS);
    }

    #[test]
    fn release_removes_the_vgpus_slots_only() {
        let (state, dirs) = state_with(&[("b", 70)]);
        let a = make_vgpu(state.path(), "a", &[("GPU-x", 30), ("GPU-y", 30)]);
        let dirs = [a, dirs[0].clone()];
        ensure_slot(state.path(), "GPU-x", "a", me(), false).unwrap();
        ensure_slot(state.path(), "GPU-y", "a", me(), false).unwrap();
        ensure_slot(state.path(), "GPU-z", "a", me(), false).unwrap();
        release_vgpu(&dirs[0]);
        let gpus = state.path().join(BOARDS_DIR);
        assert!(!gpus.join("GPU-x/a").exists() && !gpus.join("GPU-y/a").exists());
        assert!(gpus.join("GPU-z/a").exists(), "not a GPU of its usage file");
        assert!(gpus.join("GPU-x/b").exists(), "another vGPU's slot stays");
        release_vgpu(&dirs[1]);
        assert!(!gpus.join("GPU-x/b").exists());
        // Without a usage file, every GPU's directory is looked at.
        std::fs::create_dir_all(state.path().join("vgpus/z")).unwrap();
        std::fs::rename(gpus.join("GPU-z/a"), gpus.join("GPU-z/z")).unwrap();
        release_vgpu(&state.path().join("vgpus/z"));
        assert!(!gpus.join("GPU-z/z").exists());
        // A GPU directory that is a symbolic link is not followed.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("q"), b"keep").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), gpus.join("GPU-w")).unwrap();
        std::fs::create_dir_all(state.path().join("vgpus/q")).unwrap();
        release_vgpu(&state.path().join("vgpus/q"));
        assert!(elsewhere.path().join("q").exists());
    }

    #[test]
    fn orphan_slots_are_removed() {
        let (state, _dirs) = state_with(&[("a", 30), ("b", 70)]);
        ensure_slot(state.path(), "GPU-y", "gone", me(), false).unwrap();
        ensure_slot(state.path(), "GPU-x", "gone", me(), false).unwrap();
        remove_orphan_slots(state.path(), &state.path().join("vgpus"));
        assert_eq!(names(&gpu_dir(&state)), ["a", "b"]);
        assert!(names(&state.path().join(BOARDS_DIR).join("GPU-y")).is_empty());
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn an_own_slot_that_is_foreign_is_refused() {
        let (state, dirs) = state_with(&[("a", 30)]);
        let path = gpu_dir(&state).join("a");
        std::fs::write(&path, vec![0u8; slot_file_size()]).unwrap();
        assert!(matches!(Board::open(&dirs[0], "GPU-x"), Err(LayoutError::BadMagic { .. })));
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(Board::open(&dirs[0], "GPU-x"), Err(LayoutError::Truncated { .. })));
        std::fs::remove_file(&path).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("t"), slot_bytes(1, 1)).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("t"), &path).unwrap();
        assert!(matches!(Board::open(&dirs[0], "GPU-x"), Err(LayoutError::NotRegular { .. })), "symlinks are not followed");
    }
}
