//! What `vgpu run` adds to starting a program, and how that grows with the workloads that
//! run (issue 28, item 3); and what checking a sudo caller's `--cwd` and program as them
//! costs (`identity::as_user`: a thread that switches its own credentials), once per
//! `vgpu run`. Needs root (cgroups, the switch).
//!
//!     cargo build --release --workspace && cargo bench --bench run_overhead [-- ROUNDS] [--running 0,100,1000] [--vgpu PATH] [--base PATH]
//!
//! `--vgpu PATH` measures another build of `vgpu` (e.g. a copy of an earlier commit's
//! `target/release/`, with its `libvgpu.so` and `libfakegpu.so` beside it) the same way.
//! Without it, the `vgpu` measured is the one `cargo bench` builds for this bench: with the
//! test fixtures (`test-support`) and the dependency features of the tests, and measured
//! 0.3 ms slower than the one `install.sh` builds (`cargo build --release --workspace
//! --exclude workspace-hack`). For the installed binary's figures, copy that build's three
//! files to a directory first (`cargo bench` rebuilds `target/release/vgpu`) and pass it.
//! `--base PATH` measures another build beside this one, in the same rounds (`true`, then
//! the two builds in alternating order, on the same host with the same workloads running):
//! a before/after comparison paired in one run, whatever else loads the machine. The
//! running workloads are this build's.
//!
//! In one run, for each place of the state directory — on a tmpfs (`/dev/shm`, as `/run`
//! is on real hosts) and on a disk (under cargo's target directory) — and for each number
//! N of workloads already running (`--running`, default 0,100,1000), it prints:
//!
//! - `true` and `vgpu --simulate run --mem 1G -- true`, ROUNDS (default 20) of each,
//!   interleaved; the medians and the median of the paired differences (what `vgpu run`
//!   adds);
//! - that three times: with a `vgpu watch` running (this build's, every second: its
//!   history thread holds the history database open, and it publishes the GPU list that
//!   `vgpu run` then takes rather than loading the driver; the host that runs the enforcer);
//!   with no watch but the history database (`<lib>/history.db`, always on the disk, as
//!   `/var/lib/vgpu` is) held open as a watch holds it; and with neither (then the
//!   `vgpu run` that closes the database last checkpoints it, which syncs it);
//! - `vgpu ps` (the table) and `vgpu ps --json`, medians;
//! - where `strace` is installed, the system calls and `fsync`s of one `vgpu run -- true`
//!   (`strace -f -c`, the child included);
//! - the slope: what each running workload adds to `vgpu run` and to `vgpu ps`;
//! - the floor: what the mechanism alone adds (this bench run again as a program that makes
//!   the workload's cgroups, starts `true` in them with the shim and removes them), which no
//!   `vgpu run` can go under on the same host.
//!
//! The running workloads are real: each one a `vgpu run --mem 16M -- sh -c 'echo up; exec
//! sleep …'` (its supervisor, record, vGPU directory, board slot and cgroups, as any
//! workload has), started one after the other (each once it said `up`), and ended with
//! SIGTERM to their supervisors, a batch at a time, when the bench ends or fails.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `vgpu` measured: this build's, or `--vgpu PATH`.
static VGPU: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
/// `--base PATH`: the build measured beside it.
static BASE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn vgpu_bin() -> &'static Path {
    VGPU.get().map(PathBuf::as_path).unwrap_or(Path::new(env!("CARGO_BIN_EXE_vgpu")))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(FLOOR) {
        floor_runner(&args[1..]);
    }
    // ROUNDS: the first number that is not the value of an option.
    let rounds: usize = args
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || !matches!(args[i - 1].as_str(), "--running" | "--vgpu" | "--base"))
        .find_map(|(_, a)| a.parse().ok())
        .unwrap_or(20);
    let running: Vec<usize> = match args.iter().position(|a| a == "--running") {
        Some(i) => args
            .get(i + 1)
            .map(|list| list.split(',').map(|n| n.trim().parse().unwrap_or_else(|_| fail(&format!("--running {list}: numbers, e.g. 0,100,1000")))).collect())
            .unwrap_or_else(|| fail("--running needs a list, e.g. 0,100,1000")),
        None => vec![0, 100, 1000],
    };
    if !nix::unistd::geteuid().is_root() {
        fail("needs root (vgpu run creates cgroups)");
    }
    let vgpu = match args.iter().position(|a| a == "--vgpu") {
        Some(i) => PathBuf::from(args.get(i + 1).unwrap_or_else(|| fail("--vgpu needs the path of a vgpu binary"))),
        None => PathBuf::from(env!("CARGO_BIN_EXE_vgpu")),
    };
    if !vgpu.is_file() {
        fail(&format!("{} is not a file", vgpu.display()));
    }
    VGPU.set(vgpu.clone()).unwrap_or_else(|_| fail("the vgpu binary is set twice"));
    if let Some(i) = args.iter().position(|a| a == "--base") {
        let base = PathBuf::from(args.get(i + 1).unwrap_or_else(|| fail("--base needs the path of a vgpu binary")));
        if !base.is_file() {
            fail(&format!("{} is not a file", base.display()));
        }
        BASE.set(base).unwrap_or_else(|_| fail("the base binary is set twice"));
    }
    let strace = which("strace");
    println!("vgpu run overhead: {rounds} rounds (interleaved) per figure, medians; state directory on a tmpfs and on a disk; N workloads running");
    println!("{vgpu}", vgpu = vgpu.display());
    if let Some(base) = BASE.get() {
        println!("base (measured in the same rounds): {}", base.display());
    }
    if strace.is_none() {
        println!("(strace is not installed: no system call counts)");
    }

    let tmpfs = Path::new("/dev/shm");
    let disk = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let mut results: Vec<Figures> = Vec::new();
    for (label, state_parent) in [("tmpfs", tmpfs.to_path_buf()), ("disk", disk.clone())] {
        let on_tmpfs = is_tmpfs(&state_parent);
        if (label == "tmpfs") != on_tmpfs {
            println!("skipping the {label} state directory: {} is {}a tmpfs", state_parent.display(), if on_tmpfs { "" } else { "not " });
            continue;
        }
        let host = Host::new(&state_parent, &disk);
        // The store's directories (the library directory with them), as root's first listing makes them.
        host.time_vgpu(&["ps"]);
        let mut workloads = Running::new(&host);
        for &n in &running {
            workloads.grow_to(n);
            for mode in [Mode::Watch, Mode::Held, Mode::NotHeld] {
                let held = mode != Mode::NotHeld;
                let watch = (mode == Mode::Watch).then(|| host.watch());
                let holder = (mode == Mode::Held).then(|| hold_history(&host.lib));
                let run_args = ["run", "--mem", "1G", "--", "true"];
                let (bare, [(run, added), base]) = paired(
                    rounds,
                    || host.time("true", &[]),
                    [&mut || host.time_vgpu(&run_args), &mut || BASE.get().map(|b| host.time_vgpu_with(b, &run_args)).unwrap_or_default()],
                );
                let counts = strace.as_deref().map(|s| host.strace_counts(s, &run_args));
                drop(holder);
                let (ps, ps_json) = if held {
                    let ps_rounds = rounds.clamp(5, 10);
                    let ps = |args: &[&str]| {
                        let (_, [(this, _), (base, _)]) = paired(
                            ps_rounds,
                            || Duration::ZERO,
                            [&mut || host.time_vgpu(args), &mut || BASE.get().map(|b| host.time_vgpu_with(b, args)).unwrap_or_default()],
                        );
                        (this, base)
                    };
                    (Some(ps(&["ps"])), Some(ps(&["ps", "--json"])))
                } else {
                    (None, None)
                };
                let base = BASE.get().map(|_| Base { run: base.0, added: base.1, ps: ps.map(|p| p.1), ps_json: ps_json.map(|p| p.1) });
                let (ps, ps_json) = (ps.map(|p| p.0), ps_json.map(|p| p.0));
                drop(watch);
                let f = Figures { state: label, mode, n, bare, run, added, ps, ps_json, counts, base };
                f.print(results.is_empty());
                results.push(f);
            }
        }
        drop(workloads);
    }
    slopes(&results);
    floor_figures(rounds);
    as_user_figures();
}

/// The argument that makes this bench the floor's runner ([`floor_runner`]).
const FLOOR: &str = "--floor-runner";

/// What the mechanism of `vgpu run` alone adds, in a Rust program as `vgpu` is (this bench,
/// run again as [`floor_runner`]): the lower bound of `vgpu run`'s fixed cost on this host,
/// for the figures above to be read against.
fn floor_figures(rounds: usize) {
    let shim = vgpu_bin().with_file_name("libvgpu.so");
    let me = std::env::current_exe().unwrap_or_else(|e| fail(&format!("this bench's path: {e}")));
    let (bare, [(floor, added)]) = paired(rounds, || timed(Command::new("true")), [&mut || {
        let mut cmd = Command::new(&me);
        cmd.arg(FLOOR).arg(&shim).arg("true");
        timed(cmd)
    }]);
    println!(
        "\nthe mechanism alone (a program that makes the cgroups, forks a child that joins them and runs `true` with the shim, waits, removes them): {:.2} ms, {:.2} ms added to `true` ({:.2} ms)",
        ms(floor),
        ms(added),
        ms(bare)
    );
}

/// `FLOOR SHIM PROGRAM…`: a cgroup in each hierarchy `vgpu run` uses, the program run in
/// them with `SHIM` preloaded (forked, joining them before it executes, as `vgpu run`'s
/// child does), waited for; the cgroups removed. Exits with the program's status.
fn floor_runner(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt as _;
    use vgpu_cgroups::layout::{Controller, Layout};
    let (Some(shim), Some(program)) = (args.first(), args.get(1)) else { fail("--floor-runner SHIM PROGRAM [ARGS…]") };
    let layout = Layout::detect().unwrap_or_else(|| fail("no cgroup filesystem"));
    let mut dirs: Vec<PathBuf> = Vec::new();
    for mount in Controller::USED.iter().filter(|&&c| layout.has(c)).filter_map(|&c| layout.mount_of(c)) {
        let dir = mount.join("vgpu").join(format!("floor-{}", std::process::id()));
        if !dirs.contains(&dir) {
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display())));
            dirs.push(dir);
        }
    }
    let procs: Vec<std::fs::File> = dirs
        .iter()
        .map(|d| std::fs::OpenOptions::new().write(true).open(d.join("cgroup.procs")).unwrap_or_else(|e| fail(&format!("{}: {e}", d.display()))))
        .collect();
    let fds: Vec<i32> = procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let mut cmd = Command::new(program);
    cmd.args(&args[2..]).env("LD_PRELOAD", shim);
    // SAFETY: between fork and exec the child only writes to descriptors opened before.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let status = cmd.status().unwrap_or_else(|e| fail(&format!("{program}: {e}")));
    drop(procs);
    for dir in &dirs {
        let _ = std::fs::remove_dir(dir);
    }
    std::process::exit(status.code().unwrap_or(1))
}

/// One line of the table.
struct Figures {
    state: &'static str,
    mode: Mode,
    n: usize,
    bare: Duration,
    run: Duration,
    added: Duration,
    ps: Option<Duration>,
    ps_json: Option<Duration>,
    /// System calls and fsyncs of one `vgpu run -- true`.
    counts: Option<(u64, u64)>,
    /// The `--base` build's figures, measured in the same rounds.
    base: Option<Base>,
}

/// What else runs on the host while `vgpu run` is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A `vgpu watch` (this build's, every second): it holds the history open and
    /// publishes the GPU list that `vgpu run` takes rather than loading the driver.
    Watch,
    /// No watch, the history database held open as a watch's history thread holds it.
    Held,
    /// Neither: the last `vgpu run` to close the history checkpoints it.
    NotHeld,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Watch => "watch",
            Mode::Held => "held",
            Mode::NotHeld => "not held",
        }
    }
}

/// The `--base` build's figures of one line.
struct Base {
    run: Duration,
    added: Duration,
    ps: Option<Duration>,
    ps_json: Option<Duration>,
}

impl Figures {
    fn print(&self, header: bool) {
        if header {
            println!();
            print!("{:<6} {:<11} {:>5} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9} {:>7}", "state", "history", "N", "true ms", "run ms", "added ms", "ps ms", "ps json ms", "syscalls", "fsyncs");
            if self.base.is_some() {
                print!(" | {:>9} {:>9} {:>9} {:>11}", "base run", "b. added", "base ps", "b. ps json");
            }
            println!();
        }
        let opt = |d: Option<Duration>| d.map(|d| format!("{:.2}", ms(d))).unwrap_or_else(|| "-".into());
        let (calls, fsyncs) = self.counts.map(|(c, f)| (c.to_string(), f.to_string())).unwrap_or(("-".into(), "-".into()));
        print!(
            "{:<6} {:<11} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9} {:>11} {:>9} {:>7}",
            self.state,
            self.mode.name(),
            self.n,
            ms(self.bare),
            ms(self.run),
            ms(self.added),
            opt(self.ps),
            opt(self.ps_json),
            calls,
            fsyncs
        );
        if let Some(b) = &self.base {
            print!(" | {:>9.2} {:>9.2} {:>9} {:>11}", ms(b.run), ms(b.added), opt(b.ps), opt(b.ps_json));
        }
        println!();
    }
}

/// Per running workload: what `vgpu run` adds and what `vgpu ps` takes, between the smallest
/// and the largest N measured.
fn slopes(results: &[Figures]) {
    println!();
    for state in ["tmpfs", "disk"] {
        for mode in [Mode::Watch, Mode::Held, Mode::NotHeld] {
            let rows: Vec<&Figures> = results.iter().filter(|f| f.state == state && f.mode == mode).collect();
            let (Some(lo), Some(hi)) = (rows.iter().min_by_key(|f| f.n), rows.iter().max_by_key(|f| f.n)) else { continue };
            if hi.n == lo.n {
                continue;
            }
            let per = |a: Duration, b: Duration| (ms(b) - ms(a)) / (hi.n - lo.n) as f64;
            let ps = match (lo.ps, hi.ps) {
                (Some(a), Some(b)) => format!(", vgpu ps {:+.4} ms", per(a, b)),
                _ => String::new(),
            };
            let base = match (&lo.base, &hi.base) {
                (Some(a), Some(b)) => format!(
                    "; base: vgpu run {:+.4} ms{}",
                    per(a.added, b.added),
                    match (a.ps, b.ps) {
                        (Some(x), Some(y)) => format!(", vgpu ps {:+.4} ms", per(x, y)),
                        _ => String::new(),
                    }
                ),
                _ => String::new(),
            };
            println!(
                "slope, state on {state}, {}: vgpu run {:+.4} ms per running workload (N {} -> {}){ps}{base}",
                mode.name(),
                per(lo.added, hi.added),
                lo.n,
                hi.n
            );
        }
    }
}

/// `rounds` of `a` and each of `bs` interleaved (`a` first, then the `bs` in turn forwards
/// and backwards, so that neither gains from going first): the median of `a`, and for each
/// of `bs` its median and the median of its difference from `a` in the same round.
fn paired<const N: usize>(rounds: usize, mut a: impl FnMut() -> Duration, bs: [&mut dyn FnMut() -> Duration; N]) -> (Duration, [(Duration, Duration); N]) {
    let mut bs = bs;
    // Warm up (page cache, the simulated driver's link directory, the history file).
    a();
    bs.iter_mut().for_each(|b| {
        b();
    });
    let mut xs = Vec::new();
    let mut ys: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::new());
    let mut diffs: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::new());
    for round in 0..rounds {
        let x = a();
        xs.push(x);
        for k in 0..N {
            let i = if round % 2 == 0 { k } else { N - 1 - k };
            let y = bs[i]();
            ys[i].push(y);
            diffs[i].push(y.saturating_sub(x));
        }
    }
    let mut out = [(Duration::ZERO, Duration::ZERO); N];
    for i in 0..N {
        out[i] = (median(std::mem::take(&mut ys[i])), median(std::mem::take(&mut diffs[i])));
    }
    (median(xs), out)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fail(message: &str) -> ! {
    eprintln!("run_overhead: {message}");
    std::process::exit(1)
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

fn is_tmpfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// A `vgpu watch` of the bench's ([`Host::watch`]).
struct Watching(Child);

impl Drop for Watching {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid, not yet waited for.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// The history database held open as `vgpu watch`'s history thread holds it (its writer
/// keeps one `History` open); made if it does not exist yet.
fn hold_history(lib: &Path) -> vgpu_history::store::History {
    vgpu_history::store::History::open(lib).unwrap_or_else(|e| fail(&format!("cannot open the history in {}: {e}", lib.display())))
}

/// A simulated host: one H100; the state directory below `state_parent`, the library
/// directory, vgpu's (empty) config and the simulated driver's files below `disk`.
struct Host {
    _base: tempfile::TempDir,
    _state: tempfile::TempDir,
    state: PathBuf,
    lib: PathBuf,
    env: Vec<(&'static str, PathBuf)>,
}

impl Host {
    fn new(state_parent: &Path, disk: &Path) -> Host {
        let made = (|| -> std::io::Result<(tempfile::TempDir, tempfile::TempDir)> {
            let base = tempfile::Builder::new().prefix("run-overhead-").tempdir_in(disk)?;
            let state = tempfile::Builder::new().prefix("run-overhead-").tempdir_in(state_parent)?;
            std::fs::write(base.path().join("fakegpu.toml"), "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n")?;
            // The watch of the "watch" mode serves no metrics: the port may be taken.
            std::fs::write(base.path().join("vgpu.toml"), "[watch]\nlisten = \"\"\n")?;
            Ok((base, state))
        })();
        let (base, state) = made.unwrap_or_else(|e| fail(&format!("cannot make the simulated host: {e}")));
        let state_dir = state.path().join("run");
        let lib = base.path().join("lib");
        let env = vec![
            ("FAKEGPU_CONFIG", base.path().join("fakegpu.toml")),
            // The simulated driver keeps its shared state in files; a real one has none.
            ("FAKEGPU_STATE", state.path().join("fakegpu")),
            ("VGPU_STATE_DIR", state_dir.clone()),
            ("VGPU_LIB_DIR", lib.clone()),
            ("VGPU_CONFIG", base.path().join("vgpu.toml")),
        ];
        Host { _base: base, _state: state, state: state_dir, lib, env }
    }

    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.args(args).env_remove("VGPU_SIMULATE").env_remove("VGPU_LOG");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// `vgpu watch` (this build's) in the background, once its first round published the
    /// GPU list; stopped (SIGTERM) when dropped.
    fn watch(&self) -> Watching {
        let mut cmd = self.vgpu(&["watch"]);
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap_or_else(|e| fail(&format!("cannot start vgpu watch: {e}")));
        let watching = Watching(child);
        let published = self.state.join("gpus.json");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !published.exists() {
            if Instant::now() > deadline {
                fail("vgpu watch published no GPU list within 30 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        watching
    }

    fn vgpu(&self, args: &[&str]) -> Command {
        let mut cmd = self.command(vgpu_bin(), &["--simulate"]);
        cmd.args(args);
        cmd
    }

    fn time(&self, program: &str, args: &[&str]) -> Duration {
        timed(self.command(Path::new(program), args))
    }

    fn time_vgpu(&self, args: &[&str]) -> Duration {
        timed(self.vgpu(args))
    }

    /// [`Host::time_vgpu`] of another build.
    fn time_vgpu_with(&self, vgpu: &Path, args: &[&str]) -> Duration {
        let mut cmd = self.command(vgpu, &["--simulate"]);
        cmd.args(args);
        timed(cmd)
    }

    /// (system calls, fsyncs) of one `vgpu ARGS`, its children included.
    fn strace_counts(&self, strace: &Path, args: &[&str]) -> (u64, u64) {
        let out = tempfile::NamedTempFile::new().unwrap_or_else(|e| fail(&format!("temp file: {e}")));
        let mut cmd = self.command(strace, &["-f", "-c", "-o"]);
        cmd.arg(out.path()).arg(vgpu_bin()).arg("--simulate").args(args);
        timed(cmd);
        let text = std::fs::read_to_string(out.path()).unwrap_or_default();
        let calls = |line: &str| line.split_whitespace().nth(3).and_then(|c| c.parse::<u64>().ok());
        let total = text.lines().find(|l| l.trim_end().ends_with(" total")).and_then(|l| {
            // "100.00 0.019497 15 1290 154 total": calls is the 4th column.
            calls(l)
        });
        let fsyncs = text.lines().filter(|l| l.trim_end().ends_with(" fsync") || l.trim_end().ends_with(" fdatasync")).filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            // With an errors column the calls are still the 4th.
            cols.get(3).and_then(|c| c.parse::<u64>().ok())
        });
        (total.unwrap_or(0), fsyncs.sum())
    }
}

fn timed(mut cmd: Command) -> Duration {
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    let start = Instant::now();
    let status = cmd.status().unwrap_or_else(|e| fail(&format!("{cmd:?}: {e}")));
    let elapsed = start.elapsed();
    if !status.success() {
        fail(&format!("{cmd:?} failed: {status}"));
    }
    elapsed
}

/// The workloads kept running on a host: their `vgpu run` supervisors. Dropped (the bench
/// ending or failing), each is sent SIGTERM, which it relays to its workload before it
/// tears it down; a batch at a time, waiting for each batch, so that they do not all wait
/// for the store lock at once.
struct Running<'h> {
    host: &'h Host,
    supervisors: Vec<Child>,
}

impl<'h> Running<'h> {
    fn new(host: &'h Host) -> Running<'h> {
        Running { host, supervisors: Vec::new() }
    }

    /// Start workloads until `n` run, each once it says `up`; then wait until every record
    /// says running (its pid recorded).
    fn grow_to(&mut self, n: usize) {
        if self.supervisors.len() >= n {
            return;
        }
        let started = Instant::now();
        while self.supervisors.len() < n {
            // Quiet: the SIGTERM that ends each one is otherwise said by each (1000 lines).
            let mut cmd = self.host.vgpu(&["-q", "run", "--mem", "16M", "--", "sh", "-c", "echo up; exec sleep 1000000"]);
            cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
            let mut child = cmd.spawn().unwrap_or_else(|e| fail(&format!("cannot start vgpu run: {e}")));
            let mut line = String::new();
            let said = child.stdout.take().map(|out| std::io::BufReader::new(out).read_line(&mut line));
            self.supervisors.push(child);
            if !matches!(said, Some(Ok(_))) || line.trim() != "up" {
                fail(&format!("workload {} did not start (it said {line:?})", self.supervisors.len()));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.recorded_running() < n {
            if Instant::now() > deadline {
                fail(&format!("{n} workloads started, but not all are recorded running"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("run_overhead: {n} workloads running (started in {:.1} s)", started.elapsed().as_secs_f64());
    }

    fn recorded_running(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.host.state.join("workloads")) else { return 0 };
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("\"state\": \"running\"")))
            .count()
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut left = std::mem::take(&mut self.supervisors);
        while !left.is_empty() {
            let batch: Vec<Child> = left.drain(..left.len().min(32)).collect();
            for child in &batch {
                // SAFETY: kill(2) with a pid and a signal number, no memory involved.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
            for mut child in batch {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) | Err(_) => break,
                        Ok(None) if Instant::now() > deadline => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break;
                        }
                        Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
        }
        // Whatever a supervisor killed above left behind: reconciled (its cgroup's
        // processes killed) by one listing as root.
        let _ = self.host.vgpu(&["ps"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

/// The switch alone, and with the checks `vgpu run` makes in it (--cwd and the program).
fn as_user_figures() {
    let nobody = nix::unistd::User::from_name("nobody").expect("passwd").expect("user nobody");
    let user = vgpu_store::identity::sudo_caller(Some(&nobody.uid.as_raw().to_string())).expect("nobody").expect("a caller");
    let each = |f: &dyn Fn()| -> Duration {
        median(
            (0..1000)
                .map(|_| {
                    let start = Instant::now();
                    f();
                    start.elapsed()
                })
                .collect(),
        )
    };
    let switch = each(&|| vgpu_store::identity::as_user(&user, || ()).expect("as_user"));
    // What launch::resolve::check does in it: stat and access(X_OK) of the directory, the
    // program looked up on PATH.
    let checks = each(&|| {
        let found = vgpu_store::identity::as_user(&user, || {
            let dir = std::path::Path::new("/tmp");
            std::fs::metadata(dir).is_ok_and(|m| m.is_dir())
                && nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK).is_ok()
                && std::env::split_paths("/usr/local/bin:/usr/bin:/bin").any(|d| d.join("true").is_file())
        });
        assert!(found.expect("as_user"));
    });
    println!();
    println!("as_user (1000 calls, median)           {:>9.3} µs", switch.as_secs_f64() * 1e6);
    println!("--cwd + program checked as the user    {:>9.3} µs", checks.as_secs_f64() * 1e6);
}
