#![no_main]
//! `cargo +nightly fuzz run usage_file`: see `vgpu_fuzz::usage_file` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::usage_file(data));
