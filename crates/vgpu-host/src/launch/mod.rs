//! Launching a workload, the core of `vgpu run`; `commands/run.rs` only parses, calls these
//! and prints.
//!
//! * [`admit`] (`admit.rs`): under the store lock, reconcile, place the workload
//!   (`place.rs`: pool blocks, a partition, or GPUs chosen directly or by the carbon
//!   planner), check memory admission, and create its vGPU, cgroup and record — all through
//!   one `Admission` (`transaction.rs`) that undoes, in reverse order, whatever it did
//!   unless it is committed.
//! * [`ensure_vgpu`] (`vgpu.rs`): the vGPU directory, files and board slots.
//! * [`workload_env`] (`env.rs`): the child's environment, and `SHIM_ENV`, the variables
//!   nothing may replace.
//! * [`start`], [`supervise`], [`finish`] (`child.rs`): spawn into the cgroup and record the
//!   pid, wait relaying signals, and tear down on every exit path.
//! * [`resolve`]: the working directory and the program, checked as the workload's user
//!   (`identity::as_user`), never as root.

/// How often a command that `--wait`s tries again (each try under the store lock).
pub const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(200);

mod admit;
mod child;
mod env;
mod ids;
mod place;
pub mod resolve;
mod transaction;
mod told;
mod vgpu;

use std::path::PathBuf;
use std::time::Duration;

use vgpu_store::admission::MemSpec;
use vgpu_cgroups::Cgroup;
use vgpu_cgroups::Limits;
use vgpu_store::compute::ComputePolicy;
use vgpu_pool::KindFilter;
use vgpu_pool::Priority;
use vgpu_store::state::UserSpec;
use vgpu_store::state::Workload;

pub use admit::admit;
pub use child::{finish, outcome, record_end, start, supervise, records_history, watch_records_history, Ended};
pub use env::{shim_var, workload_env, ShimVar};
pub use vgpu::ensure_vgpu;

/// A workload to launch, checked (`vgpu run`'s options, validated).
#[derive(Debug, Clone)]
pub struct Request {
    /// `--name`; else `<program>-<id>`.
    pub name: Option<String>,
    pub argv: Vec<String>,
    pub user: UserSpec,
    /// `--env`, in order.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub limits: Limits,
    pub priority: Priority,
    /// `--compute-policy`; else the config's.
    pub compute_policy: Option<ComputePolicy>,
    /// `--turn` in µs (`vgpu_store::compute::parse_turn`); else the config's `[compute] turn`.
    pub turn_max_us: Option<u32>,
    pub freq_sensitivity: Option<f64>,
    /// Device memory per GPU.
    pub mem: Option<MemSpec>,
    /// A sudo caller's `[policy] max_mem` (None: root, or no cap): a slice without `mem` is
    /// lowered to it, one with `mem` above it refused.
    pub mem_cap: Option<crate::policy::MemCap>,
    /// Admit even when the memory is reserved already.
    pub oversubscribe: bool,
    pub placement: Placement,
    /// The service and replica it is (`--service`, `--replica`), recorded for `vgpu ps`
    /// and the service runners.
    pub service: Option<vgpu_store::state::ServiceRef>,
}

/// Where the workload's GPUs come from.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Blocks from the compute pool (`--tflops`).
    Pool(PoolAsk),
    /// A partition's vGPU (`--partition`).
    Partition(String),
    /// GPUs of its own: `wanted` by index or UUID (none: the one with the most unreserved
    /// memory), or a number the carbon planner chooses in `count`; `compute_pct` of each.
    Gpus { wanted: Vec<String>, count: Option<(usize, usize)>, compute_pct: u32 },
}

/// A compute-pool request, validated.
#[derive(Debug, Clone)]
pub struct PoolAsk {
    pub tflops: f64,
    pub kind: KindFilter,
    /// None: refuse when the blocks are not free; Some(None): wait forever.
    pub wait: Option<Option<Duration>>,
}

/// A workload admitted and recorded, with its cgroup created.
#[derive(Debug)]
pub struct Launched {
    pub workload: Workload,
    pub cgroup: Cgroup,
}
