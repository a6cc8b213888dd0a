//! `vgpu watch`: the long-running enforcer (SPEC 4.3). Once per `[watch] interval` it
//! reconciles the store (dead supervisors, half-done changes, the pool settled), takes a
//! [`Snapshot`] of what really runs on the GPUs, audits it (memory, compute, processes in no
//! vGPU), acts on what it finds — a workload's offences (`offence.rs`: its cgroup frozen and
//! its offenders SIGKILLed, the whole workload at a second offence), freezer throttling,
//! SIGTERM → SIGKILL for processes in no vGPU — and publishes metrics.
//!
//! One watch per state directory: it holds `<state>/watch.lock` (an `flock`, dropped by the
//! kernel when it dies) for its whole life. This module decides and acts; it returns what it
//! did as [`Event`]s, which the command prints.

pub mod compute;
pub mod contexts;
pub mod enforce;
pub mod history;
pub mod instance;
pub mod journal;
pub mod notify;
pub mod offence;
mod publish;
pub mod tell;
pub mod throttle;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use vgpu_abi::process::ProcessId;

use crate::audit::memory::MemoryAudit;
use crate::audit::terminate::Terminations;
use vgpu_gpu::unmanaged;
use vgpu_gpu::snapshot::Snapshot;
use vgpu_host::context::Context;
use vgpu_gpu::Nvml;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;
use vgpu_store::state::inventory;
use vgpu_host::config::watch as config;
use config::UnmanagedPolicy;

/// Name of the single-instance lock in the state directory.
pub const INSTANCE_LOCK: &str = "watch.lock";

/// The longest a round waits for the store lock to publish the GPU list (else next round).
const PUBLISH_LOCK_WAIT: Duration = Duration::from_millis(100);

pub use crate::event::{Event, Level};

/// The running watch.
pub struct Watch {
    ctx: Context,
    store: Store,
    nvml: Option<Nvml>,
    /// This process, recorded as the author of what it enforces.
    me: ProcessId,
    /// Held for the watch's life.
    _instance: StoreLock,
    /// NVML µs timestamp of the previous snapshot (process utilization since then).
    last_us: u64,
    /// The latest snapshot (None before the first, or without NVML).
    pub snapshot: Option<Snapshot>,
    memory: MemoryAudit,
    /// What one CUDA context takes on each GPU (`[watch] context_allowance`).
    contexts: contexts::ContextSizes,
    /// The workloads' offences, and what is done about them.
    offences: offence::OffenceEnforcer,
    /// Processes in no vGPU being terminated (`unmanaged = "kill"`).
    terminations: Terminations,
    records: enforce::Records,
    /// The compute audit and the freezer throttling.
    compute: compute::ComputeEnforcer,
    reported: unmanaged::Reported,
    /// The processes in no vGPU found at the last round, on GPUs that host vGPUs.
    pub unmanaged: Vec<unmanaged::Unmanaged>,
    /// Rounds done.
    pub rounds: u64,
    /// The metrics endpoint, textfile and enforcement counters (`publish.rs`).
    metrics: crate::metrics::Exporter,
    /// Why there is no NVML or no snapshot, as last said: said once, not every round.
    gpu_problem: Option<String>,
    /// Said by the next round (what `start` and `reload` found about NVML).
    pending: Vec<Event>,
    /// What the last reconcile warned about (damaged files, clean-ups that failed): each
    /// said once, until it goes away.
    damaged: BTreeSet<String>,
    /// Whether the driver was found not to report workload processes' memory (said once).
    memory_blind: bool,
    /// The services it runs (those no `vgpu service run` holds): their replicas are its
    /// children.
    services: crate::service::runner::Runner,
    /// What it records in history.db (`history.rs`).
    history: history::Recorder,
    /// Workloads this round's reconcile tore down, and how they ended (for the history).
    ended: HashMap<String, String>,
    /// The GPUs last published for the commands that admit (`<state>/gpus.json`).
    published: Option<inventory::Published>,
    /// Publishing it failed last round (said once, and once when it works again).
    publish_failing: bool,
}

impl Watch {
    /// Take the single-instance lock (refusing when another watch holds it) and open NVML.
    pub fn start(ctx: Context) -> Result<Watch, StartError> {
        vgpu_host::suspension::configure(&ctx);
        let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
        store.ensure_dirs().map_err(StartError::State)?;
        let instance = match StoreLock::acquire_within(&ctx.state_path(INSTANCE_LOCK), Duration::ZERO) {
            Ok(lock) => lock,
            Err(StateError::LockBusy { pid, .. }) => {
                return Err(StartError::Running { state_dir: ctx.state_dir.display().to_string(), pid })
            }
            Err(e) => return Err(StartError::State(e)),
        };
        let me = ProcessId::current().ok_or(StartError::Identity)?;
        let metrics = crate::metrics::Exporter::start(&ctx.config.watch).map_err(StartError::Metrics)?;
        let (ctx_lib_dir, ctx_history, interval) = (ctx.lib_dir.clone(), ctx.config.history.clone(), ctx.config.watch.interval);
        let allowance = ctx.config.watch.context_allowance;
        let history_store = store.clone();
        let mut watch = Watch {
            services: crate::service::runner::Runner::all(&ctx),
            compute: compute::ComputeEnforcer::new(store.clone(), me),
            ctx,
            store,
            nvml: None,
            me,
            _instance: instance,
            last_us: 0,
            snapshot: None,
            memory: MemoryAudit::default(),
            contexts: unmeasured(allowance),
            offences: offence::OffenceEnforcer::new(me),
            terminations: Terminations::default(),
            records: enforce::Records::default(),
            reported: unmanaged::Reported::default(),
            unmanaged: Vec::new(),
            rounds: 0,
            metrics,
            gpu_problem: None,
            pending: Vec::new(),
            damaged: BTreeSet::new(),
            memory_blind: false,
            history: history::Recorder::new(ctx_lib_dir, history_store, ctx_history, interval),
            ended: HashMap::new(),
            published: None,
            publish_failing: false,
        };
        // The config's idle power now; the driver's too once NVML is open.
        watch.history.idle_powers(vgpu_host::carbon::report::idle_powers(&watch.ctx.config.carbon, None));
        watch.open_nvml();
        Ok(watch)
    }

    /// Open NVML for the configured driver. Without it the watch still reconciles; it says
    /// once why it cannot audit, and tries again at the next reload (SIGHUP).
    fn open_nvml(&mut self) {
        let problem = match self.ctx.nvml() {
            Ok(Some(nvml)) => {
                self.measure_contexts(&nvml);
                self.history.idle_powers(vgpu_host::carbon::report::idle_powers(&self.ctx.config.carbon, Some(&nvml)));
                self.nvml = Some(nvml);
                self.last_us = 0;
                if self.gpu_problem.take().is_some() {
                    self.pending.push(Event::info("NVML is available again: auditing the GPUs"));
                }
                return;
            }
            Ok(None) => "no NVIDIA driver (libnvidia-ml.so.1 not found or no driver loaded)".to_string(),
            Err(e) => format!("{e:#}"),
        };
        self.nvml = None;
        self.say_gpu_problem(format!("{problem}: reconciling only, no GPU audit until the driver is back and the watch reloads (SIGHUP)"));
    }

    /// What one CUDA context takes on each GPU, as `[watch] context_allowance` says: measured
    /// through the configured driver under "auto" (once per GPU, each time NVML is opened).
    fn measure_contexts(&mut self, nvml: &Nvml) {
        let library = match self.ctx.driver_library_dir() {
            Ok(dir) => dir.map(|d| d.join(vgpu_host::paths::CUDA_SONAME)),
            Err(e) => {
                self.pending.push(Event::warn(format!("the simulated driver: {e:#}")));
                return;
            }
        };
        let (sizes, said) = contexts::ContextSizes::resolve(self.ctx.config.watch.context_allowance, nvml, library.as_deref());
        self.contexts = sizes;
        self.pending.push(said);
    }

    /// Warn about what stops the audit, unless that was the last thing said.
    fn say_gpu_problem(&mut self, problem: String) {
        if self.gpu_problem.as_deref() != Some(problem.as_str()) {
            self.pending.push(Event::warn(problem.clone()));
            self.gpu_problem = Some(problem);
        }
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn me(&self) -> ProcessId {
        self.me
    }

    pub fn interval(&self) -> Duration {
        self.ctx.config.watch.interval
    }

    /// When the next round should start, the last one having started at `started`: after
    /// the interval, or as soon as a vGPU over its memory quota has had its grace.
    pub fn next_round(&self, started: Instant) -> Instant {
        next_round(started, self.interval(), self.memory.next_verdict(self.ctx.config.watch.grace), Instant::now())
    }

    /// Take a new config (SIGHUP). NVML is opened again when the driver choice changed, or
    /// when it could not be opened before (a driver loaded since).
    pub fn reload(&mut self, ctx: Context) -> Vec<Event> {
        let mut events = Vec::new();
        if ctx.simulate != self.ctx.simulate {
            self.nvml = None;
            self.gpu_problem = None;
        }
        if ctx.state_dir != self.ctx.state_dir || ctx.lib_dir != self.ctx.lib_dir {
            events.push(Event::warn("state_dir and lib_dir changes take effect at the next start; kept the old ones"));
        }
        let (state_dir, lib_dir) = (self.ctx.state_dir.clone(), self.ctx.lib_dir.clone());
        let allowance_changed = ctx.config.watch.context_allowance != self.ctx.config.watch.context_allowance;
        self.ctx = Context { state_dir, lib_dir, ..ctx };
        if allowance_changed {
            match self.nvml.take() {
                Some(nvml) => {
                    self.measure_contexts(&nvml);
                    self.nvml = Some(nvml);
                    events.append(&mut self.pending);
                }
                None => self.contexts = unmeasured(self.ctx.config.watch.context_allowance),
            }
        }
        vgpu_host::suspension::configure(&self.ctx);
        self.services.reload(&self.ctx);
        self.history.reload(self.ctx.config.history.clone(), self.interval());
        self.history.idle_powers(vgpu_host::carbon::report::idle_powers(&self.ctx.config.carbon, self.nvml.as_ref()));
        if self.nvml.is_none() {
            self.open_nvml();
            events.append(&mut self.pending);
        }
        self.reload_metrics(&mut events);
        events.push(Event::info(format!("reloaded the config (interval {})", humantime::format_duration(self.interval()))));
        events
    }

    /// One round: reconcile, snapshot, audit, act, publish.
    pub fn tick(&mut self) -> Vec<Event> {
        let mut events = std::mem::take(&mut self.pending);
        self.reconcile(&mut events);
        self.snapshot = match &self.nvml {
            Some(nvml) => match Snapshot::take(nvml, self.last_us) {
                Ok(snapshot) => {
                    self.last_us = snapshot.taken_us;
                    if self.gpu_problem.take().is_some() {
                        events.push(Event::info("the GPUs can be read through NVML again"));
                    }
                    Some(snapshot)
                }
                Err(e) => {
                    self.say_gpu_problem(format!("cannot read the GPUs through NVML: {}", vgpu_gpu::explain(&e)));
                    events.append(&mut self.pending);
                    None
                }
            },
            None => None,
        };
        let (workloads, _) = self.store.workloads();
        // After the listing: a list marked before a workload started tells `vgpu run` that no
        // round has seen it (so none recorded GPU time for it).
        self.publish_gpus(&mut events);
        let files = enforce::VgpuFiles::all(&self.store, &workloads);
        if let Some(snapshot) = self.snapshot.as_mut() {
            // Slurm steps' tasks are in Slurm's cgroups: theirs are the processes below the
            // step's slurmstepd.
            snapshot.adopt_descendants(&vgpu_host::slurm::step_supervisors(&workloads));
        }
        if let Some(snapshot) = self.snapshot.take() {
            self.audit(&snapshot, &workloads, &files, &mut events);
            self.snapshot = Some(snapshot);
        }
        let ledgers: Vec<_> = files.iter().flat_map(|f| f.ledgers()).collect();
        let ended = std::mem::take(&mut self.ended);
        // Never waits: the rows are handed to the history thread, or kept for the next round.
        for kind in self.history.round(self.snapshot.as_ref(), &workloads, &ledgers, &ended, &mut events) {
            self.metrics.enforcements().history_failure(kind);
        }
        events.extend(self.compute.events());
        events.extend(self.terminations.tick(Instant::now()));
        self.records.flush(&self.store, &mut events);
        self.services.tick(&mut events);
        self.publish(&mut events);
        self.rounds += 1;
        events.push(Event::debug(format!("round {} done", self.rounds)));
        events
    }

    /// The watch stops (SIGTERM, SIGINT): stop the replicas of the services it runs
    /// (SIGTERM, SIGKILL after each service's grace), thaw what it throttled and clear the
    /// throttles from the records.
    pub fn shutdown(&mut self) -> Vec<Event> {
        let mut events = self.services.stop();
        self.withdraw_gpus(&mut events);
        events.extend(self.compute.stop(&self.store));
        self.history.flush(&mut events);
        events
    }

    /// Keep `<state>/gpus.json` the GPUs as this round read them, for `vgpu run` and the
    /// other commands that admit to take rather than load the driver themselves
    /// (`vgpu_store::state::inventory`): published when it differs (under the store lock,
    /// never waited for long: else next round), marked current otherwise; withdrawn when
    /// this round could not read the GPUs.
    fn publish_gpus(&mut self, events: &mut Vec<Event>) {
        let Some(snapshot) = &self.snapshot else {
            self.withdraw_gpus(events);
            return;
        };
        let gpus: Vec<inventory::PublishedGpu> = snapshot
            .gpus
            .iter()
            .map(|g| inventory::PublishedGpu { index: g.index, uuid: g.uuid.clone(), name: g.name.clone(), memory_total_bytes: g.memory_total })
            .collect();
        // The history it records, for `vgpu run` to leave its workload's end to this watch.
        let history = self.ctx.config.history.enabled.then(|| self.ctx.lib_dir.clone());
        let published = inventory::Published::new(self.me.into(), self.ctx.simulate, self.ctx.config.watch.interval, gpus, history);
        if self.published.as_ref() == Some(&published) {
            if let Err(e) = inventory::mark_current(&self.store) {
                // Published again next round.
                events.push(Event::debug(format!("cannot mark the GPU list current: {e}")));
                self.published = None;
            }
            return;
        }
        match self.store.lock_within(PUBLISH_LOCK_WAIT).map_err(|e| e.to_string()).and_then(|lock| inventory::publish(&self.store, &lock, &published).map_err(|e| e.to_string())) {
            Ok(()) => {
                self.published = Some(published);
                if std::mem::take(&mut self.publish_failing) {
                    events.push(Event::info("the GPU list is published again"));
                }
            }
            Err(e) if !self.publish_failing => {
                self.publish_failing = true;
                events.push(Event::warn(format!("cannot publish the GPU list (vgpu run reads the GPUs itself meanwhile; tried again every round): {e}")));
            }
            Err(e) => events.push(Event::debug(format!("cannot publish the GPU list: {e}"))),
        }
    }

    /// Take the published GPU list back: the commands read the GPUs themselves.
    fn withdraw_gpus(&mut self, events: &mut Vec<Event>) {
        if self.published.take().is_some() {
            if let Err(e) = inventory::withdraw(&self.store) {
                events.push(Event::warn(format!("cannot withdraw the GPU list {}: {e}", self.store.inventory_path().display())));
            }
        }
    }

    /// The services it runs, for the metrics.
    pub fn services(&self) -> &crate::service::runner::Runner {
        &self.services
    }

    /// The memory and compute audits and the processes in no vGPU, against one snapshot.
    fn audit(&mut self, snapshot: &Snapshot, workloads: &[vgpu_store::state::Workload], files: &[enforce::VgpuFiles<'_>], events: &mut Vec<Event>) {
        let config = self.ctx.config.watch.clone();
        let now = Instant::now();
        let owners = enforce::owners(snapshot);
        let blind = snapshot.memory_unreported();
        if blind && !self.memory_blind {
            events.push(Event::warn(
                "the driver does not report the device memory of workload processes (NVML says \"not available\"): the memory audit counts them as 0 until it does (run vgpu watch as root with CAP_SYS_ADMIN, outside a container's PID namespace)",
            ));
        }
        self.memory_blind = blind;
        let contexts = &self.contexts;
        let figures = enforce::vgpu_memory(files, snapshot, |gpu| contexts.of(gpu));
        let mut condemned = offence::Condemned::default();
        for breach in self.memory.observe(now, &figures, config.grace) {
            for (id, processes) in enforce::by_workload(&breach, &owners) {
                condemned.add(&id, &processes, &breach.reason, "memory");
            }
        }
        let round = compute::Round { store: &self.store, workloads, files, snapshot, config: &config, now, counters: self.metrics.enforcements() };
        self.compute.round(&round, &mut condemned, &mut self.records, events);
        let act = offence::Act { store: &self.store, workloads, window: config.offence_window, counters: self.metrics.enforcements() };
        self.offences.act(&act, condemned, &mut self.records, events);
        let vgpu_gpus: HashSet<String> = workloads.iter().flat_map(|w| w.gpus.iter().map(|g| g.uuid.clone())).collect();
        self.unmanaged = unmanaged::find(snapshot, &vgpu_gpus, &[self.me.pid]);
        for u in self.reported.first_time(&self.unmanaged) {
            events.push(Event::warn(format!("unmanaged process: {}", unmanaged::describe(u))));
            if config.unmanaged == UnmanagedPolicy::Report {
                self.metrics.enforcements().record(crate::metrics::Action::Report, "unmanaged", &crate::metrics::WorkloadLabels::none());
            }
        }
        if config.unmanaged == UnmanagedPolicy::Kill {
            for u in &self.unmanaged {
                let reason = format!("in no vGPU on GPU {}, which hosts vGPUs ([watch] unmanaged = \"kill\")", u.gpu_index);
                if let Some(event) = self.terminations.terminate(u.process, "no vGPU", &reason, now, config.kill_after) {
                    if event.level != Level::Warn {
                        self.metrics.enforcements().record(crate::metrics::Action::Kill, "unmanaged", &crate::metrics::WorkloadLabels::none());
                    }
                    events.push(event);
                }
            }
        }
    }

    /// The store brought up to date, as every command does first, and the pool settled
    /// (waiting and suspended work resumed where blocks are free). Skipped for this round
    /// when a command holds the store lock for longer than a third of the interval.
    fn reconcile(&mut self, events: &mut Vec<Event>) {
        let wait = (self.interval() / 3).min(Duration::from_secs(2));
        let lock = match self.store.lock_within(wait) {
            Ok(lock) => lock,
            Err(e @ StateError::LockBusy { .. }) => {
                events.push(Event::debug(format!("reconcile skipped this round: {e}")));
                return;
            }
            Err(e) => {
                events.push(Event::warn(format!("cannot reconcile: {e}")));
                return;
            }
        };
        let found = vgpu_host::lifecycle::reconcile_quietly(&self.store, &lock);
        for w in &found.cleaned {
            self.ended.insert(w.id.clone(), format!("supervisor (pid {}) died", w.supervisor.pid));
        }
        // A damaged file stays until `vgpu doctor --repair`, and a clean-up that fails
        // fails again next round: each warning is said once, until it goes away and comes
        // back. What reconcile did is said every time.
        let mut warnings: BTreeSet<String> = found.damaged.iter().map(|e| e.to_string()).collect();
        for note in found.notes {
            if note.warning {
                warnings.insert(note.text);
            } else {
                events.push(Event::info(note.text));
            }
        }
        if let Err(e) = vgpu_host::pool_effects::settle(&self.store, &lock) {
            warnings.insert(format!("cannot settle the compute pool: {e:#}"));
        }
        // Slurm steps whose tasks Slurm stopped or continued: their memory to the host and back.
        // (Slurm steps are never the pool's: settling changed none of these records.)
        for note in vgpu_host::slurm::follow_suspensions(&self.store, &found.workloads) {
            if note.warning {
                warnings.insert(note.text);
            } else {
                events.push(Event::info(note.text));
            }
        }
        events.extend(warnings.difference(&self.damaged).map(|message| Event::warn(message.clone())));
        self.damaged = warnings;
    }

    pub fn store(&self) -> &Store {
        &self.store
    }
}

/// The context sizes before any measurement: a fixed size as it is, "auto" as the lowest
/// architecture figure until the driver is measured.
fn unmeasured(setting: config::ContextAllowance) -> contexts::ContextSizes {
    match setting {
        config::ContextAllowance::Bytes(bytes) => contexts::ContextSizes::fixed(bytes),
        config::ContextAllowance::Auto => contexts::ContextSizes::fixed(vgpu_gpu::context::fallback(None).0),
    }
}

/// Why the watch cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("vgpu watch is already running for {state_dir}{}", .pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Running { state_dir: String, pid: Option<u32> },
    #[error(transparent)]
    State(StateError),
    #[error("cannot read this process's start time from /proc")]
    Identity,
    #[error(transparent)]
    Metrics(crate::metrics::MetricsError),
}

/// When the next round starts: `interval` after the previous start, so rounds do not drift
/// by their own duration, or earlier when a verdict falls due (`early`); a round that
/// overran starts the next at once.
pub fn next_round(started: Instant, interval: Duration, early: Option<Instant>, now: Instant) -> Instant {
    let due = early.map_or(started + interval, |e| e.min(started + interval));
    due.max(now)
}
