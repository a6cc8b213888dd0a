//! The watch's recorder: each round's [`Tick`](crate::history::tick::Tick) written to
//! history.db, workloads recorded as they appear and end, retention at start and hourly.
//!
//! A history failure (full disk, a lock held too long, a damaged file, a link in place of
//! the database) never stops enforcement: it is said once per kind of failure, the
//! connection is dropped, and the next round tries again. A round that could not be written
//! is not lost: it is kept and written with the next (one longer interval, the same totals).
//! With `[history] interval` the rounds are added up the same way until it has passed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::Event;
use crate::audit::Snapshot;
use crate::history::config::HistoryConfig;
use crate::history::store::WorkloadInfo;
use crate::history::tick::{self, Ledger, Previous, Tick};
use crate::history::{History, WriteError};
use crate::state::Workload;

/// How often retention runs (and once at start).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

pub struct Recorder {
    lib_dir: PathBuf,
    config: HistoryConfig,
    /// How long a write waits for another connection's lock: a quarter of the watch's
    /// interval (at most `db::BUSY_TIMEOUT`), so that a lock held elsewhere delays no round
    /// by much; what was not written waits for the next round.
    busy: Duration,
    db: Option<History>,
    prev: Previous,
    /// Rounds built but not written yet (`[history] interval`, or a failed write), and the
    /// time of the first of them.
    pending: Tick,
    pending_since: Option<u64>,
    /// Workloads recorded in this run (upserted), to see them end.
    seen: HashSet<String>,
    /// Kinds of failure already said, until a write succeeds again.
    warned: BTreeSet<&'static str>,
    last_prune: Option<Instant>,
}

impl Recorder {
    pub fn new(lib_dir: PathBuf, config: HistoryConfig, watch_interval: Duration) -> Recorder {
        Recorder {
            lib_dir,
            config,
            busy: watch_interval / 4,
            db: None,
            prev: Previous::default(),
            pending: Tick::default(),
            pending_since: None,
            seen: HashSet::new(),
            warned: BTreeSet::new(),
            last_prune: None,
        }
    }

    /// A new `[history]` (SIGHUP).
    pub fn reload(&mut self, config: HistoryConfig, watch_interval: Duration) {
        self.busy = watch_interval / 4;
        if let Some(db) = &self.db {
            if db.set_busy_timeout(self.busy).is_err() {
                self.db = None;
            }
        }
        if config.enabled != self.config.enabled || config.keep != self.config.keep {
            self.last_prune = None;
        }
        if !config.enabled {
            self.db = None;
        }
        self.config = config;
    }

    /// Record one round. `snapshot`: the GPUs now (None: NVML unavailable, only workloads
    /// are recorded); `ended`: workloads this round's reconcile tore down, with how.
    /// Returns the kind of failure when the round could not be recorded.
    pub fn round(&mut self, snapshot: Option<&Snapshot>, workloads: &[Workload], ledgers: &[Ledger], ended: &HashMap<String, String>, events: &mut Vec<Event>) -> Option<&'static str> {
        if !self.config.enabled {
            return None;
        }
        match self.try_round(snapshot, workloads, ledgers, ended, events) {
            Ok(()) => {
                if !self.warned.is_empty() {
                    self.warned.clear();
                    events.push(Event::info("history: recording again"));
                }
                None
            }
            Err(e) => {
                // A fresh connection next round (a replaced or repaired file is opened anew).
                self.db = None;
                if self.warned.insert(e.kind()) {
                    events.push(Event::warn(format!("history: cannot record: {e}; enforcement goes on, the next round tries again")));
                } else {
                    events.push(Event::debug(format!("history: cannot record: {e}")));
                }
                Some(e.kind())
            }
        }
    }

    fn try_round(&mut self, snapshot: Option<&Snapshot>, workloads: &[Workload], ledgers: &[Ledger], ended: &HashMap<String, String>, events: &mut Vec<Event>) -> Result<(), WriteError> {
        let now_ms = now_ms();
        let first_open = self.db.is_none();
        let db = match &mut self.db {
            Some(db) => db,
            slot => {
                let db = History::open(&self.lib_dir)?;
                db.set_busy_timeout(self.busy)?;
                slot.insert(db)
            }
        };
        if first_open && self.prev.t_ms.is_none() && self.prev.restored.is_empty() {
            // A restarted watch continues from the last readings of the one before.
            self.prev.restored = db.last_gpus()?.into_iter().collect();
            // Workloads that ended while no watch ran.
            let live: HashSet<&str> = workloads.iter().map(|w| w.id.as_str()).collect();
            for id in db.running_workloads()? {
                if !live.contains(id.as_str()) {
                    db.end_workload(&id, now_ms, None)?;
                }
            }
        }
        if self.last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            let pruned = db.prune(now_ms, self.config.keep)?;
            self.last_prune = Some(Instant::now());
            if pruned.rows > 0 {
                events.push(Event::info(format!(
                    "history: deleted {} rows older than {} ([history] keep)",
                    pruned.rows,
                    humantime::format_duration(self.config.keep)
                )));
            }
        }
        for w in workloads {
            if !self.seen.contains(&w.id) {
                db.upsert_workload(&WorkloadInfo::of(w))?;
                self.seen.insert(w.id.clone());
            }
        }
        let live: HashSet<&str> = workloads.iter().map(|w| w.id.as_str()).collect();
        // Those seen before, and those reconcile tore down before the watch saw them.
        let mut gone: Vec<String> = self.seen.iter().filter(|id| !live.contains(id.as_str())).cloned().collect();
        gone.extend(ended.keys().filter(|id| !self.seen.contains(*id) && !live.contains(id.as_str())).cloned());
        for id in gone {
            db.end_workload(&id, now_ms, ended.get(&id).map(String::as_str))?;
            self.seen.remove(&id);
        }
        if let Some(snapshot) = snapshot {
            let (rows, next) = tick::build(&self.prev, snapshot, workloads, ledgers);
            self.prev = next;
            self.pending.absorb(rows);
            let since = *self.pending_since.get_or_insert(snapshot.taken_unix_ms);
            if snapshot.taken_unix_ms.saturating_sub(since) >= self.config.interval.as_millis() as u64 {
                // Kept until written: a round that could not be written is covered by the next.
                db.record_tick(&self.pending)?;
                self.pending = Tick::default();
                self.pending_since = None;
            }
        }
        Ok(())
    }

    /// Write what is pending (the watch stops).
    pub fn flush(&mut self, events: &mut Vec<Event>) {
        if !self.config.enabled || self.pending.is_empty() {
            return;
        }
        let written = match &mut self.db {
            Some(db) => db.record_tick(&self.pending),
            None => History::open(&self.lib_dir).and_then(|mut db| db.record_tick(&self.pending)),
        };
        match written {
            Ok(()) => self.pending = Tick::default(),
            Err(e) => events.push(Event::warn(format!("history: the last {} of readings were not recorded: {e}", pending_span(&self.pending)))),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// How long what is pending covers, for a message.
fn pending_span(t: &Tick) -> String {
    let t0 = t.gpus.iter().map(|r| r.t0_ms).chain(t.workloads.iter().map(|r| r.t0_ms)).min().unwrap_or(0);
    let t1 = t.gpus.iter().map(|r| r.t1_ms).chain(t.workloads.iter().map(|r| r.t1_ms)).max().unwrap_or(0);
    humantime::format_duration(Duration::from_millis(t1.saturating_sub(t0))).to_string()
}
