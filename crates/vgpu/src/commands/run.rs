//! `vgpu run [OPTIONS] -- CMD [ARGS…]`: admit, isolate, start, supervise, clean up.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Args;
use vgpu_abi::size::parse_size;

use vgpu_store::admission::MemSpec;
use vgpu_cgroups::Cgroup;
use vgpu_cgroups::Layout;
use vgpu_cgroups::Limits;
use vgpu_store::compute::ComputePolicy;
use vgpu_host::context::Context;
use vgpu_store::error::UsageError;
use vgpu_store::state::ended::EndNote;
use vgpu_host::launch;
use vgpu_host::launch::Launched;
use vgpu_host::launch::Placement;
use vgpu_host::launch::PoolAsk;
use vgpu_host::launch::Request;
use vgpu_host::launch::ShimVar;
use vgpu_pool::KindFilter;
use vgpu_pool::Priority;
use vgpu_host::pool_effects::pool_error;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;

/// Help headings of `vgpu run` (and of `update` and `partition create` where they apply):
/// the options grouped by what they limit, so that GPU memory (`--mem`) and host memory
/// (`--memory`) never sit side by side unexplained.
pub const GPU_SLICE: &str = "GPU slice";
pub const COMPUTE_POOL: &str = "Compute pool";
pub const CARBON: &str = "Carbon";
pub const HOST_LIMITS: &str = "Host limits";
pub const PROCESS: &str = "Process";

/// The options of a workload, as `vgpu run` takes them: the one definition that `vgpu run`
/// and `vgpu service create|update` (a service's replicas) share.
#[derive(Debug, Clone, Default, Args)]
pub struct WorkloadOptions {
    /// Which GPUs, by index or UUID: --gpu 0,1 or --gpu 0 --gpu 1 (a slice of each; for a number of whole GPUs see --gpus) [default: the GPU with the most unreserved memory]
    #[arg(long = "gpu", value_name = "INDEX|UUID", value_delimiter = ',', conflicts_with = "tflops", allow_hyphen_values = true, help_heading = GPU_SLICE)]
    pub gpus: Vec<String>,
    /// How many GPUs: `all` (every GPU of the host), a number N, or a range MIN-MAX the carbon planner chooses from (stage 1); for particular GPUs see --gpu
    #[arg(long = "gpus", value_name = "all|N|MIN-MAX", conflicts_with_all = ["gpus", "tflops", "partition"], allow_hyphen_values = true, help_heading = GPU_SLICE)]
    pub gpu_count: Option<String>,
    /// GPU device memory per selected GPU (not host RAM: see --memory): 4G (=4GiB), 512M, 1.5G (a unit is required; at least 16M), or NN% of the device; through sudo, at most the config's [policy] max_mem [default: the whole GPU; with --tflops, the same share as the compute; through sudo, lowered to max_mem]
    #[arg(long, value_name = "SIZE|PCT%", allow_hyphen_values = true, help_heading = GPU_SLICE)]
    pub mem: Option<String>,
    /// Share of each GPU's busy time, percent (1-100; 30 or 30%): all the vGPU's processes together, over a ~1 s window; `vgpu update` changes it live [default: 100]
    #[arg(long, value_name = "PCT", value_parser = crate::args::compute_pct, conflicts_with = "tflops", allow_negative_numbers = true, help_heading = GPU_SLICE)]
    pub compute: Option<u32>,
    /// How the compute share is applied: strict (never above it) or fair (a floor; idle GPU time is shared out) [default: the config's [compute] policy, else strict]
    #[arg(long, value_name = "POLICY", value_enum, help_heading = GPU_SLICE)]
    pub compute_policy: Option<ComputePolicy>,
    /// The longest turn on a GPU while a vGPU of higher priority is active there (1ms-15ms, e.g. 2ms; docs/turns.md); `vgpu update --turn` changes it live [default: the config's [compute] turn, else none beyond its share of a 15 ms cycle]
    #[arg(long, value_name = "DURATION", value_parser = turn_bound, conflicts_with = "partition", help_heading = GPU_SLICE)]
    pub turn: Option<u32>,
    /// Run inside a partition (a persistent vGPU shared by all its workloads)
    #[arg(long, value_name = "NAME", conflicts_with_all = ["gpus", "mem", "compute", "compute_policy", "turn", "oversubscribe", "tflops"], help_heading = GPU_SLICE, add = crate::args::partition_candidates())]
    pub partition: Option<String>,
    /// Admit even when the GPU's memory is already fully reserved; through sudo, only if the config's [policy] grants it
    #[arg(long, help_heading = GPU_SLICE)]
    pub oversubscribe: bool,
    /// Compute from the pool, in TFLOPS (whole blocks); lower-priority work may be suspended for it
    #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = COMPUTE_POOL)]
    pub tflops: Option<String>,
    /// Which kind of device the pool blocks come from: gpu, npu, fpga or any [default: any]
    #[arg(long, value_name = "KIND", requires = "tflops", help_heading = COMPUTE_POOL, add = crate::args::kind_candidates())]
    pub kind: Option<String>,
    /// Priority, 0-100 (higher wins in the compute pool); through sudo, at most what the config's [policy] grants the caller [default: 50, or that maximum if lower]
    #[arg(long, value_name = "P", allow_negative_numbers = true, help_heading = COMPUTE_POOL)]
    pub priority: Option<String>,
    /// How much the workload's speed depends on the GPU clock, 0 to 1 (carbon planner) [default: 1]
    #[arg(long, value_name = "S", allow_negative_numbers = true, help_heading = CARBON)]
    pub freq_sensitivity: Option<f64>,
    /// Host CPUs (fractional, e.g. 1.5)
    #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = HOST_LIMITS)]
    pub cpus: Option<f64>,
    /// Host RAM limit (not GPU memory: see --mem), at least 16M (e.g. 8G); an OOM kill is reported on stderr
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, help_heading = HOST_LIMITS)]
    pub memory: Option<String>,
    /// Maximum number of host processes and threads
    #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = HOST_LIMITS)]
    pub pids: Option<u64>,
    /// Run as USER[:GROUP]; through sudo, only as the user who ran it (unless the config's [policy] run_as_others lists them) [default: the user who ran sudo, else root]
    #[arg(long, value_name = "USER[:GROUP]", help_heading = PROCESS)]
    pub user: Option<String>,
    /// Extra environment variable (repeatable); VGPU_DIR is refused, LD_PRELOAD and LD_LIBRARY_PATH only add after vgpu's own entries
    #[arg(long = "env", value_name = "K=V", help_heading = PROCESS)]
    pub env: Vec<String>,
    /// Working directory of the workload, entered and checked as its user (through sudo, never as root)
    #[arg(long, value_name = "DIR", help_heading = PROCESS)]
    pub cwd: Option<PathBuf>,
}

/// `vgpu run`'s arguments alone, as clap parses them on vgpu's command line: a service's
/// replicas are checked with them (`service::validate`).
#[derive(Debug, clap::Parser)]
#[command(name = "vgpu")]
enum RunLine {
    Run(Box<RunArgs>),
}

/// Parse `["vgpu", "run", …]` by `vgpu run`'s rules.
pub fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<RunArgs, clap::Error> {
    use clap::Parser as _;
    RunLine::try_parse_from(argv).map(|RunLine::Run(args)| *args)
}

#[derive(Debug, Clone, Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    #[command(flatten)]
    pub opts: WorkloadOptions,
    /// With --tflops: wait (up to DURATION, e.g. 10m; default forever) for blocks and memory instead of refusing
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "forever", requires = "tflops", help_heading = COMPUTE_POOL)]
    pub wait: Option<String>,
    /// Name of the workload (unique among running workloads)
    #[arg(long, help_heading = PROCESS)]
    pub name: Option<String>,
    /// The command and its arguments
    #[arg(required_unless_present = "workload", value_name = "CMD")]
    pub command: Vec<String>,
    /// A replica of service NAME (set by the service runners, `vgpu watch` and `vgpu service run`; root's own `vgpu run` only)
    #[arg(long, value_name = "NAME", hide = true, requires = "replica", help_heading = PROCESS)]
    pub service: Option<String>,
    /// Which replica of --service, from 0
    #[arg(long, value_name = "N", hide = true, requires = "service", help_heading = PROCESS)]
    pub replica: Option<u32>,
    /// With --service: the runner's pipe, inherited as this descriptor, told `admitted ID` or `error: REASON` once and closed (the workload never has it)
    #[arg(long, value_name = "FD", hide = true, requires = "service", help_heading = PROCESS)]
    pub report_fd: Option<i32>,
    /// Take the options and the command from a workload file: NAME is /etc/vgpu/workloads/NAME.toml (what vgpu@NAME.service runs), a path if it contains '/'; options given here win over the file's
    #[arg(long, value_name = "NAME|FILE", help_heading = PROCESS)]
    pub workload: Option<String>,
}

/// Variables that change which workload files root's `vgpu run` trusts, which cgroup it
/// takes as its own, or whom it talks to on D-Bus (tests, and hosts set up by their admin):
/// a user with sudo rights to `vgpu run` alone has no use for them. Refused through sudo
/// (`SUDO_UID` set and not 0), should sudo keep the environment (`-E`, `env_keep`). The
/// settings that are also config keys (`VGPU_CONFIG` itself, `VGPU_CGROUP_MANAGER`) are
/// honoured as ever: sudo's `env_reset` (its default) is what keeps them root's (user
/// guide, docs/security.md: What `sudo` grants).
pub const ROOT_ONLY_ENV: [&str; 3] = [vgpu_host::workload_file::ENV_DIR, vgpu_cgroups::home::ENV_SELF, vgpu_cgroups::systemd::ENV_BUS];

/// The user who ran sudo (`SUDO_UID` set, not 0), if any; refuses [`ROOT_ONLY_ENV`] for them.
pub(crate) fn sudo_caller() -> Result<Option<vgpu_store::state::UserSpec>> {
    let sudo_uid = std::env::var("SUDO_UID").ok();
    let caller = vgpu_store::identity::sudo_caller(sudo_uid.as_deref()).map_err(|e| UsageError::new(e.to_string()))?;
    if caller.is_some() {
        if let Some(var) = ROOT_ONLY_ENV.iter().find(|v| std::env::var_os(v).is_some()) {
            vgpu_store::usage!("{var} is root's own setting: through sudo, unset it (is sudo keeping the environment, -E or env_keep?)");
        }
    }
    Ok(caller)
}

/// `args` with the workload file's values where the command line gives none (`--workload`).
fn with_workload_file(args: &RunArgs, workload: &str, caller: Option<&vgpu_store::state::UserSpec>) -> Result<RunArgs> {
    let file = vgpu_host::workload_file::load(workload, caller).map_err(|e| match std::error::Error::source(&e) {
        Some(cause) => UsageError::new(format!("{e}: {cause}")),
        None => UsageError::new(e.to_string()),
    })?;
    let mut merged = args.clone();
    let fill = |cli: &mut Option<String>, from: Option<String>| {
        if cli.is_none() {
            *cli = from;
        }
    };
    if merged.opts.gpus.is_empty() {
        merged.opts.gpus = file.gpu;
    }
    fill(&mut merged.opts.gpu_count, file.gpus);
    fill(&mut merged.opts.mem, file.mem);
    merged.opts.compute = merged.opts.compute.or(file.compute);
    merged.opts.compute_policy = merged.opts.compute_policy.or(file.compute_policy);
    if merged.opts.turn.is_none() {
        if let Some(text) = &file.turn {
            merged.opts.turn = Some(turn_bound(text).map_err(|e| UsageError::new(format!("key `turn` in {}: {e}", file.path.display())))?);
        }
    }
    fill(&mut merged.opts.partition, file.partition);
    fill(&mut merged.opts.tflops, file.tflops);
    fill(&mut merged.opts.kind, file.kind);
    fill(&mut merged.wait, file.wait);
    merged.opts.freq_sensitivity = merged.opts.freq_sensitivity.or(file.freq_sensitivity);
    merged.opts.cpus = merged.opts.cpus.or(file.cpus);
    fill(&mut merged.opts.memory, file.memory);
    merged.opts.pids = merged.opts.pids.or(file.pids);
    fill(&mut merged.name, file.name);
    fill(&mut merged.opts.user, file.user);
    // The file's variables first: one given on the command line comes later and wins.
    merged.opts.env = file.env.into_iter().chain(args.opts.env.iter().cloned()).collect();
    merged.opts.cwd = merged.opts.cwd.or(file.cwd);
    fill(&mut merged.opts.priority, file.priority);
    merged.opts.oversubscribe |= file.oversubscribe;
    if merged.command.is_empty() {
        merged.command = file.command;
    }
    // clap checked the command line's options among themselves, not against the file's.
    let given = |key: &str| match key {
        "gpu" => !merged.opts.gpus.is_empty(),
        "gpus" => merged.opts.gpu_count.is_some(),
        "mem" => merged.opts.mem.is_some(),
        "compute" => merged.opts.compute.is_some(),
        "compute_policy" => merged.opts.compute_policy.is_some(),
        "turn" => merged.opts.turn.is_some(),
        "partition" => merged.opts.partition.is_some(),
        "tflops" => merged.opts.tflops.is_some(),
        "kind" => merged.opts.kind.is_some(),
        "wait" => merged.wait.is_some(),
        "oversubscribe" => merged.opts.oversubscribe,
        _ => false,
    };
    vgpu_host::workload_file::check_combination(&given, &|key| format!("--{} (or `{key}` in {})", key.replace('_', "-"), file.path.display()))
        .map_err(UsageError::new)?;
    Ok(merged)
}

pub fn run(ctx: &Context, args: &RunArgs) -> Result<u8> {
    let mut report = Report::take(args.report_fd)?;
    let result = admit_and_run(ctx, args, &mut report);
    if let Err(e) = &result {
        report.say(&format!("error: {e:#}"));
    }
    result
}

/// A service runner's pipe (`--report-fd`): it learns whether the replica was admitted, and
/// if not why, without reading the replica's stderr (which stays the runner's, the journal
/// under systemd, and outlives the runner).
struct Report(Option<std::fs::File>);

impl Report {
    fn take(fd: Option<i32>) -> Result<Report> {
        let Some(fd) = fd else { return Ok(Report(None)) };
        if fd < 3 {
            vgpu_store::usage!("--report-fd {fd}: not one of the standard descriptors");
        }
        if std::env::var("SUDO_UID").ok().is_some_and(|uid| uid != "0") {
            vgpu_store::usage!("--report-fd is for vgpu's service runners: not through sudo");
        }
        // Checked open before it is owned: a descriptor number that is not open is refused.
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).map_err(|e| UsageError::new(format!("--report-fd {fd}: {e}")))?;
        // SAFETY: the descriptor is open (checked above), given to this process for this use
        // alone, and owned from here by exactly one File.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // The workload must not inherit it: the runner sees end of file once vgpu run closes it.
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC)).context("--report-fd")?;
        Ok(Report(Some(file)))
    }

    /// Say `line` (the first time only) and close the pipe.
    fn say(&mut self, line: &str) {
        if let Some(mut f) = self.0.take() {
            let _ = std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes());
        }
    }
}

fn admit_and_run(ctx: &Context, args: &RunArgs, report: &mut Report) -> Result<u8> {
    let caller = sudo_caller()?;
    let from_file;
    let args = match &args.workload {
        Some(workload) => {
            from_file = with_workload_file(args, workload, caller.as_ref())?;
            &from_file
        }
        None => args,
    };
    let mut request = validate(ctx, args)?;
    // Another user's workload named like a replica would keep that replica out for as long
    // as it runs (names are unique among running workloads).
    if let (Some(name), None) = (&request.name, &request.service) {
        if let Some(service) = vgpu_daemon::service::Services::new(&ctx.lib_dir).replica_name_owner(name) {
            vgpu_store::usage!("--name {name:?} is kept for a replica of service {service} (vgpu service show {service}): choose another name");
        }
    }
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu run must run as root (through sudo, systemd or cron): it creates cgroups");
    }
    let shim = vgpu_host::paths::find_shim(ctx.config.shim_path.as_deref())?;
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    let Some(host) = ctx.host_gpus()? else {
        anyhow::bail!("no NVIDIA driver found (libnvidia-ml.so.1); use --simulate to try vgpu without a GPU");
    };
    if args.opts.gpu_count.as_deref().map(parse_gpu_count) == Some(Ok(GpuCount::All)) {
        all_gpus(&mut request, &host.gpus);
    }
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    tracing::debug!("shim {}; {}; state {}; {} GPU(s)", shim.display(), layout.mode.describe(), ctx.state_dir.display(), host.gpus.len());

    let launched = launch::admit(ctx, &store, &layout, &host, &request)?;
    let w = &launched.workload;
    report.say(&format!("admitted {}", w.id));
    let slices: Vec<String> =
        w.gpus.iter().map(|g| format!("GPU {} {} compute {}%", g.index, vgpu_abi::size::format_size(g.mem_bytes), g.compute_pct)).collect();
    tracing::info!("admitted {} ({}): {}{}", w.name, w.id, slices.join(", "), w.pool_blocks.map(|b| format!(", {b} pool blocks")).unwrap_or_default());
    tracing::debug!("cgroup {}, vGPU {}, priority {}", w.cgroup, w.vgpu, w.priority);
    // A running watch that records this history takes the workload's end from a note
    // (vgpu_store::state::ended): this command then never opens the history.
    let mut history = None;
    let result = start_and_supervise(ctx, &store, &shim, &launched, &request, host.watch.as_ref(), &mut history);
    let (cleanup, end) = match history.is_none().then(|| launch::watch_records_history(ctx, &store)).flatten() {
        Some(marked) => {
            let note = EndNote::new(w.clone(), vgpu_store::clock::now_ms(), launch::outcome(&result));
            match launch::finish(ctx, &store, &layout, w, Some(&note)) {
                (cleanup, true) => {
                    tracing::debug!("{} ({}): its end is left for vgpu watch to record in the history", w.name, w.id);
                    (cleanup, End::LeftToWatch { marked })
                }
                (cleanup, false) => (cleanup, End::Recorded(launch::record_end(ctx, w, &result, None).wait().map(Box::new))),
            }
        }
        None => {
            // Recorded in the history (on its thread) while the workload is removed.
            let recorded = launch::record_end(ctx, w, &result, history);
            let (cleanup, _) = launch::finish(ctx, &store, &layout, w, None);
            (cleanup, End::Recorded(recorded.wait().map(Box::new)))
        }
    };
    let code = result?;
    cleanup?;
    tracing::info!("{} ({}) ended with exit status {code}; its cgroup and vGPU are cleaned up", w.name, w.id);
    say_energy(ctx, w, end);
    Ok(code)
}

/// How the workload's end reached the history.
enum End {
    /// Recorded by this command: the connection that recorded it, when it did.
    Recorded(Option<Box<launch::Ended>>),
    /// Left for the watch, which last marked its GPU list (the end of its latest round) then.
    LeftToWatch { marked: std::time::SystemTime },
}

/// A round that marked its list this long before a workload's record was made may still
/// have listed it (a file's modification time is the kernel's coarse clock).
const MARK_SLACK: std::time::Duration = std::time::Duration::from_millis(50);

/// One line at the workload's end: the energy and emissions the history attributes to it
/// (what `vgpu watch` recorded, `vgpu carbon report`'s accounting); nothing recorded: a
/// line at -v only. `history`: the connection that recorded the end, when it did.
fn say_energy(ctx: &Context, w: &Workload, end: End) {
    use vgpu_carbon::account::format_energy;
    let opened = match end {
        // No GPU time recorded for it (a workload shorter than a watch round): no energy.
        End::Recorded(Some(ended)) if matches!(ended.metered, Ok(false)) => Ok(None),
        End::Recorded(Some(ended)) => Ok(Some(ended.reader)),
        End::Recorded(None) => vgpu_history::query::Reader::open(&ctx.lib_dir),
        // No round of the watch has listed it since it started: none recorded GPU time for it.
        End::LeftToWatch { marked } if marked + MARK_SLACK < std::time::UNIX_EPOCH + std::time::Duration::from_millis(w.created_unix_ms) => Ok(None),
        End::LeftToWatch { .. } => vgpu_history::query::Reader::open(&ctx.lib_dir),
    };
    let used = match opened {
        Ok(Some(reader)) => reader.workload_usage(&w.id, &vgpu_host::carbon::report::idle_defaults(ctx)),
        Ok(None) => {
            tracing::info!("workload {} ({}): no energy recorded (is vgpu watch running?)", w.name, w.id);
            return;
        }
        Err(e) => Err(e),
    };
    match used {
        Ok(used) => match used.energy_mj {
            Some(mj) => {
                let gpus: Vec<String> = used.gpu_indexes.iter().map(i64::to_string).collect();
                let time = humantime::format_duration(std::time::Duration::from_secs(used.gpu_time_ms / 1000));
                let co2 = used.g_co2.map(|g| format!(", {g:.1} g CO2")).unwrap_or_else(|| ", CO2 unknown (no intensity recorded)".into());
                vgpu_host::notice!("workload {} ({}) used {} on GPU {} (GPU time {time}){co2}", w.name, w.id, format_energy(mj), gpus.join(","));
            }
            None => tracing::info!("workload {} ({}): no energy recorded (is vgpu watch running?)", w.name, w.id),
        },
        Err(e) => tracing::info!("workload {} ({}): its energy cannot be read from the history: {e}", w.name, w.id),
    }
}

pub(crate) fn validate(ctx: &Context, args: &RunArgs) -> Result<Request> {
    let mem = args.opts.mem.as_deref().map(MemSpec::parse).transpose().map_err(|e| UsageError::new(format!("--mem: {e}")))?;
    if let Some(cpus) = args.opts.cpus {
        if !(cpus > 0.0 && cpus.is_finite()) {
            vgpu_store::usage!("--cpus must be a positive number, got {cpus}");
        }
    }
    let memory = match &args.opts.memory {
        Some(text) => match parse_size(text) {
            Ok(bytes) if bytes < vgpu_cgroups::MIN_MEMORY_BYTES => vgpu_store::usage!(
                "--memory {text} is too small: a workload's host memory limit must be at least {} (sizes are bytes unless suffixed, e.g. 512M, 8G)",
                vgpu_abi::size::format_size(vgpu_cgroups::MIN_MEMORY_BYTES)
            ),
            Ok(bytes) => Some(bytes),
            Err(e) => vgpu_store::usage!("--memory: {e}"),
        },
        None => None,
    };
    let wanted = gpu_list(&args.opts.gpus).map_err(|e| UsageError::new(format!("--gpu: {e}")))?;
    if args.opts.pids == Some(0) {
        vgpu_store::usage!("--pids must be at least 1");
    }
    if let Some(name) = &args.name {
        if !vgpu_store::state::partition::valid_name(name) {
            vgpu_store::usage!("invalid --name {name:?}: use letters, digits, '-', '_' and '.' (at most 64)");
        }
    }
    let mut env = Vec::new();
    for kv in &args.opts.env {
        match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                match launch::shim_var(k) {
                    Some(ShimVar::Owned) => vgpu_store::usage!("--env {k}: vgpu sets {k} for the shim; it cannot be replaced or unset"),
                    Some(ShimVar::Appended) if v.trim_matches([':', ' ']).is_empty() => {
                        vgpu_store::usage!("--env {k}: cannot be unset; vgpu's own entry stays first and --env {k}=VALUE only adds after it")
                    }
                    _ => {}
                }
                env.push((k.to_string(), v.to_string()))
            }
            _ => vgpu_store::usage!("--env expects K=V, got {kv:?}"),
        }
    }
    let service = match (&args.service, args.replica) {
        (Some(name), Some(replica)) => {
            if !vgpu_store::state::partition::valid_name(name) {
                vgpu_store::usage!("invalid --service {name:?}: use letters, digits, '-', '_' and '.' (at most 64)");
            }
            // The runners take a record with it for one of their replicas: only root marks one.
            if std::env::var("SUDO_UID").ok().is_some_and(|uid| uid != "0") {
                vgpu_store::usage!("--service is for vgpu's service runners (vgpu watch, vgpu service run): not through sudo");
            }
            Some(vgpu_store::state::ServiceRef { name: name.clone(), replica })
        }
        _ => None,
    };
    let asked_priority = args.opts.priority.as_deref().map(str::parse::<Priority>).transpose().map_err(pool_error)?;
    let pool = match &args.opts.tflops {
        Some(text) => Some(PoolAsk {
            tflops: vgpu_pool::parse_tflops(text).map_err(pool_error)?,
            kind: args.opts.kind.as_deref().unwrap_or("any").parse::<KindFilter>().map_err(|e| pool_error(e.into()))?,
            wait: crate::commands::wait_limit(args.wait.as_deref())?,
        }),
        None => None,
    };
    if let Some(s) = args.opts.freq_sensitivity {
        if !(0.0..=1.0).contains(&s) {
            vgpu_store::usage!("--freq-sensitivity must be between 0 and 1, got {s}");
        }
    }
    let gpu_count = args.opts.gpu_count.as_deref().map(parse_gpu_count).transpose().map_err(|e| UsageError::new(format!("--gpus: {e}")))?;
    let sudo_uid = std::env::var("SUDO_UID").ok();
    let user = vgpu_store::identity::resolve(args.opts.user.as_deref(), sudo_uid.as_deref(), &ctx.config.policy.run_as_others).map_err(|e| UsageError::new(format!("--user: {e}")))?;
    // Through sudo, priorities and oversubscription only as far as [policy] grants the caller.
    let caller = vgpu_store::identity::sudo_caller(sudo_uid.as_deref()).map_err(|e| UsageError::new(e.to_string()))?;
    let priority = vgpu_host::policy::check_run(&ctx.config.policy, caller.as_ref(), asked_priority, args.opts.oversubscribe)
        .map_err(|e| UsageError::new(e.to_string()))?;
    let path_var = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).or_else(|| std::env::var("PATH").ok());
    // Refused before anything is made, as the workload's user finds them (never as root: a
    // sudo caller learns nothing of what is closed to them): --cwd a directory they may
    // enter; the program 127 when missing, 126 when it cannot be executed, as shells, `env`
    // and `docker run` exit.
    launch::resolve::check(&user, args.opts.cwd.as_deref(), &args.command[0], path_var.as_deref())?;
    let placement = match (pool, &args.opts.partition) {
        (Some(ask), _) => Placement::Pool(ask),
        (None, Some(name)) => Placement::Partition(name.clone()),
        (None, None) => {
            let count = match gpu_count {
                Some(GpuCount::Range(min, max)) => Some((min, max)),
                // Every GPU, by index, once the driver has listed them (`all_gpus`).
                Some(GpuCount::All) | None => None,
            };
            Placement::Gpus { wanted, count, compute_pct: args.opts.compute.unwrap_or(100) }
        }
    };
    Ok(Request {
        name: args.name.clone(),
        argv: args.command.clone(),
        user,
        env,
        cwd: args.opts.cwd.clone(),
        limits: Limits { cpus: args.opts.cpus, memory, pids: args.opts.pids },
        priority,
        compute_policy: args.opts.compute_policy,
        turn_max_us: args.opts.turn,
        freq_sensitivity: args.opts.freq_sensitivity,
        mem,
        mem_cap: vgpu_host::policy::mem_cap(&ctx.config.policy, caller.as_ref()),
        oversubscribe: args.opts.oversubscribe,
        placement,
        service,
    })
}

/// `--turn`'s value, in µs.
pub(crate) fn turn_bound(text: &str) -> Result<u32, String> {
    vgpu_store::compute::parse_turn(text)
}

/// What `--gpus` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuCount {
    /// `all`: every GPU of the host (as `docker run --gpus all`).
    All,
    /// `N` (N-N) or `MIN-MAX`: stage 1 of the carbon planner picks the count and the GPUs.
    Range(usize, usize),
}

/// `--gpus all`, `--gpus N` or `--gpus MIN-MAX`.
fn parse_gpu_count(text: &str) -> Result<GpuCount, String> {
    if text.trim().eq_ignore_ascii_case("all") {
        return Ok(GpuCount::All);
    }
    let parse = |s: &str| s.trim().parse::<usize>().ok().filter(|&n| n >= 1);
    let range = match text.split_once('-') {
        Some((a, b)) => parse(a).zip(parse(b)),
        None => parse(text).map(|n| (n, n)),
    };
    match range {
        Some((min, max)) if min <= max => Ok(GpuCount::Range(min, max)),
        _ => Err(format!("expected `all`, a count N or a range MIN-MAX of at least 1, got {text:?}")),
    }
}

/// `--gpu 0,1`, `--gpu 0 --gpu GPU-8f…` (clap splits at commas): each entry once, none empty.
/// Whether each names a GPU of this host is checked against the driver's list at admission.
fn gpu_list(entries: &[String]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for entry in entries.iter().map(|e| e.trim()) {
        if entry.is_empty() {
            return Err("an empty entry: give GPU indices or UUIDs separated by commas, e.g. --gpu 0,1 (see `vgpu devices`)".into());
        }
        if entry.eq_ignore_ascii_case("all") {
            return Err("`all` is not a GPU: --gpus all asks for every GPU".into());
        }
        if out.iter().any(|e| e == entry) {
            return Err(format!("GPU {entry} is given twice"));
        }
        out.push(entry.to_string());
    }
    Ok(out)
}

/// `--gpus all`: the request names every GPU the driver lists, by index.
fn all_gpus(request: &mut Request, gpus: &[vgpu_gpu::GpuInfo]) {
    if let Placement::Gpus { wanted, .. } = &mut request.placement {
        *wanted = gpus.iter().map(|g| g.index.to_string()).collect();
    }
}

/// `history`: the history, opened while the workload runs for its end to be recorded,
/// unless `watch` (the running watch whose GPU list admission took) records it.
fn start_and_supervise(
    ctx: &Context,
    store: &Store,
    shim: &Path,
    launched: &Launched,
    request: &Request,
    watch: Option<&vgpu_store::state::inventory::Current>,
    history: &mut Option<vgpu_history::Ahead>,
) -> Result<u8> {
    // Caught before the spawn: a signal sent right after the workload starts is relayed.
    let caught = vgpu_store::supervise::CaughtSignals::catch().context("installing the signal relay")?;
    let (mut child, state) = launch::start(ctx, store, shim, launched, request)?;
    // Not before: no thread of vgpu's runs while the workload's process is forked.
    if watch.and_then(|current| launch::records_history(ctx, current)).is_none() {
        *history = Some(vgpu_history::Ahead::open(&ctx.lib_dir, &ctx.config.history));
    }
    tracing::info!("started {:?} as pid {}", launched.workload.command, child.id());
    let status = launch::supervise(store, &launched.workload, state, &mut child, caught)?;
    tracing::debug!("pid {} ended: {status}", child.id());
    explain_oom_kills(&launched.cgroup, &launched.workload, request);
    explain_enforcement(store, &launched.workload);
    Ok(vgpu_store::supervise::exit_code(status))
}

/// Say, in one line on stderr, when `vgpu watch` killed processes of the workload, or ended
/// it whole, and why (it recorded that in the record, which goes with the workload).
fn explain_enforcement(store: &Store, w: &Workload) {
    let Ok(record) = Workload::read(&store.workload_path(&w.id)) else {
        return;
    };
    match record.enforcement {
        Some(e) if e.action == vgpu_store::state::EnforcementAction::Killed => {
            let pids: Vec<String> = e.pids.iter().map(u32::to_string).collect();
            vgpu_host::notice!("vgpu watch killed pid {} of {} ({}): {}", pids.join(", "), w.name, w.id, e.reason);
        }
        Some(e) if e.action == vgpu_store::state::EnforcementAction::Ended => {
            vgpu_host::notice!("vgpu watch ended {} ({}): {}", w.name, w.id, e.reason);
        }
        _ => {}
    }
}

/// Say, in one line on stderr, when the kernel's OOM killer killed processes of the
/// workload (read from its cgroup before it is removed): otherwise a workload that hit its
/// `--memory` limit just dies with 137.
fn explain_oom_kills(cgroup: &Cgroup, w: &Workload, request: &Request) {
    let kills = match cgroup.oom_kills() {
        Ok(Some(n)) if n > 0 => n,
        Ok(_) => return,
        Err(e) => {
            tracing::debug!("cannot read the OOM events of {}: {e}", w.id);
            return;
        }
    };
    let limit = match request.limits.memory {
        Some(bytes) => format!("it reached its host memory limit (--memory {})", vgpu_abi::size::format_size(bytes)),
        None => "the host ran out of memory".to_string(),
    };
    vgpu_host::notice!("the kernel's OOM killer killed {kills} process(es) of {} ({}): {limit}", w.name, w.id);
}
