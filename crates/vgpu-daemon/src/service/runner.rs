//! Running services: keep each service at its desired number of replicas, each replica an
//! ordinary workload started as a child `vgpu run <ServiceDef::run_args>` of this process
//! (so admission is never bypassed), restarted with back-off when it exits, stopped newest
//! first on scale-down (SIGTERM to its `vgpu run`, which relays it; SIGKILL to its cgroup
//! after the service's grace). With `scale_on`, the load of the replicas ([`super::signals`])
//! is sampled every round and the [`Scaler`] decides once per round.
//!
//! Two runners use it: `vgpu watch` (every service, [`Runner::all`]) and `vgpu service run
//! NAME` (one, in the foreground, [`Runner::one`]). Whichever runs a service holds its lock,
//! `<state>/service-NAME.lock` (an `flock`, never waited on): the watch skips a service a
//! `vgpu service run` holds, and `vgpu service run` refuses one the watch holds.
//!
//! A runner that starts takes over the replicas a previous runner left running (its records
//! name the service and replica, [`vgpu_store::state::ServiceRef`]): they are watched through
//! their `vgpu run`'s pid rather than started twice.
//!
//! A replica's stdout and stderr are the runner's (the journal under systemd), so a replica
//! outlives a runner that dies. Its `vgpu run` also gets a pipe (`--report-fd 3`, closed before
//! the workload starts) on which it says `admitted ID` or `error: REASON`: a replica refused
//! admission leaves the service **short** (`short` in its state says why) and is tried again
//! every round (one not-admitted replica of a service at a time, lowest index first),
//! without back-off. Any other exit is restarted after 1 s, 2 s, 4 s … at most
//! 60 s (back to 1 s after a replica ran a minute).
//!
//! When the runner stops (SIGTERM to `vgpu watch` or `vgpu service run`), it stops the
//! replicas as on scale-down, and waits for them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal as Sig};
use nix::unistd::Pid;
use vgpu_abi::process::ProcessId;

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::Layout;
use vgpu_host::context::Context;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;
use vgpu_store::state::Workload;
use crate::event::Event;

use super::def::ServiceDef;
use super::scale::{Decision, Load, Scaler};
use super::signals::{self, Sampler};
use super::store::{ReplicaState, ServiceError, ServiceState, Services, MAX_DECISIONS};

/// The first restart's delay; doubled at each exit in a row, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The descriptor a replica's `vgpu run` gets its report pipe as (`--report-fd`).
const REPORT_FD: i32 = 3;

/// The lock a runner holds for one service, in the state directory.
pub fn lock_path(ctx: &Context, name: &str) -> PathBuf {
    ctx.state_path(&format!("service-{name}.lock"))
}

/// What a replica's `vgpu run` said on its report pipe (`vgpu run --report-fd`), read by a
/// thread until the pipe closes: once admitted, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    Admitted(String),
    Refused(String),
}

impl Said {
    fn parse(text: &str) -> Option<Said> {
        let line = text.lines().next()?;
        match line.split_once(' ') {
            Some(("admitted", id)) => Some(Said::Admitted(id.to_string())),
            Some(("error:", reason)) => Some(Said::Refused(reason.to_string())),
            _ => None,
        }
    }
}

/// The thread reading a replica's report pipe; its result once the pipe closed.
type Reader = std::thread::JoinHandle<Option<Said>>;

/// The process a replica runs as: a child of this runner, or one a previous runner left.
#[derive(Debug)]
enum Proc {
    Child(Child),
    Adopted(ProcessId),
}

impl Proc {
    fn pid(&self) -> u32 {
        match self {
            Proc::Child(c) => c.id(),
            Proc::Adopted(p) => p.pid,
        }
    }
}

#[derive(Debug)]
struct Replica {
    proc: Option<Proc>,
    /// Reads its report pipe until `vgpu run` closes it (admitted, or exiting).
    reader: Option<Reader>,
    /// What it said there, not acted on yet.
    said: Option<Said>,
    /// Its workload's id, once its record was seen.
    workload: Option<Workload>,
    started: Instant,
    /// SIGTERM sent (scale-down or stop) at.
    stopping: Option<Instant>,
    killed: bool,
    restarts: u32,
    /// Exits in a row (for the back-off).
    failures: u32,
    next_start: Option<Instant>,
    next_start_unix_ms: Option<u64>,
    /// How its last run ended: its exit status (128+N for signal N).
    last_exit: Option<i32>,
    /// Why it was not admitted, at its last try.
    refused: Option<String>,
}

impl Replica {
    fn new(now: Instant) -> Replica {
        Replica {
            proc: None,
            reader: None,
            said: None,
            workload: None,
            started: now,
            stopping: None,
            killed: false,
            restarts: 0,
            failures: 0,
            next_start: None,
            next_start_unix_ms: None,
            last_exit: None,
            refused: None,
        }
    }

    fn running(&self) -> bool {
        self.proc.is_some()
    }

    /// Running, its workload's record seen (admitted).
    fn admitted(&self) -> bool {
        self.proc.is_some() && self.workload.is_some()
    }
}

/// One service being run.
struct Running {
    def: ServiceDef,
    scaler: Scaler,
    replicas: BTreeMap<u32, Replica>,
    decisions: Vec<Decision>,
    desired: u32,
    short: Option<String>,
    /// Its definition is gone (`service remove --force`): its replicas are stopped, then it
    /// is forgotten and its state file removed.
    removed: bool,
    /// The desired count this runner last wrote: a different one in the file is
    /// `service scale`'s, taken at the next round.
    written_desired: Option<u32>,
    /// What was last written to the state file (to write it only on change).
    written: Option<String>,
    /// Held while this runner runs the service.
    _lock: StoreLock,
}

impl Running {
    /// Replicas admitted and running (and not being stopped).
    fn actual(&self) -> u32 {
        self.replicas.values().filter(|r| r.admitted() && r.stopping.is_none()).count() as u32
    }

    /// Its state for `service show`.
    fn state(&self) -> ServiceState {
        ServiceState {
            desired: self.desired,
            short: self.short.clone(),
            decisions: self.decisions.clone(),
            replicas: self
                .replicas
                .iter()
                .map(|(index, r)| ReplicaState {
                    index: *index,
                    workload_id: r.workload.as_ref().filter(|_| r.running()).map(|w| w.id.clone()),
                    restarts: r.restarts,
                    last_exit: r.last_exit,
                    next_start_unix_ms: r.next_start_unix_ms,
                })
                .collect(),
            stopping: self.removed,
        }
    }
}

/// Which services a runner runs.
enum Scope {
    All,
    One(String),
}

/// The replicas of every service (or of one), round after round.
pub struct Runner {
    ctx: Context,
    store: Store,
    services: Services,
    layout: Option<Layout>,
    sampler: Sampler,
    running: BTreeMap<String, Running>,
    scope: Scope,
    /// Services another runner holds, and who, as last said (said once).
    elsewhere: BTreeMap<String, Option<u32>>,
    /// What was last reported damaged (said once).
    damaged: Vec<String>,
}

/// Why `vgpu service run` cannot run a service.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("service {name} is already run by {}: stop that first", .pid.map(|p| format!("pid {p}")).unwrap_or_else(|| "vgpu watch or another vgpu service run".into()))]
    Busy { name: String, pid: Option<u32> },
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Service(#[from] ServiceError),
}

impl Runner {
    /// The runner of `vgpu watch`: every defined service no `vgpu service run` holds.
    pub fn all(ctx: &Context) -> Runner {
        Runner::new(ctx, Scope::All)
    }

    /// The runner of `vgpu service run NAME`: that service, whose lock it takes now.
    pub fn one(ctx: &Context, name: &str) -> Result<Runner, RunnerError> {
        let mut runner = Runner::new(ctx, Scope::One(name.to_string()));
        let def = runner.services.load(name)?;
        let lock = match StoreLock::acquire_within(&lock_path(ctx, name), Duration::ZERO) {
            Ok(lock) => lock,
            Err(StateError::LockBusy { pid, .. }) => return Err(RunnerError::Busy { name: name.to_string(), pid }),
            Err(e) => return Err(e.into()),
        };
        runner.take(def, lock);
        Ok(runner)
    }

    fn new(ctx: &Context, scope: Scope) -> Runner {
        Runner {
            store: Store::new(&ctx.state_dir, &ctx.lib_dir),
            services: Services::new(&ctx.lib_dir),
            layout: Layout::detect(),
            ctx: ctx.clone(),
            sampler: Sampler::default(),
            running: BTreeMap::new(),
            scope,
            elsewhere: BTreeMap::new(),
            damaged: Vec::new(),
        }
    }

    /// A config reloaded (SIGHUP): its global options go to the replicas started from now.
    pub fn reload(&mut self, ctx: &Context) {
        let (state_dir, lib_dir) = (self.ctx.state_dir.clone(), self.ctx.lib_dir.clone());
        self.ctx = Context { state_dir, lib_dir, ..ctx.clone() };
    }

    /// Start running `def` under `lock`, from its saved state (the desired count, the last
    /// decisions).
    fn take(&mut self, def: ServiceDef, lock: StoreLock) {
        let state = self.services.state(&def.name).unwrap_or_default();
        let scaler = Scaler::new(def.min, def.max, &def.scale_on, def.window, def.cooldown);
        let desired = state.desired.clamp(def.min, def.max);
        let run = Running {
            def,
            scaler,
            replicas: BTreeMap::new(),
            decisions: state.decisions,
            desired,
            short: None,
            removed: false,
            written_desired: Some(state.desired),
            written: None,
            _lock: lock,
        };
        self.running.insert(run.def.name.clone(), run);
    }

    /// Whether it runs no service (`vgpu service run`'s was removed, its replicas stopped).
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// What the metrics export of the services it runs.
    pub fn metrics(&self) -> Vec<crate::metrics::model::ServiceMetrics> {
        self.running
            .values()
            .map(|r| crate::metrics::model::ServiceMetrics {
                name: r.def.name.clone(),
                desired: r.desired,
                actual: r.actual(),
                signals: r.decisions.last().map(|d| d.values.iter().map(|v| (v.signal.as_str().to_string(), v.value, v.target)).collect()).unwrap_or_default(),
            })
            .collect()
    }

    /// One round: pick up definitions, reap and restart replicas, sample and scale, stop
    /// the surplus, write each service's state.
    pub fn tick(&mut self, events: &mut Vec<Event>) {
        let now = Instant::now();
        self.definitions(events);
        let (workloads, _) = self.store.workloads();
        let names: Vec<String> = self.running.keys().cloned().collect();
        let mut alive: Vec<String> = Vec::new();
        for name in names {
            let Some(mut run) = self.running.remove(&name) else { continue };
            let records: Vec<&Workload> = workloads.iter().filter(|w| w.service.as_ref().is_some_and(|s| s.name == name)).collect();
            self.round(&mut run, &records, now, events);
            alive.extend(run.replicas.values().filter_map(|r| r.workload.as_ref().map(|w| w.id.clone())));
            if run.removed && run.replicas.is_empty() {
                if let Err(e) = self.services.remove(&name) {
                    events.push(Event::warn(format!("service {name}: cannot remove its state: {e}")));
                }
                events.push(Event::info(format!("service {name}: removed, its replicas stopped")));
                continue;
            }
            self.running.insert(name, run);
        }
        let alive: Vec<&str> = alive.iter().map(String::as_str).collect();
        self.sampler.retain(&alive);
    }

    /// New definitions taken on (when their lock is free), changed ones updated, removed
    /// ones scaled to 0.
    fn definitions(&mut self, events: &mut Vec<Event>) {
        let (defs, damaged): (Vec<ServiceDef>, Vec<String>) = match &self.scope {
            Scope::One(name) => match self.services.load(name) {
                Ok(def) => (vec![def], Vec::new()),
                Err(ServiceError::NotFound { .. }) => (Vec::new(), Vec::new()),
                // Kept running as it was: a definition being rewritten by hand.
                Err(e) => {
                    self.say_damaged(vec![e.to_string()], events);
                    return;
                }
            },
            Scope::All => match self.services.list() {
                Ok((defs, damaged)) => (defs, damaged.iter().map(ToString::to_string).collect()),
                Err(e) => {
                    self.say_damaged(vec![e.to_string()], events);
                    return;
                }
            },
        };
        self.say_damaged(damaged.clone(), events);
        for run in self.running.values_mut() {
            match defs.iter().find(|d| d.name == run.def.name) {
                Some(def) if *def != run.def => {
                    events.push(Event::info(format!("service {}: definition changed (replicas started from now use it)", def.name)));
                    run.scaler = Scaler::new(def.min, def.max, &def.scale_on, def.window, def.cooldown);
                    run.def = def.clone();
                    run.removed = false;
                }
                Some(_) => run.removed = false,
                // A damaged file is not a removed one: its replicas keep running. (Its file
                // is there; not a damaged message's text, where `ab.toml` contains `b.toml`.)
                None if std::fs::symlink_metadata(self.services.def_path(&run.def.name)).is_ok() => {}
                None => {
                    if !run.removed {
                        events.push(Event::info(format!("service {}: definition removed: stopping its replicas", run.def.name)));
                    }
                    run.removed = true;
                }
            }
        }
        for def in defs {
            if self.running.contains_key(&def.name) {
                continue;
            }
            match StoreLock::acquire_within(&lock_path(&self.ctx, &def.name), Duration::ZERO) {
                Ok(lock) => {
                    self.elsewhere.remove(&def.name);
                    events.push(Event::info(format!("service {}: running it ({}..{} replicas)", def.name, def.min, def.max)));
                    self.take(def, lock);
                }
                Err(StateError::LockBusy { pid, .. }) => {
                    if self.elsewhere.get(&def.name) != Some(&pid) {
                        let who = pid.map(|p| format!("pid {p}")).unwrap_or_else(|| "another process".into());
                        events.push(Event::info(format!("service {}: run by {who} (vgpu service run): left to it", def.name)));
                        self.elsewhere.insert(def.name.clone(), pid);
                    }
                }
                Err(e) => events.push(Event::warn(format!("service {}: cannot take its lock: {e}", def.name))),
            }
        }
        // Removed (`remove --force`) while no runner ran it: its replicas, found by their
        // records, are stopped and its state removed as if it had been running here.
        if matches!(self.scope, Scope::All) {
            for name in self.services.orphan_states().unwrap_or_default() {
                if self.running.contains_key(&name) || !self.services.state(&name).is_ok_and(|s| s.stopping) {
                    continue;
                }
                let Ok(lock) = StoreLock::acquire_within(&lock_path(&self.ctx, &name), Duration::ZERO) else { continue };
                events.push(Event::info(format!("service {name}: removed: stopping what is left of it")));
                let def = ServiceDef {
                    name: name.clone(),
                    min: 0,
                    max: 0,
                    run: vgpu_host::workload_file::Options::default(),
                    command: Vec::new(),
                    scale_on: Vec::new(),
                    window: super::def::DEFAULT_WINDOW,
                    cooldown: super::def::DEFAULT_COOLDOWN,
                    grace: super::def::DEFAULT_GRACE,
                };
                self.take(def, lock);
                if let Some(run) = self.running.get_mut(&name) {
                    run.removed = true;
                }
            }
        }
    }

    fn say_damaged(&mut self, damaged: Vec<String>, events: &mut Vec<Event>) {
        for d in damaged.iter().filter(|d| !self.damaged.contains(d)) {
            events.push(Event::warn(format!("service skipped: {d}")));
        }
        self.damaged = damaged;
    }

    /// One service's round.
    fn round(&mut self, run: &mut Running, records: &[&Workload], now: Instant, events: &mut Vec<Event>) {
        let name = run.def.name.clone();
        self.reap(run, records, now, events);
        self.adopt(run, records, now, events);
        let saved = self.services.state(&name).unwrap_or_default();
        if run.written_desired != Some(saved.desired) {
            // `vgpu service scale` since the last round.
            run.desired = saved.desired.clamp(run.def.min, run.def.max);
            run.written_desired = Some(saved.desired);
        }
        if run.removed {
            run.desired = 0;
        } else if !run.def.scale_on.is_empty() {
            let limits = limits(&run.def);
            let loads: Vec<Load> = run
                .replicas
                .values()
                .filter(|r| r.running() && r.stopping.is_none())
                .filter_map(|r| r.workload.as_ref())
                .map(|w| self.sampler.sample(&self.store, self.layout.as_ref(), w, limits, now))
                .collect();
            let decision = run.scaler.decide(vgpu_store::clock::now_ms(), run.desired, &loads);
            let values: Vec<String> = decision.values.iter().map(|v| format!("{} {:.2}", v.signal.as_str(), v.value)).collect();
            let line = format!("service {name}: decision: {} → {} ({}) [{}]", run.desired, decision.desired, decision.reason, values.join(", "));
            events.push(if decision.desired != run.desired { Event::info(line) } else { Event::debug(line) });
            run.desired = decision.desired;
            run.decisions.push(decision);
            let over = run.decisions.len().saturating_sub(MAX_DECISIONS);
            run.decisions.drain(..over);
        } else {
            run.desired = run.desired.clamp(run.def.min, run.def.max);
        }
        self.converge(run, now, events);
        self.write_state(run, &saved, events);
    }

    /// Replicas whose process ended: stopped on purpose (forgotten), not admitted (tried
    /// again next round), or exited (restarted after the back-off). Those still stopping
    /// get SIGKILL once their grace is over.
    fn reap(&mut self, run: &mut Running, records: &[&Workload], now: Instant, events: &mut Vec<Event>) {
        let name = run.def.name.clone();
        for (index, r) in run.replicas.iter_mut() {
            // Its report pipe closes once it is admitted, or when it exits.
            if r.reader.as_ref().is_some_and(|t| t.is_finished()) {
                r.said = r.reader.take().and_then(|t| t.join().ok()).flatten();
            }
            let admitted = match &r.said {
                Some(Said::Admitted(id)) => Some(id.clone()),
                _ => None,
            };
            if let Some(id) = admitted {
                r.said = None;
                if r.refused.take().is_some() {
                    events.push(Event::info(format!("service {name}: replica {index} admitted ({id})")));
                }
            }
            if let Some(w) = records.iter().find(|w| r.proc.as_ref().is_some_and(|p| p.pid() == w.supervisor.pid)) {
                r.workload = Some((*w).clone());
            }
            let status = match &mut r.proc {
                Some(Proc::Child(child)) => match child.try_wait() {
                    Ok(Some(status)) => Some(describe(status)),
                    Ok(None) => None,
                    Err(e) => Some((None, format!("cannot be waited for ({e})"))),
                },
                Some(Proc::Adopted(p)) => (!p.is_alive()).then(|| (None, "ended".to_string())),
                None => None,
            };
            let Some((status, how)) = status else {
                self.kill_after_grace(&name, *index, r, run.def.grace, now, events);
                continue;
            };
            r.proc = None;
            r.workload = None;
            // It exited: its pipe is closed, what it said is read to the end.
            if let Some(t) = r.reader.take() {
                r.said = t.join().ok().flatten();
            }
            let said = r.said.take();
            if r.stopping.take().is_some() {
                r.killed = false;
                r.next_start = None;
                r.next_start_unix_ms = None;
                events.push(Event::info(format!("service {name}: replica {index} stopped ({how})")));
                continue;
            }
            match said {
                // Tried again at the next round (admission is not a crash: no back-off).
                Some(Said::Refused(reason)) => {
                    if r.refused.as_deref() != Some(reason.as_str()) {
                        events.push(Event::warn(format!("service {name}: replica {index} not admitted: {reason} (tried again every round)")));
                    }
                    r.refused = Some(reason);
                    r.next_start = None;
                    r.next_start_unix_ms = None;
                }
                _ => {
                    r.refused = None;
                    if now.saturating_duration_since(r.started) >= MAX_BACKOFF {
                        r.failures = 0;
                    }
                    let delay = backoff(r.failures);
                    r.failures += 1;
                    r.restarts += 1;
                    r.last_exit = status;
                    r.next_start = Some(now + delay);
                    r.next_start_unix_ms = Some(vgpu_store::clock::now_ms() + delay.as_millis() as u64);
                    events.push(Event::warn(format!("service {name}: replica {index} {how}: restarting in {}", humantime::format_duration(delay))));
                }
            }
        }
    }

    /// SIGKILL to a stopping replica's workload (its cgroup: its `vgpu run` then cleans up
    /// as ever) once the grace is over; to its `vgpu run` when it has no workload yet.
    fn kill_after_grace(&self, name: &str, index: u32, r: &mut Replica, grace: Duration, now: Instant, events: &mut Vec<Event>) {
        let Some(since) = r.stopping else { return };
        if r.killed || now.saturating_duration_since(since) < grace {
            return;
        }
        r.killed = true;
        let cgroup = r.workload.as_ref().zip(self.layout.as_ref()).and_then(|(w, l)| Cgroup::open_at(l, &w.cgroup_home, &w.cgroup).ok());
        let killed = cgroup.is_some_and(|c| c.kill(Sig::SIGKILL).is_ok());
        if !killed {
            if let Some(p) = &r.proc {
                signal(p, Sig::SIGKILL);
            }
        }
        events.push(Event::warn(format!("service {name}: replica {index} still runs {} after SIGTERM: SIGKILL", humantime::format_duration(grace))));
    }

    /// Replicas a previous runner left running (a record naming this service and replica,
    /// its `vgpu run` alive) are taken over rather than started again.
    fn adopt(&mut self, run: &mut Running, records: &[&Workload], now: Instant, events: &mut Vec<Event>) {
        for w in records {
            let Some(service) = &w.service else { continue };
            let r = run.replicas.entry(service.replica).or_insert_with(|| Replica::new(now));
            if r.proc.is_some() || !w.supervisor_alive() {
                continue;
            }
            r.proc = Some(Proc::Adopted(w.supervisor.into()));
            r.workload = Some((*w).clone());
            r.started = now;
            r.next_start = None;
            r.next_start_unix_ms = None;
            events.push(Event::info(format!(
                "service {}: replica {} found running ({}, vgpu run pid {}): taken over",
                run.def.name, service.replica, w.id, w.supervisor.pid
            )));
        }
    }

    /// Start the missing replicas below the desired count (back-off permitting), stop
    /// those above it, newest first.
    fn converge(&mut self, run: &mut Running, now: Instant, events: &mut Vec<Event>) {
        let name = run.def.name.clone();
        // Replicas not admitted are retried one at a time, lowest index first: what refused
        // one (the GPU, the pool, the policy) refuses the next alike, and a service held
        // short by MAX-MIN replicas must not fork as many `vgpu run` every round.
        let mut retrying = run.replicas.values().any(|r| r.refused.is_some() && r.proc.is_some());
        for index in 0..run.desired {
            let r = run.replicas.entry(index).or_insert_with(|| Replica::new(now));
            if r.proc.is_some() || r.next_start.is_some_and(|t| t > now) {
                continue;
            }
            if r.refused.is_some() {
                if retrying {
                    continue;
                }
                retrying = true;
            }
            match spawn(&self.ctx, &run.def, index) {
                Ok((child, reader)) => {
                    // A replica refused admission is tried every round: said once.
                    let line = format!("service {name}: starting replica {index} (vgpu run pid {})", child.id());
                    events.push(if r.refused.is_none() { Event::info(line) } else { Event::debug(line) });
                    r.proc = Some(Proc::Child(child));
                    r.reader = Some(reader);
                    r.said = None;
                    r.started = now;
                    r.next_start = None;
                    r.next_start_unix_ms = None;
                }
                Err(e) => {
                    events.push(Event::warn(format!("service {name}: cannot start replica {index}: {e}")));
                    r.next_start = Some(now + MAX_BACKOFF);
                }
            }
        }
        let desired = run.desired;
        for (index, r) in run.replicas.iter_mut().rev().filter(|(i, _)| **i >= desired) {
            if let (Some(p), None) = (&r.proc, r.stopping) {
                signal(p, Sig::SIGTERM);
                r.stopping = Some(now);
                events.push(Event::info(format!("service {name}: stopping replica {index} (SIGTERM to vgpu run pid {})", p.pid())));
            }
        }
        run.replicas.retain(|i, r| *i < desired || r.proc.is_some());
        let actual = run.actual();
        let short = (actual < desired).then(|| short(run, actual));
        if short != run.short {
            if let Some(why) = &short {
                events.push(Event::info(format!("service {name}: short: {why}")));
            }
        }
        run.short = short;
    }

    /// Save the service's state for `service show` when it changed. `saved` is what the
    /// round started from: a `service scale` since then wins (taken next round).
    fn write_state(&self, run: &mut Running, saved: &ServiceState, events: &mut Vec<Event>) {
        let state = run.state();
        let text = serde_json::to_string(&state).unwrap_or_default();
        if run.written.as_deref() == Some(text.as_str()) {
            return;
        }
        if self.services.state(&run.def.name).is_ok_and(|now| now.desired != saved.desired) {
            return;
        }
        match self.services.save_state(&run.def.name, &state) {
            Ok(()) => {
                run.written = Some(text);
                run.written_desired = Some(state.desired);
            }
            Err(e) => events.push(Event::warn(format!("service {}: cannot save its state: {e}", run.def.name))),
        }
    }

    /// The runner stops: SIGTERM to every replica, SIGKILL to what still runs after its
    /// service's grace; returns once all ended (or 5 s after the longest grace). The desired
    /// counts stay in the state files for the next runner.
    pub fn stop(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let start = Instant::now();
        let mut longest = Duration::ZERO;
        for run in self.running.values_mut() {
            longest = longest.max(run.def.grace);
            for (index, r) in run.replicas.iter_mut() {
                if let (Some(p), None) = (&r.proc, r.stopping) {
                    signal(p, Sig::SIGTERM);
                    r.stopping = Some(start);
                    events.push(Event::info(format!("service {}: stopping replica {index} (SIGTERM to vgpu run pid {})", run.def.name, p.pid())));
                }
            }
        }
        // Checked: an Instant plus a duration past its range panics.
        let deadline = start.checked_add(longest.saturating_add(Duration::from_secs(5)));
        loop {
            let now = Instant::now();
            let (workloads, _) = self.store.workloads();
            let names: Vec<String> = self.running.keys().cloned().collect();
            for name in names {
                let Some(mut run) = self.running.remove(&name) else { continue };
                let records: Vec<&Workload> = workloads.iter().filter(|w| w.service.as_ref().is_some_and(|s| s.name == name)).collect();
                self.reap(&mut run, &records, now, &mut events);
                run.replicas.retain(|_, r| r.proc.is_some());
                self.running.insert(name, run);
            }
            if self.running.values().all(|r| r.replicas.is_empty()) || deadline.is_none_or(|d| now >= d) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for run in self.running.values_mut() {
            run.short = None;
            let saved = self.services.state(&run.def.name).unwrap_or_default();
            let mut state = run.state();
            state.desired = saved.desired;
            if let Err(e) = self.services.save_state(&run.def.name, &state) {
                events.push(Event::warn(format!("service {}: cannot save its state: {e}", run.def.name)));
            }
        }
        events
    }
}

/// `vgpu run --report-fd 3 <run_args>` for replica `index` of `def`, and the thread
/// reading that pipe. Its stdout and stderr are the runner's (the journal under systemd):
/// they outlive the runner.
fn spawn(ctx: &Context, def: &ServiceDef, index: u32) -> std::io::Result<(Child, Reader)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(global_args(ctx)).arg("run").arg("--report-fd").arg(REPORT_FD.to_string()).args(def.run_args(index));
    // Not theirs: systemd's notification socket, watchdog and sockets are the runner's.
    for var in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        cmd.env_remove(var);
    }
    let fd = write.as_raw_fd();
    // SAFETY: between fork and exec the child only calls dup2(2) or fcntl(2), which are
    // async-signal-safe, on a descriptor this process owns; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep FD_CLOEXEC: clear it instead.
            let done = if fd == REPORT_FD { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, REPORT_FD) };
            if done == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // The descriptor limit the watch inherited, not the one it raised for itself.
    vgpu_host::fdlimit::restore_in_child(&mut cmd);
    let child = cmd.stdin(Stdio::null()).spawn()?;
    // Only the child holds the write end now: the pipe ends when it closes it.
    drop(write);
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut text).ok()?;
        Said::parse(&text)
    });
    Ok((child, reader))
}

/// `vgpu`'s own global options as this runner got them, for its `vgpu run` children.
fn global_args(ctx: &Context) -> Vec<OsString> {
    let o = &ctx.origin;
    let mut args: Vec<OsString> = Vec::new();
    if o.simulate {
        args.push("--simulate".into());
    }
    for (flag, value) in [("--config", &o.config), ("--state-dir", &o.state_dir), ("--lib-dir", &o.lib_dir)] {
        if let Some(v) = value {
            args.push(flag.into());
            args.push(v.into());
        }
    }
    args
}

/// The limits a replica's utilizations are relative to.
fn limits(def: &ServiceDef) -> signals::Limits {
    signals::Limits { cpus: def.run.cpus, memory: def.run.memory.as_deref().and_then(|m| vgpu_abi::size::parse_size(m).ok()) }
}

/// The delay before the restart after `failures` exits in a row: 1 s, 2 s, 4 s … 60 s.
pub fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX)).min(MAX_BACKOFF)
}

/// Its status as a shell says it (128+N for signal N), and how it ended in words.
fn describe(status: std::process::ExitStatus) -> (Option<i32>, String) {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => (Some(code), format!("exited with status {code}")),
        (None, Some(sig)) => (Some(128 + sig), format!("was killed by signal {sig}")),
        (None, None) => (None, format!("ended ({status})")),
    }
}

/// Why fewer replicas run than desired, one line.
fn short(run: &Running, actual: u32) -> String {
    let why = run
        .replicas
        .iter()
        .filter(|(i, _)| **i < run.desired)
        .filter(|(_, r)| !r.admitted() || r.stopping.is_some())
        .map(|(i, r)| match (&r.refused, &r.proc, &r.last_exit) {
            (Some(reason), _, _) => format!("replica {i} not admitted: {reason}"),
            (None, None, Some(exit)) => format!("replica {i} exited with status {exit}, restarting"),
            _ => format!("replica {i} starting"),
        })
        .next()
        .unwrap_or_else(|| "replicas starting".to_string());
    format!("{actual} of {} running: {why}", run.desired)
}

fn signal(p: &Proc, sig: Sig) {
    match p {
        Proc::Child(child) => {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), sig);
            }
        }
        // The exact process (its start time checked), not a pid recycled since.
        Proc::Adopted(id) => {
            if id.is_alive() {
                if let Ok(pid) = i32::try_from(id.pid) {
                    let _ = kill(Pid::from_raw(pid), sig);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_says_admitted_or_why_not() {
        assert_eq!(Said::parse("admitted 0a1b2c3d\n"), Some(Said::Admitted("0a1b2c3d".into())));
        assert_eq!(Said::parse("error: GPU 0 has 0 B free of 16 GiB\n"), Some(Said::Refused("GPU 0 has 0 B free of 16 GiB".into())));
        assert_eq!(Said::parse(""), None);
        assert_eq!(Said::parse("garbage"), None);
    }

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        let delays: Vec<u64> = (0..9).map(|f| backoff(f).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
