//! Offences in the watch: what the audits condemn is gathered per workload each round
//! ([`Condemned`]), judged (`audit::offence`: a first offence or a second one within
//! `[watch] offence_window`) and acted on ([`OffenceEnforcer::act`]):
//!
//! - **First offence.** Under the store lock (waiting at most [`LOCK_WAIT`]; without it if
//!   it stays busy), the record says why (`killed: …`), the workload's cgroup is frozen at
//!   once (so nothing in it runs, allocates or spawns a replacement meanwhile), the
//!   offending processes get SIGKILL (a frozen process cannot act on SIGTERM, and a SIGTERM
//!   would need a thaw first, which lets a respawning parent run), and the cgroup is thawed
//!   (a task frozen by the v1 freezer dies once thawed with SIGKILL pending; v2 kills it
//!   frozen; the order is the same on both). A workload suspended (frozen by `vgpu
//!   suspend` or the pool) is not thawed: only its offenders leave the freezer to die
//!   (`Cgroup::release_killed`), so nothing else of it runs; where that fails it is
//!   thawed for them and frozen again once they are gone.
//! - **Second offence** within the window: the record says `ended: second offence within
//!   10m: …`, the cgroup is frozen at once, every process in it gets SIGKILL (v2:
//!   `cgroup.kill`), and it is thawed; what is still there (a process the kernel is slow to
//!   reap) is killed again every round until the workload is gone.
//!
//! Holding the store lock across freeze, kill and thaw is what keeps the other freezer users
//! off the cgroup meanwhile: the throttling thread (`throttle.rs`) and reconcile (which
//! thaws a running workload frozen for no recorded reason) change freezers only under it,
//! so an offence's freeze is never undone half-way. A watch killed in the middle leaves a
//! frozen cgroup whose record says `killed` or `ended` by a watch that is gone: the next
//! reconcile thaws it, and finishes an `ended` one (`recovery.rs`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use vgpu_abi::process::ProcessId;

use super::enforce::{self, Records};
use super::Event;
use crate::audit::offence::describe_window;
use crate::audit::offence::Judgement;
use crate::audit::offence::Offences;
use vgpu_cgroups::Cgroup;
use vgpu_cgroups::CgroupError;
use vgpu_cgroups::FreezerState;
use vgpu_cgroups::Layout;
use crate::metrics;
use crate::metrics::Enforcements;
use crate::metrics::WorkloadLabels;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadState;

/// How long an offence waits for the store lock before it acts without it.
pub const LOCK_WAIT: Duration = Duration::from_millis(500);
/// How long a freeze may take before the watch kills without it.
const FREEZE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long ending a workload waits for its processes to be gone (the rest is killed again
/// at the next rounds).
const KILL_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a later round waits for them: it only signals again what is left (a process
/// stuck in the kernel, in a hung file system say, must not slow every round down).
const SWEEP_TIMEOUT: Duration = Duration::from_millis(10);
/// How long a suspended workload's killed offenders are waited for before it is frozen again.
const REAP_TIMEOUT: Duration = Duration::from_millis(500);

/// The audit that condemned processes (`vgpu_enforcements_total`'s `reason`).
pub type Audit = &'static str;

/// One round's kill verdicts against one workload.
#[derive(Debug, Default)]
struct Charge {
    processes: Vec<(ProcessId, Audit)>,
    reasons: Vec<String>,
}

/// One round's kill verdicts, per workload: each workload's are one offence.
#[derive(Debug, Default)]
pub struct Condemned {
    charges: BTreeMap<String, Charge>,
}

impl Condemned {
    /// The audit `audit` condemns `processes` of workload `id` for `reason`.
    pub fn add(&mut self, id: &str, processes: &[ProcessId], reason: &str, audit: Audit) {
        let charge = self.charges.entry(id.to_string()).or_default();
        for p in processes {
            if !charge.processes.iter().any(|(q, _)| q == p) {
                charge.processes.push((*p, audit));
            }
        }
        if !charge.reasons.iter().any(|r| r == reason) {
            charge.reasons.push(reason.to_string());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.charges.is_empty()
    }
}

/// What one round acts with.
pub struct Act<'a> {
    pub store: &'a Store,
    pub workloads: &'a [Workload],
    pub window: Duration,
    pub counters: &'a Enforcements,
}

/// The offences the watch knows of, and the workloads it is ending.
pub struct OffenceEnforcer {
    me: ProcessId,
    layout: Option<Layout>,
    offences: Offences,
    /// Workloads this watch ended whose processes may not all be gone yet.
    ending: BTreeSet<String>,
}

impl OffenceEnforcer {
    pub fn new(me: ProcessId) -> OffenceEnforcer {
        OffenceEnforcer::with_layout(me, Layout::detect())
    }

    /// With the cgroup filesystem at `layout` (tests: a fake tree).
    pub fn with_layout(me: ProcessId, layout: Option<Layout>) -> OffenceEnforcer {
        OffenceEnforcer { me, layout, offences: Offences::default(), ending: BTreeSet::new() }
    }

    /// Judge and act on one round's verdicts; kill again what is left of the workloads it
    /// ended.
    pub fn act(&mut self, r: &Act<'_>, condemned: Condemned, records: &mut Records, events: &mut Vec<Event>) {
        let live: HashSet<&str> = r.workloads.iter().map(|w| w.id.as_str()).collect();
        self.offences.retain(&live);
        self.ending.retain(|id| live.contains(id.as_str()));
        self.sweep(r, events);
        let now_ms = vgpu_store::clock::now_ms();
        let window_ms = u64::try_from(r.window.as_millis()).unwrap_or(u64::MAX);
        for (id, charge) in condemned.charges {
            let w = r.workloads.iter().find(|w| w.id == id);
            if let Some(e) = w.and_then(|w| w.enforcement.as_ref()).filter(|e| e.action.is_offence()) {
                // A watch before this one (or this one, forgotten) recorded an offence.
                if !self.offences.knows(&id) {
                    self.offences.seed(&id, e.since_unix_ms, &e.reason);
                }
            }
            let processes: Vec<ProcessId> = charge.processes.iter().map(|(p, _)| *p).collect();
            let reason = charge.reasons.join("; ");
            let Some(judgement) = self.offences.offend(&id, &processes, &reason, now_ms, window_ms) else { continue };
            let audits = |fresh: &[ProcessId]| -> Vec<Audit> {
                fresh.iter().filter_map(|p| charge.processes.iter().find(|(q, _)| q == p).map(|(_, a)| *a)).collect()
            };
            let Some(w) = w else {
                // Its record is gone (it ends): nothing to freeze or record, only signals.
                for p in judgement_processes(&judgement) {
                    if let Ok(true) = vgpu_store::supervise::signal_exact(*p, libc::SIGKILL) {
                        events.push(Event::info(format!("SIGKILL to pid {} of workload {id}: {reason}", p.pid)));
                    }
                }
                continue;
            };
            match judgement {
                Judgement::First { processes } => {
                    let audits = audits(&processes);
                    self.first(r, w, &processes, &audits, &reason, window_ms, records, events);
                }
                Judgement::Second { first, processes } => {
                    let audits = audits(&processes);
                    let reason = format!("second offence within {}: {reason}", describe_window(window_ms));
                    events.push(Event::debug(format!("{}: first offence {} s ago: {}", enforce::whose(r.workloads, &id), now_ms.saturating_sub(first.at_unix_ms) / 1000, first.reason)));
                    self.end(r, w, &reason, audits.first().copied().unwrap_or("memory"), records, events);
                }
            }
        }
    }

    /// A workload's first offence: freeze, SIGKILL the offenders, thaw (see the module).
    #[allow(clippy::too_many_arguments)]
    fn first(&mut self, r: &Act<'_>, w: &Workload, processes: &[ProcessId], audits: &[Audit], reason: &str, window_ms: u64, records: &mut Records, events: &mut Vec<Event>) {
        let whose = enforce::whose(r.workloads, &w.id);
        let lock = self.lock(r.store, events);
        records.add(&w.id, enforce::killed(self.me, reason, processes.iter().map(|p| p.pid).collect()));
        if let Some(lock) = &lock {
            records.flush_locked(r.store, lock, events);
        }
        // Suspended since the round began? Then it stays so.
        let suspended = current_state(r.store, w) == WorkloadState::Suspended;
        let cgroup = self.cgroup(w, FREEZE_TIMEOUT, events);
        let frozen = match &cgroup {
            Some(c) => match c.freeze() {
                Ok(()) => true,
                Err(e) => {
                    events.push(Event::warn(format!("cannot freeze {whose} at its offence: {e}; killing its offenders anyway")));
                    false
                }
            },
            None => false,
        };
        if frozen {
            vgpu_store::stop_point::stop_point("watch:offence-frozen");
        }
        let what = if frozen { "its first offence (frozen meanwhile)" } else { "its first offence" };
        let next = if window_ms == 0 { String::new() } else { format!(": a second within {} ends the workload", describe_window(window_ms)) };
        let labels = WorkloadLabels::of(w);
        let mut killed = Vec::new();
        for (p, audit) in processes.iter().zip(audits) {
            // A Slurm step's task learns why in the job's output (no vgpu run tells it).
            if let Some(step) = &w.slurm {
                if p.is_alive() {
                    super::tell::tell(p.pid, w.user.uid, &format!("vgpu watch on {}: killed pid {} of job {} step {}: {reason}", step.node, p.pid, step.job, step.step));
                }
            }
            match vgpu_store::supervise::signal_exact(*p, libc::SIGKILL) {
                Ok(true) => {
                    killed.push(*p);
                    r.counters.record(metrics::Action::Kill, audit, &labels);
                    events.push(Event::info(format!("SIGKILL to pid {} of {whose}: {reason}; {what}{next}", p.pid)));
                }
                Ok(false) => {}
                Err(e) => events.push(Event::warn(format!("cannot signal pid {} of {whose}: {e}", p.pid))),
            }
        }
        if let Some(c) = &cgroup {
            // A suspended workload's other processes must not run: only its offenders are
            // let out of the freezer to die (v1; v2 kills them frozen).
            // Only pids inside the frozen cgroup: a frozen task cannot die, so its pid is
            // not reused meanwhile (an offender outside it, a Slurm task say, is not moved).
            let released = suspended && frozen && {
                let inside = c.pids().unwrap_or_default();
                let pids: Vec<i32> = killed.iter().filter_map(|p| i32::try_from(p.pid).ok()).filter(|pid| inside.contains(pid)).collect();
                match c.release_killed(&pids) {
                    Ok(()) => true,
                    Err(e) => {
                        events.push(Event::warn(format!("cannot let the offenders of suspended {whose} die frozen: {e}; thawing it for them")));
                        false
                    }
                }
            };
            if released {
                wait_gone(&killed, REAP_TIMEOUT);
            } else {
                if frozen || c.state().is_ok_and(|s| s != FreezerState::Thawed) {
                    if let Err(e) = c.thaw() {
                        events.push(Event::warn(format!("cannot thaw {whose} after killing its offenders: {e}; reconcile thaws it")));
                    }
                }
                if suspended {
                    // Thawed for its offenders to die; frozen again once they are, as its
                    // suspension wants.
                    wait_gone(&killed, REAP_TIMEOUT);
                    if let Err(e) = c.freeze() {
                        events.push(Event::warn(format!("cannot freeze suspended {whose} again after killing its offenders: {e}")));
                    }
                }
            }
        }
        drop(lock);
    }

    /// A workload's second offence within the window: freeze, kill every process, thaw.
    fn end(&mut self, r: &Act<'_>, w: &Workload, reason: &str, audit: Audit, records: &mut Records, events: &mut Vec<Event>) {
        let whose = enforce::whose(r.workloads, &w.id);
        let lock = self.lock(r.store, events);
        let cgroup = self.cgroup(w, KILL_TIMEOUT, events);
        let pids: Vec<u32> = cgroup.as_ref().and_then(|c| c.pids().ok()).unwrap_or_default().into_iter().filter_map(|p| u32::try_from(p).ok()).collect();
        records.add(&w.id, enforce::ended(self.me, reason, pids.clone()));
        if let Some(lock) = &lock {
            records.flush_locked(r.store, lock, events);
        }
        r.counters.record(metrics::Action::End, audit, &WorkloadLabels::of(w));
        events.push(Event::warn(format!("ended {whose}: {reason}")));
        self.ending.insert(w.id.clone());
        let Some(c) = cgroup else { return };
        let frozen = c.freeze_within(FREEZE_TIMEOUT);
        if let Err(e) = &frozen {
            events.push(Event::warn(format!("cannot freeze {whose} to end it: {e}; killing it anyway")));
        } else {
            vgpu_store::stop_point::stop_point("watch:offence-frozen");
        }
        match c.kill_all() {
            Ok(n) => events.push(Event::info(format!("SIGKILL to the {n} process(es) of {whose}: {reason}"))),
            Err(e) => events.push(Event::warn(format!("cannot kill every process of {whose} yet: {e}; trying again next round"))),
        }
        drop(lock);
    }

    /// Kill again what is left of the workloads this watch ended.
    fn sweep(&mut self, r: &Act<'_>, events: &mut Vec<Event>) {
        for id in self.ending.clone() {
            let Some(w) = r.workloads.iter().find(|w| w.id == id) else { continue };
            let Some(c) = self.cgroup(w, SWEEP_TIMEOUT, &mut Vec::new()) else { continue };
            if c.pids().is_ok_and(|p| p.is_empty()) {
                continue;
            }
            if let Err(e) = c.kill_all() {
                events.push(Event::debug(format!("{} still has processes: {e}", enforce::whose(r.workloads, &id))));
            }
        }
    }

    fn lock(&self, store: &Store, events: &mut Vec<Event>) -> Option<vgpu_store::state::StoreLock> {
        match store.lock_within(LOCK_WAIT) {
            Ok(lock) => Some(lock),
            Err(e) => {
                events.push(Event::debug(format!("acting on an offence without the store lock: {e}")));
                None
            }
        }
    }

    fn cgroup(&self, w: &Workload, timeout: Duration, events: &mut Vec<Event>) -> Option<Cgroup> {
        let layout = self.layout.as_ref()?;
        match Cgroup::open_at(layout, &w.cgroup_home, &w.cgroup) {
            Ok(c) => Some(c.with_timeout(timeout)),
            Err(CgroupError::NotFound { .. }) => None,
            Err(e) => {
                events.push(Event::warn(format!("cannot open the cgroup of {}: {e}", enforce::whose(std::slice::from_ref(w), &w.id))));
                None
            }
        }
    }
}

fn judgement_processes(j: &Judgement) -> &[ProcessId] {
    match j {
        Judgement::First { processes } | Judgement::Second { processes, .. } => processes,
    }
}

/// The workload's state as its record says now (the round's copy may be older).
fn current_state(store: &Store, w: &Workload) -> WorkloadState {
    Workload::read(&store.workload_path(&w.id)).map(|r| r.state).unwrap_or(w.state)
}

/// Wait (at most `timeout`) until none of `processes` runs.
fn wait_gone(processes: &[ProcessId], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while processes.iter().any(|p| p.is_alive()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_cgroups::fake::FakeV1;
    use vgpu_store::state::workload::tests::sample;
    use vgpu_store::state::EnforcementAction;
    use crate::watch::throttle::Throttler;

    struct Setup {
        fake: FakeV1,
        _dir: tempfile::TempDir,
        store: Store,
        me: ProcessId,
        counters: Enforcements,
    }

    impl Setup {
        fn new(state: WorkloadState) -> Setup {
            let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
            let (dir, store) = vgpu_store::state::temp_store();
            let me = ProcessId::current().unwrap();
            let mut w = sample();
            w.state = state;
            w.supervisor = me.into();
            store.write_workload(&w).unwrap();
            Cgroup::create(&fake.layout(), &w.cgroup).unwrap();
            fake.kernel_populate(&w.cgroup);
            Setup { fake, _dir: dir, store, me, counters: Enforcements::default() }
        }

        fn cgroup(&self) -> Cgroup {
            Cgroup::open(&self.fake.layout(), &sample().cgroup).unwrap()
        }

        fn frozen(&self) -> bool {
            // The fake file can be read between a truncation and a write: read again.
            loop {
                if let Ok(state) = self.cgroup().state() {
                    return state == FreezerState::Frozen;
                }
            }
        }

        fn record(&self) -> Workload {
            Workload::read(&self.store.workload_path(&sample().id)).unwrap()
        }

        /// One round in which `processes` of the sample workload are condemned.
        fn round(&self, enforcer: &mut OffenceEnforcer, processes: &[ProcessId]) -> Vec<Event> {
            let workloads = vec![self.record()];
            let mut condemned = Condemned::default();
            condemned.add(&sample().id, processes, "over memory quota on GPU 0: 3 GiB of 1 GiB", "memory");
            let act = Act { store: &self.store, workloads: &workloads, window: Duration::from_secs(600), counters: &self.counters };
            let (mut records, mut events) = (Records::default(), Vec::new());
            enforcer.act(&act, condemned, &mut records, &mut events);
            records.flush(&self.store, &mut events);
            events
        }

        fn enforcer(&self) -> OffenceEnforcer {
            OffenceEnforcer::with_layout(self.me, Some(self.fake.layout()))
        }
    }

    /// A process to condemn, and its id.
    fn offender() -> (std::process::Child, ProcessId) {
        let child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let id = ProcessId { pid: child.id(), start_time: vgpu_abi::process::start_time(child.id()).unwrap() };
        (child, id)
    }

    fn died_of_sigkill(mut child: std::process::Child) -> bool {
        std::os::unix::process::ExitStatusExt::signal(&child.wait().unwrap()) == Some(libc::SIGKILL)
    }

    #[test]
    fn a_first_offence_kills_the_offenders_records_why_and_leaves_the_workload_thawed() {
        let s = Setup::new(WorkloadState::Running);
        let mut enforcer = s.enforcer();
        let (child, p) = offender();
        let events = s.round(&mut enforcer, &[p]);
        assert!(died_of_sigkill(child));
        assert!(!s.frozen(), "thawed after the kill");
        let e = s.record().enforcement.unwrap();
        assert_eq!((e.action, e.pids.as_slice()), (EnforcementAction::Killed, &[p.pid][..]));
        let line = events.iter().find(|e| e.message.starts_with("SIGKILL to pid")).expect("a SIGKILL line");
        assert!(line.message.ends_with("over memory quota on GPU 0: 3 GiB of 1 GiB; its first offence (frozen meanwhile): a second within 10m ends the workload"), "{line:?}");
        assert_eq!(s.counters.count(metrics::Action::Kill, "memory", &WorkloadLabels::of(&sample())), 1);
        // The same process seen again next round (NVML may still list it): no new offence.
        assert!(s.round(&mut enforcer, &[p]).is_empty());
    }

    #[test]
    fn a_second_offence_within_the_window_ends_the_workload_and_a_new_watch_knows_the_first() {
        let s = Setup::new(WorkloadState::Running);
        let (first, p) = offender();
        s.round(&mut s.enforcer(), &[p]);
        assert!(died_of_sigkill(first));
        // Another watch (this one forgot, or was restarted): the record says it offended.
        let (mut second, q) = offender();
        let events = s.round(&mut s.enforcer(), &[q]);
        let e = s.record().enforcement.unwrap();
        assert_eq!(e.action, EnforcementAction::Ended, "{events:?}");
        assert_eq!(e.reason, "second offence within 10m: over memory quota on GPU 0: 3 GiB of 1 GiB");
        assert!(events.iter().any(|e| e.message == "ended workload train (a1b2c3d4): second offence within 10m: over memory quota on GPU 0: 3 GiB of 1 GiB"), "{events:?}");
        assert_eq!(s.counters.count(metrics::Action::End, "memory", &WorkloadLabels::of(&sample())), 1);
        assert!(!s.frozen(), "thawed once killed");
        // The fake cgroup lists no process, so the end signalled none: this one is left.
        let _ = second.kill();
        let _ = second.wait();
    }

    #[test]
    fn a_suspended_workload_is_frozen_again_after_its_offenders_are_killed() {
        let s = Setup::new(WorkloadState::Suspended);
        s.cgroup().freeze().unwrap();
        let (child, p) = offender();
        s.round(&mut s.enforcer(), &[p]);
        assert!(died_of_sigkill(child));
        assert!(s.frozen(), "still suspended");
        assert_eq!(s.record().state, WorkloadState::Suspended);
    }

    #[test]
    fn a_throttled_workload_is_thawed_by_its_offence_and_no_longer_cycled() {
        let s = Setup::new(WorkloadState::Running);
        // Throttled by this watch: the throttler cycles its freezer.
        let mut w = s.record();
        w.enforcement = Some(enforce::throttled(s.me, "GPU 0 at 97% by the driver", vec![1]));
        s.store.write_workload(&w).unwrap();
        let mut throttler = Throttler::with_layout(s.store.clone(), s.me, Some(s.fake.layout()));
        throttler.set([(w.id.clone(), 0.5)].into_iter().collect());
        let deadline = Instant::now() + Duration::from_secs(5);
        while !s.frozen() {
            assert!(Instant::now() < deadline, "the throttler never froze it");
            std::thread::sleep(Duration::from_millis(1));
        }
        let (child, p) = offender();
        s.round(&mut s.enforcer(), &[p]);
        assert!(died_of_sigkill(child));
        assert_eq!(s.record().enforcement.map(|e| e.action), Some(EnforcementAction::Killed), "a kill outranks the throttle");
        // The throttler may thaw it once more, never freeze it again.
        let end = Instant::now() + Duration::from_millis(300);
        std::thread::sleep(Duration::from_millis(150));
        while Instant::now() < end {
            assert!(!s.frozen(), "frozen again by the throttler after the offence");
            std::thread::sleep(Duration::from_millis(2));
        }
        throttler.stop();
    }
}
