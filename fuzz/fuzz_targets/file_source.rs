#![no_main]
//! `cargo +nightly fuzz run file_source`: see `vgpu_fuzz::file_source` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::file_source(data));
