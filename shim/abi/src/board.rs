//! A GPU's board: one small shared file per physical GPU (`<state>/gpus/<uuid>`) where every
//! vGPU using the GPU publishes its share, priority, policy, whether it wants more, and
//! how much it uses. The compute governor of each vGPU reads the board to turn its share
//! into an allowance ([`crate::compute::allowance_ppm`]): work-conserving in `fair` mode,
//! priority order when the GPU is oversubscribed.
//!
//! The `vgpu` CLI creates the board when it first gives a vGPU part of the GPU; the shim
//! only maps it. Slots are taken by compare-and-swap on `owner` (a vGPU's key); a slot
//! whose heartbeat is older than [`STALE_NS`] belongs to a vGPU that stopped launching and
//! may be taken over. A missing or damaged board only means "no competitors known": each
//! vGPU then keeps exactly its own share.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::compute::{Competitor, Policy};
use crate::layout::{
    board_file_size, now_unix_ns, BoardHeader, BoardSlot, BOARDS_DIR, BOARD_MAGIC, BOARD_SLOTS, LAYOUT_VERSION,
};
use crate::mapping::SharedMapping;
use crate::usage::LayoutError;

/// A slot not written for this long is free to take (ns).
pub const STALE_NS: u64 = 3_000_000_000;
/// A vGPU whose processes have not published for this long is not competing for the GPU
/// now (it stopped launching, or it is gone): others do not count it (ns).
pub const ACTIVE_NS: u64 = 1_000_000_000;

/// Give up every board slot of the vGPU in `vgpu_dir` (its workload ended; the directory is
/// about to be removed). Best effort: a missing board or usage file has nothing to give up.
pub fn release_vgpu(vgpu_dir: &Path) {
    let Ok(usage) = crate::usage::UsageFile::open(&vgpu_dir.join(crate::layout::USAGE_FILE)) else {
        return;
    };
    for device in 0..usage.device_count() {
        let Some(path) = path_for_vgpu(vgpu_dir, usage.device_uuid(device)) else { continue };
        if let Ok(board) = Board::open(&path) {
            board.release_owner(owner_key(usage.created_unix_ns(), device));
        }
    }
}

/// Where the board of GPU `uuid` lives for the vGPU directory `vgpu_dir`
/// (`<state>/vgpus/<id>` → `<state>/gpus/<uuid>`). `None` for a UUID that is not a plain
/// file name.
pub fn path_for_vgpu(vgpu_dir: &Path, uuid: &str) -> Option<PathBuf> {
    let state = vgpu_dir.parent()?.parent()?;
    path_in_state(state, uuid)
}

/// `<state>/gpus/<uuid>`, if `uuid` is a safe file name.
pub fn path_in_state(state_dir: &Path, uuid: &str) -> Option<PathBuf> {
    let safe = !uuid.is_empty()
        && uuid.len() <= crate::layout::MAX_UUID_LEN
        && uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    safe.then(|| state_dir.join(BOARDS_DIR).join(uuid))
}

/// The key a vGPU's processes share: derived from its usage file's creation time and
/// the device's index in it (never 0).
pub fn owner_key(usage_created_unix_ns: u64, device_index: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in usage_created_unix_ns.to_le_bytes().into_iter().chain((device_index as u64).to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// A mapped board.
pub struct Board {
    map: SharedMapping,
}

impl Board {
    /// Create the board at `path` unless a valid one is there (temporary + rename; mode
    /// 0666 so that workloads of any user can publish, like the usage file). The parent
    /// directory is created with mode 0755.
    pub fn ensure(path: &Path) -> io::Result<()> {
        if Board::open(path).is_ok() {
            return Ok(());
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(meta) => {
                return Err(io::Error::other(format!(
                    "{} is a {}, not a directory",
                    dir.display(),
                    crate::mapping::kind_name(&meta.file_type())
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().mode(0o755).create(dir)?;
                // The umask may have narrowed it; the mode is the one intended, whatever it is.
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
            }
            Err(e) => return Err(e),
        }
        let mut bytes = vec![0u8; board_file_size()];
        let header = BoardHeader {
            magic: BOARD_MAGIC,
            version: LAYOUT_VERSION,
            slot_count: BOARD_SLOTS as u32,
            created_unix_ns: now_unix_ns(),
            reserved: [0; 5],
        };
        // SAFETY: BoardHeader is repr(C) plain data; the buffer holds at least its size.
        let raw = unsafe {
            std::slice::from_raw_parts((&header as *const BoardHeader).cast::<u8>(), std::mem::size_of::<BoardHeader>())
        };
        bytes[..raw.len()].copy_from_slice(raw);
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("board"),
            std::process::id()
        ));
        let write = || -> io::Result<()> {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            file.set_permissions(std::fs::Permissions::from_mode(0o666))?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    /// Map the board at `path` read-write (never following a symlink, never blocking on a
    /// FIFO) and check its layout.
    pub fn open(path: &Path) -> Result<Board, LayoutError> {
        let (file, len) = crate::mapping::open_regular(path, true).map_err(|e| LayoutError::from_open(path, e))?;
        let expected = board_file_size();
        if len as usize != expected {
            return Err(LayoutError::Truncated {
                path: path.to_path_buf(),
                len: len as usize,
                expected,
            });
        }
        let map = SharedMapping::new(&file, expected, true).map_err(|e| LayoutError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        // SAFETY: BoardHeader is plain data valid for any bytes, at page-aligned offset 0.
        let header: &BoardHeader = unsafe { map.at(0) };
        if header.magic != BOARD_MAGIC {
            return Err(LayoutError::BadMagic {
                path: path.to_path_buf(),
                what: "vgpu GPU board",
            });
        }
        if header.version != LAYOUT_VERSION {
            return Err(LayoutError::Version {
                path: path.to_path_buf(),
                found: header.version,
            });
        }
        if header.slot_count as usize != BOARD_SLOTS {
            return Err(LayoutError::Corrupt {
                path: path.to_path_buf(),
                reason: format!("{} slots (expected {BOARD_SLOTS})", header.slot_count),
            });
        }
        Ok(Board { map })
    }

    fn slot(&self, index: usize) -> &BoardSlot {
        assert!(index < BOARD_SLOTS);
        let offset = std::mem::size_of::<BoardHeader>() + index * std::mem::size_of::<BoardSlot>();
        // SAFETY: in range of the validated length; BoardSlot is atomics and padding.
        unsafe { self.map.at(offset) }
    }

    /// The slot of `owner`, taking a free or stale one if it has none. `None` if the board
    /// is full of live vGPUs. Processes of one vGPU racing here may each take a slot; the
    /// owner then keeps its lowest one and gives the others back (and [`Board::snapshot`]
    /// counts an owner once meanwhile).
    pub fn claim(&self, owner: u64, now_mono: u64) -> Option<usize> {
        let mine = |i: usize| self.slot(i).owner.load(Ordering::Acquire) == owner;
        if let Some(i) = (0..BOARD_SLOTS).find(|&i| mine(i)) {
            self.drop_duplicates(owner, i);
            return Some(i);
        }
        for i in 0..BOARD_SLOTS {
            let slot = self.slot(i);
            let current = slot.owner.load(Ordering::Acquire);
            let stale = now_mono.saturating_sub(slot.heartbeat_ns.load(Ordering::Acquire)) > STALE_NS;
            if (current == 0 || stale)
                && slot
                    .owner
                    .compare_exchange(current, owner, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                slot.heartbeat_ns.store(now_mono, Ordering::Release);
                slot.hungry_until_ns.store(0, Ordering::Relaxed);
                slot.usage_ppm.store(0, Ordering::Relaxed);
                // Another process of the vGPU may have taken a lower slot meanwhile.
                let first = (0..BOARD_SLOTS).find(|&j| mine(j)).unwrap_or(i);
                self.drop_duplicates(owner, first);
                return Some(first);
            }
        }
        None
    }

    /// Give back every slot of `owner` but `keep`.
    fn drop_duplicates(&self, owner: u64, keep: usize) {
        for j in (0..BOARD_SLOTS).filter(|&j| j != keep) {
            self.release(j, owner);
        }
    }

    /// Publish `owner`'s figures in slot `index`; `false` if the slot was taken over (claim
    /// again).
    pub fn publish(&self, index: usize, owner: u64, figures: Competitor, hungry_until: u64, now_mono: u64) -> bool {
        let slot = self.slot(index);
        if slot.owner.load(Ordering::Acquire) != owner {
            return false;
        }
        slot.share_ppm.store(figures.share_ppm.min(u64::from(u32::MAX)) as u32, Ordering::Relaxed);
        slot.priority.store(figures.priority, Ordering::Relaxed);
        slot.policy.store(figures.policy.code(), Ordering::Relaxed);
        slot.usage_ppm.store(figures.usage_ppm, Ordering::Relaxed);
        slot.hungry_until_ns.fetch_max(hungry_until, Ordering::Relaxed);
        slot.heartbeat_ns.store(now_mono, Ordering::Release);
        true
    }

    /// Give the slot up (the last process of the vGPU leaves, or a test cleans up).
    pub fn release(&self, index: usize, owner: u64) {
        let _ = self
            .slot(index)
            .owner
            .compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Give up whichever slot `owner` holds.
    pub fn release_owner(&self, owner: u64) {
        for i in 0..BOARD_SLOTS {
            self.release(i, owner);
        }
    }

    /// The live vGPUs on the board into `out`; returns how many, and where `me` (a slot
    /// index) is among them. No allocation.
    pub fn snapshot(&self, me: usize, now_mono: u64, out: &mut [Competitor; BOARD_SLOTS]) -> (usize, Option<usize>) {
        let mut n = 0;
        let mut mine = None;
        let mut owners = [0u64; BOARD_SLOTS];
        for i in 0..BOARD_SLOTS {
            let slot = self.slot(i);
            let owner = slot.owner.load(Ordering::Acquire);
            // An owner counts once, whatever a race left behind.
            if owner == 0 || (owners[..n].contains(&owner) && i != me) {
                continue;
            }
            if i != me && now_mono.saturating_sub(slot.heartbeat_ns.load(Ordering::Acquire)) > ACTIVE_NS {
                continue;
            }
            if let Some(k) = owners[..n].iter().position(|&o| o == owner) {
                // `me` is a duplicate of an owner already listed: that entry is me.
                mine = Some(k);
                continue;
            }
            if i == me {
                mine = Some(n);
            }
            owners[n] = owner;
            out[n] = Competitor {
                share_ppm: u64::from(slot.share_ppm.load(Ordering::Relaxed)),
                priority: slot.priority.load(Ordering::Relaxed),
                policy: Policy::from_code(slot.policy.load(Ordering::Relaxed)),
                hungry: slot.hungry_until_ns.load(Ordering::Relaxed) > now_mono,
                usage_ppm: slot.usage_ppm.load(Ordering::Relaxed),
            };
            n += 1;
        }
        (n, mine)
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

    #[test]
    fn paths_are_validated() {
        let vgpu = Path::new("/run/vgpu/vgpus/abc");
        assert_eq!(
            path_for_vgpu(vgpu, "GPU-1234").unwrap(),
            PathBuf::from("/run/vgpu/gpus/GPU-1234")
        );
        assert!(path_for_vgpu(vgpu, "../etc").is_none());
        assert!(path_for_vgpu(vgpu, "a/b").is_none());
        assert!(path_for_vgpu(vgpu, "").is_none());
    }

    #[test]
    fn claim_publish_snapshot_and_stale_takeover() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(BOARDS_DIR).join("GPU-x");
        Board::ensure(&path).unwrap();
        Board::ensure(&path).unwrap(); // idempotent
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666);
        let a = Board::open(&path).unwrap();
        let b = Board::open(&path).unwrap();
        let now = 10 * STALE_NS;
        let sa = a.claim(11, now).unwrap();
        assert_eq!(b.claim(11, now), Some(sa), "one slot per owner");
        let sb = b.claim(22, now).unwrap();
        assert_ne!(sa, sb);
        assert!(a.publish(sa, 11, fig(300_000), now + 5, now));
        assert!(b.publish(sb, 22, fig(700_000), 0, now));
        let mut out = [fig(0); BOARD_SLOTS];
        let (n, me) = a.snapshot(sa, now + 1, &mut out);
        assert_eq!(n, 2);
        let me = me.unwrap();
        assert_eq!(out[me].share_ppm, 300_000);
        assert!(out[me].hungry);
        assert_eq!(out[..n].iter().map(|c| c.share_ppm).sum::<u64>(), PPM);
        // 22 stops publishing: after ACTIVE_NS it no longer competes; after STALE_NS its
        // slot can be taken.
        let idle = now + ACTIVE_NS + 1;
        assert!(a.publish(sa, 11, fig(300_000), 0, idle));
        let (n, _) = a.snapshot(sa, idle, &mut out);
        assert_eq!(n, 1, "an inactive vGPU does not compete");
        let later = now + STALE_NS + 1;
        assert!(a.publish(sa, 11, fig(300_000), 0, later));
        let (n, _) = a.snapshot(sa, later, &mut out);
        assert_eq!(n, 1);
        let sc = a.claim(33, later).unwrap();
        assert!(!b.publish(sb, 22, fig(700_000), 0, later) || sc != sb);
        // Released slots are free at once.
        a.release_owner(11);
        assert_eq!(a.claim(44, later), Some(sa.min(sb).min(sc).min(sa)), "the lowest free slot is taken first");
    }

    #[test]
    fn racing_processes_of_one_vgpu_count_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("GPU-r");
        Board::ensure(&path).unwrap();
        let board = Board::open(&path).unwrap();
        let now = 10 * STALE_NS;
        // What a race leaves: the same owner in two slots (as two CASes on free slots do).
        for i in [3, 5] {
            board.slot(i).owner.store(77, Ordering::SeqCst);
            board.slot(i).heartbeat_ns.store(now, Ordering::SeqCst);
            board.slot(i).share_ppm.store(800_000, Ordering::SeqCst);
        }
        let mut out = [fig(0); BOARD_SLOTS];
        let (n, me) = board.snapshot(5, now, &mut out);
        assert_eq!(n, 1, "one vGPU, one competitor");
        assert_eq!(me, Some(0));
        assert_eq!(crate::compute::allowance_ppm(&out[..n], 0), 800_000, "not halved by its own duplicate");
        // The next claim keeps the lowest slot and gives the other back.
        assert_eq!(board.claim(77, now), Some(3));
        assert_eq!(board.slot(5).owner.load(Ordering::SeqCst), 0);
        // Threads racing to claim end with one slot.
        let board = std::sync::Arc::new(board);
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let b = board.clone();
                std::thread::spawn(move || b.claim(99, now))
            })
            .collect();
        let got: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        board.claim(99, now);
        let held = (0..BOARD_SLOTS).filter(|&i| board.slot(i).owner.load(Ordering::SeqCst) == 99).count();
        assert_eq!(held, 1, "claims {got:?}");
    }

    #[test]
    fn a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("GPU-y");
        std::fs::write(&path, vec![0u8; board_file_size()]).unwrap();
        assert!(matches!(Board::open(&path), Err(LayoutError::BadMagic { .. })));
        std::fs::write(&path, b"short").unwrap();
        assert!(Board::open(&path).is_err());
        let link = dir.path().join("GPU-z");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(Board::open(&link).is_err(), "symlinks are not followed");
    }
}
