//! The decision of what to write, and its execution against a recording device.

use super::*;

fn state() -> DeviceState {
    DeviceState {
        index: 0,
        uuid: "GPU-0".into(),
        persistence: Some(true),
        power_limit_mw: Some(700_000),
        default_power_limit_mw: Some(700_000),
        power_limit_range_mw: Some((200_000, 700_000)),
    }
}

fn target(clock: u32) -> Target {
    Target {
        clock_mhz: clock,
        min_clock_mhz: 345,
        max_clock_mhz: 1980,
        power_w: 100.0 + 600.0 * (f64::from(clock) / 1980.0).powi(2),
    }
}

/// A device that records writes and refuses the ones `refuse` names.
struct Recorder {
    writes: Vec<Write>,
    refuse: fn(Write) -> Option<NvmlError>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder { writes: Vec::new(), refuse: |_| None }
    }
    fn refusing(refuse: fn(Write) -> Option<NvmlError>) -> Recorder {
        Recorder { writes: Vec::new(), refuse }
    }
}

impl Control for Recorder {
    fn write(&mut self, write: Write) -> Result<(), NvmlError> {
        if let Some(e) = (self.refuse)(write) {
            return Err(e);
        }
        self.writes.push(write);
        Ok(())
    }
}

/// The device after `writes`, as NVML would report it.
fn after(mut s: DeviceState, writes: &[Write]) -> DeviceState {
    for w in writes {
        match *w {
            Write::EnablePersistence => s.persistence = Some(true),
            Write::SetPowerLimit { mw } => s.power_limit_mw = Some(mw),
            _ => {}
        }
    }
    s
}

#[test]
fn first_apply_enables_persistence_and_locks_and_the_second_writes_nothing() {
    let fresh = DeviceState { persistence: Some(false), ..state() };
    let mut dev = Recorder::new();
    let (run, record) = execute(&mut dev, &fresh, &target(1200), None);
    assert_eq!(dev.writes, vec![Write::EnablePersistence, Write::LockClocks { min_mhz: 345, max_mhz: 1200 }]);
    assert_eq!(run.writes, dev.writes);
    assert_eq!(run.error, None);
    let record = record.unwrap();
    assert_eq!(record.cap, Cap::LockedClocks { min_mhz: 345, max_mhz: 1200 });

    let now = after(fresh, &dev.writes);
    assert_eq!(decide(&now, &target(1200), Some(&record)), vec![]);
    let mut again = Recorder::new();
    let (run, record2) = execute(&mut again, &now, &target(1200), Some(&record));
    assert!(again.writes.is_empty() && run.writes.is_empty());
    assert_eq!(record2, Some(record));
}

#[test]
fn a_new_clock_relocks() {
    let record = Applied {
        uuid: "GPU-0".into(),
        cap: Cap::LockedClocks { min_mhz: 345, max_mhz: 1200 },
        locking_unsupported: false,
    };
    assert_eq!(decide(&state(), &target(900), Some(&record)), vec![Write::LockClocks { min_mhz: 345, max_mhz: 900 }]);
}

#[test]
fn a_remembered_cap_is_not_trusted_without_persistence_or_for_another_gpu() {
    let record = Applied {
        uuid: "GPU-0".into(),
        cap: Cap::LockedClocks { min_mhz: 345, max_mhz: 1200 },
        locking_unsupported: false,
    };
    let lock = Write::LockClocks { min_mhz: 345, max_mhz: 1200 };
    let off = DeviceState { persistence: Some(false), ..state() };
    assert_eq!(decide(&off, &target(1200), Some(&record)), vec![Write::EnablePersistence, lock]);
    let unknown = DeviceState { persistence: None, ..state() };
    assert_eq!(decide(&unknown, &target(1200), Some(&record)), vec![lock]);
    let other = DeviceState { uuid: "GPU-9".into(), ..state() };
    assert_eq!(decide(&other, &target(1200), Some(&record)), vec![lock]);
}

#[test]
fn maximum_clock_means_uncapped() {
    // Unknown state: unlock once; then nothing.
    assert_eq!(decide(&state(), &target(1980), None), vec![Write::ResetClocks]);
    let uncapped = Applied { uuid: "GPU-0".into(), cap: Cap::Uncapped, locking_unsupported: false };
    assert_eq!(decide(&state(), &target(1980), Some(&uncapped)), vec![]);
    let locked = Applied { cap: Cap::LockedClocks { min_mhz: 345, max_mhz: 900 }, ..uncapped };
    assert_eq!(decide(&state(), &target(1980), Some(&locked)), vec![Write::ResetClocks]);
}

#[test]
fn without_clock_locking_the_power_limit_caps_and_is_read_back() {
    let mut dev = Recorder::refusing(|w| matches!(w, Write::LockClocks { .. }).then_some(NvmlError::NotSupported));
    let (run, record) = execute(&mut dev, &state(), &target(990), None);
    assert_eq!(dev.writes, vec![Write::SetPowerLimit { mw: 250_000 }]);
    assert_eq!(run.error, None);
    assert!(run.notes[0].contains("clock locking is not supported"), "{:?}", run.notes);
    let record = record.unwrap();
    assert!(record.locking_unsupported);
    assert_eq!(record.cap, Cap::PowerLimit { mw: 250_000 });

    let now = after(state(), &dev.writes);
    assert_eq!(decide(&now, &target(990), Some(&record)), vec![]);
    // The driver rounds to watts: no rewrite for less than a watt.
    let rounded = DeviceState { power_limit_mw: Some(250_400), ..now.clone() };
    assert_eq!(decide(&rounded, &target(990), Some(&record)), vec![]);
    // Someone changed it: set again.
    let changed = DeviceState { power_limit_mw: Some(300_000), ..now.clone() };
    assert_eq!(decide(&changed, &target(990), Some(&record)), vec![Write::SetPowerLimit { mw: 250_000 }]);
    // Planned at maximum: restore the default limit, no clock writes.
    assert_eq!(decide(&now, &target(1980), Some(&record)), vec![Write::SetPowerLimit { mw: 700_000 }]);
}

#[test]
fn the_power_limit_is_clamped_to_the_devices_range() {
    assert_eq!(power_limit_mw(&state(), 50.0), 200_000);
    assert_eq!(power_limit_mw(&state(), 900.0), 700_000);
    assert_eq!(power_limit_mw(&DeviceState { power_limit_range_mw: None, ..state() }, 50.0), 50_000);
}

#[test]
fn an_administrators_power_limit_is_left_alone_by_clock_caps() {
    let custom = DeviceState { power_limit_mw: Some(500_000), ..state() };
    assert_eq!(decide(&custom, &target(1200), None), vec![Write::LockClocks { min_mhz: 345, max_mhz: 1200 }]);
    // …but a limit vgpu set is undone when clocks take over.
    let ours = Applied { uuid: "GPU-0".into(), cap: Cap::PowerLimit { mw: 500_000 }, locking_unsupported: false };
    assert_eq!(
        decide(&custom, &target(1200), Some(&ours)),
        vec![Write::LockClocks { min_mhz: 345, max_mhz: 1200 }, Write::SetPowerLimit { mw: 700_000 }]
    );
}

#[test]
fn permission_refusal_is_explained_and_forgets_the_record() {
    let mut dev = Recorder::refusing(|_| Some(NvmlError::NoPermission));
    let (run, record) = execute(&mut dev, &state(), &target(1200), None);
    let error = run.error.unwrap();
    assert_eq!(error, "cannot lock clocks: NVML refused: permission denied (run as root, e.g. with sudo)");
    assert!(record.is_none());
    assert!(run.writes.is_empty());
}

#[test]
fn unsupported_persistence_is_said_and_the_cap_still_set() {
    let off = DeviceState { persistence: Some(false), ..state() };
    let mut dev = Recorder::refusing(|w| (w == Write::EnablePersistence).then_some(NvmlError::NotSupported));
    let (run, record) = execute(&mut dev, &off, &target(1200), None);
    assert_eq!(dev.writes, vec![Write::LockClocks { min_mhz: 345, max_mhz: 1200 }]);
    assert!(run.notes[0].contains("persistence mode is not supported"));
    assert!(record.is_some());
}

#[test]
fn neither_locking_nor_power_limit_is_a_failure() {
    let mut dev = Recorder::refusing(|w| (w != Write::EnablePersistence).then_some(NvmlError::NotSupported));
    let (run, record) = execute(&mut dev, &state(), &target(1200), None);
    assert!(run.error.unwrap().contains("cannot lock clocks (not supported) nor set the power limit"));
    assert!(record.is_none());
}

#[test]
fn reset_unlocks_and_restores_the_default_limit() {
    let capped = DeviceState { power_limit_mw: Some(250_000), ..state() };
    let mut dev = Recorder::new();
    let run = execute_reset(&mut dev, &capped, None);
    assert_eq!(dev.writes, vec![Write::ResetClocks, Write::SetPowerLimit { mw: 700_000 }]);
    assert_eq!(run.cap, Some(Cap::Uncapped));
    // Unlocking where locking is unsupported is not an error.
    let mut dev = Recorder::refusing(|w| (w == Write::ResetClocks).then_some(NvmlError::NotSupported));
    assert_eq!(execute_reset(&mut dev, &state(), None).error, None);
    let mut dev = Recorder::refusing(|_| Some(NvmlError::NoPermission));
    assert!(execute_reset(&mut dev, &state(), None).error.unwrap().contains("permission denied"));
}

#[test]
fn writes_read_well() {
    assert_eq!(Write::LockClocks { min_mhz: 345, max_mhz: 1200 }.to_string(), "clocks locked 345–1200 MHz");
    assert_eq!(Write::SetPowerLimit { mw: 250_000 }.to_string(), "power limit 250 W");
    assert_eq!(serde_json::to_string(&Write::ResetClocks).unwrap(), r#"{"op":"reset-clocks"}"#);
}

#[test]
fn applied_store_round_trips_and_survives_damage() {
    let dir = tempfile::tempdir().unwrap();
    let store = AppliedStore::new(dir.path().join("run/carbon-applied.json"));
    assert!(store.load().is_empty());
    let records = vec![Applied { uuid: "GPU-0".into(), cap: Cap::PowerLimit { mw: 1 }, locking_unsupported: true }];
    store.save(&records).unwrap();
    assert_eq!(store.load(), records);
    std::fs::write(dir.path().join("run/carbon-applied.json"), "[{").unwrap();
    assert!(store.load().is_empty());
}

#[test]
fn the_store_lock_is_exclusive() {
    let dir = tempfile::tempdir().unwrap();
    let store = AppliedStore::new(dir.path().join(APPLIED_FILE));
    let held = store.lock().expect("lock").expect("root makes the lock file");
    let file = std::fs::File::open(dir.path().join("carbon-applied.lock")).unwrap();
    assert!(nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err(), "held elsewhere");
    drop(held);
    let file = std::fs::File::open(dir.path().join("carbon-applied.lock")).unwrap();
    assert!(nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok());
}
