#![no_main]
//! `cargo +nightly fuzz run size`: see `vgpu_fuzz::size` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::size(data));
