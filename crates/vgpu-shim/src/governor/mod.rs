//! Enforcement: the memory quota ([`memory`]) and what it needs to know about devices and
//! allocations.

pub mod allocations;
pub mod arrays;
pub mod compute;
pub mod devices;
pub mod memory;
pub mod meter;
