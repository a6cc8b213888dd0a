//! Throttling by the cgroup freezer: one thread duty-cycles the freezers of every throttled
//! workload so that each runs a given fraction of every [`PERIOD`]. Each period starts with
//! the workload thawed; it is frozen once its fraction has passed, and thawed at the next
//! period's start. The fraction is the compute audit's (`audit::compute`): it adapts from
//! round to round so that the share NVML measures converges to the vGPU's share.
//!
//! It must not fight suspension, resumption and preemption, which freeze and thaw the same
//! cgroups under the store lock. So every transition takes the store lock (waiting at most
//! [`LOCK_WAIT`]; when the store is busy the transition is skipped: a freeze until the next
//! period, a thaw for a few milliseconds) and reads the workload's record under it:
//!
//! - it freezes only a workload whose record says running and throttled by this watch (so a
//!   reconcile never finds it frozen with no record of why, and a kill recorded since — a
//!   kill outranks a throttle — stops the cycle);
//! - it thaws only a workload whose record says running;
//! - a workload whose record says anything else (suspended by hand or by the pool) is left
//!   as the suspension wants and no longer cycled; one whose record is gone has ended.
//!
//! The thread never writes records: the watch records and clears the throttle
//! (`enforce::Records`). When a workload leaves the set, or the throttler stops, whatever it
//! froze is thawed (unless suspended since). Problems come back as [`Event`]s.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vgpu_abi::process::ProcessId;

use super::enforce::is_throttle_by;
use super::Event;
use vgpu_cgroups::Cgroup;
use vgpu_cgroups::CgroupError;
use vgpu_cgroups::Layout;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadState;

/// One duty cycle: short enough that a workload frozen for part of it sees steady progress
/// (a frozen period of tens of milliseconds is shorter than what a CUDA program notices),
/// long enough that the two freezer writes and store-lock acquisitions per period cost
/// little (each is tens of microseconds).
pub const PERIOD: Duration = Duration::from_millis(100);
/// How long a transition waits for the store lock before it is skipped.
pub const LOCK_WAIT: Duration = Duration::from_millis(5);
/// How soon a skipped thaw is tried again.
const THAW_RETRY: Duration = Duration::from_millis(10);
/// How long a freeze may take before it is given up (and the cgroup thawed again).
const FREEZE_TIMEOUT: Duration = Duration::from_millis(50);
/// How long the final thaws wait for the store lock when the throttler stops.
const STOP_LOCK_WAIT: Duration = Duration::from_secs(2);

/// The freezer duty cycle of the watch's throttled workloads (a thread, started with the
/// first throttle).
pub struct Throttler {
    store: Store,
    me: ProcessId,
    layout: Option<Layout>,
    worker: Option<Worker>,
}

struct Worker {
    commands: Sender<Command>,
    events: Receiver<Event>,
    thread: JoinHandle<()>,
}

enum Command {
    /// Cycle exactly these workloads (id → fraction of each period they run).
    Set(BTreeMap<String, f64>),
    Stop,
}

impl Throttler {
    pub fn new(store: Store, me: ProcessId) -> Throttler {
        Throttler::with_layout(store, me, Layout::detect())
    }

    /// With the cgroup filesystem at `layout` (tests: a fake tree).
    pub fn with_layout(store: Store, me: ProcessId, layout: Option<Layout>) -> Throttler {
        Throttler { store, me, layout, worker: None }
    }

    /// Duty-cycle exactly these workloads: id → the fraction of each period it runs
    /// (0..=1). Workloads no longer named are thawed where the throttler froze them.
    pub fn set(&mut self, targets: BTreeMap<String, f64>) -> Option<Event> {
        if self.worker.is_none() {
            if targets.is_empty() {
                return None;
            }
            match self.spawn() {
                Ok(worker) => self.worker = Some(worker),
                Err(e) => return Some(Event::warn(format!("cannot start the throttling thread: {e}"))),
            }
        }
        let worker = self.worker.as_ref()?;
        worker.commands.send(Command::Set(targets)).err().map(|_| Event::warn("the throttling thread is gone"))
    }

    /// What the thread has to say since the last call.
    pub fn events(&self) -> Vec<Event> {
        self.worker.as_ref().map(|w| w.events.try_iter().collect()).unwrap_or_default()
    }

    /// Stop cycling: thaw everything the throttler froze (unless suspended since), waiting
    /// for the store lock up to a few seconds per workload. Returns what it has to say.
    pub fn stop(&mut self) -> Vec<Event> {
        let Some(worker) = self.worker.take() else { return Vec::new() };
        let _ = worker.commands.send(Command::Stop);
        if worker.thread.join().is_err() {
            return vec![Event::warn("the throttling thread panicked; `vgpu ps` (reconcile) thaws what it froze")];
        }
        worker.events.try_iter().collect()
    }

    fn spawn(&self) -> std::io::Result<Worker> {
        let (commands, from_watch) = mpsc::channel();
        let (to_watch, events) = mpsc::channel();
        let cycle = Cycle { store: self.store.clone(), me: self.me, layout: self.layout.clone(), events: to_watch, targets: BTreeMap::new(), releasing: BTreeMap::new() };
        let thread = std::thread::Builder::new().name("vgpu-throttle".into()).spawn(move || cycle.run(from_watch))?;
        Ok(Worker { commands, events, thread })
    }
}

impl Drop for Throttler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One cycled workload.
struct Target {
    /// Fraction of each period it runs.
    run: f64,
    /// Frozen by the throttler (and not thawed since).
    frozen: bool,
    /// A transition skipped is tried again from then.
    retry_at: Option<Instant>,
    cgroup: Option<Cgroup>,
    /// Said once that a transition failed.
    warned: bool,
}

impl Target {
    fn new(run: f64) -> Target {
        Target { run, frozen: false, retry_at: None, cgroup: None, warned: false }
    }
}

/// What became of one transition.
enum Step {
    Done,
    /// The store lock was busy, or the record does not yet say throttled by this watch.
    Skipped,
    /// The record says it is not running (suspended): leave it to that.
    NotRunning,
    /// No record or no cgroup: it ended.
    Gone,
    Failed(String),
}

/// The thread's state.
struct Cycle {
    store: Store,
    me: ProcessId,
    layout: Option<Layout>,
    events: Sender<Event>,
    targets: BTreeMap<String, Target>,
    /// No longer to be cycled, but still frozen by the throttler: to thaw.
    releasing: BTreeMap<String, Target>,
}

impl Cycle {
    fn run(mut self, commands: Receiver<Command>) {
        let mut period_start = Instant::now();
        loop {
            let now = Instant::now();
            let command = match self.next_wake(period_start, now) {
                None => commands.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(at) => commands.recv_timeout(at.saturating_duration_since(now)),
            };
            match command {
                Ok(Command::Set(targets)) => self.set(targets),
                Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            if now >= period_start + PERIOD {
                let behind = (now - period_start).as_nanos() / PERIOD.as_nanos();
                period_start += PERIOD * u32::try_from(behind).unwrap_or(u32::MAX);
            }
            self.step(period_start, now);
        }
        self.stop();
    }

    /// When something is next due; None: nothing to do until told.
    fn next_wake(&self, period_start: Instant, now: Instant) -> Option<Instant> {
        if self.targets.is_empty() && self.releasing.is_empty() {
            return None;
        }
        let mut wake = period_start + PERIOD;
        for t in self.targets.values() {
            let freeze_at = period_start + PERIOD.mul_f64(t.run);
            if t.run < 1.0 && !t.frozen && freeze_at > now {
                wake = wake.min(freeze_at);
            }
        }
        for t in self.targets.values().chain(self.releasing.values()) {
            if let Some(at) = t.retry_at.filter(|&at| at > now) {
                wake = wake.min(at);
            }
        }
        Some(wake.max(now))
    }

    fn set(&mut self, wanted: BTreeMap<String, f64>) {
        let gone: Vec<String> = self.targets.keys().filter(|id| !wanted.contains_key(*id)).cloned().collect();
        for id in gone {
            if let Some(t) = self.targets.remove(&id).filter(|t| t.frozen) {
                self.releasing.insert(id, t);
            }
        }
        for (id, run) in wanted {
            let target = self.targets.entry(id.clone()).or_insert_with(|| self.releasing.remove(&id).unwrap_or_else(|| Target::new(run)));
            target.run = run.clamp(0.0, 1.0);
        }
    }

    fn step(&mut self, period_start: Instant, now: Instant) {
        let phase = now.saturating_duration_since(period_start);
        let ids: Vec<String> = self.targets.keys().cloned().collect();
        for id in ids {
            let Some(mut t) = self.targets.remove(&id) else { continue };
            let freeze = t.run < 1.0 && phase >= PERIOD.mul_f64(t.run);
            if freeze == t.frozen || t.retry_at.is_some_and(|at| at > now) {
                self.targets.insert(id, t);
                continue;
            }
            match self.transition(&id, &mut t, freeze, LOCK_WAIT) {
                Step::Done => {
                    t.frozen = freeze;
                    t.retry_at = None;
                }
                Step::Skipped if freeze => t.retry_at = Some(period_start + PERIOD),
                Step::Skipped => t.retry_at = Some(now + THAW_RETRY),
                Step::NotRunning | Step::Gone => continue, // no longer cycled; left as it is
                Step::Failed(why) => {
                    if !t.warned {
                        t.warned = true;
                        let _ = self.events.send(Event::warn(format!("cannot {} workload {id} to throttle it: {why}", if freeze { "freeze" } else { "thaw" })));
                    }
                    t.retry_at = Some(period_start + PERIOD);
                }
            }
            self.targets.insert(id, t);
        }
        let ids: Vec<String> = self.releasing.keys().cloned().collect();
        for id in ids {
            let Some(mut t) = self.releasing.remove(&id) else { continue };
            if t.retry_at.is_some_and(|at| at > now) {
                self.releasing.insert(id, t);
                continue;
            }
            match self.transition(&id, &mut t, false, LOCK_WAIT) {
                Step::Done | Step::NotRunning | Step::Gone => {}
                Step::Skipped => {
                    t.retry_at = Some(now + THAW_RETRY);
                    self.releasing.insert(id, t);
                }
                Step::Failed(why) => {
                    let _ = self.events.send(Event::warn(format!("cannot thaw workload {id} after throttling it: {why}; `vgpu resume {id}` thaws it")));
                }
            }
        }
    }

    /// Thaw everything frozen by the throttler, waiting longer for the store lock.
    fn stop(&mut self) {
        let frozen: Vec<(String, Target)> =
            std::mem::take(&mut self.targets).into_iter().chain(std::mem::take(&mut self.releasing)).filter(|(_, t)| t.frozen).collect();
        for (id, mut t) in frozen {
            match self.transition(&id, &mut t, false, STOP_LOCK_WAIT) {
                Step::Done | Step::NotRunning | Step::Gone => {}
                Step::Skipped => {
                    let _ = self.events.send(Event::warn(format!("left workload {id} frozen: the store stayed locked; the next `vgpu` command thaws it")));
                }
                Step::Failed(why) => {
                    let _ = self.events.send(Event::warn(format!("cannot thaw workload {id}: {why}; `vgpu resume {id}` thaws it")));
                }
            }
        }
    }

    /// Freeze or thaw one workload, under the store lock, if its record allows it.
    fn transition(&self, id: &str, t: &mut Target, freeze: bool, wait: Duration) -> Step {
        let _lock = match self.store.lock_within(wait) {
            Ok(lock) => lock,
            Err(StateError::LockBusy { .. }) => return Step::Skipped,
            Err(e) => return Step::Failed(e.to_string()),
        };
        let w = match Workload::read(&self.store.workload_path(id)) {
            Ok(w) => w,
            Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Step::Gone,
            Err(e) => return Step::Failed(e.to_string()),
        };
        if w.state != WorkloadState::Running {
            return Step::NotRunning;
        }
        if freeze && !w.enforcement.as_ref().is_some_and(|e| is_throttle_by(e, self.me.into())) {
            return Step::Skipped;
        }
        let cgroup = match &t.cgroup {
            Some(cgroup) => cgroup,
            None => {
                let Some(layout) = &self.layout else { return Step::Failed("no cgroup filesystem".into()) };
                match Cgroup::open_at(layout, &w.cgroup_home, &w.cgroup) {
                    Ok(cgroup) => t.cgroup.insert(cgroup.with_timeout(FREEZE_TIMEOUT)),
                    Err(CgroupError::NotFound { .. }) => return Step::Gone,
                    Err(e) => return Step::Failed(e.to_string()),
                }
            }
        };
        let done = if freeze { cgroup.freeze() } else { cgroup.thaw() };
        match done {
            Ok(()) => Step::Done,
            Err(CgroupError::NotFound { .. }) => Step::Gone,
            Err(e) => Step::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_cgroups::fake::FakeV1;
    use vgpu_cgroups::FreezerState;
    use vgpu_store::state::workload::tests::sample;
    use vgpu_store::state::Enforcement;
    use vgpu_store::state::EnforcementAction;

    struct Setup {
        fake: FakeV1,
        _dir: tempfile::TempDir,
        store: Store,
        me: ProcessId,
        workload: Workload,
    }

    impl Setup {
        fn new() -> Setup {
            let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
            let dir = tempfile::tempdir().unwrap();
            let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
            store.ensure_dirs().unwrap();
            let me = ProcessId::current().unwrap();
            let mut workload = sample();
            workload.supervisor = me.into();
            Cgroup::create(&fake.layout(), &workload.cgroup).unwrap();
            fake.kernel_populate(&workload.cgroup);
            Setup { fake, _dir: dir, store, me, workload }
        }

        /// Change the record (and the freezer) under the store lock, as `vgpu suspend` does.
        fn record(&self, state: WorkloadState, throttled: bool, freeze: Option<bool>) {
            let _lock = self.store.lock().unwrap();
            let mut w = self.workload.clone();
            w.state = state;
            w.enforcement = throttled.then(|| Enforcement {
                action: EnforcementAction::Throttled,
                reason: "r".into(),
                pids: Vec::new(),
                by: self.me.into(),
                since_unix_ms: 0,
            });
            self.store.write_workload(&w).unwrap();
            match freeze {
                Some(true) => self.cgroup().freeze().unwrap(),
                Some(false) => self.cgroup().thaw().unwrap(),
                None => {}
            }
        }

        fn cgroup(&self) -> Cgroup {
            Cgroup::open(&self.fake.layout(), &self.workload.cgroup).unwrap()
        }

        fn frozen(&self) -> bool {
            // The fake file can be read between the throttler's truncation and its write
            // (the kernel's cannot): read again.
            loop {
                if let Ok(state) = self.cgroup().state() {
                    return state == FreezerState::Frozen;
                }
            }
        }

        /// The freezer states seen every 2 ms for `how_long`.
        fn watch(&self, how_long: Duration) -> Vec<bool> {
            let end = Instant::now() + how_long;
            let mut seen = Vec::new();
            while Instant::now() < end {
                seen.push(self.frozen());
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        }

        fn throttler(&self) -> Throttler {
            Throttler::with_layout(self.store.clone(), self.me, Some(self.fake.layout()))
        }
    }

    fn freezes(seen: &[bool]) -> usize {
        seen.windows(2).filter(|w| !w[0] && w[1]).count()
    }

    fn targets(id: &str, run: f64) -> BTreeMap<String, f64> {
        [(id.to_string(), run)].into_iter().collect()
    }

    #[test]
    fn it_cycles_only_a_running_workload_throttled_by_this_watch_and_leaves_a_suspended_one() {
        let s = Setup::new();
        let id = s.workload.id.clone();
        let mut throttler = s.throttler();
        // Not (yet) recorded as throttled: never frozen.
        s.record(WorkloadState::Running, false, None);
        assert!(throttler.set(targets(&id, 0.3)).is_none());
        assert!(s.watch(Duration::from_millis(300)).iter().all(|f| !f), "frozen before its record said throttled");
        // Recorded: it cycles (about 10 times a second; 3 in 3 s is plenty on a loaded host).
        s.record(WorkloadState::Running, true, None);
        let seen = s.watch(Duration::from_secs(3));
        let frozen = seen.iter().filter(|f| **f).count() as f64 / seen.len() as f64;
        eprintln!("run 0.3: {} freezes in 3 s, frozen in {:.0}% of the samples", freezes(&seen), frozen * 100.0);
        assert!(freezes(&seen) >= 3, "{seen:?}");
        // Suspended (by hand, under the lock): frozen, and left so.
        s.record(WorkloadState::Suspended, true, Some(true));
        assert!(s.watch(Duration::from_millis(300)).iter().all(|f| *f), "a suspended workload was thawed");
        // Resumed and no longer throttled: the throttler keeps its hands off.
        s.record(WorkloadState::Running, false, Some(false));
        assert!(throttler.set(targets(&id, 0.3)).is_none());
        assert!(s.watch(Duration::from_millis(300)).iter().all(|f| !f));
        // Throttled again, then released: thawed, and left thawed.
        s.record(WorkloadState::Running, true, None);
        s.watch(Duration::from_millis(200));
        assert!(throttler.set(BTreeMap::new()).is_none());
        std::thread::sleep(Duration::from_millis(50));
        assert!(s.watch(Duration::from_millis(300)).iter().all(|f| !f), "released but frozen");
        assert!(throttler.stop().is_empty());
    }

    #[test]
    fn no_transition_without_the_store_lock_and_stop_thaws() {
        let s = Setup::new();
        s.record(WorkloadState::Running, true, None);
        let mut throttler = s.throttler();
        throttler.set(targets(&s.workload.id, 0.5));
        s.watch(Duration::from_millis(150));
        for _ in 0..3 {
            let lock = s.store.lock().unwrap();
            let state = s.frozen();
            assert!(s.watch(Duration::from_millis(250)).iter().all(|f| *f == state), "changed while the store was locked");
            drop(lock);
            s.watch(Duration::from_millis(60));
        }
        // Stopping thaws it, whatever the phase.
        while !s.frozen() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(throttler.stop().is_empty());
        assert!(!s.frozen(), "stop left it frozen");
    }
}
