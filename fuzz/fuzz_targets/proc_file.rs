#![no_main]
//! `cargo +nightly fuzz run proc_file`: see `vgpu_fuzz::proc_file` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::proc_file(data));
