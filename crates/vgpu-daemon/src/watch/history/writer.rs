//! The history thread of `vgpu watch`: writes what the rounds hand it ([`Batch`]es, through
//! a bounded queue), keeps and merges what it could not write, runs retention, publishes the
//! public copy ([`snapshot`]) and says what happened ([`Reply`]). Its only waits are
//! SQLite's, each bounded by [`vgpu_history::db::BUSY_TIMEOUT`], and the queue's
//! ([`RETRY`]); it never holds anything the enforcement loop needs.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use vgpu_history::config::HistoryConfig;
use vgpu_history::snapshot;
use vgpu_history::snapshot::Cadence;
use vgpu_history::store::WorkloadInfo;
use vgpu_history::tick::LastGpu;
use vgpu_history::tick::Tick;
use vgpu_history::History;
use vgpu_history::WriteError;

/// How often what could not be written is tried again when no round hands anything over.
pub const RETRY: Duration = Duration::from_secs(1);

/// How often retention runs (and once at start).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

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
    /// The queue was closed and everything written (or given up): the thread ends.
    Stopped,
}

struct Writer {
    lib_dir: PathBuf,
    config: HistoryConfig,
    db: Option<History>,
    /// Handed over but not written yet.
    pending: Batch,
    restored: bool,
    closed_stale: bool,
    last_prune: Option<Instant>,
    cadence: Cadence,
    failing: bool,
}

/// The thread's body: until the queue is closed, then what is left, then [`Reply::Stopped`].
pub fn run(lib_dir: PathBuf, config: HistoryConfig, rx: Receiver<Batch>, replies: Sender<Reply>) {
    let mut w = Writer {
        lib_dir,
        config,
        db: None,
        pending: Batch::default(),
        restored: false,
        closed_stale: false,
        last_prune: None,
        cadence: Cadence::default(),
        failing: false,
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
        let had = !self.pending.is_empty();
        let ended = !self.pending.ends.is_empty();
        match self.try_write(replies) {
            Ok(()) => {
                if had {
                    self.cadence.wrote(ended);
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

    fn try_write(&mut self, replies: &Sender<Reply>) -> Result<(), WriteError> {
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
        Ok(())
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
