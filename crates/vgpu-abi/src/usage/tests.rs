use super::*;
use crate::compute::Policy;
use crate::layout::{PROC_MAGIC, USAGE_FILE};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const GIB: u64 = 1 << 30;
const UUID0: &str = "GPU-8f3c9a2e-1b7d-4c55-9e0a-3d2f6b1c7e90";
const UUID1: &str = "GPU-00112233-4455-6677-8899-aabbccddeeff";

struct Vgpu {
    _dir: tempfile::TempDir,
    usage: UsageFile,
}

fn vgpu(quotas: &[u64]) -> Vgpu {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(PROCS_DIR)).unwrap();
    let uuids = [UUID0, UUID1];
    let devices: Vec<DeviceQuota> = quotas
        .iter()
        .enumerate()
        .map(|(i, &q)| DeviceQuota {
            uuid: uuids[i].to_string(),
            quota_bytes: q,
            compute_pct: 100,
            policy: Policy::Strict,
            priority: 50,
            turn_max_us: 0,
        })
        .collect();
    let path = dir.path().join(USAGE_FILE);
    UsageFile::create(&path, &devices).unwrap();
    let usage = UsageFile::open(&path).unwrap();
    Vgpu { _dir: dir, usage }
}

fn me() -> ProcessId {
    ProcessId::current().unwrap()
}

/// An identity that looks like this process but is not (pid reuse): never alive.
fn ghost(n: u64) -> ProcessId {
    let me = me();
    ProcessId {
        pid: me.pid,
        start_time: me.start_time + 1 + n,
    }
}

#[test]
fn create_then_open_reads_back_the_devices() {
    let v = vgpu(&[4 * GIB, GIB]);
    let devices = v.usage.devices();
    assert_eq!(devices.len(), 2);
    assert_eq!(
        devices[0],
        DeviceUsage {
            uuid: UUID0.into(),
            quota_bytes: 4 * GIB,
            used_bytes: 0,
            peak_bytes: 0,
            compute_pct: 100,
            policy: Policy::Strict,
            priority: 50,
            charged_ns: 0,
            measured_share_ppm: None,
            throttled_ns: 0,
            turns_taken: 0,
            turn_wait_ns: 0,
            switches_avoided: 0,
        }
    );
    assert_eq!(devices[1].quota_bytes, GIB);
    let mode = |p: &std::path::Path| std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o7777;
    assert_eq!(mode(v.usage.path()), 0o600, "the usage file is the tenant's alone");
    assert_eq!(mode(&v.usage.path().with_file_name(crate::layout::LIMITS_FILE)), 0o644, "the limits are root's");
    assert!(v.usage.processes().is_empty());
}

#[test]
fn create_rejects_bad_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    let dev = |uuid: &str, pct| DeviceQuota {
        uuid: uuid.into(),
        quota_bytes: GIB,
        compute_pct: pct,
        policy: Policy::Fair,
        priority: 50,
        turn_max_us: 0,
    };
    assert!(UsageFile::create(&path, &[]).is_err());
    assert!(UsageFile::create(&path, &[dev(UUID0, 0)]).is_err());
    assert!(UsageFile::create(&path, &[dev(UUID0, 101)]).is_err());
    assert!(UsageFile::create(&path, &[dev("", 100)]).is_err());
    assert!(UsageFile::create(&path, &[dev(&"x".repeat(64), 100)]).is_err());
    assert!(!path.exists(), "a refused create leaves nothing behind");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn open_names_what_is_wrong() {
    let v = vgpu(&[GIB]);
    let path = v.usage.path().to_path_buf();
    let good = std::fs::read(&path).unwrap();
    let err = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        UsageFile::open(&path).err().expect("must be refused").to_string()
    };
    let mut newer = good.clone();
    newer[8..12].copy_from_slice(&(LAYOUT_VERSION + 1).to_ne_bytes());
    let msg = err(&newer);
    assert!(msg.contains("created by a newer vgpu"), "{msg}");
    assert!(
        msg.contains(&format!(
            "layout version {}, this build reads {LAYOUT_VERSION}",
            LAYOUT_VERSION + 1
        )),
        "{msg}"
    );
    let mut older = good.clone();
    older[8..12].copy_from_slice(&0u32.to_ne_bytes());
    assert!(err(&older).contains("created by an older vgpu (layout version 0"));
    let mut magic = good.clone();
    magic[0] = b'X';
    assert!(err(&magic).contains("not a vgpu usage file"));
    assert!(err(&good[..good.len() - 8]).contains("damaged"));
    assert!(err(b"short").contains("damaged"));
    // The limits are checked in their own file.
    let limits = path.with_file_name(crate::layout::LIMITS_FILE);
    let good_limits = std::fs::read(&limits).unwrap();
    let mut pct = good_limits.clone();
    pct[64 + 88..64 + 92].copy_from_slice(&0u32.to_ne_bytes());
    std::fs::write(&path, &good).unwrap();
    std::fs::write(&limits, &pct).unwrap();
    let msg = UsageFile::open(&path).err().expect("must be refused").to_string();
    assert!(msg.contains("compute share") && msg.contains("limits"), "{msg}");
    let mut other = good_limits.clone();
    other[0..8].copy_from_slice(crate::layout::USAGE_MAGIC.as_slice());
    std::fs::write(&limits, &other).unwrap();
    assert!(UsageFile::open(&path).err().unwrap().to_string().contains("not a vgpu limits file"));
    std::fs::remove_file(&limits).unwrap();
    assert!(UsageFile::open(&path).is_err(), "no limits, no vGPU");
    std::fs::write(&limits, &good_limits).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(UsageFile::open(&path)
        .err()
        .unwrap()
        .to_string()
        .contains(path.to_str().unwrap()));
}

#[test]
fn reserve_checks_the_quota_and_release_gives_back() {
    let v = vgpu(&[GIB, GIB]);
    let p = v.usage.register(me()).unwrap();
    v.usage.try_reserve(&p, 0, 600 << 20).unwrap();
    let refused = v.usage.try_reserve(&p, 0, 500 << 20).unwrap_err();
    assert_eq!(
        refused,
        OverQuota {
            quota_bytes: GIB,
            used_bytes: 600 << 20
        }
    );
    v.usage.try_reserve(&p, 0, 424 << 20).unwrap();
    assert_eq!(v.usage.used_bytes(0), GIB);
    assert!(v.usage.try_reserve(&p, 0, 1).is_err());
    assert!(
        v.usage.try_reserve(&p, 0, u64::MAX).is_err(),
        "no overflow past the quota"
    );
    v.usage.try_reserve(&p, 1, 1).unwrap();
    v.usage.release(&p, 0, 600 << 20);
    assert_eq!(v.usage.used_bytes(0), 424 << 20);
    let procs = v.usage.processes();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, std::process::id());
    assert!(procs[0].alive);
    assert_eq!(procs[0].used_bytes, vec![424 << 20, 1]);
    assert_eq!(procs[0].peak_bytes, vec![GIB, 1]);
    assert_eq!(v.usage.devices()[0].peak_bytes, GIB);
    let (begun, ended) = (
        p.header().ops_begun.load(Ordering::SeqCst),
        p.header().ops_ended.load(Ordering::SeqCst),
    );
    assert_eq!(begun, ended);
    assert_eq!(begun, 7);
}

#[test]
fn threads_never_cross_the_quota_and_totals_match_records() {
    let v = Arc::new(vgpu(&[1 << 20]));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (v, stop) = (v.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::SeqCst) {
                max = max.max(v.usage.used_bytes(0));
            }
            max
        })
    };
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let v = v.clone();
            std::thread::spawn(move || {
                // Each thread plays one process: its own record.
                let p = v.usage.register(ghost(100 + t)).unwrap();
                let mut held = Vec::new();
                let mut seed = t * 7919 + 1;
                for _ in 0..20_000 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    if seed % 3 != 0 || held.is_empty() {
                        let n = 1 + seed % (200 << 10);
                        if v.usage.try_reserve(&p, 0, n).is_ok() {
                            held.push(n);
                        }
                    } else {
                        let n = held.swap_remove((seed as usize / 3) % held.len());
                        v.usage.release(&p, 0, n);
                    }
                }
                held.iter().sum::<u64>()
            })
        })
        .collect();
    let held: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    stop.store(true, Ordering::SeqCst);
    assert!(watcher.join().unwrap() <= 1 << 20);
    assert_eq!(v.usage.used_bytes(0), held);
    assert!(v.usage.devices()[0].peak_bytes <= 1 << 20);
}

#[test]
fn reclaim_gives_back_exactly_what_dead_processes_held() {
    let v = vgpu(&[GIB, GIB]);
    let live = v.usage.register(me()).unwrap();
    let dead = v.usage.register(ghost(1)).unwrap();
    v.usage.try_reserve(&live, 0, 100).unwrap();
    v.usage.try_reserve(&dead, 0, 1000).unwrap();
    v.usage.try_reserve(&dead, 1, 7).unwrap();
    assert_eq!(v.usage.processes().iter().filter(|p| !p.alive).count(), 1);
    let report = v.usage.reclaim_dead();
    assert_eq!((report.processes, report.bytes), (1, 1007));
    assert!(
        !report.reconciled && !report.reconcile_pending && report.errors.is_empty(),
        "{report:?}"
    );
    assert_eq!(v.usage.used_bytes(0), 100);
    assert_eq!(v.usage.used_bytes(1), 0);
    assert!(!dead.path().exists());
    assert!(live.path().exists());
    // Idempotent.
    assert_eq!(v.usage.reclaim_dead(), ReclaimReport::default());
    assert_eq!(v.usage.used_bytes(0), 100);
}

#[test]
fn records_that_claim_more_than_can_be_counted_are_reclaimed_without_overflow() {
    // Found by fuzzing (`vgpu_dir`): a process writes its own record, so the bytes of two
    // dead records may add up past u64::MAX; the report saturates instead of panicking.
    let v = vgpu(&[u64::MAX, u64::MAX]);
    for n in [1, 2] {
        let dead = v.usage.register(ghost(10 + n)).unwrap();
        v.usage.try_reserve(&dead, n as usize - 1, u64::MAX).unwrap();
    }
    let report = v.usage.reclaim_dead();
    assert_eq!((report.processes, report.bytes), (2, u64::MAX));
    assert_eq!((v.usage.used_bytes(0), v.usage.used_bytes(1)), (0, 0));
}

#[test]
fn a_recycled_pid_does_not_keep_a_dead_record_alive() {
    let v = vgpu(&[GIB]);
    // Same pid as a live process (this one), other start time: the original is gone.
    let old = v.usage.register(ghost(5)).unwrap();
    v.usage.try_reserve(&old, 0, 4096).unwrap();
    assert_eq!(old.id().pid, std::process::id());
    assert_eq!(v.usage.reclaim_dead().bytes, 4096);
    assert_eq!(v.usage.used_bytes(0), 0);
}

#[test]
fn reaped_child_is_reclaimed() {
    let v = vgpu(&[GIB]);
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let id = ProcessId {
        pid: child.id(),
        start_time: crate::process::start_time(child.id()).unwrap(),
    };
    let record = v.usage.register(id).unwrap();
    v.usage.try_reserve(&record, 0, 5000).unwrap();
    assert_eq!(v.usage.reclaim_dead().processes, 0, "alive: kept");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(v.usage.reclaim_dead().bytes, 5000);
}

#[test]
fn death_inside_an_update_is_healed_by_reconcile() {
    let v = vgpu(&[GIB]);
    let live = v.usage.register(me()).unwrap();
    v.usage.try_reserve(&live, 0, 300).unwrap();
    let dead = v.usage.register(ghost(2)).unwrap();
    v.usage.try_reserve(&dead, 0, 50).unwrap();
    // The dead process reserved 1000 more on the total, then died before recording it.
    dead.header().ops_begun.fetch_add(1, Ordering::SeqCst);
    v.usage.record(0).used_bytes.fetch_add(1000, Ordering::SeqCst);
    assert_eq!(v.usage.used_bytes(0), 1350);
    let report = v.usage.reclaim_dead();
    assert_eq!((report.processes, report.bytes), (1, 50));
    assert!(report.reconciled, "{report:?}");
    assert_eq!(v.usage.used_bytes(0), 300, "total = what the live process holds");
    assert!(!v.usage.needs_reconcile());
}

#[test]
fn reconcile_waits_for_a_live_process_in_mid_update() {
    let v = vgpu(&[GIB]);
    let live = v.usage.register(me()).unwrap();
    v.usage.try_reserve(&live, 0, 300).unwrap();
    v.usage.request_reconcile();
    // A live process stopped between the total and its record (e.g. frozen): no reconcile.
    live.header().ops_begun.fetch_add(1, Ordering::SeqCst);
    v.usage.record(0).used_bytes.fetch_add(10, Ordering::SeqCst);
    let report = v.usage.reclaim_dead();
    assert!(report.reconcile_pending && !report.reconciled, "{report:?}");
    assert_eq!(v.usage.used_bytes(0), 310, "over-counted, never under-counted");
    live.device(0).used_bytes.fetch_add(10, Ordering::SeqCst);
    live.header().ops_ended.fetch_add(1, Ordering::SeqCst);
    assert!(v.usage.reclaim_dead().reconciled);
    assert_eq!(v.usage.used_bytes(0), 310);
}

#[test]
fn a_reclaimer_that_died_half_way_is_not_given_back_twice() {
    let v = vgpu(&[GIB]);
    let live = v.usage.register(me()).unwrap();
    v.usage.try_reserve(&live, 0, 300).unwrap();
    let dead = v.usage.register(ghost(3)).unwrap();
    v.usage.try_reserve(&dead, 0, 700).unwrap();
    // A reclaimer gave the 700 back and died before removing the record.
    v.usage.record(0).used_bytes.fetch_sub(700, Ordering::SeqCst);
    v.usage.header().reclaimer.store(12345, Ordering::SeqCst);
    let report = v.usage.reclaim_dead();
    assert_eq!(report.processes, 1);
    assert_eq!(report.bytes, 0, "not given back a second time");
    assert!(report.reconciled);
    assert_eq!(v.usage.used_bytes(0), 300);
    assert_eq!(v.usage.header().reclaimer.load(Ordering::SeqCst), 0);
}

#[test]
fn damaged_record_of_a_dead_process_is_removed_and_reconciled() {
    let v = vgpu(&[GIB]);
    let live = v.usage.register(me()).unwrap();
    v.usage.try_reserve(&live, 0, 300).unwrap();
    v.usage.record(0).used_bytes.fetch_add(999, Ordering::SeqCst); // the damaged one's share
    let path = v.usage.procs_dir().join(procfile::file_name(ghost(4)));
    std::fs::write(&path, b"garbage").unwrap();
    // Fresh: might be a file being written; left alone.
    assert!(v.usage.reclaim_dead().errors.is_empty());
    assert!(path.exists());
    let old = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let report = v.usage.reclaim_dead();
    assert!(!path.exists());
    assert!(
        report.errors.iter().any(|e| e.contains(path.to_str().unwrap())),
        "{report:?}"
    );
    assert!(report.reconciled);
    assert_eq!(v.usage.used_bytes(0), 300);
    // A damaged file never makes processes() fail.
    std::fs::write(&path, PROC_MAGIC).unwrap();
    assert_eq!(v.usage.processes().len(), 1);
}

#[test]
fn reconcile_racing_with_updates_never_under_counts() {
    let v = Arc::new(vgpu(&[1 << 40]));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (v, stop) = (v.clone(), stop.clone());
            std::thread::spawn(move || {
                let p = v.usage.register(ghost(200 + t)).unwrap();
                let mut held = 0u64;
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    // Same sizes up and down: the ABA a naive reconcile would fall for.
                    if i % 2 == 1 {
                        v.usage.try_reserve(&p, 0, 4096).unwrap();
                        held += 4096;
                    } else {
                        v.usage.release(&p, 0, 4096);
                        held -= 4096;
                    }
                    // Bursts with short pauses, like real allocators: without quiet moments
                    // a loaded 2-core machine may never let a reconcile through (liveness),
                    // while the bursts keep racing the reconciles (safety).
                    if i.is_multiple_of(1024) {
                        std::thread::sleep(std::time::Duration::from_micros(300));
                    }
                }
                (p, held)
            })
        })
        .collect();
    let mut reconciled = 0;
    // Each round leaks 1 MiB into the total (as a death inside an update would); a successful
    // reconcile removes all leaks so far, a failed one keeps them. An under-count by a stale
    // snapshot would show as a total below that.
    let leak = 1u64 << 20;
    let mut outstanding = 0u64;
    for _ in 0..60 {
        v.usage.record(0).used_bytes.fetch_add(leak, Ordering::SeqCst);
        outstanding += leak;
        v.usage.request_reconcile();
        // Not reclaim_dead(): these workers' identities are "dead" ghosts.
        let mut report = ReclaimReport::default();
        let _lock = VgpuLock::acquire(v.usage.path(), LOCK_TIMEOUT).unwrap();
        if v.usage.reconcile(&mut report, RECONCILE_ATTEMPTS) {
            reconciled += 1;
            outstanding = 0;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let results: Vec<(ProcFile, u64)> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let held: u64 = results.iter().map(|(_, h)| h).sum();
    let recorded: u64 = results
        .iter()
        .map(|(p, _)| p.device(0).used_bytes.load(Ordering::SeqCst))
        .sum();
    assert_eq!(recorded, held);
    assert!(reconciled > 0, "no reconcile found a quiet moment in 60 rounds");
    assert_eq!(
        v.usage.used_bytes(0),
        held + outstanding,
        "after {reconciled} reconciles the total is exact"
    );
}

#[test]
fn reconcile_is_not_fooled_by_updates_between_its_reads() {
    // The interleaving a snapshot without update counters gets wrong: after the reconcile
    // read one record, that process reserves n and another releases n. The total is back to
    // what was read (ABA) but the records read add up to n too little.
    let v = vgpu(&[GIB]);
    let a = v.usage.register(ghost(300)).unwrap();
    let b = v.usage.register(ghost(301)).unwrap();
    v.usage.try_reserve(&a, 0, 1000).unwrap();
    v.usage.try_reserve(&b, 0, 1000).unwrap();
    v.usage.record(0).used_bytes.fetch_add(77, Ordering::SeqCst); // a leak to reconcile
    let first = v.usage.proc_entries()[0].0;
    let (first, second) = if first == a.id() { (&a, &b) } else { (&b, &a) };
    let mut interfered = false;
    let mut report = ReclaimReport::default();
    let ok = v.usage.reconcile_observed(&mut report, RECONCILE_ATTEMPTS, &mut |step| {
        if step == ReconcileStep::RecordRead(0) && !interfered {
            interfered = true;
            v.usage.try_reserve(first, 0, 500).unwrap();
            v.usage.release(second, 0, 500);
        }
    });
    assert!(ok && interfered);
    assert_eq!(v.usage.used_bytes(0), 2000, "exactly what the records hold");
}

#[test]
fn uuids_match_by_their_bytes() {
    let v = vgpu(&[GIB, GIB]);
    let bytes = parse_uuid_bytes(UUID1).unwrap();
    assert_eq!(bytes[0], 0x00);
    assert_eq!(bytes[15], 0xff);
    assert_eq!(format_uuid("GPU", &bytes), UUID1);
    assert_eq!(v.usage.find_device(&bytes), Some(1));
    assert_eq!(v.usage.find_device_str(UUID0), Some(0));
    assert_eq!(v.usage.find_device_str(&UUID1.replace("GPU-", "MIG-")), Some(1));
    assert_eq!(v.usage.find_device(&[7; 16]), None);
    assert_eq!(parse_uuid_bytes("GPU-123"), None);
    assert_eq!(parse_uuid_bytes("GPU-zz112233-4455-6677-8899-aabbccddeeff"), None);
}

#[test]
fn the_quota_and_shares_come_from_the_limits_file_only() {
    let v = vgpu(&[GIB]);
    let path = v.usage.path().to_path_buf();
    // A tenant rewrites the limit fields of its own usage file: nothing changes.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[64 + 64..64 + 72].copy_from_slice(&(8 * GIB).to_ne_bytes());
    bytes[64 + 88..64 + 92].copy_from_slice(&100u32.to_ne_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let usage = UsageFile::open(&path).unwrap();
    assert_eq!(usage.quota_bytes(0), GIB);
    let proc = usage.register(crate::process::ProcessId::current().unwrap()).unwrap();
    assert!(usage.try_reserve(&proc, 0, 2 * GIB).is_err(), "the quota is the limits file's");
    assert!(usage.try_reserve(&proc, 0, GIB).is_ok());
    // Root changes them in the limits file; every opener sees it.
    usage.set_compute_pct(0, 40).unwrap();
    assert_eq!(UsageFile::open(&path).unwrap().compute_pct(0), 40);
    let limits = std::fs::read(path.with_file_name(crate::layout::LIMITS_FILE)).unwrap();
    assert_eq!(u32::from_ne_bytes(limits[64 + 88..64 + 92].try_into().unwrap()), 40);
    let counters = std::fs::read(&path).unwrap();
    assert_eq!(u64::from_ne_bytes(counters[64 + 72..64 + 80].try_into().unwrap()), GIB, "used_bytes is counted in usage");
}

/// A `sleep` child: a real process of its own, killed (and reaped) when dropped.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(std::process::Command::new("sleep").arg("60").spawn().unwrap())
    }

    fn id(&self) -> ProcessId {
        let pid = self.0.id();
        ProcessId {
            pid,
            start_time: crate::process::start_time(pid).unwrap(),
        }
    }

    /// SIGKILL; wait until it is dead but leave it unreaped (a zombie).
    fn kill_leaving_a_zombie(&mut self) {
        self.0.kill().unwrap();
        // SAFETY: a zeroed siginfo_t is valid; WNOWAIT leaves our child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid siginfo pointer.
        let rc = unsafe { libc::waitid(libc::P_PID, self.0.id(), &mut info, libc::WEXITED | libc::WNOWAIT) };
        assert_eq!(rc, 0);
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn nothing_to_reclaim_holds_only_while_a_reclaim_could_give_nothing_back() {
    let v = vgpu(&[GIB]);
    let mine = v.usage.register(me()).unwrap();
    v.usage.try_reserve(&mine, 0, 100).unwrap();
    let mut peer = Sleeper::start();
    let theirs = v.usage.register(peer.id()).unwrap();
    v.usage.try_reserve(&theirs, 0, 1000).unwrap();
    assert!(!v.usage.nothing_to_reclaim(&Peers::new()), "nothing listed yet");

    let (report, peers) = v.usage.reclaim_dead_quick_listing();
    assert_eq!(report, ReclaimReport::default());
    assert!(peers.is_usable());
    assert_eq!(peers.watched(), 1, "the other process; not this one");
    assert!(v.usage.nothing_to_reclaim(&peers));

    // Anything a reclaim could act on makes it false.
    v.usage.request_reconcile();
    assert!(!v.usage.nothing_to_reclaim(&peers), "a reconcile is pending");
    v.usage.header().needs_reconcile.store(0, Ordering::SeqCst);
    v.usage.header().reclaimer.store(12345, Ordering::SeqCst);
    assert!(!v.usage.nothing_to_reclaim(&peers), "a reclaim is under way or was cut short");
    v.usage.header().reclaimer.store(0, Ordering::SeqCst);
    assert!(v.usage.nothing_to_reclaim(&peers));
    let late = v.usage.register(ghost(7)).unwrap();
    v.usage.try_reserve(&late, 0, 10).unwrap();
    assert!(!v.usage.nothing_to_reclaim(&peers), "a process registered since the listing");
    let (report, peers) = v.usage.reclaim_dead_quick_listing();
    assert_eq!((report.processes, report.bytes), (1, 10), "the late one was a ghost");
    assert!(v.usage.nothing_to_reclaim(&peers));

    // A listing is trusted for a second at most.
    let mut stale = v.usage.reclaim_dead_quick_listing().1;
    assert!(v.usage.nothing_to_reclaim(&stale));
    stale.listed_mono_ns -= MAX_LISTING_AGE.as_nanos() as u64;
    assert!(!v.usage.nothing_to_reclaim(&stale), "too old");

    // The peer dies, and is not even reaped: a zombie holds no GPU memory.
    peer.kill_leaving_a_zombie();
    assert!(!v.usage.nothing_to_reclaim(&peers), "a listed process exited");
    let (report, peers) = v.usage.reclaim_dead_quick_listing();
    assert_eq!((report.processes, report.bytes), (1, 1000));
    assert_eq!(v.usage.used_bytes(0), 100);
    assert_eq!(peers.watched(), 0);
    assert!(v.usage.nothing_to_reclaim(&peers));
}

#[test]
fn a_listing_that_leaves_a_dead_process_behind_is_not_usable() {
    let v = vgpu(&[GIB]);
    let _mine = v.usage.register(me()).unwrap();
    // A dead process's damaged file, too fresh to remove (it might be being written).
    let path = v.usage.procs_dir().join(procfile::file_name(ghost(4)));
    std::fs::write(&path, b"").unwrap();
    let (_, peers) = v.usage.reclaim_dead_quick_listing();
    assert!(path.exists());
    assert!(!peers.is_usable(), "a later reclaim will remove it and reconcile");
    assert!(!v.usage.nothing_to_reclaim(&peers));
    std::fs::remove_file(&path).unwrap();
    let (_, peers) = v.usage.reclaim_dead_quick_listing();
    assert!(v.usage.nothing_to_reclaim(&peers));
}

#[test]
fn a_usage_file_of_an_older_vgpu_is_always_reclaimed_before_a_refusal() {
    let v = vgpu(&[GIB]);
    // Made by a vgpu before `registrations`: its shims do not count themselves.
    v.usage.header().registrations.store(0, Ordering::SeqCst);
    let _mine = v.usage.register(me()).unwrap();
    assert_eq!(v.usage.header().registrations.load(Ordering::SeqCst), 0, "0 stays 0");
    let (_, peers) = v.usage.reclaim_dead_quick_listing();
    assert!(!peers.is_usable());
    assert!(!v.usage.nothing_to_reclaim(&peers));
}

#[test]
fn register_publishes_whole_counts_itself_and_takes_no_lock() {
    let v = vgpu(&[GIB]);
    assert_eq!(v.usage.header().registrations.load(Ordering::SeqCst), 1, "a fresh usage file counts");
    // The vGPU lock held elsewhere (say by `vgpu`'s reconcile of another part) does not
    // delay a registration when no reclaim is under way.
    let _held = VgpuLock::acquire(v.usage.path(), LOCK_TIMEOUT).unwrap();
    let mut steps = Vec::new();
    let file = v.usage.register_observed(me(), &mut |step| steps.push(step)).unwrap();
    assert_eq!(
        steps,
        [RegisterStep::Opened, RegisterStep::Written, RegisterStep::Published, RegisterStep::Ready]
    );
    assert_eq!(v.usage.header().registrations.load(Ordering::SeqCst), 2);
    assert_eq!(ProcFile::open(file.path()).unwrap().id(), me());
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(file.path()).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o644, "others of the vGPU read it");
}

#[test]
fn register_waits_for_a_reclaim_under_way_and_gives_up_on_one_that_never_ends() {
    let v = Arc::new(vgpu(&[GIB]));
    let held = VgpuLock::acquire(v.usage.path(), LOCK_TIMEOUT).unwrap();
    v.usage.header().reclaimer.store(u64::from(std::process::id()), Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let registrant = {
        let v = v.clone();
        std::thread::spawn(move || {
            let file = v.usage.register_observed(ghost(20), &mut |step| tx.send(step).unwrap())?;
            v.usage.try_reserve(&file, 0, 4096).unwrap();
            Ok::<ProcFile, io::Error>(file)
        })
    };
    let steps: Vec<RegisterStep> = rx.iter().take(4).collect();
    assert_eq!(
        steps,
        [RegisterStep::Opened, RegisterStep::Written, RegisterStep::Published, RegisterStep::WaitingForReclaim],
        "published, then waits: the reclaim may have listed the records without it"
    );
    assert_eq!(v.usage.used_bytes(0), 0, "nothing reserved while the reclaim runs");
    v.usage.header().reclaimer.store(0, Ordering::SeqCst);
    drop(held);
    assert_eq!(rx.recv().unwrap(), RegisterStep::Ready);
    let file = registrant.join().unwrap().unwrap();
    assert_eq!(v.usage.used_bytes(0), 4096);

    // A reclaim that never ends (its holder frozen): the registration gives up, unpublished.
    let _frozen = VgpuLock::acquire(v.usage.path(), LOCK_TIMEOUT).unwrap();
    v.usage.header().reclaimer.store(u64::from(std::process::id()), Ordering::SeqCst);
    let Err(err) = v.usage.register(ghost(21)) else {
        panic!("registered while a reclaim held the lock")
    };
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    assert!(!v.usage.procs_dir().join(procfile::file_name(ghost(21))).exists());
    assert!(file.path().exists());
}

#[test]
fn a_reconcile_never_misses_a_process_that_registers_during_it() {
    // After a reconcile listed the records, a process publishes its record and reserves
    // before the reconcile reads the totals: the reconcile's sum lacks those bytes and its
    // compare-and-swap would take them off the total (an escape). The registrant sees the
    // reclaim under way and waits for its end before reserving.
    let v = Arc::new(vgpu(&[GIB]));
    let live = v.usage.register(ghost(30)).unwrap();
    v.usage.try_reserve(&live, 0, 1000).unwrap();
    v.usage.record(0).used_bytes.fetch_add(77, Ordering::SeqCst); // a leak to reconcile
    // What reclaim does around its reconcile: the lock, `reclaimer` set.
    let lock = VgpuLock::acquire(v.usage.path(), LOCK_TIMEOUT).unwrap();
    v.usage.header().reclaimer.store(u64::from(std::process::id()), Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut registrant = None;
    let mut report = ReclaimReport::default();
    let ok = v.usage.reconcile_observed(&mut report, RECONCILE_ATTEMPTS, &mut |step| {
        if step != ReconcileStep::Listed || registrant.is_some() {
            return;
        }
        let (v, tx) = (v.clone(), tx.clone());
        registrant = Some(std::thread::spawn(move || {
            let file = v.usage.register_observed(ghost(31), &mut |step| tx.send(Some(step)).unwrap())?;
            v.usage.try_reserve(&file, 0, 500).unwrap();
            tx.send(None).unwrap(); // reserved
            Ok::<ProcFile, io::Error>(file)
        }));
        // Until it either waits for this reclaim or has reserved.
        for step in rx.iter() {
            if matches!(step, Some(RegisterStep::WaitingForReclaim) | None) {
                break;
            }
        }
    });
    assert!(ok, "{report:?}");
    v.usage.header().reclaimer.store(0, Ordering::SeqCst);
    drop(lock);
    let late = registrant.unwrap().join().unwrap().unwrap();
    let held = live.device(0).used_bytes.load(Ordering::SeqCst) + late.device(0).used_bytes.load(Ordering::SeqCst);
    assert_eq!(held, 1500);
    assert_eq!(v.usage.used_bytes(0), held, "the total is exactly what the records hold");
}

#[test]
fn a_vgpu_no_process_ever_counted_itself_in_is_not_locked_to_reclaim() {
    let v = vgpu(&[GIB]);
    assert!(v.usage.never_registered());
    // The vGPU lock held elsewhere: a full reclaim would wait for it and give up; this one
    // does not look.
    {
        let _held = VgpuLock::acquire(v.usage.path(), LOCK_TIMEOUT).unwrap();
        assert_eq!(v.usage.reclaim_dead_if_any(), ReclaimReport::default());
    }
    // A registration killed after publishing its record, before counting itself: it holds
    // nothing, but `procs/` is not empty, and the reclaim removes it.
    let half = ProcFile::create(v.usage.procs_dir(), ghost(1), 1, &mut |_| {}).unwrap();
    assert!(v.usage.never_registered());
    assert_eq!(v.usage.reclaim_dead_if_any().processes, 1);
    assert!(!half.path().exists());
    // Whatever else is in `procs/` (its tenant's), as a reclaim reports it.
    std::os::unix::fs::symlink("/etc/passwd", v.usage.procs_dir().join("999998-1")).unwrap();
    let report = v.usage.reclaim_dead_if_any();
    assert!(report.errors.iter().any(|e| e.contains("999998-1")), "{report:?}");
    // Once a process counted itself, its death is given back.
    let dead = v.usage.register(ghost(2)).unwrap();
    v.usage.try_reserve(&dead, 0, 1000).unwrap();
    assert!(!v.usage.never_registered());
    let report = v.usage.reclaim_dead_if_any();
    assert_eq!((report.processes, report.bytes), (1, 1000), "{report:?}");
    assert_eq!(v.usage.used_bytes(0), 0);
    assert!(!dead.path().exists());
}

#[test]
fn a_pending_reconcile_a_reclaimer_or_an_older_file_is_always_reclaimed() {
    // A reconcile pending, or a reclaimer that died half-way: the reclaim runs and reconciles.
    for (field, value) in [("needs_reconcile", 1), ("reclaimer", u64::from(ghost(3).pid))] {
        let v = vgpu(&[GIB]);
        let header = v.usage.header();
        match field {
            "needs_reconcile" => header.needs_reconcile.store(value, Ordering::SeqCst),
            _ => header.reclaimer.store(value, Ordering::SeqCst),
        }
        assert!(!v.usage.never_registered(), "{field} = {value}");
        let report = v.usage.reclaim_dead_if_any();
        assert!(report.reconciled, "{field} = {value}: it did not reclaim: {report:?}");
        assert!(v.usage.never_registered(), "{field} = {value}: nothing left to do");
    }
    // A file of an older vgpu, whose shims do not count themselves: a dead process's record
    // is removed.
    let v = vgpu(&[GIB]);
    v.usage.header().registrations.store(0, Ordering::SeqCst);
    let dead = v.usage.register(ghost(4)).unwrap();
    assert!(!v.usage.never_registered());
    assert_eq!(v.usage.reclaim_dead_if_any().processes, 1);
    assert!(!dead.path().exists());
}
