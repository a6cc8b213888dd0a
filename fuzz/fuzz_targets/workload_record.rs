#![no_main]
//! `cargo +nightly fuzz run workload_record`: see `vgpu_fuzz::workload_record` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::workload_record(data));
