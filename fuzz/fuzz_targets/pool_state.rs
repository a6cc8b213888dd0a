#![no_main]
//! `cargo +nightly fuzz run pool_state`: see `vgpu_fuzz::pool_state` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::pool_state(data));
