//! The compute pool of 1-TFLOPS blocks (SPEC 1.2, 4.4): pure logic, no effects.
//!
//! - [`inventory`]: devices → regions → block numbers.
//! - [`map`], [`compact`]: who owns which block; compaction.
//! - [`allocate`], [`preempt`], [`resume`], [`resize`]: decisions, returned as a [`Plan`].
//! - [`state`]: the [`Pool`] value the state store keeps; [`view`]: what `vgpu pool` shows.
//!
//! How a caller uses it (all under the state store's lock):
//!
//! ```text
//! run:     plan = pool.admit(&request)?      // TooLarge → exit 2; NoRoom → wait or refuse
//!          freeze plan.suspend (undo and stop on failure) → pool.apply(plan)? → save
//!          → compute shares from pool.gpu_shares(id), env from pool.declared_env(id)
//! --wait:  pool.enqueue(&request)? → save; poll until pool.allocation(id) is running
//! exit:    pool.release(id)? → plan = pool.settle() → freeze plan.suspend, thaw
//!          plan.resume → pool.apply(plan)? → save
//! compact: pool.compact() → save
//! update:  plan = pool.resize(id, blocks)?   // like admit, on the devices it runs on
//! ```

pub mod allocate;
pub mod compact;
pub mod config;
pub mod error;
pub mod inventory;
pub mod kind;
pub mod map;
pub mod plan;
pub mod preempt;
pub mod priority;
pub mod request;
pub mod resize;
pub mod resume;
pub mod state;
pub mod status;
pub mod tflops;
pub mod view;

#[cfg(test)]
mod tests;

pub use config::PoolConfig;
pub use error::PoolError;
pub use inventory::{Device, Inventory, NvmlGpu};
pub use kind::{DeviceKind, KindFilter};
pub use plan::{Plan, Suspension, WorkloadRef};
pub use priority::Priority;
pub use request::{blocks_for, parse_tflops, Request};
pub use state::{AllocState, Allocation, DeviceShare, Pool, Share};
pub use view::PoolView;
