//! `vgpu run [OPTIONS] -- CMD [ARGS…]`: admit, isolate, start, supervise, clean up.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Args;
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::process::ProcessId;
use vgpu_abi::size::parse_size;
use vgpu_abi::usage::{DeviceQuota, UsageFile};

use crate::admission::{self, Device, MemSpec};
use crate::cgroup::{Cgroup, Layout, Limits};
use crate::compute::ComputePolicy;
use crate::context::Context;
use crate::error::UsageError;
use crate::gpu::GpuInfo;
use crate::pool::{AllocState, KindFilter, PoolError, Priority};
use crate::pooling::{self, pool_error};
use crate::state::workload::{WorkloadState, WORKLOAD_FORMAT};
use crate::state::{intent, Partitions, Store, StoreLock, UserSpec, Workload, WorkloadGpu};

/// How vgpu guards a variable the shim (or the simulated driver) depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimVar {
    /// vgpu alone sets it (or leaves it out): `--env` may not name it, and a value inherited
    /// from vgpu's own environment never reaches the workload.
    Owned,
    /// A search list whose head vgpu sets: `--env K=V` (non-empty) and an inherited value only
    /// come after it.
    Appended,
}

/// The variables the shim and the simulated driver depend on: the one list. Neither `--env`
/// nor vgpu's own environment can unset or replace them (see `workload_env`).
pub const SHIM_ENV: &[(&str, ShimVar)] = &[
    // The shim, always first; `--env LD_PRELOAD=extra.so` adds libraries after it.
    ("LD_PRELOAD", ShimVar::Appended),
    // With --simulate: the simulated driver's directory first; extra directories after it.
    ("LD_LIBRARY_PATH", ShimVar::Appended),
    // The vGPU's state: unset or empty would make the shim pass everything through.
    ("VGPU_DIR", ShimVar::Owned),
    // The shim's panic-injection test hook: a panic before the driver call falls back to the
    // unguarded driver call, so it must never reach a workload.
    ("VGPU_SHIM_TEST_PANIC", ShimVar::Owned),
];

fn shim_var(key: &str) -> Option<ShimVar> {
    SHIM_ENV.iter().find(|(k, _)| *k == key).map(|(_, kind)| *kind)
}

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// GPU to use, by index or UUID (repeatable) [default: the GPU with the most unreserved memory]
    #[arg(long = "gpu", value_name = "INDEX|UUID", conflicts_with = "tflops", allow_hyphen_values = true)]
    pub gpus: Vec<String>,
    /// Device memory per selected GPU: 4G (=4GiB), 512M, 1.5G, or NN% of the device [default: the whole GPU; with --tflops, the same share as the compute]
    #[arg(long, value_name = "SIZE|PCT%", allow_hyphen_values = true)]
    pub mem: Option<String>,
    /// Share of each GPU's busy time, percent (1-100): all the vGPU's processes together, over a ~1 s window; `vgpu update` changes it live [default: 100]
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100), conflicts_with = "tflops", allow_negative_numbers = true)]
    pub compute: Option<u32>,
    /// How the compute share is applied: strict (never above it) or fair (a floor; idle GPU time is shared out) [default: the config's [compute] policy, else strict]
    #[arg(long, value_name = "POLICY", value_enum)]
    pub compute_policy: Option<ComputePolicy>,
    /// Run inside a partition (a persistent vGPU shared by all its workloads)
    #[arg(long, value_name = "NAME", conflicts_with_all = ["gpus", "mem", "compute", "compute_policy", "oversubscribe", "tflops"])]
    pub partition: Option<String>,
    /// Compute from the pool, in TFLOPS (whole blocks); lower-priority work may be suspended for it
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub tflops: Option<String>,
    /// Which kind of device the pool blocks come from: gpu, npu, fpga or any
    #[arg(long, value_name = "KIND", requires = "tflops")]
    pub kind: Option<String>,
    /// With --tflops: wait (up to DURATION, e.g. 10m; default forever) for blocks instead of refusing
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "forever", requires = "tflops")]
    pub wait: Option<String>,
    /// Number of whole GPUs, or a range MIN-MAX the carbon planner chooses from (stage 1)
    #[arg(long = "gpus", value_name = "N|MIN-MAX", conflicts_with_all = ["gpus", "tflops", "partition"], allow_hyphen_values = true)]
    pub gpu_count: Option<String>,
    /// How much the workload's speed depends on the GPU clock, 0 to 1 (carbon planner) [default: 1]
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    pub freq_sensitivity: Option<f64>,
    /// Host CPUs (fractional, e.g. 1.5)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub cpus: Option<f64>,
    /// Host memory limit, at least 16M (e.g. 8G); an OOM kill is reported on stderr
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub memory: Option<String>,
    /// Maximum number of processes
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub pids: Option<u64>,
    /// Name of the workload (unique among running workloads)
    #[arg(long)]
    pub name: Option<String>,
    /// Run as USER[:GROUP]; through sudo, only as the user who ran it (unless the config's [policy] run_as_others lists them) [default: the user who ran sudo, else root]
    #[arg(long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
    /// Extra environment variable (repeatable); VGPU_DIR is refused, LD_PRELOAD and LD_LIBRARY_PATH only add after vgpu's own entries
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory of the workload
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Priority, 0-100 (higher wins in the compute pool); through sudo, at most what the config's [policy] grants the caller [default: 50, or that maximum if lower]
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub priority: Option<String>,
    /// Admit even when the GPU's memory is already fully reserved; through sudo, only if the config's [policy] grants it
    #[arg(long)]
    pub oversubscribe: bool,
    /// The command and its arguments
    #[arg(required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// A compute-pool request, validated.
struct PoolAsk {
    tflops: f64,
    kind: KindFilter,
    /// None: refuse when the blocks are not free; Some(None): wait forever.
    wait: Option<Option<Duration>>,
}

/// Everything checked before anything is created.
struct Request {
    mem: Option<MemSpec>,
    limits: Limits,
    user: UserSpec,
    env: Vec<(String, String)>,
    argv: Vec<String>,
    cwd: Option<PathBuf>,
    priority: Priority,
    pool: Option<PoolAsk>,
    gpu_range: Option<(usize, usize)>,
}

pub fn run(ctx: &Context, args: &RunArgs) -> Result<u8> {
    let request = validate(ctx, args)?;
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu run must run as root (through sudo, systemd or cron): it creates cgroups");
    }
    let shim = crate::paths::find_shim(ctx)?;
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    let Some(nvml) = ctx.nvml()? else {
        anyhow::bail!("no NVIDIA driver found (libnvidia-ml.so.1); use --simulate to try vgpu without a GPU");
    };
    let gpus = nvml.inventory()?;
    drop(nvml);
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);

    let started = admit(ctx, &store, &layout, &gpus, args, &request)?;
    let result = start_and_supervise(ctx, &store, &layout, &shim, &started, &request);
    let cleanup = finish(&store, &layout, &started.workload);
    let code = result?;
    cleanup?;
    Ok(code)
}

fn validate(ctx: &Context, args: &RunArgs) -> Result<Request> {
    let mem = args.mem.as_deref().map(MemSpec::parse).transpose().map_err(|e| UsageError::new(format!("--mem: {e}")))?;
    if let Some(cpus) = args.cpus {
        if !(cpus > 0.0 && cpus.is_finite()) {
            crate::usage!("--cpus must be a positive number, got {cpus}");
        }
    }
    let memory = match &args.memory {
        Some(text) => match parse_size(text) {
            Ok(bytes) if bytes < crate::cgroup::MIN_MEMORY_BYTES => crate::usage!(
                "--memory {text} is too small: a workload's host memory limit must be at least {} (sizes are bytes unless suffixed, e.g. 512M, 8G)",
                vgpu_abi::size::format_size(crate::cgroup::MIN_MEMORY_BYTES)
            ),
            Ok(bytes) => Some(bytes),
            Err(e) => crate::usage!("--memory: {e}"),
        },
        None => None,
    };
    if let Some(gpu) = args.gpus.iter().find(|g| g.trim().is_empty()) {
        crate::usage!("--gpu {gpu:?}: give a GPU index or UUID (see `vgpu devices`)");
    }
    if args.pids == Some(0) {
        crate::usage!("--pids must be at least 1");
    }
    if let Some(name) = &args.name {
        if !crate::state::partition::valid_name(name) {
            crate::usage!("invalid --name {name:?}: use letters, digits, '-', '_' and '.' (at most 64)");
        }
    }
    let mut env = Vec::new();
    for kv in &args.env {
        match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                match shim_var(k) {
                    Some(ShimVar::Owned) => crate::usage!("--env {k}: vgpu sets {k} for the shim; it cannot be replaced or unset"),
                    Some(ShimVar::Appended) if v.trim_matches([':', ' ']).is_empty() => {
                        crate::usage!("--env {k}: cannot be unset; vgpu's own entry stays first and --env {k}=VALUE only adds after it")
                    }
                    _ => {}
                }
                env.push((k.to_string(), v.to_string()))
            }
            _ => crate::usage!("--env expects K=V, got {kv:?}"),
        }
    }
    if let Some(cwd) = &args.cwd {
        if !cwd.is_dir() {
            crate::usage!("--cwd {}: no such directory", cwd.display());
        }
    }
    let asked_priority = args.priority.as_deref().map(str::parse::<Priority>).transpose().map_err(pool_error)?;
    let pool = match &args.tflops {
        Some(text) => Some(PoolAsk {
            tflops: crate::pool::parse_tflops(text).map_err(pool_error)?,
            kind: args.kind.as_deref().unwrap_or("any").parse::<KindFilter>().map_err(pool_error)?,
            wait: match args.wait.as_deref() {
                None => None,
                Some("forever") => Some(None),
                Some(text) => Some(Some(humantime::parse_duration(text).map_err(|e| UsageError::new(format!("--wait {text:?}: {e}")))?)),
            },
        }),
        None => None,
    };
    if let Some(s) = args.freq_sensitivity {
        if !(0.0..=1.0).contains(&s) {
            crate::usage!("--freq-sensitivity must be between 0 and 1, got {s}");
        }
    }
    let gpu_range = args.gpu_count.as_deref().map(parse_gpu_range).transpose().map_err(|e| UsageError::new(format!("--gpus: {e}")))?;
    let sudo_uid = std::env::var("SUDO_UID").ok();
    let user = crate::identity::resolve(args.user.as_deref(), sudo_uid.as_deref(), &ctx.config.policy.run_as_others).map_err(|e| UsageError::new(format!("--user: {e}")))?;
    // Through sudo, priorities and oversubscription only as far as [policy] grants the caller.
    let caller = crate::identity::sudo_caller(sudo_uid.as_deref()).map_err(|e| UsageError::new(e.to_string()))?;
    let priority = crate::policy::check_run(&ctx.config.policy, caller.as_ref(), asked_priority, args.oversubscribe)
        .map_err(|e| UsageError::new(e.to_string()))?;
    let path_var = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).or_else(|| std::env::var("PATH").ok());
    let program = &args.command[0];
    if resolve_program(program, path_var.as_deref(), args.cwd.as_deref()).is_none() {
        crate::usage!("command not found: {program}");
    }
    Ok(Request {
        mem,
        limits: Limits { cpus: args.cpus, memory, pids: args.pids },
        user,
        env,
        argv: args.command.clone(),
        cwd: args.cwd.clone(),
        priority,
        pool,
        gpu_range,
    })
}

/// `--gpus N` or `--gpus MIN-MAX`.
fn parse_gpu_range(text: &str) -> Result<(usize, usize), String> {
    let parse = |s: &str| s.trim().parse::<usize>().ok().filter(|&n| n >= 1);
    let range = match text.split_once('-') {
        Some((a, b)) => parse(a).zip(parse(b)),
        None => parse(text).map(|n| (n, n)),
    };
    match range {
        Some((min, max)) if min <= max => Ok((min, max)),
        _ => Err(format!("expected a count N or a range MIN-MAX of at least 1, got {text:?}")),
    }
}

fn resolve_program(program: &str, path: Option<&str>, cwd: Option<&Path>) -> Option<PathBuf> {
    if program.contains('/') {
        let p = match cwd {
            Some(dir) if !program.starts_with('/') => dir.join(program),
            _ => PathBuf::from(program),
        };
        return p.is_file().then_some(p);
    }
    std::env::split_paths(path?).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// A workload that has been admitted and recorded, with its cgroup created.
struct Started {
    workload: Workload,
    cgroup: Cgroup,
}

/// Under the store lock: reconcile, choose GPUs (or pool blocks), check admission, create
/// the vGPU, the cgroup and the record. On failure everything created here is removed.
fn admit(ctx: &Context, store: &Store, layout: &Layout, gpus: &[GpuInfo], args: &RunArgs, request: &Request) -> Result<Started> {
    let devices: Vec<Device> = gpus
        .iter()
        .map(|g| Device { index: g.index, uuid: g.uuid.clone(), name: g.name.clone(), memory: g.memory_total })
        .collect();
    let mut lock = store.lock()?;
    crate::lifecycle::reconcile(store, &lock);
    let (workloads, damaged) = store.workloads();
    let damaged = crate::state::damaged::damaged_records(&damaged);

    if let Some(name) = &args.name {
        if workloads.iter().any(|w| &w.name == name) {
            crate::usage!("a workload named {name:?} is already running");
        }
    }
    let supervisor = ProcessId::current().context("cannot read this process's start time from /proc")?;
    let id = new_id(&workloads, &damaged);
    let name = args.name.clone().unwrap_or_else(|| default_name(&request.argv[0], &id));
    let mut workload = Workload {
        format: WORKLOAD_FORMAT,
        id: id.clone(),
        name,
        command: request.argv.clone(),
        user: request.user.clone(),
        gpus: Vec::new(),
        vgpu: id.clone(),
        partition: None,
        priority: request.priority.get(),
        compute_policy: args.compute_policy.unwrap_or(ctx.config.compute.policy),
        pool_blocks: None,
        pool_env: Vec::new(),
        freq_sensitivity: args.freq_sensitivity,
        cgroup: id.clone(),
        supervisor: supervisor.into(),
        pid: None,
        state: WorkloadState::Starting,
        suspended_reason: None,
        created_unix_ms: now_ms(),
        enforcement: None,
    };
    let mut pool_granted = false;
    let mut partition_used: Option<crate::state::Partition> = None;

    if let Some(ask) = &request.pool {
        let mut pool = pooling::current(ctx, store, gpus)?;
        let pool_request = crate::pool::Request::for_tflops(&id, &workload.name, ask.tflops, ctx.config.pool.block_tflops, request.priority, ask.kind)
            .map_err(pool_error)?;
        match pool.admit(&pool_request) {
            Ok(plan) => pooling::execute(store, &lock, &mut pool, plan)?,
            Err(PoolError::NoRoom { .. }) if ask.wait.is_some() => {
                pool.enqueue(&pool_request).map_err(pool_error)?;
                pooling::save(store, &pool)?;
                workload.state = WorkloadState::Waiting;
                store.write_workload(&workload)?;
                eprintln!("vgpu: waiting for {} TFLOPS from the pool…", ask.tflops);
                drop(lock);
                lock = wait_for_blocks(store, &id, ask.wait.flatten())?;
                pool = pooling::load(store)?.context("the pool state disappeared while waiting")?;
                workload.state = WorkloadState::Starting;
            }
            Err(e) => return Err(pool_error(e)),
        }
        pool_granted = true;
        let alloc = pool.allocation(&id).context("the pool did not record the allocation")?;
        workload.pool_blocks = Some(alloc.held());
        for share in pool.gpu_shares(&id) {
            let Some(device) = share.device.uuid().and_then(|u| devices.iter().find(|d| d.uuid == u)) else { continue };
            let fraction = share.percent() / 100.0;
            let bytes = match request.mem {
                Some(m) => m.bytes_of(device.memory),
                None => (device.memory as f64 * fraction) as u64,
            };
            workload.gpus.push(WorkloadGpu {
                index: device.index,
                uuid: device.uuid.clone(),
                mem_bytes: bytes,
                device_bytes: device.memory,
                compute_pct: u32::from(share.compute_percent()),
            });
        }
        workload.pool_env = pool.declared_env(&id);
    } else if let Some(pname) = &args.partition {
        let partitions = Partitions::load(&store.partitions_path())?;
        let Some(p) = partitions.get(pname) else {
            crate::usage!("no partition {pname:?} (see `vgpu partition list`)");
        };
        let device = devices
            .iter()
            .find(|d| d.uuid == p.gpu_uuid)
            .with_context(|| format!("partition {pname:?} is on GPU {} which is no longer present", p.gpu_uuid))?;
        workload.gpus.push(WorkloadGpu {
            index: device.index,
            uuid: device.uuid.clone(),
            mem_bytes: p.mem_bytes,
            device_bytes: device.memory,
            compute_pct: p.compute_pct,
        });
        workload.vgpu = p.vgpu_id();
        workload.partition = Some(p.name.clone());
        workload.compute_policy = p.compute_policy;
        partition_used = Some(p.clone());
    } else {
        let partitions = Partitions::load(&store.partitions_path())?;
        let chosen: Vec<String> = match request.gpu_range {
            // Stage 1 of the carbon planner decides the count. It may ask the intensity source
            // (bounded by [carbon] timeout) while holding the store lock: the decision must
            // see the same workloads the admission below sees.
            Some((min, max)) => crate::commands::carbon::gpus_for_range(ctx, min, max, args.freq_sensitivity)?
                .iter()
                .map(u32::to_string)
                .collect(),
            None => args.gpus.clone(),
        };
        for device in select_gpus(&devices, &chosen, &workloads, &partitions.partitions, &damaged)? {
            let bytes = request.mem.map(|m| m.bytes_of(device.memory)).unwrap_or(device.memory);
            workload.gpus.push(WorkloadGpu {
                index: device.index,
                uuid: device.uuid.clone(),
                mem_bytes: bytes,
                device_bytes: device.memory,
                compute_pct: args.compute.unwrap_or(100),
            });
        }
    }

    // Memory admission for every GPU slice of a vGPU of its own.
    if workload.partition.is_none() && !args.oversubscribe {
        let (others, damaged) = store.workloads();
        let damaged = crate::state::damaged::damaged_records(&damaged);
        let others: Vec<Workload> = others.into_iter().filter(|w| w.id != id).collect();
        let partitions = Partitions::load(&store.partitions_path())?;
        for g in &workload.gpus {
            if let Some(device) = devices.iter().find(|d| d.uuid == g.uuid) {
                let fits = admission::check_not_blocked(device, &damaged)
                    .and_then(|()| admission::check_fits(device, g.mem_bytes, &others, &partitions.partitions));
                if let Err(msg) = fits {
                    if pool_granted {
                        let _ = pooling::release(store, &lock, &id);
                        let _ = store.remove_workload(&id);
                    }
                    return Err(anyhow::Error::msg(msg));
                }
            }
        }
    }

    // Who may write the vGPU's counters, and whether this workload may use the partition.
    let tenant = match crate::access::tenant_for(&workload, partition_used.as_ref()) {
        Ok(tenant) => tenant,
        Err(e) => {
            if pool_granted {
                let _ = pooling::release(store, &lock, &id);
                let _ = store.remove_workload(&id);
            }
            return Err(UsageError::new(e.to_string()).into());
        }
    };

    // Create, rolling back on failure.
    let vgpu_dir = store.vgpu_dir(&workload.vgpu);
    let own_vgpu = workload.partition.is_none();
    let result = (|| -> Result<Cgroup> {
        // Recorded first: if this process dies before the record exists, reconcile
        // removes the cgroup (see recovery.rs).
        let intent = intent::begin(store, intent::Op::Start, &[&id])?;
        if !workload.gpus.is_empty() {
            ensure_vgpu(store, &vgpu_dir, &workload, tenant)?;
        }
        let cgroup = Cgroup::create(layout, &workload.cgroup).context("creating the workload's cgroup")?;
        if let Err(e) = cgroup.apply(&request.limits) {
            let _ = cgroup.remove();
            return Err(e).context("setting cgroup limits");
        }
        crate::stop_point::stop_point("run:cgroup-created");
        if let Err(e) = store.write_workload(&workload) {
            let _ = cgroup.remove();
            return Err(e.into());
        }
        intent.done();
        crate::stop_point::stop_point("run:recorded");
        Ok(cgroup)
    })();
    match result {
        Ok(cgroup) => Ok(Started { workload, cgroup }),
        Err(e) => {
            if own_vgpu {
                vgpu_abi::board::release_vgpu(&vgpu_dir);
                let _ = std::fs::remove_dir_all(&vgpu_dir);
            }
            if pool_granted {
                let _ = store.remove_workload(&id);
                let _ = pooling::release(store, &lock, &id);
            }
            Err(e)
        }
    }
}

/// Poll (dropping the lock between polls) until the pool has started workload `id`.
/// On timeout its queue entry and record are removed.
fn wait_for_blocks(store: &Store, id: &str, limit: Option<Duration>) -> Result<StoreLock> {
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let lock = store.lock()?;
        crate::lifecycle::reconcile(store, &lock);
        let mut pool = pooling::load(store)?.context("the pool state disappeared while waiting")?;
        // Whoever released blocks settled the pool; settle again in case nobody did.
        let plan = pool.settle();
        pooling::execute(store, &lock, &mut pool, plan)?;
        match pool.allocation(id).map(|a| a.state) {
            Some(AllocState::Running) => return Ok(lock),
            Some(_) => {}
            None => anyhow::bail!("the pool dropped this request while it waited"),
        }
        if limit.is_some_and(|l| started.elapsed() >= l) {
            let _ = store.remove_workload(id);
            pooling::release(store, &lock, id)?;
            anyhow::bail!("timed out after {} waiting for pool blocks", humantime::format_duration(limit.unwrap_or_default()));
        }
    }
}

fn select_gpus<'a>(
    devices: &'a [Device],
    wanted: &[String],
    workloads: &[Workload],
    partitions: &[crate::state::Partition],
    damaged: &[crate::state::DamagedRecord],
) -> Result<Vec<&'a Device>> {
    if devices.is_empty() {
        anyhow::bail!("the NVIDIA driver reports no GPU");
    }
    if wanted.is_empty() {
        // A GPU a damaged record may hold memory on is picked only when every GPU is (and
        // admission then refuses it, naming the record).
        let open: Vec<Device> = devices.iter().filter(|d| admission::check_not_blocked(d, damaged).is_ok()).cloned().collect();
        let candidates = if open.is_empty() { devices } else { &open[..] };
        let pick = admission::pick_default(candidates, workloads, partitions).context("no GPU")?;
        let device = devices.iter().find(|d| d.index == pick.index).context("no GPU")?;
        return Ok(vec![device]);
    }
    let mut out: Vec<&Device> = Vec::new();
    for query in wanted {
        let device = admission::find_device(devices, query).map_err(|e| UsageError::new(format!("--gpu: {e}")))?;
        if out.iter().any(|d| d.index == device.index) {
            crate::usage!("--gpu {query} given twice");
        }
        out.push(device);
    }
    Ok(out)
}

/// Create the vGPU directory, its limits and usage files and `procs/`, owned as the
/// README's table says ([`crate::access`]) — a partition's exist after its first use — and
/// its slot on the board of each of its GPUs, the tenant's (one that cannot be made is only
/// a warning).
fn ensure_vgpu(store: &Store, dir: &Path, w: &Workload, tenant: vgpu_abi::usage::Tenant) -> Result<()> {
    crate::compute::ensure_slots(&store.state_dir, &w.vgpu, w.gpus.iter().map(|g| g.uuid.as_str()), (tenant.uid, tenant.gid), tenant.group_writable);
    let usage_path = dir.join(USAGE_FILE);
    if w.partition.is_some() && std::fs::symlink_metadata(&usage_path).is_ok() {
        match UsageFile::open(&usage_path) {
            Ok(_) => return Ok(()),
            // Made by an older vgpu and used by no workload now: nothing in it counts any more.
            Err(vgpu_abi::usage::LayoutError::Version { found, .. })
                if found < vgpu_abi::layout::LAYOUT_VERSION
                    && !store.workloads().0.iter().any(|o| o.id != w.id && o.partition == w.partition) =>
            {
                tracing::info!("{}: made by an older vgpu (layout {found}); made again", dir.display());
                // Not its board slots: they were made (again) just above, for the same vGPU.
                std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", usage_path.display())),
        }
    }
    crate::access::vgpu_dirs(dir, tenant)?;
    let quotas: Vec<DeviceQuota> = w
        .gpus
        .iter()
        .map(|g| DeviceQuota {
            uuid: g.uuid.clone(),
            quota_bytes: g.mem_bytes,
            compute_pct: g.compute_pct,
            policy: w.compute_policy.abi(),
            priority: crate::compute::abi_priority(w.priority),
        })
        .collect();
    UsageFile::create_for(&usage_path, &quotas, tenant).with_context(|| format!("creating {}", usage_path.display()))?;
    Ok(())
}

fn start_and_supervise(ctx: &Context, store: &Store, _layout: &Layout, shim: &Path, started: &Started, request: &Request) -> Result<u8> {
    let w = &started.workload;
    let env = workload_env(ctx, store, shim, w, request)?;
    let procs = started.cgroup.self_join_files().context("opening the cgroup's process lists")?;
    let launch = crate::supervise::Launch {
        argv: request.argv.clone(),
        env,
        cwd: request.cwd.clone(),
        user: request.user.clone(),
        cgroup_procs: procs,
    };
    let mut child = crate::supervise::spawn(launch).with_context(|| format!("cannot start {}", request.argv[0]))?;
    crate::stop_point::stop_point("run:spawned");
    {
        // Re-read: a preemption may have changed the record since admission.
        let _lock = store.lock()?;
        let mut record = Workload::read(&store.workload_path(&w.id)).unwrap_or_else(|_| w.clone());
        record.pid = Some(child.id());
        if record.state == WorkloadState::Starting {
            record.state = WorkloadState::Running;
        }
        store.write_workload(&record)?;
    }
    let wake = {
        let (store, id, name, cgroup) = (store.clone(), w.id.clone(), w.name.clone(), w.cgroup.clone());
        move |signal: i32| match crate::lifecycle::wake_to_terminate(&store, &id, &cgroup) {
            Ok(true) => eprintln!("vgpu: {name} ({id}) was suspended: resumed so that it acts on signal {signal}"),
            Ok(false) => {}
            Err(e) => eprintln!("vgpu: warning: cannot resume suspended {name} ({id}) to deliver signal {signal}: {e:#}"),
        }
    };
    let status = crate::supervise::wait_relaying_signals(&mut child, wake).context("waiting for the workload")?;
    explain_oom_kills(&started.cgroup, w, request);
    explain_enforcement(store, w);
    Ok(crate::supervise::exit_code(status))
}

/// Say, in one line on stderr, when `vgpu watch` killed processes of the workload and why
/// (it recorded that in the record, which goes with the workload).
fn explain_enforcement(store: &Store, w: &Workload) {
    let Ok(record) = Workload::read(&store.workload_path(&w.id)) else { return };
    if let Some(e) = record.enforcement.filter(|e| e.action == crate::state::EnforcementAction::Killed) {
        let pids: Vec<String> = e.pids.iter().map(u32::to_string).collect();
        eprintln!("vgpu: vgpu watch killed pid {} of {} ({}): {}", pids.join(", "), w.name, w.id, e.reason);
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
    eprintln!("vgpu: the kernel's OOM killer killed {kills} process(es) of {} ({}): {limit}", w.name, w.id);
}

/// The child's environment: ours, plus the GPUs, the vGPU, the user's identity, `--env`, and
/// last the shim's variables ([`SHIM_ENV`]), so that nothing before can replace them.
fn workload_env(ctx: &Context, store: &Store, shim: &Path, w: &Workload, request: &Request) -> Result<Vec<(OsString, OsString)>> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            !k.starts_with("SUDO_") && shim_var(&k).is_none()
        })
        .collect();
    let mut set = |k: &str, v: OsString| {
        env.retain(|(key, _)| key != k);
        env.push((k.into(), v));
    };
    let uuids: Vec<&str> = w.gpus.iter().map(|g| g.uuid.as_str()).collect();
    set("CUDA_VISIBLE_DEVICES", uuids.join(",").into());
    set("VGPU_WORKLOAD_ID", w.id.clone().into());
    set("VGPU_WORKLOAD_NAME", w.name.clone().into());
    set("VGPU_NUM_GPUS", w.gpus.len().to_string().into());
    for (k, v) in w.pool_env.iter().filter(|(k, _)| shim_var(k).is_none()) {
        set(k, v.into());
    }
    if request.user.uid != 0 || std::env::var_os("SUDO_UID").is_some() {
        set("HOME", request.user.home.clone().into());
        set("USER", request.user.name.clone().into());
        set("LOGNAME", request.user.name.clone().into());
    }
    for (k, v) in request.env.iter().filter(|(k, _)| shim_var(k).is_none()) {
        set(k, v.into());
    }
    // The shim's variables. An Appended one: vgpu's head, then `--env`'s value (validated
    // non-empty) or else the inherited one.
    let extra = |k: &str| -> Option<OsString> {
        match request.env.iter().rev().find(|(key, _)| key == k) {
            Some((_, v)) => Some(v.into()),
            None => std::env::var_os(k).filter(|v| !v.is_empty()),
        }
    };
    let join = |head: OsString, tail: Option<OsString>| match tail {
        Some(tail) => {
            let mut v = head;
            v.push(":");
            v.push(tail);
            v
        }
        None => head,
    };
    set("LD_PRELOAD", join(shim.as_os_str().to_owned(), extra("LD_PRELOAD")));
    match ctx.driver_library_dir()? {
        Some(dir) => set("LD_LIBRARY_PATH", join(dir.into_os_string(), extra("LD_LIBRARY_PATH"))),
        None => {
            if let Some(v) = extra("LD_LIBRARY_PATH") {
                set("LD_LIBRARY_PATH", v);
            }
        }
    }
    set("VGPU_DIR", store.vgpu_dir(&w.vgpu).into_os_string());
    Ok(env)
}

/// On every exit path: kill what is left in the cgroup, remove it, the vGPU and the record.
fn finish(store: &Store, layout: &Layout, w: &Workload) -> Result<()> {
    let lock = store.lock()?;
    crate::lifecycle::teardown(store, w, Some(layout))?;
    crate::lifecycle::reclaim_vgpu(store, &w.vgpu);
    // Only a workload that holds pool blocks touches the pool's state (a damaged pool.json
    // must not fail the others).
    if w.pool_blocks.is_some() {
        pooling::release(store, &lock, &w.id)?;
    }
    Ok(())
}

fn new_id(existing: &[Workload], damaged: &[crate::state::DamagedRecord]) -> String {
    loop {
        let mut bytes = [0u8; 4];
        if getrandom(&mut bytes).is_err() {
            let t = now_ms() ^ u64::from(std::process::id());
            bytes = (t as u32).to_le_bytes();
        }
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        // Never the id of a damaged record: its file would be overwritten.
        if !existing.iter().any(|w| w.id == id) && !damaged.iter().any(|d| d.id.as_deref() == Some(id.as_str())) {
            return id;
        }
    }
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

fn default_name(program: &str, id: &str) -> String {
    let base = Path::new(program).file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let clean: String = base.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(32).collect();
    if clean.is_empty() {
        id.to_string()
    } else {
        format!("{clean}-{id}")
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
