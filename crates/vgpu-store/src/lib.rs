//! The store: workload and partition records, intents, the state lock, atomic small files, and the error contract shared by every command.

pub mod access;
pub mod admission;
pub mod clock;
pub mod compute;
pub mod error;
pub mod identity;
pub mod read_only;
pub mod resize;
pub mod spawn;
pub mod state;
pub mod stop_point;
pub mod supervise;
