//! Control groups: which hierarchy the host has (v1, v2 or hybrid), and one workload's
//! cgroup behind one interface with a v1 and a v2 implementation side by side.
//!
//! - [`Layout`]: where each controller is mounted (`Layout::detect()`; tests build one
//!   over a temporary directory, which is how the fake cgroupfs trees are injected).
//! - [`CgroupHome`] (`home.rs`): where a workload's `vgpu/` lives — the hierarchies' roots
//!   (cgroupfs) or the delegated subtree of the systemd unit vgpu runs in — chosen per run.
//! - [`Cgroup`]: create / open / apply limits / join / freeze / kill / stats / remove.
//!   `v1.rs` and `v2.rs` implement the version-specific part.

mod error;
mod fs;
mod handle;
pub mod home;
pub mod systemd;
pub mod layout;
mod manager;
mod v1;
mod v2;

#[cfg(any(test, feature = "test-support"))]
pub mod fake;

pub use error::CgroupError;
pub use handle::{Cgroup, CgroupReader, CgroupReaders, DEFAULT_TIMEOUT, PARENT};
pub use home::{CgroupHome, ManagerKind};
pub use layout::{Controller, Layout, Mode};
pub use manager::{CgroupSpec, FreezerState, Limits, Stats, CPU_PERIOD_US, MIN_MEMORY_BYTES};
