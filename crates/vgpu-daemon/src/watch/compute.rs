//! The compute audit's round in the watch: gather each vGPU's figures
//! (`enforce::vgpu_compute`), judge them (`audit::compute`), and act on its workloads —
//! a partition's vGPU is judged once and acts on every workload in it: duty-cycle their
//! freezers (`throttle`), condemn the processes the shim does not see (each an offence of
//! its workload: `offence.rs`), or say so — and record what is done in the workloads'
//! records.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use vgpu_abi::process::ProcessId;

use vgpu_host::config::watch::WatchConfig;
use super::enforce::{self, Records};
use super::offence::Condemned;
use super::throttle::{self, Throttler};
use super::Event;
use crate::audit::compute::Action;
use crate::audit::compute::ComputeAudit;
use crate::audit::compute::Settings;
use crate::audit::compute::Verdict;
use vgpu_gpu::snapshot::Snapshot;
use crate::metrics;
use crate::metrics::Enforcements;
use crate::metrics::WorkloadLabels;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadState;

/// How long clearing the throttles from the records waits for the store lock when the
/// watch stops.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// What one round works on.
pub struct Round<'a> {
    pub store: &'a Store,
    pub workloads: &'a [Workload],
    /// The workloads' vGPU files, as read this round.
    pub files: &'a [enforce::VgpuFiles<'a>],
    pub snapshot: &'a Snapshot,
    pub config: &'a WatchConfig,
    pub now: Instant,
    /// The counters of `vgpu_enforcements_total` (`reason = "compute"`).
    pub counters: &'a Enforcements,
}

/// The compute audit's memory and the throttler.
pub struct ComputeEnforcer {
    me: ProcessId,
    audit: ComputeAudit,
    throttler: Throttler,
    /// The workloads being throttled (as handed to the throttler), and who they are.
    throttling: BTreeMap<String, String>,
    /// Whether anything was ever throttled (then the records are cleaned when it stops).
    used: bool,
}

impl ComputeEnforcer {
    pub fn new(store: Store, me: ProcessId) -> ComputeEnforcer {
        ComputeEnforcer { me, audit: ComputeAudit::default(), throttler: Throttler::new(store, me), throttling: BTreeMap::new(), used: false }
    }

    /// One round against a snapshot: judge, act, say what was done.
    pub fn round(&mut self, r: &Round<'_>, condemned: &mut Condemned, records: &mut Records, events: &mut Vec<Event>) {
        let figures = enforce::vgpu_compute(r.files, r.snapshot);
        let settings = Settings { policy: r.config.compute, tolerance_pct: r.config.compute_tolerance, window: r.config.compute_window, settle: throttle::PERIOD };
        let verdicts = self.audit.observe(r.now, &figures, &settings);
        let mut wanted: BTreeMap<String, f64> = BTreeMap::new();
        let mut ended: BTreeMap<String, String> = BTreeMap::new();
        for v in &verdicts {
            let members: Vec<&Workload> = r.workloads.iter().filter(|w| w.vgpu == v.vgpu).collect();
            match v.action {
                Action::Throttle { run, start } => {
                    for w in members.iter().filter(|w| w.state == WorkloadState::Running) {
                        let slot = wanted.entry(w.id.clone()).or_insert(run);
                        *slot = slot.min(run);
                        if !self.throttling.contains_key(&w.id) {
                            events.push(Event::info(format!("throttling {}: {}", enforce::whose(r.workloads, &w.id), v.reason)));
                            records.add(&w.id, enforce::throttled(self.me, &v.reason, gpu_pids(r.snapshot, w, &v.gpu_uuid)));
                            r.counters.record(metrics::Action::Throttle, "compute", &WorkloadLabels::of(w));
                        }
                    }
                    if !start {
                        events.push(Event::debug(format!("throttling vGPU {}: {}, running {:.0}% of the time", v.vgpu, v.reason, run * 100.0)));
                    }
                }
                Action::Release => {
                    for w in &members {
                        ended.insert(w.id.clone(), v.reason.clone());
                    }
                }
                Action::Kill { first, escalated } => {
                    if first && escalated {
                        for w in &members {
                            events.push(Event::info(format!("{}: {}; killing what the shim does not see", enforce::whose(r.workloads, &w.id), v.reason)));
                            ended.insert(w.id.clone(), "throttling did not bring it down".into());
                        }
                    }
                    condemn(r, v, condemned);
                }
                Action::Report => {
                    for w in &members {
                        events.push(Event::warn(format!("{} is {} ([watch] compute = \"report\")", enforce::whose(r.workloads, &w.id), v.reason)));
                    }
                    let owners = enforce::owners(r.snapshot);
                    for (id, processes) in enforce::by_owner(&v.offenders, &owners) {
                        for _ in processes {
                            r.counters.record(metrics::Action::Report, "compute", &WorkloadLabels::find(r.workloads, &id));
                        }
                    }
                }
            }
        }
        for (id, whose) in &self.throttling {
            if wanted.contains_key(id) {
                continue;
            }
            let why = ended.remove(id).unwrap_or_else(|| match r.workloads.iter().find(|w| &w.id == id) {
                None => "it ended".into(),
                Some(w) if w.state != WorkloadState::Running => format!("it is {}", w.state.as_str()),
                Some(_) => "its vGPU is no longer audited".into(),
            });
            events.push(Event::info(format!("stopped throttling {whose}: {why}")));
            records.clear_throttle(id, self.me);
        }
        self.throttling = wanted.keys().map(|id| (id.clone(), enforce::whose(r.workloads, id))).collect();
        self.used |= !wanted.is_empty();
        if let Some(e) = self.throttler.set(wanted) {
            events.push(e);
        }
    }

    /// What the throttling thread said since the last call (every round, with or without a
    /// snapshot).
    pub fn events(&self) -> Vec<Event> {
        self.throttler.events()
    }

    /// The watch stops: thaw what the throttler froze and clear the throttles from the
    /// records (what is left after a crash, reconcile does).
    pub fn stop(&mut self, store: &Store) -> Vec<Event> {
        let mut events = self.throttler.stop();
        if !std::mem::take(&mut self.used) {
            return events;
        }
        self.throttling.clear();
        match enforce::clear_all_throttles(store, self.me, STOP_WAIT) {
            Ok(cleared) => {
                for w in cleared {
                    events.push(Event::info(format!("stopped throttling workload {} ({}): vgpu watch is stopping", w.name, w.id)));
                }
            }
            Err(e) => events.push(Event::warn(format!("cannot clear the throttles from the records: {e}; the next `vgpu` command does"))),
        }
        events
    }
}

/// The offenders of a kill verdict, each an offence of the workload it belongs to (the
/// offence enforcer records why before it signals, so that `vgpu run` finds the reason).
fn condemn(r: &Round<'_>, v: &Verdict, condemned: &mut Condemned) {
    let owners = enforce::owners(r.snapshot);
    for (id, processes) in enforce::by_owner(&v.offenders, &owners) {
        condemned.add(&id, &processes, &v.reason, "compute");
    }
}

/// The pids of workload `w` on GPU `uuid`, as the snapshot has them.
fn gpu_pids(snapshot: &Snapshot, w: &Workload, uuid: &str) -> Vec<u32> {
    snapshot.processes_of(&w.cgroup).filter(|(g, _)| g.uuid == uuid).map(|(_, p)| p.pid).collect()
}
