//! Enforcement: the memory quota ([`memory`]), the compute share ([`compute`], [`meter`]) and
//! what they need to know about devices, allocations and pools. The governor never decides
//! the mode itself: the hooks pass it in (`config::mode()`), or it reads the decided one
//! (`state`).

pub mod allocations;
pub mod arrays;
pub mod compute;
pub mod devices;
pub mod memory;
pub mod meter;
pub mod pools;
