//! `vgpu doctor`: is this host ready for `vgpu run`? One line per check, with what to do
//! about each failure.

use std::path::Path;
use std::process::Command;

use anyhow::Result;
use serde::Serialize;

use clap::Args;

use vgpu_cgroups::Controller;

use vgpu_cgroups::Layout;
use vgpu_host::context::Context;
use vgpu_gpu::Nvml;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON instead of lines
    #[arg(long)]
    pub json: bool,
    /// Instead of checking, remove damaged workload records (once no process is left in their cgroup) and set a damaged pool.json aside (once no workload holds pool blocks); says what it removed and what it left, and why (root)
    #[arg(long)]
    pub repair: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Missing, and `vgpu run` needs it.
    Fail,
    /// Missing or off, but optional.
    Warn,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do about it (failures and warnings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn fail(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn warn(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    ok: bool,
    checks: Vec<Check>,
}

pub fn run(ctx: &Context, args: &DoctorArgs) -> Result<()> {
    if args.repair {
        return repair(ctx, args.json);
    }
    let checks = all_checks(ctx);
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    if args.json {
        crate::output::print_json(&Report { ok, checks })?;
    } else {
        for check in &checks {
            let mark = match check.status {
                Status::Ok => "✓",
                Status::Fail => "✗",
                Status::Warn => "!",
            };
            match &check.fix {
                Some(fix) => println!("{mark} {}: {} — {fix}", check.name, check.detail),
                None => println!("{mark} {}: {}", check.name, check.detail),
            }
        }
    }
    if ok {
        Ok(())
    } else {
        anyhow::bail!("some checks failed: `vgpu run` will not work until they are fixed")
    }
}

/// `vgpu doctor --repair`: exit 1 when something damaged was left.
fn repair(ctx: &Context, json: bool) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu doctor --repair must run as root: it removes cgroups and state files");
    }
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    vgpu_host::lifecycle::reconcile_store(&store, &lock);
    let report = vgpu_host::repair::repair(&store, &lock);
    drop(lock);
    if json {
        crate::output::print_json(&report)?;
    } else {
        for r in &report.removed {
            let also = if r.also.is_empty() { String::new() } else { format!(" with {}", r.also.join(", ")) };
            println!("removed {} ({}){also}", r.path.display(), r.problem);
        }
        for l in &report.left {
            println!("left {} ({}): {}", l.path.display(), l.problem, l.reason);
        }
        if report.removed.is_empty() && report.left.is_empty() {
            println!("no damaged state files");
        }
    }
    if report.left.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{} damaged state file(s) left; see above why", report.left.len())
    }
}

pub fn all_checks(ctx: &Context) -> Vec<Check> {
    let mut checks = Vec::new();
    let nvml = check_nvml(ctx, &mut checks);
    checks.push(check_cuda(ctx));
    check_cgroups(&mut checks);
    checks.push(check_cgroup_manager(ctx));
    checks.push(check_shim(ctx));
    checks.push(check_state_dir("state directory", &ctx.state_dir, "--state-dir"));
    checks.push(check_state_dir("library directory", &ctx.lib_dir, "--lib-dir"));
    checks.push(check_state_files(ctx));
    checks.push(check_watch(ctx));
    checks.push(check_checkpoint(ctx));
    checks.push(check_root());
    checks.push(check_mps());
    if let Some(nvml) = &nvml {
        check_gpu_modes(nvml, &mut checks);
    }
    check_slurm(ctx, &mut checks);
    checks
}

/// Where a slurmd runs on this host: its node's GRES, as slurmctld has them, against what
/// `vgpu slurm conf` declares (`Gres=` names no device file: those are gres.conf's).
fn check_slurm(ctx: &Context, checks: &mut Vec<Check>) {
    for (node, conf) in crate::commands::slurm::running_slurmds(ctx) {
        let name = format!("Slurm GRES of {node}");
        checks.push(match crate::commands::slurm::gres_check(ctx, &node, conf.as_deref(), Path::new("/dev")) {
            Ok(diff) if diff.is_empty() => Check::ok(name, "slurmd's GRES are what vgpu slurm conf declares"),
            Ok(diff) => Check::warn(name, diff.join("; "), "put vgpu slurm conf's lines in gres.conf and its Gres= on the node's NodeName line, then restart slurmd"),
            Err(e) => Check::warn(name, e, "check slurmd and slurmctld (scontrol show node)"),
        });
    }
}

/// Whether suspending a workload can release its device memory (the CUDA checkpoint API).
fn check_checkpoint(ctx: &Context) -> Check {
    const NAME: &str = "checkpoint API";
    let library = match ctx.driver_library_dir() {
        Ok(dir) => dir.map(|d| d.join(vgpu_host::paths::CUDA_SONAME)),
        Err(e) => return Check::warn(NAME, format!("{e:#}"), "check the simulated driver"),
    };
    match vgpu_gpu::checkpoint::Checkpointer::open(library.as_deref()) {
        Ok(Some(_)) => Check::ok(NAME, "available: a suspended workload's device memory can be moved to host memory"),
        Ok(None) => Check::warn(
            NAME,
            "the driver has no checkpoint API: a suspended or preempted workload keeps its device memory",
            "install NVIDIA driver 570 or later",
        ),
        Err(e) => Check::warn(NAME, e.to_string(), "check the NVIDIA driver installation (nvidia-smi)"),
    }
}

/// Whether quotas are also enforced from outside the shim.
fn check_watch(ctx: &Context) -> Check {
    use vgpu_daemon::watch::instance::Running;
    match vgpu_daemon::watch::instance::running(&ctx.state_dir) {
        Running::Yes(pid) => Check::ok("vgpu watch", format!("running{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())),
        Running::No => Check::warn(
            "vgpu watch",
            "not running: only the shim enforces quotas, and processes that escape it are not stopped",
            "systemctl enable --now vgpu-watch.service (or run `vgpu watch`)",
        ),
        Running::Unknown(why) => Check::warn("vgpu watch", format!("cannot tell whether it runs: {why}"), "run vgpu doctor as root"),
    }
}

fn check_nvml(ctx: &Context, checks: &mut Vec<Check>) -> Option<Nvml> {
    let driver = if ctx.simulate { "simulated driver" } else { "NVIDIA driver" };
    let nvml = match ctx.nvml() {
        Ok(Some(nvml)) => nvml,
        Ok(None) => {
            checks.push(Check::fail(
                "NVML",
                "libnvidia-ml.so.1 not loadable",
                "install the NVIDIA driver (or try vgpu with --simulate)",
            ));
            return None;
        }
        Err(e) => {
            checks.push(Check::fail("NVML", format!("{e:#}"), "check the NVIDIA driver installation (nvidia-smi)"));
            return None;
        }
    };
    let version = nvml.driver_version().unwrap_or_else(|_| "unknown".into());
    let cuda = nvml.cuda_version().map(|v| format!(", CUDA {v}")).unwrap_or_default();
    checks.push(Check::ok("NVML", format!("{driver} {version}{cuda}")));
    match nvml.count() {
        Ok(0) => checks.push(Check::fail("GPUs", "the driver reports no GPU", "check nvidia-smi and the kernel module")),
        Ok(n) => checks.push(Check::ok("GPUs", format!("{n} GPU{}", if n == 1 { "" } else { "s" }))),
        Err(e) => checks.push(Check::fail("GPUs", vgpu_gpu::explain(&e), "check nvidia-smi")),
    }
    Some(nvml)
}

/// Load the CUDA driver the way CUDA programs do and ask its version.
fn check_cuda(ctx: &Context) -> Check {
    let path = match ctx.driver_library_dir() {
        Ok(Some(dir)) => dir.join(vgpu_host::paths::CUDA_SONAME),
        Ok(None) => vgpu_host::paths::CUDA_SONAME.into(),
        Err(e) => return Check::fail("CUDA driver", format!("{e:#}"), "build or install the simulated driver"),
    };
    match cuda_driver_version(&path) {
        Ok(v) => Check::ok("CUDA driver", format!("libcuda.so.1 loads, driver API {}.{}", v / 1000, (v % 1000) / 10)),
        Err(e) => Check::fail("CUDA driver", e, "install the NVIDIA driver (libcuda.so.1)"),
    }
}

fn cuda_driver_version(path: &Path) -> Result<i32, String> {
    // SAFETY: loading the CUDA driver runs its initialisers, which is what every CUDA
    // program does; the library stays loaded for the rest of this short-lived process.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("cannot load {}: {e}", path.display()))?;
    // SAFETY: cuDriverGetVersion has this C signature in cuda.h: CUresult (int*).
    let get: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> u32> =
        unsafe { lib.get(b"cuDriverGetVersion\0") }.map_err(|e| format!("no cuDriverGetVersion: {e}"))?;
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer for the call.
    let rc = unsafe { get(&mut version) };
    std::mem::forget(lib);
    if rc == 0 {
        Ok(version)
    } else {
        Err(format!("cuDriverGetVersion failed with CUresult {rc}"))
    }
}

fn check_cgroups(checks: &mut Vec<Check>) {
    let Some(layout) = Layout::detect() else {
        checks.push(Check::fail("cgroups", "no cgroup filesystem mounted", "mount cgroup2 at /sys/fs/cgroup"));
        return;
    };
    checks.push(Check::ok("cgroups", layout.mode.describe()));
    for controller in Controller::ALL {
        let name = format!("cgroup {}", controller.name());
        match layout.mount_of(controller).filter(|_| layout.has(controller)) {
            Some(mount) if writable(mount) => checks.push(Check::ok(name, format!("usable at {}", mount.display()))),
            Some(mount) => checks.push(Check::fail(name, format!("{} is not writable", mount.display()), "run as root")),
            None => {
                let fix = match layout.mode {
                    vgpu_cgroups::Mode::V2 => "enable it in the root's cgroup.subtree_control (or the kernel command line)",
                    _ => "mount its v1 hierarchy under /sys/fs/cgroup",
                };
                // Without the freezer nothing can be suspended; without the others only
                // their limit is lost: vgpu run says so and runs the workload without it.
                let option = match controller {
                    Controller::Cpu => Some("--cpus"),
                    Controller::Memory => Some("--memory"),
                    Controller::Pids => Some("--pids"),
                    Controller::Freezer | Controller::Cpuacct => None,
                };
                checks.push(match option {
                    Some(option) => Check::warn(name, format!("controller not available: {option} cannot be enforced (vgpu run says so and runs without it)"), fix),
                    None => Check::fail(name, "controller not available", fix),
                });
            }
        }
    }
}

/// Who would make a workload's cgroup if `vgpu run` started here: `cgroupfs`, `delegated` or
/// `systemd` (a transient scope; not asked for here).
fn check_cgroup_manager(ctx: &Context) -> Check {
    const NAME: &str = "cgroup manager";
    let Some(layout) = Layout::detect() else {
        return Check::fail(NAME, "no cgroup filesystem mounted", "mount cgroup2 at /sys/fs/cgroup");
    };
    match vgpu_cgroups::home::choose(&layout, ctx.config.cgroup.manager) {
        Ok(choice) if choice.home.manager == vgpu_cgroups::ManagerKind::Systemd => {
            match vgpu_cgroups::systemd::ping(std::time::Duration::from_secs(2)) {
                Ok(()) => Check::ok(NAME, format!("{} ({}; systemd answers on the bus)", choice.home.describe(), choice.why)),
                Err(e) => Check::warn(
                    NAME,
                    format!("{} ({}), but {e}", choice.home.describe(), choice.why),
                    "check the system bus (busctl status); under [cgroup] manager = \"auto\" vgpu run falls back to cgroupfs",
                ),
            }
        }
        Ok(choice) => Check::ok(NAME, format!("{} ({})", choice.home.describe(), choice.why)),
        Err(e) => Check::fail(NAME, e.to_string(), "set [cgroup] manager (auto, cgroupfs, delegated, systemd) or VGPU_CGROUP_MANAGER"),
    }
}

fn check_shim(ctx: &Context) -> Check {
    let shim = match vgpu_host::paths::find_shim(ctx.config.shim_path.as_deref()) {
        Ok(path) => path,
        Err(e) => return Check::fail("shim", format!("{e:#}"), "run install.sh, or set shim_path in the config"),
    };
    // Preload it into a trivial program, as `vgpu run` will: the dynamic linker reports a
    // shim it cannot load on stderr and carries on without it.
    let out = Command::new("true").env("LD_PRELOAD", &shim).output();
    match out {
        Ok(out) if out.status.success() && out.stderr.is_empty() => Check::ok("shim", format!("{} preloads", shim.display())),
        Ok(out) => Check::fail(
            "shim",
            format!("{} does not preload: {}", shim.display(), String::from_utf8_lossy(&out.stderr).trim()),
            "rebuild it for this host (install.sh)",
        ),
        Err(e) => Check::fail("shim", format!("cannot test {}: {e}", shim.display()), "check that `true` is on PATH"),
    }
}

/// `option` is the one that picks this directory (`--state-dir`, `--lib-dir`), for the fix.
fn check_state_dir(name: &str, dir: &Path, option: &str) -> Check {
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    // Owned by root and writable by nobody else, up to `/` (what every command checks).
    if let Err(e) = vgpu_store::state::dirs::check_dir(existing) {
        return match e {
            vgpu_store::state::StateError::UnsafeDir { reason, fix, .. } => Check::fail(name, reason, fix),
            other => Check::fail(name, other.to_string(), "check the path"),
        };
    }
    if writable(existing) {
        let detail = if existing == dir {
            format!("{} writable", dir.display())
        } else {
            format!("{} will be created (under {})", dir.display(), existing.display())
        };
        Check::ok(name, detail)
    } else {
        Check::fail(name, format!("{} is not writable", existing.display()), format!("run as root or pick {option}"))
    }
}

/// Damaged workload records and a damaged pool.json (read without the store lock: a
/// report, nothing is changed).
fn check_state_files(ctx: &Context) -> Check {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let (workloads, errors) = store.workloads();
    let mut damaged: Vec<String> = vgpu_store::state::damaged::damaged_records(&errors).iter().map(|d| d.path.display().to_string()).collect();
    if let Err(StateError::Damaged { path, .. } | StateError::NotRegular { path, .. }) = vgpu_host::pool_effects::read(&store) {
        damaged.push(path.display().to_string());
    }
    if damaged.is_empty() {
        Check::ok("state files", format!("{} workload record(s), none damaged", workloads.len()))
    } else {
        Check::fail(
            "state files",
            format!("damaged: {}", damaged.join(", ")),
            "sudo vgpu doctor --repair (removes them once nothing uses what they held)",
        )
    }
}

fn check_root() -> Check {
    if nix::unistd::geteuid().is_root() {
        Check::ok("root", "running as root")
    } else {
        Check::fail("root", "not running as root", "run vgpu through sudo, systemd or cron as root")
    }
}

fn check_mps() -> Check {
    match which("nvidia-cuda-mps-control") {
        Some(path) => Check::ok("MPS", format!("control binary {}", path.display())),
        None => Check::warn("MPS", "nvidia-cuda-mps-control not found", "optional; install the CUDA MPS tools to use MPS"),
    }
}

fn check_gpu_modes(nvml: &Nvml, checks: &mut Vec<Check>) {
    let count = nvml.count().unwrap_or(0);
    for index in 0..count {
        let Ok(device) = nvml.device(index) else { continue };
        let mig = match device.mig_mode() {
            Ok(mode) if mode.current == 1 => Check::ok(format!("GPU {index} MIG"), "enabled"),
            Ok(_) => Check::ok(format!("GPU {index} MIG"), "disabled"),
            Err(nvml_wrapper::error::NvmlError::NotSupported) => Check::ok(format!("GPU {index} MIG"), "not supported by this GPU"),
            Err(e) => Check::warn(format!("GPU {index} MIG"), vgpu_gpu::explain(&e), "check nvidia-smi -q"),
        };
        checks.push(mig);
        let persistence = match device.is_in_persistent_mode() {
            Ok(true) => Check::ok(format!("GPU {index} persistence"), "enabled"),
            Ok(false) => Check::warn(
                format!("GPU {index} persistence"),
                "disabled: the driver forgets clock caps when no process uses the GPU",
                "nvidia-smi -pm 1 (vgpu carbon apply enables it when it can)",
            ),
            Err(e) => Check::warn(format!("GPU {index} persistence"), vgpu_gpu::explain(&e), "check nvidia-smi -q"),
        };
        checks.push(persistence);
    }
}

fn writable(path: &Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}
