//! The watch's recorder: each round's [`Tick`](vgpu_history::tick::Tick) written to
//! history.db, workloads recorded as they appear and end, retention at start and hourly,
//! and the public copy of the history ([`vgpu_history::snapshot`]) refreshed.
//!
//! Enforcement never waits on the history (SPEC 4.7). The round only builds its rows (a pure
//! function, [`tick::build`]) and hands them to the history thread ([`writer`]) through a
//! bounded queue with `try_send`: nothing here blocks, opens a file or takes a lock. What
//! cannot be queued (the thread is behind, e.g. a write waiting on a lock) stays here and is
//! merged into the next round's batch ([`Batch::absorb`]: one longer interval per GPU, the
//! same totals, as the energy comes from cumulative counters), workloads that appeared or
//! ended included. The thread keeps what it could not write the same way and tries again;
//! every wait of its own is bounded ([`vgpu_history::db::BUSY_TIMEOUT`]).
//!
//! A history failure (full disk, a lock held too long, a damaged file, a link in place of
//! the database) is said once per kind of failure, and again when recording resumes.
//! With `[history] interval` the rounds are added up the same way until it has passed.
//! The idle powers reports take on this host (the config's, the driver's power limits) are
//! handed over too ([`Recorder::idle_powers`]): the thread makes the rollups with
//! them.
//! At the stop, what is pending is handed over and the thread given [`FLUSH_WAIT`] to
//! write it.

pub mod writer;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use super::Event;
use vgpu_gpu::snapshot::Snapshot;
use vgpu_history::config::HistoryConfig;
use vgpu_history::query::IdlePowers;
use vgpu_history::store::WorkloadInfo;
use vgpu_history::tick;
use vgpu_history::tick::Ledger;
use vgpu_history::tick::Previous;
use vgpu_history::tick::Tick;
pub use writer::{Batch, Reply};

/// How many batches may wait for the history thread; past that, rounds are merged here.
pub const QUEUE: usize = 4;

/// How long the stop waits for the history thread to write what is pending.
pub const FLUSH_WAIT: Duration = Duration::from_secs(3);

/// The history thread, as the enforcement loop sees it.
struct Thread {
    tx: SyncSender<Batch>,
    replies: Receiver<Reply>,
}

pub struct Recorder {
    lib_dir: PathBuf,
    /// Where `vgpu run` leaves workloads' ends for the history thread to record.
    store: vgpu_store::state::Store,
    config: HistoryConfig,
    thread: Option<Thread>,
    prev: Previous,
    /// Built but not handed over yet (`[history] interval`, or the queue was full), and the
    /// time of its first round.
    pending: Batch,
    pending_since: Option<u64>,
    /// Workloads recorded in this run (handed over), to see them end.
    seen: HashSet<String>,
    /// The first snapshot of this watch, kept until the history thread says where the
    /// previous watch stopped (so that the gap between them is recorded).
    first: Option<Snapshot>,
    /// Whether the previous watch's last readings are known (or will never be).
    restored: bool,
    /// Kinds of failure already said, until a write succeeds again.
    warned: BTreeSet<&'static str>,
    /// The queue was found full (said once until it is not).
    behind: bool,
}

impl Recorder {
    pub fn new(lib_dir: PathBuf, store: vgpu_store::state::Store, config: HistoryConfig, _watch_interval: Duration) -> Recorder {
        let mut r = Recorder {
            lib_dir,
            store,
            config,
            thread: None,
            prev: Previous::default(),
            pending: Batch::default(),
            pending_since: None,
            seen: HashSet::new(),
            first: None,
            restored: false,
            warned: BTreeSet::new(),
            behind: false,
        };
        r.start_thread();
        r
    }

    fn start_thread(&mut self) {
        if !self.config.enabled || self.thread.is_some() {
            return;
        }
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let (reply_tx, replies) = mpsc::channel();
        let lib_dir = self.lib_dir.clone();
        let store = self.store.clone();
        let config = self.config.clone();
        match std::thread::Builder::new().name("vgpu-history".into()).spawn(move || writer::run(lib_dir, store, config, rx, reply_tx)) {
            Ok(_) => self.thread = Some(Thread { tx, replies }),
            // Said at the next round (no thread, nothing recorded).
            Err(e) => tracing::warn!("history: cannot start its thread: {e}; nothing is recorded until the next reload"),
        }
    }

    /// A new `[history]` (SIGHUP).
    pub fn reload(&mut self, config: HistoryConfig, _watch_interval: Duration) {
        let enabled = config.enabled;
        self.config = config;
        self.pending.config = Some(self.config.clone());
        if !enabled {
            // The thread writes what it has and ends.
            self.thread = None;
        } else {
            self.start_thread();
        }
    }

    /// The idle powers reports take on this host, for the rollups the history thread makes
    /// (handed over with the next batch).
    pub fn idle_powers(&mut self, idle: IdlePowers) {
        self.pending.idle = Some(idle);
    }

    /// Record one round. `snapshot`: the GPUs now (None: NVML unavailable, only workloads
    /// are recorded); `ended`: workloads this round's reconcile tore down, with how.
    /// Returns the kinds of failure the history thread reported since the last round.
    pub fn round(&mut self, snapshot: Option<&Snapshot>, workloads: &[vgpu_store::state::Workload], ledgers: &[Ledger], ended: &HashMap<String, String>, events: &mut Vec<Event>) -> Vec<&'static str> {
        if !self.config.enabled {
            return Vec::new();
        }
        let failed = self.replies(events);
        let now_ms = now_ms();
        for w in workloads {
            if self.seen.insert(w.id.clone()) {
                self.pending.upserts.push(WorkloadInfo::of(w));
            }
        }
        let live: HashSet<&str> = workloads.iter().map(|w| w.id.as_str()).collect();
        // Those seen before, and those reconcile tore down before the watch saw them.
        let mut gone: Vec<String> = self.seen.iter().filter(|id| !live.contains(id.as_str())).cloned().collect();
        gone.extend(ended.keys().filter(|id| !self.seen.contains(*id) && !live.contains(id.as_str())).cloned());
        for id in gone {
            let outcome = ended.get(&id).cloned();
            self.seen.remove(&id);
            self.pending.ends.push((id, now_ms, outcome));
        }
        self.pending.live = Some(live.iter().map(|id| id.to_string()).collect());
        if let Some(snapshot) = snapshot {
            if !self.restored && self.prev.t_ms.is_none() {
                self.first = Some(snapshot.clone());
            }
            let (rows, next) = tick::build(&self.prev, snapshot, workloads, ledgers);
            self.prev = next;
            self.pending.tick.absorb(rows);
            self.pending_since.get_or_insert(snapshot.taken_unix_ms);
        }
        let due = match (snapshot, self.pending_since) {
            (Some(s), Some(since)) => s.taken_unix_ms.saturating_sub(since) >= self.config.interval.as_millis() as u64,
            _ => false,
        };
        self.hand_over(due, events);
        failed
    }

    /// What the history thread said since the last round: failures (said once per kind),
    /// recording again, the previous watch's last readings.
    fn replies(&mut self, events: &mut Vec<Event>) -> Vec<&'static str> {
        let mut failed = Vec::new();
        let Some(thread) = &self.thread else { return failed };
        while let Ok(reply) = thread.replies.try_recv() {
            match reply {
                Reply::Restored(gpus) => {
                    self.restored = true;
                    let restored: HashMap<_, _> = gpus.into_iter().collect();
                    match self.first.take() {
                        // No snapshot yet: the first round's rows start from them.
                        None if self.prev.t_ms.is_none() => self.prev.restored = restored,
                        None => {}
                        // The first round is gone by: the gap up to it, as its own rows.
                        Some(first) => {
                            let (bridge, _) = tick::build(&Previous { restored, ..Previous::default() }, &first, &[], &[]);
                            self.pending.tick.absorb(bridge);
                        }
                    }
                }
                Reply::Failed { kind, message } => {
                    failed.push(kind);
                    if self.warned.insert(kind) {
                        events.push(Event::warn(message));
                    } else {
                        events.push(Event::debug(message));
                    }
                }
                Reply::Recorded => {
                    if !self.warned.is_empty() {
                        self.warned.clear();
                        events.push(Event::info("history: recording again"));
                    }
                }
                Reply::Pruned(message) | Reply::Info(message) => events.push(Event::info(message)),
                Reply::Warn(message) => events.push(Event::warn(message)),
                Reply::Stopped => {}
            }
        }
        failed
    }

    /// Hand what is pending to the thread: everything when `tick_due`, else the workloads
    /// that appeared or ended (the rows wait for `[history] interval`). Never blocks.
    fn hand_over(&mut self, tick_due: bool, events: &mut Vec<Event>) {
        let Some(thread) = &self.thread else { return };
        let batch = if tick_due {
            self.pending_since = None;
            std::mem::take(&mut self.pending)
        } else if self.pending.upserts.is_empty() && self.pending.ends.is_empty() && self.pending.idle.is_none() {
            return;
        } else {
            Batch {
                upserts: std::mem::take(&mut self.pending.upserts),
                ends: std::mem::take(&mut self.pending.ends),
                live: self.pending.live.clone(),
                config: self.pending.config.take(),
                idle: self.pending.idle.take(),
                ..Batch::default()
            }
        };
        match thread.tx.try_send(batch) {
            Ok(()) => {
                if self.behind {
                    self.behind = false;
                    events.push(Event::info("history: the writer caught up"));
                }
            }
            Err(TrySendError::Full(batch)) => {
                if !self.behind {
                    self.behind = true;
                    events.push(Event::warn(format!(
                        "history: the writer is behind ({QUEUE} batches queued): this round's rows are kept and merged into the next; enforcement goes on"
                    )));
                }
                self.put_back(batch, tick_due);
            }
            Err(TrySendError::Disconnected(batch)) => {
                events.push(Event::warn("history: its thread ended; a new one starts"));
                self.thread = None;
                self.put_back(batch, tick_due);
                self.start_thread();
            }
        }
    }

    /// A batch that could not be handed over goes back in front of what is pending.
    fn put_back(&mut self, batch: Batch, had_tick: bool) {
        let rest = std::mem::take(&mut self.pending);
        self.pending = batch;
        self.pending.absorb(rest);
        if had_tick {
            // Due again at the next round.
            self.pending_since = Some(0);
        }
    }

    /// Hand everything over and give the thread [`FLUSH_WAIT`] to write it (the watch
    /// stops).
    pub fn flush(&mut self, events: &mut Vec<Event>) {
        if !self.config.enabled {
            return;
        }
        let Some(thread) = self.thread.take() else { return };
        let deadline = Instant::now() + FLUSH_WAIT;
        let mut batch = std::mem::take(&mut self.pending);
        loop {
            match thread.tx.try_send(batch) {
                Ok(()) => break,
                Err(TrySendError::Full(b)) if Instant::now() < deadline => {
                    batch = b;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) => {
                    if !b.tick.is_empty() {
                        events.push(Event::warn(format!("history: the last {} of readings were not recorded: the writer did not take them in time", pending_span(&b.tick))));
                    }
                    return;
                }
            }
        }
        // Its end of the queue closed: it writes what is queued, then says it stopped.
        let Thread { tx, replies } = thread;
        drop(tx);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match replies.recv_timeout(left) {
                Ok(Reply::Stopped) => return,
                Ok(Reply::Failed { message, .. }) => events.push(Event::warn(message)),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    events.push(Event::warn(format!("history: the writer did not finish within {}; what it had not written is lost", humantime::format_duration(FLUSH_WAIT))));
                    return;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// How long what is pending covers, for a message.
pub(crate) fn pending_span(t: &Tick) -> String {
    let t0 = t.gpus.iter().map(|r| r.t0_ms).chain(t.workloads.iter().map(|r| r.t0_ms)).min().unwrap_or(0);
    let t1 = t.gpus.iter().map(|r| r.t1_ms).chain(t.workloads.iter().map(|r| r.t1_ms)).max().unwrap_or(0);
    humantime::format_duration(Duration::from_millis(t1.saturating_sub(t0))).to_string()
}
