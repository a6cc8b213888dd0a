//! What every integration test needs: the built `libfakegpu.so`, a directory of links that
//! makes it `libcuda.so.1` and `libnvidia-ml.so.1`, a private state directory and config,
//! child processes that load it the way real clients do, NVIDIA's headers and gcc.
//!
//! Tests that need a client process of their own run a probe of the example program
//! `examples/fakegpu_probe.rs`: [`Fake::probe`] starts `fakegpu_probe <probe>` with the
//! driver's environment; it prints `key=value` lines and exits non-zero if a check fails.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use fakegpu::config::Config;
use fakegpu::state::DeviceState;

/// `target/<profile>/libfakegpu.so`, found relative to this test binary
/// (`target/<profile>/deps/<test>-<hash>`): next to it in `deps/`, or one level up.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    let deps = exe.parent().expect("test binary has a directory");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let candidate = dir.join("libfakegpu.so");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "libfakegpu.so not found next to {} or in its parent; build the workspace first",
        exe.display()
    );
}

/// `target/<profile>/examples/fakegpu_probe`, which `cargo test -p fakegpu` builds, found
/// relative to this test binary (`target/<profile>/deps/<test>-<hash>`).
pub fn probe_program() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary is in target/<profile>/deps");
    let program = profile.join("examples").join("fakegpu_probe");
    assert!(
        program.is_file(),
        "the probe program {} is missing (test binary {}); build it with \
         `cargo build -p fakegpu --example fakegpu_probe`, or run `cargo test -p fakegpu` \
         without selecting test targets, which builds it",
        program.display(),
        exe.display()
    );
    program
}

/// A private installation of the fake driver.
pub struct Fake {
    pub dir: tempfile::TempDir,
    /// Holds libcuda.so.1, libcuda.so, libnvidia-ml.so.1, libnvidia-ml.so → libfakegpu.so.
    pub lib_dir: PathBuf,
    /// FAKEGPU_STATE.
    pub state_dir: PathBuf,
    /// FAKEGPU_CONFIG, when not the built-in default.
    pub config_path: Option<PathBuf>,
}

impl Fake {
    /// The built-in default device (one H100).
    pub fn new() -> Fake {
        Fake::build(None)
    }

    /// Devices from this TOML.
    pub fn with_config(toml: &str) -> Fake {
        Fake::build(Some(toml))
    }

    fn build(toml: Option<&str>) -> Fake {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temporary directory");
        // Readable by the unprivileged children of the permission tests.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod temp dir");
        let lib_dir = dir.path().join("lib");
        std::fs::create_dir(&lib_dir).expect("lib dir");
        let library = library();
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            std::os::unix::fs::symlink(&library, lib_dir.join(name)).expect("symlink");
        }
        let config_path = toml.map(|text| {
            let path = dir.path().join("fakegpu.toml");
            std::fs::write(&path, text).expect("write config");
            path
        });
        let state_dir = dir.path().join("state");
        Fake {
            dir,
            lib_dir,
            state_dir,
            config_path,
        }
    }

    /// The parsed config the driver will use.
    pub fn config(&self) -> Config {
        match &self.config_path {
            Some(path) => fakegpu::config::load_from(path).expect("valid test config"),
            None => fakegpu::config::default_config(),
        }
    }

    /// The shared state of every device, as another process sees it.
    pub fn states(&self) -> Vec<DeviceState> {
        fakegpu::state::open_all(&self.config(), &self.state_dir).expect("open state")
    }

    /// `program` with the driver's environment: the link directory first on
    /// LD_LIBRARY_PATH, FAKEGPU_STATE, FAKEGPU_CONFIG (or none), no CUDA_VISIBLE_DEVICES.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let mut path = self.lib_dir.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", path)
            .env("FAKEGPU_STATE", &self.state_dir)
            .env_remove("CUDA_VISIBLE_DEVICES");
        match &self.config_path {
            Some(p) => cmd.env("FAKEGPU_CONFIG", p),
            None => cmd.env_remove("FAKEGPU_CONFIG"),
        };
        cmd
    }

    /// The probe program running probe `name` (see `examples/fakegpu_probe.rs`), with the
    /// driver's environment.
    pub fn probe(&self, name: &str) -> Command {
        let mut cmd = self.command(probe_program());
        cmd.arg(name);
        cmd
    }
}

#[path = "../../../../tests/support/process.rs"]
mod process;
pub use process::{assert_success, run_ok};

/// The name the test harness gives test `test` of the module at `module_path` (pass
/// `module_path!()`): `cuda_api::cu_init` for `cu_init` in `fake::cuda_api`. For a test that
/// runs itself in a child process (`--exact`).
pub fn test_path(module_path: &str, test: &str) -> String {
    let (_crate, module) = module_path
        .split_once("::")
        .expect("a module of the test crate");
    format!("{module}::{test}")
}

/// `key=value` lines a child printed.
pub fn field<'a>(stdout: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= line in:\n{stdout}"))
}

/// NVIDIA's include directories (cuda.h, nvml.h), fetched by tests/fetch-headers.sh.
/// Fails the test, with the script's message, when they cannot be had.
pub fn headers() -> Vec<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fetch-headers.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "tests/fetch-headers.sh could not provide NVIDIA's headers (these tests need them; no skipping):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dirs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect();
    assert!(
        dirs.iter().any(|d| d.join("cuda.h").is_file()),
        "fetch-headers printed no cuda.h directory: {dirs:?}"
    );
    dirs
}

/// `tests/c/<name>`.
pub fn c_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

/// Compile `tests/c/<source>` with gcc against NVIDIA's real headers into `out`.
pub fn gcc(source: &str, out: &Path, extra: &[&OsStr]) {
    let mut cmd = Command::new("gcc");
    cmd.args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(out)
        .arg(c_source(source));
    for dir in headers() {
        cmd.arg("-I").arg(dir);
    }
    cmd.args(extra);
    run_ok(&mut cmd);
}

impl Fake {
    /// tests/c/client.c, linked like a real CUDA program: `-l:libcuda.so.1` from the link
    /// directory (so its DT_NEEDED is libcuda.so.1).
    pub fn build_client(&self) -> PathBuf {
        let out = self.dir.path().join("client");
        let lib_dir = format!("-L{}", self.lib_dir.display());
        gcc(
            "client.c",
            &out,
            &[OsStr::new(&lib_dir), OsStr::new("-l:libcuda.so.1")],
        );
        out
    }
}

/// A child that printed "ready" and now waits for its stdin to close.
pub struct Holder {
    pub child: std::process::Child,
    /// Kept open (and drained at the end) so that the child never writes into a closed pipe.
    stdout: std::io::BufReader<std::process::ChildStdout>,
    pub output: Vec<String>,
}

impl Holder {
    /// Spawn `cmd` with piped stdin/stdout and wait for its "ready" line.
    pub fn spawn(cmd: &mut Command) -> Holder {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut output = Vec::new();
        let mut line = String::new();
        while stdout.read_line(&mut line).expect("read child stdout") > 0 {
            let text = line.trim_end().to_string();
            line.clear();
            let ready = text.trim() == "ready";
            output.push(text);
            if ready {
                return Holder {
                    child,
                    stdout,
                    output,
                };
            }
        }
        let status = child.wait();
        panic!(
            "{cmd:?} ended ({status:?}) without printing ready; it printed:\n{}",
            output.join("\n")
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Close stdin and wait for a clean exit.
    pub fn finish(mut self) {
        use std::io::Read;
        drop(self.child.stdin.take());
        let mut rest = String::new();
        let _ = self.stdout.read_to_string(&mut rest);
        let status = self.child.wait().expect("wait for child");
        assert!(
            status.success(),
            "holder {} exited with {status}; it printed:\n{}\n{rest}",
            self.child.id(),
            self.output.join("\n")
        );
    }

    /// SIGKILL it and reap it.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }
}
