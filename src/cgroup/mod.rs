//! Control groups: which hierarchy the host has (v1, v2 or hybrid) and where each
//! controller vgpu uses is mounted.

pub mod layout;

pub use layout::{Controller, Layout, Mode};
