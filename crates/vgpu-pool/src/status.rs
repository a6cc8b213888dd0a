//! Where a workload's claim on the pool stands.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The state of one workload's allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocState {
    /// Holds its blocks.
    Running,
    /// Preempted: frozen, its blocks given to a higher-priority workload; it gets the same
    /// number of blocks on the same devices back when it resumes.
    Suspended,
    /// Queued (`vgpu run --wait`): holds nothing yet.
    Waiting,
}

impl fmt::Display for AllocState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AllocState::Running => "running",
            AllocState::Suspended => "suspended",
            AllocState::Waiting => "waiting",
        })
    }
}
