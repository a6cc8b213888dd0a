#![no_main]
//! `cargo +nightly fuzz run intensity_response`: see `vgpu_fuzz::intensity_response` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::intensity_response(data));
