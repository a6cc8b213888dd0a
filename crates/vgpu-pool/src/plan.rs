//! Plans: what a decision changes, computed without changing anything.
//!
//! `admit` and `settle` work on a scratch view of the pool (free blocks per device and
//! the allocations whose state they change) and return a [`Plan`]. The caller carries out
//! its effects in order (freeze every workload in [`Plan::suspend`]; if a freeze fails,
//! thaw the ones already frozen and drop the plan: nothing was recorded), thaws
//! [`Plan::resume`], lets [`Plan::start`] and [`Plan::granted`] run, and records it all with
//! [`Pool::apply`].

use std::cell::OnceCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::error::PoolError;
use super::map::{BlockMap, DeviceRuns};
use super::priority::Priority;
use super::state::{AllocState, Allocation, Pool, Share};

/// A workload to freeze: preempted by `by`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspension {
    pub id: String,
    pub name: String,
    pub priority: Priority,
    /// Blocks it gives up (and gets back on resuming).
    pub blocks: u64,
    pub by: String,
}

/// A workload named in a plan, by id and name (its record is `state::Workload`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadRef {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    base_generation: u64,
    changes: Vec<(u64, Change)>,
    new: Option<Allocation>,
    suspend: Vec<Suspension>,
    resume: Vec<WorkloadRef>,
    start: Vec<WorkloadRef>,
}

impl Plan {
    /// Freeze these first, in this order.
    pub fn suspend(&self) -> &[Suspension] {
        &self.suspend
    }

    /// Then thaw these (suspended workloads whose blocks are back), highest priority first.
    pub fn resume(&self) -> &[WorkloadRef] {
        &self.resume
    }

    /// Waiting workloads that now have their blocks and may start, highest priority first.
    pub fn start(&self) -> &[WorkloadRef] {
        &self.start
    }

    /// The admitted request's allocation, with the blocks it gets per device.
    pub fn granted(&self) -> Option<&Allocation> {
        self.new.as_ref()
    }

    /// True when recording it would change nothing.
    pub fn is_empty(&self) -> bool {
        self.new.is_none() && self.changes.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    pub state: AllocState,
    pub shares: Vec<Share>,
    pub preempted_by: Option<String>,
}

/// The pool as a plan in progress sees it: only block counts matter to decisions, since
/// blocks within a device are interchangeable.
pub(crate) struct Scratch<'p> {
    pub pool: &'p Pool,
    pub free: Vec<u64>,
    changed: BTreeMap<u64, Change>,
    /// The order of first changes: the order the plan lists them in.
    order: Vec<u64>,
    /// Built on first need: plans that preempt nobody never pay for it.
    index: OnceCell<Index>,
    new: Option<Allocation>,
    /// Suspended or waiting workloads that settling leaves where they are (their memory
    /// does not fit back yet: a fact outside the pool's).
    pub held: BTreeSet<String>,
}

/// What makes preemption cheap to plan on a large pool.
struct Index {
    /// Allocations that are or were running, in preemption order (lowest priority first,
    /// then the youngest): victims are looked for in its prefix of lower priorities only.
    by_rank: Vec<(Priority, Reverse<u64>)>,
    /// Per device, blocks held by running allocations at each priority: answers "could
    /// preemption make room at all?" without walking the allocations.
    running_at: Vec<[u64; PRIORITIES]>,
}

const PRIORITIES: usize = (Priority::MAX - Priority::MIN + 1) as usize;

fn rank(p: Priority) -> usize {
    // Priorities are MIN..=MAX by construction.
    (p.get() - Priority::MIN) as usize
}

/// What preemption and placement need to know of an allocation.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub seq: u64,
    pub priority: Priority,
    pub shares: Vec<Share>,
}

impl<'p> Scratch<'p> {
    pub fn new(pool: &'p Pool) -> Self {
        Scratch {
            pool,
            free: pool.map.free_per_device(),
            changed: BTreeMap::new(),
            order: Vec::new(),
            index: OnceCell::new(),
            new: None,
            held: BTreeSet::new(),
        }
    }

    fn index(&self) -> &Index {
        self.index.get_or_init(|| {
            let mut by_rank = Vec::new();
            let mut running_at = vec![[0; PRIORITIES]; self.pool.inventory.devices.len()];
            for a in self.pool.allocations.values() {
                let (state, shares) = match self.changed.get(&a.seq) {
                    Some(c) => (c.state, c.shares.as_slice()),
                    None => (a.state, a.shares.as_slice()),
                };
                if state == AllocState::Running {
                    by_rank.push((a.priority, Reverse(a.seq)));
                    for s in shares {
                        running_at[s.device][rank(a.priority)] += s.blocks;
                    }
                }
            }
            by_rank.sort_unstable();
            Index { by_rank, running_at }
        })
    }

    /// Blocks on device `d` held by running allocations of priority strictly below `p`.
    pub fn running_below(&self, d: usize, p: Priority) -> u64 {
        self.index().running_at[d][..rank(p)].iter().sum()
    }

    pub fn state(&self, seq: u64) -> Option<AllocState> {
        match self.changed.get(&seq) {
            Some(c) => Some(c.state),
            None => self.pool.allocations.get(&seq).map(|a| a.state),
        }
    }

    pub fn shares(&self, seq: u64) -> &[Share] {
        match self.changed.get(&seq) {
            Some(c) => &c.shares,
            None => self.pool.allocations.get(&seq).map_or(&[], |a| &a.shares),
        }
    }

    /// Running allocations of priority strictly below `priority` holding blocks on a
    /// device `relevant` accepts, in the order they are preempted: lowest priority first,
    /// then the youngest.
    pub fn victims_below(&self, priority: Priority, relevant: impl Fn(usize) -> bool) -> Vec<Candidate> {
        self.index()
            .by_rank
            .iter()
            .take_while(|(p, _)| *p < priority)
            .map(|&(p, Reverse(seq))| (p, seq))
            .filter(|&(_, seq)| self.state(seq) == Some(AllocState::Running))
            .filter(|&(_, seq)| self.shares(seq).iter().any(|s| relevant(s.device)))
            .map(|(priority, seq)| Candidate { seq, priority, shares: self.shares(seq).to_vec() })
            .collect()
    }

    /// Record that `seq` stops running: preempted by `by`.
    pub fn suspend(&mut self, seq: u64, by: &str) {
        let shares = self.shares(seq).to_vec();
        for s in &shares {
            self.free[s.device] += s.blocks;
        }
        if let (Some(index), Some(a)) = (self.index.get_mut(), self.pool.allocations.get(&seq)) {
            for s in &shares {
                index.running_at[s.device][rank(a.priority)] -= s.blocks;
            }
        }
        self.record(seq, Change { state: AllocState::Suspended, shares, preempted_by: Some(by.to_string()) });
    }

    /// Record that `seq` runs on `shares`, which the caller has checked are free.
    pub fn run(&mut self, seq: u64, shares: Vec<Share>) {
        for s in &shares {
            self.free[s.device] -= s.blocks;
        }
        if let (Some(index), Some(a)) = (self.index.get_mut(), self.pool.allocations.get(&seq)) {
            for s in &shares {
                index.running_at[s.device][rank(a.priority)] += s.blocks;
            }
            let key = (a.priority, Reverse(seq));
            if let Err(at) = index.by_rank.binary_search(&key) {
                index.by_rank.insert(at, key);
            }
        }
        self.record(seq, Change { state: AllocState::Running, shares, preempted_by: None });
    }

    /// Record that running `seq` now holds `shares` instead (a resize): the caller has
    /// checked that the blocks it gains are free.
    pub fn reshape(&mut self, seq: u64, shares: Vec<Share>) {
        let old = self.shares(seq).to_vec();
        for s in &old {
            self.free[s.device] += s.blocks;
        }
        for s in &shares {
            self.free[s.device] -= s.blocks;
        }
        if let (Some(index), Some(a)) = (self.index.get_mut(), self.pool.allocations.get(&seq)) {
            for s in &old {
                index.running_at[s.device][rank(a.priority)] -= s.blocks;
            }
            for s in &shares {
                index.running_at[s.device][rank(a.priority)] += s.blocks;
            }
        }
        self.record(seq, Change { state: AllocState::Running, shares, preempted_by: None });
    }

    fn record(&mut self, seq: u64, change: Change) {
        if self.changed.insert(seq, change).is_none() {
            self.order.push(seq);
        }
    }

    /// Record the admitted request: it runs on `shares`.
    pub fn run_new(&mut self, mut alloc: Allocation, shares: Vec<Share>) {
        for s in &shares {
            self.free[s.device] -= s.blocks;
        }
        alloc.shares = shares;
        alloc.state = AllocState::Running;
        self.new = Some(alloc);
    }

    /// The plan: the net change from the pool as it was.
    pub fn into_plan(mut self) -> Plan {
        let pool = self.pool;
        let mut plan = Plan {
            base_generation: pool.generation,
            changes: Vec::new(),
            new: self.new,
            suspend: Vec::new(),
            resume: Vec::new(),
            start: Vec::new(),
        };
        for seq in self.order {
            let Some(change) = self.changed.remove(&seq) else { continue };
            let Some(before) = pool.allocations.get(&seq) else { continue };
            if before.state == change.state && before.shares == change.shares {
                continue;
            }
            let workload = WorkloadRef { id: before.id.clone(), name: before.name.clone() };
            match (before.state, change.state) {
                (AllocState::Running, AllocState::Suspended) => plan.suspend.push(Suspension {
                    id: before.id.clone(),
                    name: before.name.clone(),
                    priority: before.priority,
                    blocks: before.held(),
                    by: change.preempted_by.clone().unwrap_or_default(),
                }),
                (AllocState::Suspended, AllocState::Running) => plan.resume.push(workload),
                (AllocState::Waiting, AllocState::Running) => plan.start.push(workload),
                _ => {}
            }
            plan.changes.push((seq, change));
        }
        plan
    }
}

impl Pool {
    /// Record a plan whose effects were carried out. Fails only if the pool changed since
    /// the plan was made (then nothing is recorded).
    pub fn apply(&mut self, plan: Plan) -> Result<(), PoolError> {
        if plan.base_generation != self.generation {
            return Err(PoolError::StalePlan);
        }
        if let Some(new) = &plan.new {
            if new.seq != self.next_seq || self.by_id.contains_key(&new.id) {
                return Err(PoolError::StalePlan);
            }
        }
        // Work on copies of the devices touched, so that a surprise leaves the pool as it was.
        let mut devices: HashMap<usize, DeviceRuns> = HashMap::new();
        // Whether a change moves blocks: it stops or starts running, or a running
        // allocation is resized (it gives all its blocks back and takes its new count).
        let moves = |before: &Allocation, change: &Change| {
            (before.state == AllocState::Running) != (change.state == AllocState::Running)
                || (change.state == AllocState::Running && before.shares != change.shares)
        };
        // Free first: suspended workloads' blocks are what the others take.
        for (seq, change) in &plan.changes {
            let before = self.allocations.get(seq).ok_or(PoolError::StalePlan)?;
            if before.state == AllocState::Running && moves(before, change) {
                for s in &before.shares {
                    copy_of(&mut devices, &self.map, s.device).release(*seq);
                }
            }
        }
        let newly_running = plan
            .changes
            .iter()
            .filter(|(seq, c)| c.state == AllocState::Running && self.allocations.get(seq).is_some_and(|a| moves(a, c)))
            .map(|(seq, c)| (*seq, &c.shares))
            .chain(plan.new.as_ref().map(|a| (a.seq, &a.shares)));
        for (seq, shares) in newly_running {
            for s in shares {
                copy_of(&mut devices, &self.map, s.device).take(seq, s.blocks).map_err(|_| PoolError::StalePlan)?;
            }
        }
        for (d, mut runs) in devices {
            runs.compact();
            *self.map.device_mut(d) = runs;
        }
        for (seq, change) in plan.changes {
            if let Some(alloc) = self.allocations.get_mut(&seq) {
                if change.state != AllocState::Waiting {
                    // A resize changes the count; otherwise it is the same.
                    alloc.blocks = change.shares.iter().map(|s| s.blocks).sum();
                }
                alloc.state = change.state;
                alloc.shares = change.shares;
                alloc.preempted_by = change.preempted_by;
            }
        }
        if let Some(new) = plan.new {
            self.next_seq += 1;
            self.insert(new);
        }
        self.generation += 1;
        Ok(())
    }
}

/// The working copy of device `d`, made on first use.
fn copy_of<'a>(copies: &'a mut HashMap<usize, DeviceRuns>, map: &BlockMap, d: usize) -> &'a mut DeviceRuns {
    copies.entry(d).or_insert_with(|| map.device(d).clone())
}
