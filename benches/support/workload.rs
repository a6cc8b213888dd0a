//! The GPU workload program (`crates/fakegpu/examples/gpu_workload.rs`) with the shim and the
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
            let status = Command::new(cargo).args(build).current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).stdout(Stdio::null()).status();
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

/// A simulated host in a temporary directory: one H100, the fake's state, vgpu's state and
/// lib directories, and a vgpu config file.
pub struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    /// With `vgpu_toml` as vgpu's config; exit 1 naming `bench` if the files cannot be made.
    pub fn new(bench: &str, vgpu_toml: &str) -> Host {
        let made = tempfile::tempdir().and_then(|dir| {
            std::fs::write(dir.path().join("fakegpu.toml"), "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n")?;
            std::fs::write(dir.path().join("vgpu.toml"), vgpu_toml)?;
            Ok(dir)
        });
        match made {
            Ok(dir) => Host { dir },
            Err(e) => {
                eprintln!("{bench}: cannot make the simulated host: {e}");
                std::process::exit(1)
            }
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `vgpu --simulate ARGS…` on this host.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").args(args).env_remove("VGPU_SIMULATE");
        for (k, rel) in [
            ("FAKEGPU_CONFIG", "fakegpu.toml"),
            ("FAKEGPU_STATE", "fakegpu-state"),
            ("VGPU_STATE_DIR", "run"),
            ("VGPU_LIB_DIR", "lib"),
            ("VGPU_CONFIG", "vgpu.toml"),
        ] {
            cmd.env(k, self.path(rel));
        }
        cmd
    }
}
