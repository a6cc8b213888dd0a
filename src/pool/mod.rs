//! The compute pool of 1-TFLOPS blocks (SPEC 1.2, 4.4).

pub mod config;
