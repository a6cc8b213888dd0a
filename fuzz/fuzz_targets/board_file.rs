#![no_main]
//! `cargo +nightly fuzz run board_file`: see `vgpu_fuzz::board_file` for what is checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::board_file(data));
