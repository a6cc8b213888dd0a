//! The watch's recorder: each round's [`Tick`](crate::history::tick::Tick) written to
//! history.db, workloads recorded as they appear and end, retention at start and hourly.
//!
//! A history failure (full disk, a lock held too long, a damaged file, a link in place of
//! the database) never stops enforcement: it is said once per kind of failure, the
//! connection is dropped, and the next round tries again. A round that could not be written
//! is not lost: the next one continues from the last interval written (the energy counter's
//! delta covers both).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::Event;
use crate::audit::Snapshot;
use crate::history::config::HistoryConfig;
use crate::history::store::WorkloadInfo;
use crate::history::tick::{self, Ledger, Previous};
use crate::history::{History, WriteError};
use crate::state::Workload;

/// How often retention runs (and once at start).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

pub struct Recorder {
    lib_dir: PathBuf,
    config: HistoryConfig,
    db: Option<History>,
    prev: Previous,
    /// Workloads recorded in this run (upserted), to see them end.
    seen: HashSet<String>,
    /// Kinds of failure already said, until a write succeeds again.
    warned: BTreeSet<&'static str>,
    last_prune: Option<Instant>,
    /// Writes that failed, for the metrics.
    pub failures: u64,
}

impl Recorder {
    pub fn new(lib_dir: PathBuf, config: HistoryConfig) -> Recorder {
        Recorder {
            lib_dir,
            config,
            db: None,
            prev: Previous::default(),
            seen: HashSet::new(),
            warned: BTreeSet::new(),
            last_prune: None,
            failures: 0,
        }
    }

    /// A new `[history]` (SIGHUP).
    pub fn reload(&mut self, config: HistoryConfig) {
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
    pub fn round(&mut self, snapshot: Option<&Snapshot>, workloads: &[Workload], ledgers: &[Ledger], ended: &HashMap<String, String>, events: &mut Vec<Event>) {
        if !self.config.enabled {
            return;
        }
        match self.try_round(snapshot, workloads, ledgers, ended, events) {
            Ok(()) => {
                if !self.warned.is_empty() {
                    self.warned.clear();
                    events.push(Event::info("history: recording again"));
                }
            }
            Err(e) => {
                self.failures += 1;
                // A fresh connection next round (a replaced or repaired file is opened anew).
                self.db = None;
                if self.warned.insert(e.kind()) {
                    events.push(Event::warn(format!("history: cannot record: {e}; enforcement goes on, the next round tries again")));
                } else {
                    events.push(Event::debug(format!("history: cannot record: {e}")));
                }
            }
        }
    }

    fn try_round(&mut self, snapshot: Option<&Snapshot>, workloads: &[Workload], ledgers: &[Ledger], ended: &HashMap<String, String>, events: &mut Vec<Event>) -> Result<(), WriteError> {
        let now_ms = now_ms();
        let first_open = self.db.is_none();
        let db = match &mut self.db {
            Some(db) => db,
            slot => slot.insert(History::open(&self.lib_dir)?),
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
        let gone: Vec<String> = self.seen.iter().filter(|id| !live.contains(id.as_str())).cloned().collect();
        for id in gone {
            db.end_workload(&id, now_ms, ended.get(&id).map(String::as_str))?;
            self.seen.remove(&id);
        }
        if let Some(snapshot) = snapshot {
            let (rows, next) = tick::build(&self.prev, snapshot, workloads, ledgers);
            db.record_tick(&rows)?;
            // Only once written: a round that failed is covered by the next.
            self.prev = next;
        }
        Ok(())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
