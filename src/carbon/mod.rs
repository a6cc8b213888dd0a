//! Carbon-budgeted clocks (SPEC 1.3, 4.5).

pub mod config;
