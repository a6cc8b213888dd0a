#![no_main]
//! `cargo +nightly fuzz run partitions`: see `vgpu_fuzz::partitions` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::partitions(data));
