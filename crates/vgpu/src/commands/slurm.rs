//! `vgpu slurm conf` (this node's gres.conf lines and `Gres=`), and the two steps
//! `spank_vgpu.so` runs from slurmstepd: `vgpu slurm step-begin` and `vgpu slurm step-end`.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};

use vgpu_cgroups::Layout;
use vgpu_host::context::Context;
use vgpu_host::slurm::{self, StepAsk};
use vgpu_store::admission::MemSpec;
use vgpu_store::compute::ComputePolicy;
use vgpu_store::error::UsageError;
use vgpu_store::state::{SlurmStep, Store};

#[derive(Debug, Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    pub command: SlurmCommand,
}

#[derive(Debug, Subcommand)]
pub enum SlurmCommand {
    /// Print this node's gres.conf lines and its slurm.conf NodeName line's Gres= (GPUs with their device files, shards, the pool's TFLOPS blocks per device kind)
    Conf(ConfArgs),
    /// For spank_vgpu.so (as root, from slurmstepd): admit a job step on this node and make its vGPU; prints the tasks' environment, one `set K=V` or `prepend K=V` a line
    #[command(hide = true)]
    StepBegin(StepBeginArgs),
    /// For spank_vgpu.so (as root, from slurmstepd): remove a job step's vGPU on this node
    #[command(hide = true)]
    StepEnd(StepArgs),
}

#[derive(Debug, Args)]
pub struct ConfArgs {
    /// The node's Slurm name [default: this host's short name]
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Where the GPUs' device files are
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub dev_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct StepArgs {
    #[arg(long)]
    pub job: u32,
    #[arg(long)]
    pub step: String,
    #[arg(long)]
    pub node: String,
}

#[derive(Debug, Args)]
pub struct StepBeginArgs {
    #[command(flatten)]
    pub step: StepArgs,
    /// The step's user
    #[arg(long)]
    pub uid: u32,
    /// The step's slurmstepd, the vGPU's supervisor
    #[arg(long)]
    pub stepd: u32,
    /// The step's GPUs on this node, by index (SLURM_STEP_GPUS)
    #[arg(long, value_delimiter = ',')]
    pub gpus: Vec<u32>,
    #[arg(long)]
    pub mem: Option<String>,
    #[arg(long)]
    pub compute: Option<u32>,
    #[arg(long, value_enum)]
    pub compute_policy: Option<ComputePolicy>,
    #[arg(long)]
    pub freq_sensitivity: Option<f64>,
    /// The shards the step holds on this node (SLURM_SHARDS_ON_NODE)
    #[arg(long)]
    pub shards: Option<u32>,
    /// Asked nothing else: fence the step only if its job holds the tflops GRES (read with
    /// scontrol), and else make nothing and print nothing
    #[arg(long)]
    pub if_tflops: bool,
}

pub fn run(ctx: &Context, args: &SlurmArgs) -> Result<()> {
    match &args.command {
        SlurmCommand::Conf(a) => conf(ctx, a),
        SlurmCommand::StepBegin(a) => step_begin(ctx, a),
        SlurmCommand::StepEnd(a) => step_end(ctx, a),
    }
}

fn step_of(a: &StepArgs) -> SlurmStep {
    SlurmStep { job: a.job, step: a.step.clone(), node: a.node.clone() }
}

fn short_hostname() -> Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/hostname").context("this host's name")?.trim().split('.').next().unwrap_or_default().to_string())
}

/// This node's declaration, from the inventory.
fn declared(ctx: &Context, node: &str, dev_dir: &std::path::Path) -> Result<slurm::SlurmConf> {
    let Some(nvml) = ctx.nvml_read_only()? else {
        anyhow::bail!("no NVIDIA driver found (libnvidia-ml.so.1): no GPU to declare to Slurm");
    };
    let gpus = nvml.inventory()?;
    Ok(slurm::conf(node, &gpus, &ctx.config.pool, dev_dir, ctx.config.slurm.shards_per_gpu).map_err(|e| UsageError::new(e.to_string()))?)
}

/// A slurmd running on this host: its node name (`-N`, else this host's name) and its
/// config file (`-f`, else its `SLURM_CONF`), for `vgpu doctor`. Where several run (Slurm's
/// multiple-slurmd setups, the tests' clusters), those whose environment names this
/// command's state directory (`VGPU_STATE_DIR`), if any; else every one.
pub fn running_slurmds(ctx: &Context) -> Vec<(String, Option<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        if std::fs::read_to_string(entry.path().join("comm")).map(|c| c.trim() != "slurmd").unwrap_or(true) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let after = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let env: Vec<String> = environ.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let var = |k: &str| env.iter().find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(str::to_string));
        let ours = var("VGPU_STATE_DIR").map(|d| std::path::Path::new(&d) == ctx.state_dir);
        let Some(node) = after("-N").or_else(|| short_hostname().ok()) else { continue };
        found.push((node, after("-f").or_else(|| var("SLURM_CONF")), ours));
    }
    if found.iter().any(|(_, _, ours)| *ours == Some(true)) {
        found.retain(|(_, _, ours)| *ours == Some(true));
    }
    found.into_iter().map(|(n, c, _)| (n, c)).collect()
}

/// The node's GRES as slurmctld has them (`scontrol -o show node NODE`), against vgpu's
/// declaration: the differences, or why they could not be compared.
pub fn gres_check(ctx: &Context, node: &str, slurm_conf: Option<&str>, dev_dir: &std::path::Path) -> Result<Vec<String>, String> {
    let declared = declared(ctx, node, dev_dir).map_err(|e| format!("{e:#}"))?;
    let mut cmd = std::process::Command::new("scontrol");
    cmd.args(["-o", "show", "node", node]).stdin(std::process::Stdio::null());
    if let Some(conf) = slurm_conf {
        cmd.env("SLURM_CONF", conf);
    }
    let out = cmd.output().map_err(|e| format!("cannot run scontrol: {e}"))?;
    if !out.status.success() {
        return Err(format!("scontrol show node {node}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let running = text.split_whitespace().find_map(|kv| kv.strip_prefix("Gres=")).unwrap_or_default().to_string();
    Ok(slurm::gres_differences(&declared.gres, &running))
}

fn conf(ctx: &Context, args: &ConfArgs) -> Result<()> {
    let node = match &args.node {
        Some(n) => n.clone(),
        None => short_hostname()?,
    };
    let conf = declared(ctx, &node, &args.dev_dir)?;
    println!("# gres.conf (vgpu slurm conf; shards_per_gpu = {})", ctx.config.slurm.shards_per_gpu);
    for line in &conf.gres_conf {
        println!("{line}");
    }
    println!("# slurm.conf: add to the NodeName={node} line, and gpu,shard,tflops to GresTypes");
    println!("Gres={}", conf.gres);
    Ok(())
}

fn need_root(what: &str) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu slurm {what} must run as root (spank_vgpu.so runs it from slurmstepd)");
    }
    Ok(())
}

fn step_begin(ctx: &Context, args: &StepBeginArgs) -> Result<()> {
    need_root("step-begin")?;
    let mem = args.mem.as_deref().map(MemSpec::parse).transpose().map_err(|e| UsageError::new(format!("--vgpu-mem: {e}")))?;
    if let Some(c) = args.compute {
        if !(1..=100).contains(&c) {
            vgpu_store::usage!("--vgpu-compute must be between 1 and 100, got {c}");
        }
    }
    // The tflops GRES: Slurm 22.05 gives a step no variable for a count-only GRES; the
    // job's TresPerNode says it.
    let tflops_blocks = if args.if_tflops || args.mem.is_none() && args.compute.is_none() && args.shards.is_none() {
        job_tflops(args.step.job)
    } else {
        None
    };
    if args.if_tflops && tflops_blocks.is_none() {
        return Ok(());
    }
    let ask = StepAsk {
        tflops_blocks,
        step: step_of(&args.step),
        uid: args.uid,
        stepd: args.stepd,
        gpus: args.gpus.clone(),
        mem,
        compute_pct: args.compute,
        compute_policy: args.compute_policy,
        freq_sensitivity: args.freq_sensitivity,
        shards: args.shards,
    };
    let shim = vgpu_host::paths::find_shim(ctx.config.shim_path.as_deref())?;
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    let Some(host) = ctx.host_gpus()? else {
        anyhow::bail!("no NVIDIA driver found (libnvidia-ml.so.1) on node {}", args.step.node);
    };
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let (w, env) = slurm::begin_step(ctx, &store, &layout, &host, &shim, &ask, &job_suspended)?;
    let slices: Vec<String> =
        w.gpus.iter().map(|g| format!("GPU {} {} compute {}%", g.index, vgpu_abi::size::format_size(g.mem_bytes), g.compute_pct)).collect();
    tracing::info!("admitted {} ({}): {}", w.name, w.id, slices.join(", "));
    let mut out = String::new();
    for change in env {
        out.push_str(&change.line());
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// `scontrol -o show job JOB`'s line; None when scontrol cannot say.
fn show_job(job: u32) -> Option<String> {
    let out = std::process::Command::new("scontrol")
        .args(["-o", "show", "job", &job.to_string()])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `tflops` GRES job `job` holds per node; None when it holds none or scontrol cannot
/// say.
fn job_tflops(job: u32) -> Option<u64> {
    slurm::tflops_of(&show_job(job)?)
}

/// Whether slurmctld holds job `job` suspended (`JobState=SUSPENDED`).
fn job_suspended(job: u32) -> bool {
    show_job(job).is_some_and(|line| line.split_whitespace().any(|kv| kv == "JobState=SUSPENDED"))
}

fn step_end(ctx: &Context, args: &StepArgs) -> Result<()> {
    need_root("step-end")?;
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    if let Some(w) = slurm::end_step(ctx, &store, &layout, &step_of(args))? {
        tracing::info!("{} ({}) ended; its vGPU is cleaned up", w.name, w.id);
    }
    Ok(())
}
