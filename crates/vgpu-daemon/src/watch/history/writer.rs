//! The history thread of `vgpu watch`: writes what the rounds hand it ([`Batch`]es, through
//! a bounded queue), keeps and merges what it could not write, runs retention, makes the
//! rollups of hours and days ([`vgpu_history::rollup`]), publishes the public copy ([`snapshot`]) and
//! says what happened ([`Reply`]). Its only waits are
//! SQLite's, each bounded by [`vgpu_history::db::BUSY_TIMEOUT`], and the queue's
//! ([`RETRY`]); it never holds anything the enforcement loop needs.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use vgpu_history::config::HistoryConfig;
use vgpu_history::query::IdlePowers;
use vgpu_history::snapshot;
use vgpu_history::snapshot::Cadence;
use vgpu_history::store::WorkloadInfo;
use vgpu_history::tick::LastGpu;
use vgpu_history::tick::Tick;
use vgpu_history::History;
use vgpu_history::WriteError;
use vgpu_store::state::ended;
use vgpu_store::state::Store;

/// How often what could not be written is tried again when no round hands anything over.
pub const RETRY: Duration = Duration::from_secs(1);

/// How often retention runs (and once at start).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// How often the rollups are brought up to date (once at start, then again at once
/// while some are left).
pub const ROLLUP_EVERY: Duration = Duration::from_secs(60);

/// How often they are also checked against the intensity figures and the idle powers
/// (a reading recorded late, a new power model, another config).
pub const ROLLUP_CHECK_EVERY: Duration = Duration::from_secs(600);

/// The longest one pass of rollups takes (its transactions hold the write lock at most
/// [`vgpu_history::store::ROLLUP_TX`] each); a history of 90 days made by an older vgpu is
/// rolled up a pass per second.
pub const ROLLUP_BUDGET: Duration = Duration::from_millis(500);

/// What rounds hand over: their rows, the workloads that appeared and ended.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub tick: Tick,
    pub upserts: Vec<WorkloadInfo>,
    /// (workload, when, how) for workloads that ended.
    pub ends: Vec<(String, u64, Option<String>)>,
    /// The workloads running at the latest round (to close, once, those a previous watch
    /// left running).
    pub live: Option<Vec<String>>,
    /// A new `[history]` (SIGHUP).
    pub config: Option<HistoryConfig>,
    /// The idle powers reports take on this host (at the start, when NVML opens, SIGHUP).
    pub idle: Option<IdlePowers>,
}

impl Batch {
    /// Add a later batch to this one: the rows one longer interval each ([`Tick::absorb`]),
    /// a workload's latest description, every end, the latest live set and config.
    pub fn absorb(&mut self, later: Batch) {
        self.tick.absorb(later.tick);
        for u in later.upserts {
            match self.upserts.iter_mut().find(|o| o.id == u.id) {
                Some(o) => *o = u,
                None => self.upserts.push(u),
            }
        }
        self.ends.extend(later.ends);
        if later.live.is_some() {
            self.live = later.live;
        }
        if later.config.is_some() {
            self.config = later.config;
        }
        if later.idle.is_some() {
            self.idle = later.idle;
        }
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.tick.is_empty() && self.upserts.is_empty() && self.ends.is_empty()
    }
}

/// What the thread tells the rounds (read without waiting at each round).
#[derive(Debug)]
pub enum Reply {
    /// The previous watch's last reading of each GPU (once, at the first open).
    Restored(Vec<(String, LastGpu)>),
    /// A write or the public copy failed; `message` is the log line.
    Failed { kind: &'static str, message: String },
    /// Written again after failures.
    Recorded,
    /// Retention deleted rows (the log line).
    Pruned(String),
    /// Something to say at info level (the log line).
    Info(String),
    /// Something to say as a warning (the log line).
    Warn(String),
    /// The queue was closed and everything written (or given up): the thread ends.
    Stopped,
}

struct Writer {
    lib_dir: PathBuf,
    /// Where `vgpu run` leaves its workloads' ends ([`ended`]).
    store: Store,
    config: HistoryConfig,
    db: Option<History>,
    /// Handed over but not written yet.
    pending: Batch,
    restored: bool,
    closed_stale: bool,
    last_prune: Option<Instant>,
    cadence: Cadence,
    failing: bool,
    rollups: Rollups,
}

/// The state of the rollups ([`Writer::roll_up`]).
#[derive(Default)]
struct Rollups {
    /// None until the rounds say (none is made before: they would be made again).
    idle: Option<IdlePowers>,
    last: Option<Instant>,
    last_check: Option<Instant>,
    /// Passes in a row that left hours for the next, since when, and what they made.
    behind: Option<(Instant, usize)>,
    /// Whether a series of passes finished since the start (said at info level).
    said: bool,
    /// A pass failed (said once until one succeeds).
    failing: bool,
}

/// The thread's body: until the queue is closed, then what is left, then [`Reply::Stopped`].
pub fn run(lib_dir: PathBuf, store: Store, config: HistoryConfig, rx: Receiver<Batch>, replies: Sender<Reply>) {
    let mut w = Writer {
        lib_dir,
        store,
        config,
        db: None,
        pending: Batch::default(),
        restored: false,
        closed_stale: false,
        last_prune: None,
        cadence: Cadence::default(),
        failing: false,
        rollups: Rollups::default(),
    };
    // Open at once: the previous watch's readings before the first round needs them.
    w.write(&replies);
    loop {
        match rx.recv_timeout(RETRY) {
            Ok(batch) => w.pending.absorb(batch),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        while let Ok(batch) = rx.try_recv() {
            w.pending.absorb(batch);
        }
        w.write(&replies);
        w.roll_up(&replies);
        w.publish(&replies);
    }
    w.write(&replies);
    let _ = replies.send(Reply::Stopped);
}

impl Writer {
    fn write(&mut self, replies: &Sender<Reply>) {
        if let Some(config) = self.pending.config.take() {
            if config.keep != self.config.keep {
                self.last_prune = None;
            }
            self.config = config;
        }
        if let Some(idle) = self.pending.idle.take() {
            if self.rollups.idle.as_ref() != Some(&idle) {
                // Rollups made with other idle powers are made again.
                self.rollups.last_check = None;
                self.rollups.idle = Some(idle);
            }
        }
        let had = !self.pending.is_empty();
        let ended = !self.pending.ends.is_empty();
        match self.try_write(replies) {
            Ok(noted) => {
                if had || noted {
                    self.cadence.wrote(ended || noted);
                }
                if self.failing {
                    self.failing = false;
                    let _ = replies.send(Reply::Recorded);
                }
            }
            Err(e) => {
                // A fresh connection next time (a replaced or repaired file is opened anew).
                self.db = None;
                self.failing = true;
                let message = format!("history: cannot record: {e}; enforcement goes on, the next round tries again");
                let _ = replies.send(Reply::Failed { kind: e.kind(), message });
            }
        }
    }

    /// Write what is pending, and the ends `vgpu run` left; whether there were any.
    fn try_write(&mut self, replies: &Sender<Reply>) -> Result<bool, WriteError> {
        let now_ms = now_ms();
        let db = match &mut self.db {
            Some(db) => db,
            slot => slot.insert(History::open(&self.lib_dir)?),
        };
        if !self.restored {
            // A restarted watch continues from the last readings of the one before.
            let gpus = db.last_gpus()?;
            self.restored = true;
            let _ = replies.send(Reply::Restored(gpus));
        }
        if !self.closed_stale {
            if let Some(live) = &self.pending.live {
                // Workloads that ended while no watch ran.
                let live: HashSet<&str> = live.iter().map(String::as_str).collect();
                for id in db.running_workloads()? {
                    if !live.contains(id.as_str()) {
                        db.end_workload(&id, now_ms, None)?;
                    }
                }
                self.closed_stale = true;
            }
        }
        if self.last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            let pruned = db.prune(now_ms, self.config.keep)?;
            self.last_prune = Some(Instant::now());
            if pruned.rows > 0 {
                let _ = replies.send(Reply::Pruned(format!(
                    "history: deleted {} rows older than {} ([history] keep)",
                    pruned.rows,
                    humantime::format_duration(self.config.keep)
                )));
            }
        }
        // The ends `vgpu run` left, before the rounds' own: theirs say how the workload ended
        // and when exactly (the first end recorded counts). Each note is removed once written.
        let (notes, damaged) = ended::pending(&self.store);
        for found in &notes {
            let n = &found.note;
            db.upsert_workload(&WorkloadInfo::of(&n.workload))?;
            db.end_workload(&n.workload.id, n.ended_unix_ms, Some(&n.outcome))?;
        }
        // Each step is idempotent but the tick, written (all or nothing) last: a failure
        // keeps the whole batch for the next try.
        for w in &self.pending.upserts {
            db.upsert_workload(w)?;
        }
        for (id, at, outcome) in &self.pending.ends {
            db.end_workload(id, *at, outcome.as_deref())?;
        }
        if !self.pending.tick.is_empty() {
            db.record_tick(&self.pending.tick)?;
        }
        let live = self.pending.live.take();
        self.pending = Batch { live, ..Batch::default() };
        for found in &notes {
            if let Err(e) = ended::remove(&found.path) {
                // Written again at the next pass (the same rows), removed then.
                let _ = replies.send(Reply::Warn(format!("history: cannot remove {} once recorded: {e}", found.path.display())));
            }
        }
        for e in damaged {
            // What cannot be read can never be recorded: said, and removed when it is a file
            // (an unsafe directory is left as it is, and said at every pass).
            let removed = match &e {
                vgpu_store::state::StateError::Damaged { path, .. } => ended::remove(path).is_ok(),
                _ => false,
            };
            let what = if removed { "removed" } else { "left" };
            let _ = replies.send(Reply::Warn(format!("history: a workload's end left by vgpu run cannot be recorded ({what}): {e}")));
        }
        Ok(!notes.is_empty())
    }

    /// Bring the rollups up to date when it is due ([`ROLLUP_EVERY`], or at once
    /// while a history is rolled up a pass at a time), for at most [`ROLLUP_BUDGET`]. A
    /// failure changes nothing readers see (they read the rows of an hour without its
    /// rollup): it is said once, and the next pass tries again.
    fn roll_up(&mut self, replies: &Sender<Reply>) {
        let now = Instant::now();
        let r = &mut self.rollups;
        let Some(db) = self.db.as_mut().filter(|_| !self.failing) else { return };
        let Some(idle) = &r.idle else { return };
        if r.behind.is_none() && r.last.is_some_and(|at| now.duration_since(at) < ROLLUP_EVERY) {
            return;
        }
        let check = r.last_check.is_none_or(|at| now.duration_since(at) >= ROLLUP_CHECK_EVERY);
        r.last = Some(now);
        match db.roll_up(&idle.defaults(), check, ROLLUP_BUDGET) {
            Ok(pass) => {
                if check {
                    r.last_check = Some(now);
                }
                if r.failing {
                    r.failing = false;
                    let _ = replies.send(Reply::Info("history: rollups are made again".into()));
                }
                let (since, made) = r.behind.take().unwrap_or((now, 0));
                let made = made + pass.made;
                if pass.left > 0 {
                    r.behind = Some((since, made));
                } else if made > 0 && (!r.said || now > since) {
                    r.said = true;
                    let took = humantime::format_duration(Duration::from_millis(since.elapsed().as_millis() as u64));
                    let _ = replies.send(Reply::Info(format!("history: rollups up to date ({made} hours and days rolled up in {took})")));
                }
            }
            Err(e) => {
                r.behind = None;
                if !r.failing {
                    r.failing = true;
                    let message = format!("history: cannot make the rollups: {e}; reports read those hours' rows, the next pass tries again");
                    let _ = replies.send(Reply::Failed { kind: "rollup", message });
                }
            }
        }
    }

    /// Refresh the public copy when it is due.
    fn publish(&mut self, replies: &Sender<Reply>) {
        let now = Instant::now();
        let Some(db) = &self.db else { return };
        if !self.cadence.due(now) {
            return;
        }
        match snapshot::publish(db.connection(), &self.lib_dir) {
            Ok(took) => self.cadence.made(now, took, true),
            Err(e) => {
                self.cadence.made(now, now.elapsed(), false);
                let message = format!("history: cannot publish its public copy ({}): {e}; users other than root read the previous one", snapshot::SNAPSHOT_FILE);
                let _ = replies.send(Reply::Failed { kind: "snapshot", message });
            }
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
