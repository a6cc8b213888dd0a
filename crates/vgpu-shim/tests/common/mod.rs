//! The shim's test bench: the simulated driver installed as `libcuda.so.1` /
//! `libnvidia-ml.so.1` in a private directory, a vGPU directory made through
//! `vgpu_abi::usage` exactly as `vgpu run` makes it, the built `libvgpu.so` preloaded, and C
//! programs from `tests/c/` compiled against NVIDIA's real headers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use vgpu_abi::layout::{PROCS_DIR, USAGE_FILE};
use vgpu_abi::usage::{DeviceQuota, UsageFile};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// UUIDs of the simulated devices (fixed in the config, so the vGPU can name them).
pub const UUIDS: [&str; 2] = [
    "GPU-5e1f0c3a-7b2d-4e8f-9a61-0c2b3d4e5f60",
    "GPU-6f2a1d4b-8c3e-4f90-ab72-1d3c4e5f6071",
];

/// `target/<profile>/NAME`, next to this test binary (`target/<profile>/deps/…`) or one up.
pub fn artifact(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary directory");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{name} not found near {}: build the workspace (cargo build --workspace) first",
        exe.display()
    );
}

/// The shim, freshly built. `cargo test` does not build a cdylib-only package's library
/// for its integration tests, so the first call runs `cargo build --workspace` (the shim,
/// the driver) in the same profile; cargo no longer holds the target lock while tests run.
pub fn shim_library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps/<test>");
            let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") | None => "dev".to_string(),
                Some(other) => other.to_string(),
            };
            // The whole workspace (see `cargo_build_workspace`): a build of `-p vgpu-shim -p
            // fakegpu` alone recompiled both libraries after the README's build.
            run_ok(&mut process::cargo_build_workspace(&repo_root().join("Cargo.toml"), &profile));
            artifact("libvgpu.so")
        })
        .clone()
}

/// The directories holding cuda.h and nvml.h (tests/fetch-headers.sh; downloads once).
pub fn header_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let script = repo_root().join("tests/fetch-headers.sh");
        let out = Command::new(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(PathBuf::from)
            .collect()
    })
}

pub fn repo_root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .to_path_buf()
}

/// One installation of the simulated driver plus one vGPU on it.
pub struct Bench {
    pub dir: tempfile::TempDir,
    pub lib_dir: PathBuf,
    pub state_dir: PathBuf,
    pub config_path: PathBuf,
    /// `VGPU_DIR`.
    pub vgpu_dir: PathBuf,
    pub bin_dir: PathBuf,
}

impl Bench {
    /// Simulated devices of `device_memory` bytes each (one per quota), no context overhead,
    /// and one vGPU with these quotas.
    pub fn new(device_memory: u64, quotas: &[u64]) -> Bench {
        Bench::new_in(&std::env::temp_dir(), device_memory, quotas)
    }

    /// [`Bench::new`] in a temporary directory below `parent` (the benchmark puts it on a
    /// tmpfs, as `/run/vgpu` is on a real host).
    pub fn new_in(parent: &Path, device_memory: u64, quotas: &[u64]) -> Bench {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir_in(parent).expect("temporary directory");
        let lib_dir = dir.path().join("lib");
        std::fs::create_dir(&lib_dir).unwrap();
        shim_library(); // builds the driver too
        let fake = artifact("libfakegpu.so");
        for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"] {
            std::os::unix::fs::symlink(&fake, lib_dir.join(name)).unwrap();
        }
        let mut toml = String::new();
        for uuid in UUIDS.iter().take(quotas.len()) {
            toml += &format!(
                "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = {device_memory}\nuuid = \"{uuid}\"\ncontext_overhead = 0\n\n"
            );
        }
        let config_path = dir.path().join("fakegpu.toml");
        std::fs::write(&config_path, toml).unwrap();
        let state_dir = dir.path().join("fakegpu-state");
        let vgpu_dir = dir.path().join("vgpu");
        std::fs::create_dir_all(vgpu_dir.join(PROCS_DIR)).unwrap();
        std::fs::set_permissions(vgpu_dir.join(PROCS_DIR), std::fs::Permissions::from_mode(0o777)).unwrap();
        let devices: Vec<DeviceQuota> = quotas
            .iter()
            .zip(UUIDS)
            .map(|(&q, uuid)| DeviceQuota {
                uuid: uuid.to_string(),
                quota_bytes: q,
                compute_pct: 100,
                policy: Default::default(),
                priority: 0,
                turn_max_us: 0,
            })
            .collect();
        UsageFile::create(&vgpu_dir.join(USAGE_FILE), &devices).expect("create usage file");
        let bin_dir = dir.path().join("bin");
        std::fs::create_dir(&bin_dir).unwrap();
        Bench {
            dir,
            lib_dir,
            state_dir,
            config_path,
            vgpu_dir,
            bin_dir,
        }
    }

    pub fn usage(&self) -> UsageFile {
        UsageFile::open(&self.vgpu_dir.join(USAGE_FILE)).expect("open usage file")
    }

    /// The simulated driver's shared state of every device (used and peak bytes).
    pub fn driver_states(&self) -> Vec<fakegpu::state::DeviceState> {
        let config = fakegpu::config::load_from(&self.config_path).expect("test config");
        fakegpu::state::open_all(&config, &self.state_dir).expect("driver state")
    }

    /// `program` with the simulated driver and without the shim.
    pub fn bare(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("LD_LIBRARY_PATH", &self.lib_dir)
            .env("FAKEGPU_STATE", &self.state_dir)
            .env("FAKEGPU_CONFIG", &self.config_path)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("LD_PRELOAD")
            .env_remove("VGPU_DIR");
        cmd
    }

    /// `program` inside the vGPU: the shim preloaded and `VGPU_DIR` set.
    pub fn shimmed(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = self.bare(program);
        cmd.env("LD_PRELOAD", shim_library()).env("VGPU_DIR", &self.vgpu_dir);
        cmd
    }

    /// Compile `tests/c/NAME.c` (plus extra gcc arguments) into this bench's bin dir.
    pub fn compile(&self, name: &str, extra: &[&str]) -> PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/c")
            .join(format!("{name}.c"));
        self.compile_source(&src, extra)
    }

    /// Compile a C file against the real headers, linked with the driver's libraries.
    pub fn compile_source(&self, src: &Path, extra: &[&str]) -> PathBuf {
        let out = self.bin_dir.join(src.file_stem().expect("a file name"));
        let mut cmd = Command::new("gcc");
        cmd.args(["-O2", "-g", "-Wall", "-Werror", "-o"]).arg(&out).arg(src);
        for dir in header_dirs() {
            cmd.arg("-I").arg(dir);
        }
        cmd.arg("-L").arg(&self.lib_dir).args(extra).args([
            "-l:libcuda.so.1",
            "-l:libnvidia-ml.so.1",
            "-ldl",
            "-lpthread",
        ]);
        run_ok(&mut cmd);
        out
    }
}

#[path = "../../../../tests/support/process.rs"]
mod process;
#[allow(unused_imports)] // not every test binary uses both
pub use process::{assert_success, run_ok};

/// The value of `key=VALUE` in `text` (space- or line-separated).
pub fn field<'a>(text: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= in output:\n{text}"))
}

pub fn field_u64(text: &str, key: &str) -> u64 {
    field(text, key).parse().unwrap_or_else(|e| panic!("{key}: {e}"))
}
