//! The pool: the inventory, the block map and the allocations, as one value the state
//! store keeps in a JSON file (read, changed and written under its lock).
//!
//! Everything here is pure: the methods that decide (`admit`, `settle`) return a [`Plan`]
//! and change nothing; the caller carries out its effects (freeze, thaw) and then records
//! it with [`Pool::apply`]. See `README.md` beside this file.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::error::PoolError;
use super::inventory::{Device, DeviceOrigin, Inventory};
use super::kind::KindFilter;
use super::map::BlockMap;
use super::priority::Priority;
use super::request::Request;

pub use crate::status::AllocState;

/// Blocks on one device (an index into the inventory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub device: usize,
    pub blocks: u64,
}

/// One workload's claim on the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub id: String,
    pub name: String,
    pub priority: Priority,
    /// Creation order, unique in the pool: the larger, the younger.
    pub seq: u64,
    /// Blocks requested.
    pub blocks: u64,
    pub kind: KindFilter,
    pub state: AllocState,
    /// Running: blocks held per device. Suspended: what it holds again on resuming.
    /// Waiting: empty. Sorted by device.
    pub shares: Vec<Share>,
    /// Set while suspended: the id of the workload that took its blocks.
    pub preempted_by: Option<String>,
}

impl Allocation {
    pub fn held(&self) -> u64 {
        self.shares.iter().map(|s| s.blocks).sum()
    }
}

/// A workload's part of one device, for `--compute`-like limits.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceShare<'a> {
    pub device: &'a Device,
    pub index: usize,
    pub blocks: u64,
}

impl DeviceShare<'_> {
    /// Blocks held / blocks of the device, in percent.
    pub fn percent(&self) -> f64 {
        if self.device.blocks == 0 {
            return 0.0;
        }
        self.blocks as f64 * 100.0 / self.device.blocks as f64
    }

    /// [`Self::percent`] as the shim's `--compute` wants it: rounded, at least 1, at most 100.
    pub fn compute_percent(&self) -> u8 {
        // Clamped to 1..=100 first, so the cast is exact.
        self.percent().round().clamp(1.0, 100.0) as u8
    }
}

#[derive(Debug, Clone)]
pub struct Pool {
    pub(crate) inventory: Inventory,
    pub(crate) map: BlockMap,
    pub(crate) allocations: BTreeMap<u64, Allocation>,
    pub(crate) by_id: HashMap<String, u64>,
    pub(crate) next_seq: u64,
    pub(crate) generation: u64,
}

impl PartialEq for Pool {
    fn eq(&self, other: &Self) -> bool {
        self.inventory == other.inventory
            && self.map == other.map
            && self.allocations == other.allocations
            && self.next_seq == other.next_seq
            && self.generation == other.generation
    }
}

impl Pool {
    /// An empty pool over `inventory`.
    pub fn new(inventory: Inventory) -> Pool {
        let map = BlockMap::new(inventory.devices.iter().map(|d| d.blocks));
        Pool { inventory, map, allocations: BTreeMap::new(), by_id: HashMap::new(), next_seq: 1, generation: 0 }
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    pub fn map(&self) -> &BlockMap {
        &self.map
    }

    /// Every allocation, oldest first.
    pub fn allocations(&self) -> impl Iterator<Item = &Allocation> {
        self.allocations.values()
    }

    pub fn allocation(&self, id: &str) -> Option<&Allocation> {
        self.by_id.get(id).and_then(|seq| self.allocations.get(seq))
    }

    /// Change the priority of workload `id`'s allocation (`vgpu update --priority`); false
    /// if it has none. Settle afterwards: the change may let it preempt, or be preempted.
    pub fn set_priority(&mut self, id: &str, priority: Priority) -> bool {
        match self.by_id.get(id).and_then(|seq| self.allocations.get_mut(seq)) {
            Some(a) => {
                a.priority = priority;
                true
            }
            None => false,
        }
    }

    /// Counts every change; a [`Plan`] is valid only for the generation it was made from.
    ///
    /// [`Plan`]: super::plan::Plan
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn total_blocks(&self) -> u64 {
        self.inventory.total_blocks()
    }

    pub fn free_blocks(&self) -> u64 {
        self.map.devices().iter().map(|d| d.free()).sum()
    }

    pub fn used_blocks(&self) -> u64 {
        self.total_blocks() - self.free_blocks()
    }

    /// Queue a request that cannot be served now (`--wait`). It holds nothing; the next
    /// [`Pool::settle`] that finds room for it starts it.
    pub fn enqueue(&mut self, request: &Request) -> Result<(), PoolError> {
        self.check_request(request)?;
        let seq = self.next_seq;
        self.insert(Allocation {
            id: request.id.clone(),
            name: request.name.clone(),
            priority: request.priority,
            seq,
            blocks: request.blocks,
            kind: request.kind,
            state: AllocState::Waiting,
            shares: Vec::new(),
            preempted_by: None,
        });
        self.next_seq += 1;
        self.generation += 1;
        Ok(())
    }

    /// Remove a workload (it exited, was killed, its supervisor died, or it stopped
    /// waiting) and give its blocks back, compacting the devices it was on. Follow with
    /// [`Pool::settle`] so that suspended and waiting work can use them.
    pub fn release(&mut self, id: &str) -> Result<Allocation, PoolError> {
        let seq = self.by_id.remove(id).ok_or_else(|| PoolError::UnknownWorkload(id.to_string()))?;
        let alloc = self.allocations.remove(&seq).ok_or_else(|| PoolError::UnknownWorkload(id.to_string()))?;
        if alloc.state == AllocState::Running {
            for share in &alloc.shares {
                let device = self.map.device_mut(share.device);
                device.release(seq);
                device.compact();
            }
        }
        self.generation += 1;
        Ok(alloc)
    }

    /// Relabel blocks so that every owner's blocks on a device are one run and the free
    /// blocks one run at the end of each device (`vgpu pool compact`). True if any moved.
    pub fn compact(&mut self) -> bool {
        let moved = self.map.compact();
        if moved {
            self.generation += 1;
        }
        moved
    }

    /// A workload's blocks per device, with each device's size.
    pub fn shares(&self, id: &str) -> Vec<DeviceShare<'_>> {
        let Some(alloc) = self.allocation(id) else { return Vec::new() };
        alloc
            .shares
            .iter()
            .filter_map(|s| {
                let device = self.inventory.devices.get(s.device)?;
                Some(DeviceShare { device, index: s.device, blocks: s.blocks })
            })
            .collect()
    }

    /// The NVML GPUs a workload holds blocks on, with its compute share of each: what
    /// `CUDA_VISIBLE_DEVICES` and the shim's compute limit are made from.
    pub fn gpu_shares(&self, id: &str) -> Vec<DeviceShare<'_>> {
        self.shares(id).into_iter().filter(|s| matches!(s.device.origin, DeviceOrigin::Nvml { .. })).collect()
    }

    /// The environment that hands declared devices to a workload: for every `env` variable
    /// of the `[[pool.device]]` tables it holds blocks on, the ids, comma-joined in block
    /// order.
    pub fn declared_env(&self, id: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, Vec<String>)> = Vec::new();
        for share in self.shares(id) {
            if let DeviceOrigin::Declared { id: dev_id, env: Some(var) } = &share.device.origin {
                let value = dev_id.clone().unwrap_or_else(|| share.device.name.clone());
                match env.iter_mut().find(|(v, _)| v == var) {
                    Some((_, values)) => values.push(value),
                    None => env.push((var.clone(), vec![value])),
                }
            }
        }
        env.into_iter().map(|(var, values)| (var, values.join(","))).collect()
    }

    /// Take a new inventory (GPUs added or removed, config changed). Allocations keep their
    /// blocks on devices that still exist (by UUID or declared id) while they fit, oldest
    /// first; the ones that cannot (and queued requests the new pool is too small for) are
    /// removed and returned, for the caller to stop or report. Follow with a settle.
    pub fn adopt(&mut self, inventory: Inventory) -> Vec<Allocation> {
        if self.inventory == inventory {
            return Vec::new();
        }
        let same_layout = self.inventory.block_tflops == inventory.block_tflops
            && self.inventory.devices.len() == inventory.devices.len()
            && self
                .inventory
                .devices
                .iter()
                .zip(&inventory.devices)
                .all(|(a, b)| a.key() == b.key() && a.blocks == b.blocks);
        if same_layout {
            self.inventory = inventory;
            self.generation += 1;
            return Vec::new();
        }
        let new_index: HashMap<String, usize> =
            inventory.devices.iter().enumerate().map(|(i, d)| (d.key(), i)).collect();
        let remap: Vec<Option<usize>> =
            self.inventory.devices.iter().map(|d| new_index.get(&d.key()).copied()).collect();
        let mut next = Pool::new(inventory);
        next.next_seq = self.next_seq;
        next.generation = self.generation + 1;
        let mut dropped = Vec::new();
        for (_, mut alloc) in std::mem::take(&mut self.allocations) {
            let shares: Option<Vec<Share>> = alloc
                .shares
                .iter()
                .map(|s| remap.get(s.device).copied().flatten().map(|device| Share { device, blocks: s.blocks }))
                .collect();
            let keep = match (alloc.state, shares) {
                // A queued request stays queued while the pool can ever serve it.
                (AllocState::Waiting, _) => {
                    let eligible = next.inventory.eligible(alloc.kind);
                    eligible.iter().map(|&d| next.inventory.devices[d].blocks).sum::<u64>() >= alloc.blocks
                }
                (_, None) => false,
                (state, Some(mut shares)) => {
                    shares.sort_by_key(|s| s.device);
                    let running = state == AllocState::Running;
                    // A running workload needs the blocks now; a suspended one only needs
                    // a device big enough to resume on.
                    let room = |s: &Share| {
                        if running {
                            next.map.device(s.device).free()
                        } else {
                            next.inventory.devices[s.device].blocks
                        }
                    };
                    let ok = shares.iter().all(|s| room(s) >= s.blocks);
                    if ok && running {
                        for s in &shares {
                            // Cannot fail: the room was checked just above.
                            let _ = next.map.device_mut(s.device).take(alloc.seq, s.blocks);
                        }
                    }
                    alloc.shares = shares;
                    ok
                }
            };
            if keep {
                next.insert(alloc);
            } else {
                dropped.push(alloc);
            }
        }
        *self = next;
        dropped
    }

    pub(crate) fn insert(&mut self, alloc: Allocation) {
        self.by_id.insert(alloc.id.clone(), alloc.seq);
        self.allocations.insert(alloc.seq, alloc);
    }

    /// The checks every request passes before any planning: a sane size, a new id, and no
    /// more blocks than the devices it may use have.
    pub(crate) fn check_request(&self, request: &Request) -> Result<(), PoolError> {
        if request.blocks == 0 {
            return Err(PoolError::InvalidTflops("0".into()));
        }
        if self.by_id.contains_key(&request.id) {
            return Err(PoolError::DuplicateWorkload(request.id.clone()));
        }
        let available: u64 =
            self.inventory.eligible(request.kind).iter().map(|&i| self.inventory.devices[i].blocks).sum();
        if request.blocks > available {
            return Err(PoolError::TooLarge {
                requested: request.blocks,
                available,
                total: self.total_blocks(),
                kind: request.kind,
            });
        }
        Ok(())
    }

    /// Check that the parts agree (a state file may have been damaged or edited by hand).
    pub fn check(&self) -> Result<(), PoolError> {
        let corrupt = |msg: String| Err(PoolError::Corrupt(msg));
        if self.map.devices().len() != self.inventory.devices.len() {
            return corrupt(format!(
                "{} devices in the inventory but {} in the block map",
                self.inventory.devices.len(),
                self.map.devices().len()
            ));
        }
        // Counts come from the file: every sum below is checked, so that a damaged file is
        // refused instead of overflowing here or in a later operation.
        if self.next_seq == u64::MAX || self.generation == u64::MAX {
            return corrupt(format!("sequence {} or generation {} cannot grow", self.next_seq, self.generation));
        }
        let mut expected_first: u64 = 1;
        for (i, (device, runs)) in self.inventory.devices.iter().zip(self.map.devices()).enumerate() {
            if device.first_block != expected_first {
                return corrupt(format!(
                    "device {i} ({}) starts at block {}, expected {expected_first}",
                    device.name, device.first_block
                ));
            }
            let Some(next_first) = expected_first.checked_add(device.blocks) else {
                return corrupt(format!("device {i} ({}) has {} blocks, more than can be numbered", device.name, device.blocks));
            };
            expected_first = next_first;
            let covered = runs.runs().iter().try_fold(0u64, |sum, r| sum.checked_add(r.len));
            if covered != Some(device.blocks) {
                return corrupt(format!(
                    "device {i} ({}) has {} blocks but its map covers {}",
                    device.name,
                    device.blocks,
                    covered.map_or_else(|| "more than can be counted".to_string(), |n| n.to_string())
                ));
            }
            if runs.runs().iter().any(|r| r.len == 0) {
                return corrupt(format!("device {i} has an empty run"));
            }
        }
        let mut held: HashMap<(u64, usize), u64> = HashMap::new();
        for (device, runs) in self.map.devices().iter().enumerate() {
            for run in runs.runs() {
                if let Some(owner) = run.owner {
                    *held.entry((owner, device)).or_default() += run.len;
                }
            }
        }
        let mut ids = HashMap::new();
        for (&seq, alloc) in &self.allocations {
            if alloc.seq != seq || seq >= self.next_seq {
                return corrupt(format!("workload {:?} has a bad sequence number {}", alloc.id, alloc.seq));
            }
            if ids.insert(alloc.id.as_str(), seq).is_some() {
                return corrupt(format!("workload {:?} appears twice", alloc.id));
            }
            if alloc.shares.windows(2).any(|w| w[0].device >= w[1].device)
                || alloc.shares.iter().any(|s| s.device >= self.inventory.devices.len() || s.blocks == 0)
            {
                return corrupt(format!("workload {:?} has bad device shares", alloc.id));
            }
            let expected_held = if alloc.state == AllocState::Waiting { 0 } else { alloc.blocks };
            let shares_sum = alloc.shares.iter().try_fold(0u64, |sum, s| sum.checked_add(s.blocks));
            if shares_sum != Some(expected_held) {
                return corrupt(format!(
                    "{} workload {:?} asked for {} blocks but has shares of {}",
                    alloc.state,
                    alloc.id,
                    alloc.blocks,
                    shares_sum.map_or_else(|| "more than can be counted".to_string(), |n| n.to_string())
                ));
            }
            for share in &alloc.shares {
                let in_map = held.remove(&(seq, share.device)).unwrap_or(0);
                let expected = if alloc.state == AllocState::Running { share.blocks } else { 0 };
                if in_map != expected {
                    return corrupt(format!(
                        "workload {:?} should hold {expected} blocks on device {} but the map gives it {in_map}",
                        alloc.id, share.device
                    ));
                }
            }
        }
        if let Some(((owner, device), _)) = held.into_iter().next() {
            return corrupt(format!("blocks on device {device} belong to no running workload (owner {owner})"));
        }
        Ok(())
    }
}

/// The stored form. Deserialising checks it ([`Pool::check`]), so a damaged file is an
/// error naming what is wrong, never a pool that breaks later.
#[derive(Deserialize)]
struct PoolRepr {
    inventory: Inventory,
    map: BlockMap,
    allocations: Vec<Allocation>,
    next_seq: u64,
    generation: u64,
}

impl Serialize for Pool {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Ref<'a> {
            inventory: &'a Inventory,
            map: &'a BlockMap,
            allocations: Vec<&'a Allocation>,
            next_seq: u64,
            generation: u64,
        }
        Ref {
            inventory: &self.inventory,
            map: &self.map,
            allocations: self.allocations.values().collect(),
            next_seq: self.next_seq,
            generation: self.generation,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Pool {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = PoolRepr::deserialize(deserializer)?;
        let mut pool = Pool {
            inventory: repr.inventory,
            map: repr.map,
            allocations: BTreeMap::new(),
            by_id: HashMap::new(),
            next_seq: repr.next_seq,
            generation: repr.generation,
        };
        for alloc in repr.allocations {
            if pool.allocations.contains_key(&alloc.seq) {
                return Err(serde::de::Error::custom(PoolError::Corrupt(format!(
                    "sequence number {} is used twice",
                    alloc.seq
                ))));
            }
            if pool.by_id.contains_key(&alloc.id) {
                return Err(serde::de::Error::custom(PoolError::Corrupt(format!(
                    "workload {:?} appears twice",
                    alloc.id
                ))));
            }
            pool.insert(alloc);
        }
        pool.check().map_err(serde::de::Error::custom)?;
        Ok(pool)
    }
}
