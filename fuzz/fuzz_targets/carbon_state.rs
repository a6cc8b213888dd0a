#![no_main]
//! `cargo +nightly fuzz run carbon_state`: see `vgpu_fuzz::carbon_state` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::carbon_state(data));
