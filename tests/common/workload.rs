//! `tests/fakegpu/examples/gpu_workload.rs`, built once per test binary in the test's own
//! profile (with the workspace: the shim and the driver, which `cargo test` does not build
//! for this package's tests).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::artefact_dir;

/// The workload program's path.
pub fn workload_bin() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = artefact_dir();
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(other) => other.to_string(),
        };
        // The whole workspace (see `cargo_build_workspace`): a build of `-p fakegpu -p
        // vgpu-shim` alone recompiled the driver and the shim (15 s of each CI run) and
        // overwrote the libraries every other test loads.
        let mut cmd = super::process::cargo_build_workspace(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"), &profile);
        cmd.args(["--example", "gpu_workload"]);
        super::process::run_ok(&mut cmd);
        let bin = dir.join("examples/gpu_workload");
        assert!(bin.is_file(), "{} missing after building it", bin.display());
        bin
    })
}

/// Start `gpu_workload idle 300 --alloc-mib MIB` in no vGPU: the simulated driver straight
/// through vgpu's link directory (`run/simulate`, which `vgpu devices` makes), no shim.
/// Returns once it holds its memory (its `--ready` file, named after `tag`). The caller
/// kills it.
pub fn unmanaged(sim: &crate::common::Sim, tag: &str, alloc_mib: u32) -> std::process::Child {
    let ready = sim.path(&format!("{tag}.ready"));
    let child = Command::new(workload_bin())
        .args(["idle", "300", "--alloc-mib", &alloc_mib.to_string(), "--ready"])
        .arg(&ready)
        .envs(sim.env())
        .env("LD_LIBRARY_PATH", sim.path("run/simulate"))
        .env_remove("LD_PRELOAD")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start a CUDA process in no vGPU");
    crate::common::wait_for(&format!("{tag} to allocate"), || ready.exists());
    child
}
