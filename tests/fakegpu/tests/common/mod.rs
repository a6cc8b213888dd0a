//! What every integration test needs: the built `libfakegpu.so`, a directory of links that
//! makes it `libcuda.so.1` and `libnvidia-ml.so.1`, a private state directory and config,
//! child processes that load it the way real clients do, NVIDIA's headers and gcc.
//!
//! Tests that must load the driver into a process of their own re-run their own test
//! binary: [`Fake::rerun`] starts `<this test binary> <test name> --exact` with the driver's
//! environment and `FAKEGPU_TEST_CHILD=1`; the test sees [`in_child`] and plays the client.

#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, OsStr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fakegpu::config::Config;
use fakegpu::state::DeviceState;

/// Set in a child started by [`Fake::rerun`].
pub const CHILD_ENV: &str = "FAKEGPU_TEST_CHILD";

/// Whether this process is a child started by [`Fake::rerun`].
pub fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

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

    /// This test binary, running only test `test` (which sees [`in_child`]; tests that exist
    /// only as children are `#[ignore]`d in normal runs).
    pub fn rerun(&self, test: &str) -> Command {
        let exe = std::env::current_exe().expect("path of the test binary");
        let mut cmd = self.command(exe);
        cmd.args([
            test,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
            "-q",
        ])
        .env(CHILD_ENV, "1");
        cmd
    }
}

/// Run `cmd` to completion and insist that it succeeded; returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert_success(cmd, &out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn assert_success(cmd: &Command, out: &Output) {
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fetch-headers.sh");
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

// ----- a small client of the CUDA driver API over dlopen, for child processes -----

/// `CUresult` as the raw integer the C API returns.
pub type Cu = u32;

/// libcuda.so.1 loaded the way a runtime loads it: `dlopen` by soname.
pub struct Cuda {
    pub lib: libloading::Library,
}

impl Cuda {
    /// `dlopen("libcuda.so.1")`, found through LD_LIBRARY_PATH.
    pub fn load() -> Cuda {
        // SAFETY: loading the fake driver runs no initializers beyond Rust's own.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.expect("dlopen libcuda.so.1");
        Cuda { lib }
    }

    /// The function `name`, typed as the test says.
    pub fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller names the C signature of `name` as cuda.h declares it.
        unsafe {
            *self
                .lib
                .get::<T>(name.as_bytes())
                .unwrap_or_else(|e| panic!("dlsym {name}: {e}"))
        }
    }

    pub fn init(&self) -> Cu {
        let f: unsafe extern "C" fn(c_uint) -> Cu = self.sym("cuInit");
        // SAFETY: cuInit(0).
        unsafe { f(0) }
    }

    pub fn device_count(&self) -> Result<c_int, Cu> {
        let f: unsafe extern "C" fn(*mut c_int) -> Cu = self.sym("cuDeviceGetCount");
        let mut n = 0;
        // SAFETY: valid out-pointer.
        wrap(unsafe { f(&mut n) }, n)
    }

    pub fn device_name(&self, dev: c_int) -> String {
        let f: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Cu = self.sym("cuDeviceGetName");
        let mut buf = [0 as c_char; 128];
        // SAFETY: 128 writable bytes.
        assert_eq!(unsafe { f(buf.as_mut_ptr(), 128, dev) }, 0);
        // SAFETY: the fake NUL-terminates within the buffer.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn device_uuid(&self, dev: c_int) -> [u8; 16] {
        let f: unsafe extern "C" fn(*mut [u8; 16], c_int) -> Cu = self.sym("cuDeviceGetUuid_v2");
        let mut uuid = [0u8; 16];
        // SAFETY: a 16-byte CUuuid.
        assert_eq!(unsafe { f(&mut uuid, dev) }, 0);
        uuid
    }

    /// cuCtxCreate_v2 on `dev`; the context becomes current.
    pub fn ctx_create(&self, dev: c_int) -> Result<*mut c_void, Cu> {
        let f: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> Cu =
            self.sym("cuCtxCreate_v2");
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        wrap(unsafe { f(&mut ctx, 0, dev) }, ctx)
    }

    pub fn ctx_destroy(&self, ctx: *mut c_void) -> Cu {
        let f: unsafe extern "C" fn(*mut c_void) -> Cu = self.sym("cuCtxDestroy_v2");
        // SAFETY: a handle from ctx_create.
        unsafe { f(ctx) }
    }

    pub fn alloc(&self, bytes: usize) -> Result<u64, Cu> {
        let f: unsafe extern "C" fn(*mut u64, usize) -> Cu = self.sym("cuMemAlloc_v2");
        let mut ptr = 0;
        // SAFETY: valid out-pointer.
        wrap(unsafe { f(&mut ptr, bytes) }, ptr)
    }

    pub fn free(&self, ptr: u64) -> Cu {
        let f: unsafe extern "C" fn(u64) -> Cu = self.sym("cuMemFree_v2");
        // SAFETY: plain value argument.
        unsafe { f(ptr) }
    }

    /// (free, total).
    pub fn mem_info(&self) -> Result<(usize, usize), Cu> {
        let f: unsafe extern "C" fn(*mut usize, *mut usize) -> Cu = self.sym("cuMemGetInfo_v2");
        let (mut free, mut total) = (0, 0);
        // SAFETY: valid out-pointers.
        wrap(unsafe { f(&mut free, &mut total) }, (free, total))
    }

    /// Load any image and get a function handle.
    pub fn function(&self) -> *mut c_void {
        let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> Cu =
            self.sym("cuModuleLoadData");
        let get: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> Cu =
            self.sym("cuModuleGetFunction");
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        let image = b"fake cubin\0";
        // SAFETY: valid out-pointers, a non-NULL image and a C string name.
        unsafe {
            assert_eq!(load(&mut module, image.as_ptr().cast()), 0);
            assert_eq!(get(&mut function, module, c"kernel".as_ptr()), 0);
        }
        function
    }

    /// cuLaunchKernel with `blocks` blocks of 256 threads on the NULL stream.
    pub fn launch(&self, function: *mut c_void, blocks: c_uint) -> Cu {
        type Launch = unsafe extern "C" fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> Cu;
        let f: Launch = self.sym("cuLaunchKernel");
        // SAFETY: a function handle from `function`; params/extra may be NULL for the fake.
        unsafe {
            f(
                function,
                blocks,
                1,
                1,
                256,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    }

    pub fn synchronize(&self) -> Cu {
        let f: unsafe extern "C" fn() -> Cu = self.sym("cuCtxSynchronize");
        // SAFETY: no arguments.
        unsafe { f() }
    }
}

fn wrap<T>(code: Cu, value: T) -> Result<T, Cu> {
    if code == 0 {
        Ok(value)
    } else {
        Err(code)
    }
}

/// Block until the parent closes our stdin (keeps a child's allocations alive meanwhile).
pub fn wait_for_stdin_eof() {
    use std::io::Read;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
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
