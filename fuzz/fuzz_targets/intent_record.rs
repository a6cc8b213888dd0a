#![no_main]
//! `cargo +nightly fuzz run intent_record`: see `vgpu_fuzz::intent_record` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::intent_record(data));
