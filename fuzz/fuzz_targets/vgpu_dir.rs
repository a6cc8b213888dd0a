#![no_main]
//! `cargo +nightly fuzz run vgpu_dir`: see `vgpu_fuzz::vgpu_dir` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::vgpu_dir(data));
