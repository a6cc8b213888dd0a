#![no_main]
//! `cargo +nightly fuzz run config`: see `vgpu_fuzz::config` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::config(data));
