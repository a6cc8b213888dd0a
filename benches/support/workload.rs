//! The GPU workload program (`tests/fakegpu/examples/gpu_workload.rs`) with the shim and the
//! simulated driver, built in release beside the bench's `vgpu`. Include with
//! `#[path = "support/workload.rs"] mod workload;`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Build them (through the `CARGO` cargo sets for a bench) and return the program's path;
/// exit 1 with one line naming `bench` when that fails or a piece is missing.
pub fn build(bench: &str) -> PathBuf {
    let fail = |message: String| -> ! {
        eprintln!("{bench}: {message}");
        std::process::exit(1)
    };
    let vgpu = PathBuf::from(env!("CARGO_BIN_EXE_vgpu"));
    let bin_dir = vgpu.parent().unwrap_or_else(|| fail("CARGO_BIN_EXE_vgpu has no directory".into())).to_path_buf();
    let build = ["build", "--release", "-p", "vgpu-shim", "-p", "fakegpu", "--lib", "--example", "gpu_workload"];
    match std::env::var_os("CARGO") {
        Some(cargo) => {
            let status = Command::new(cargo).args(build).current_dir(env!("CARGO_MANIFEST_DIR")).stdout(Stdio::null()).status();
            if !matches!(status, Ok(s) if s.success()) {
                fail(format!("`cargo {}` failed ({status:?})", build.join(" ")));
            }
        }
        None => eprintln!("{bench}: CARGO is not set; not building (run it with `cargo bench`)"),
    }
    let workload = bin_dir.join("examples/gpu_workload");
    for need in [&workload, &bin_dir.join("libvgpu.so"), &bin_dir.join("libfakegpu.so")] {
        if !need.is_file() {
            fail(format!("{} is missing: run `cargo {}` first", need.display(), build.join(" ")));
        }
    }
    workload
}
