//! The pool's errors: one type, each variant a message a user can act on.

use thiserror::Error;

use super::kind::{KindFilter, UnknownKind};
use super::status::AllocState;

/// A running workload that holds blocks a refused request would have needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub id: String,
    pub name: String,
    pub priority: i32,
    pub blocks: u64,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum PoolError {
    #[error("invalid --tflops {0:?}: give a positive number of TFLOPS, e.g. --tflops 4 or --tflops 2.5")]
    InvalidTflops(String),

    #[error("unknown device kind {given:?}: expected {expected}")]
    UnknownKind { given: String, expected: &'static str },

    #[error("invalid priority {0:?}: give an integer from 0 to 100 (higher is more important)")]
    PriorityOutOfRange(String),

    #[error(
        "pool device {name:?} in the config has no TFLOPS figure: \
         add `tflops = <peak TFLOPS>` to its [[pool.device]] table"
    )]
    DeviceWithoutTflops { name: String },

    #[error("pool device {name:?}: tflops must be a positive number, got {value}")]
    InvalidDeviceTflops { name: String, value: f64 },

    #[error("[pool] {key}: must be a positive number of TFLOPS, got {value}")]
    InvalidConfigTflops { key: String, value: f64 },

    #[error("[pool] block_tflops: must be from {min} to {max} TFLOPS, got {value}", )]
    InvalidBlockTflops { value: f64, min: f64, max: f64 },

    #[error("pool device {0:?} is declared twice in the config: give each [[pool.device]] a distinct name or id")]
    DuplicateDevice(String),

    #[error(
        "no TFLOPS figure is known for GPU {name:?} ({uuid}): set one in the config, \
         under [pool.tflops] \"{name}\" = <TFLOPS>, or [pool.uuid_tflops] \"{uuid}\" = <TFLOPS>"
    )]
    UnknownGpuModel { name: String, uuid: String },

    #[error("{}", too_large(*.requested, *.available, *.total, *.kind))]
    TooLarge { requested: u64, available: u64, total: u64, kind: KindFilter },

    #[error("{}", no_room(*.requested, *.free, .holders))]
    NoRoom { requested: u64, free: u64, holders: Vec<Holder> },

    #[error("{name} ({id}) runs on {devices} pool devices and keeps at least one block on each: ask for at least {devices} blocks, not {requested}")]
    ResizeBelowDevices { id: String, name: String, devices: usize, requested: u64 },

    #[error("{requested} blocks requested for {name} ({id}) but the devices it runs on have {available} blocks; a running workload cannot move to other devices")]
    ResizeTooLarge { id: String, name: String, requested: u64, available: u64 },

    #[error("{name} ({id}) is {state} in the pool: its blocks can change only while it runs")]
    NotRunning { id: String, name: String, state: AllocState },

    #[error("workload {0:?} already has an entry in the pool")]
    DuplicateWorkload(String),

    #[error("workload {0:?} has no entry in the pool")]
    UnknownWorkload(String),

    #[error("the pool changed after this plan was made; plan again")]
    StalePlan,

    #[error("damaged pool state: {0}")]
    Corrupt(String),
}

impl PoolError {
    /// True when the user must change the request or the config (exit code 2); false for
    /// conditions of the host or the state (exit code 1).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            PoolError::InvalidTflops(_)
                | PoolError::UnknownKind { .. }
                | PoolError::PriorityOutOfRange(_)
                | PoolError::DeviceWithoutTflops { .. }
                | PoolError::InvalidDeviceTflops { .. }
                | PoolError::InvalidConfigTflops { .. }
                | PoolError::InvalidBlockTflops { .. }
                | PoolError::DuplicateDevice(_)
                | PoolError::UnknownGpuModel { .. }
                | PoolError::TooLarge { .. }
                | PoolError::ResizeBelowDevices { .. }
                | PoolError::ResizeTooLarge { .. }
        )
    }
}

fn too_large(requested: u64, available: u64, total: u64, kind: KindFilter) -> String {
    match kind {
        KindFilter::Any => format!("{requested} blocks requested but the whole pool has {total} blocks"),
        KindFilter::Only(k) => {
            format!("{requested} blocks requested but the pool has {available} {k} blocks ({total} blocks in all)")
        }
    }
}

fn no_room(requested: u64, free: u64, holders: &[Holder]) -> String {
    const SHOWN: usize = 5;
    let mut held_by: Vec<String> = holders
        .iter()
        .take(SHOWN)
        .map(|h| format!("{} ({}, priority {}, {} blocks)", h.name, h.id, h.priority, h.blocks))
        .collect();
    if holders.len() > SHOWN {
        held_by.push(format!("and {} more", holders.len() - SHOWN));
    }
    let held_by = if held_by.is_empty() { "nothing that may be preempted".to_string() } else { held_by.join(", ") };
    format!(
        "{requested} blocks requested, {free} free; the other blocks are held by workloads of equal or \
         higher priority: {held_by}; use --wait to queue, or a higher --priority"
    )
}

impl From<UnknownKind> for PoolError {
    fn from(e: UnknownKind) -> PoolError {
        PoolError::UnknownKind { given: e.given, expected: e.expected }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::DeviceKind;

    #[test]
    fn too_large_carries_the_pool_size() {
        let e = PoolError::TooLarge { requested: 60, available: 50, total: 50, kind: KindFilter::Any };
        assert_eq!(e.to_string(), "60 blocks requested but the whole pool has 50 blocks");
        let e =
            PoolError::TooLarge { requested: 20, available: 18, total: 63, kind: KindFilter::Only(DeviceKind::Gpu) };
        assert!(e.to_string().contains("18 gpu blocks (63 blocks in all)"), "{e}");
        assert!(e.is_usage());
    }

    #[test]
    fn no_room_names_the_holders() {
        let holders = vec![Holder { id: "w1".into(), name: "train".into(), priority: 70, blocks: 8 }];
        let e = PoolError::NoRoom { requested: 5, free: 2, holders };
        let msg = e.to_string();
        assert!(msg.contains("train (w1, priority 70, 8 blocks)"), "{msg}");
        assert!(!e.is_usage());
    }
}
