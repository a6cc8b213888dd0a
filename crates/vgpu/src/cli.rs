//! The command line, defined once: parsing, the man page and shell completions all come
//! from here; and the routing of each command to its module of `commands`.

use std::path::PathBuf;

use anyhow::Result;
use clap::{ArgAction, CommandFactory, Parser, Subcommand};

use vgpu_host::context::Context;

pub mod man;

use crate::args::CompletionsArgs;
use crate::commands::carbon::CarbonArgs;
use crate::commands::pool::PoolArgs;
use crate::commands::{carbon, completions, control, devices, doctor, partition, pool, ps, run, service, slurm, update, watch};

/// The help heading of the options every command takes.
const GLOBAL: &str = "Global options";

const AFTER_HELP: &str = "\
Exit status: 0 success, 1 runtime failure, 2 usage error (nothing changed); run: the
workload's status, 128+N when killed by signal N, 126/127 when the command cannot be
executed / is not found; 141 (SIGPIPE) when a listing's reader goes away (see vgpu(1)).

Examples:
  sudo vgpu run --mem 4G --compute 30 -- python train.py
  sudo vgpu run --gpus all -- python train.py
  sudo vgpu update train --compute 60 --compute-policy fair
  vgpu --simulate devices            try vgpu on a machine without a GPU
  */15 * * * * root /usr/local/bin/vgpu carbon apply      (crontab)";

/// Split local NVIDIA GPUs into virtual GPUs: memory and compute quotas enforced from
/// inside CUDA processes, a pool of 1-TFLOPS blocks with priority preemption, and GPU
/// clocks capped to a carbon budget.
#[derive(Debug, Parser)]
#[command(name = "vgpu", version, about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    /// Config file [default: /etc/vgpu/config.toml; a missing default file means defaults]
    #[arg(long, global = true, help_heading = GLOBAL, env = "VGPU_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Runtime state directory [default: /run/vgpu]
    #[arg(long, global = true, help_heading = GLOBAL, env = "VGPU_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Persistent state directory: partitions, carbon log [default: /var/lib/vgpu]
    #[arg(long, global = true, help_heading = GLOBAL, env = "VGPU_LIB_DIR", value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,

    /// Use the bundled simulated NVIDIA driver, for vgpu and every workload it starts
    #[arg(long, global = true, help_heading = GLOBAL, env = "VGPU_SIMULATE", value_parser = clap::builder::FalseyValueParser::new())]
    pub simulate: bool,

    /// More log output on stderr (-v info, -vv debug, -vvv trace)
    #[arg(short, long, global = true, help_heading = GLOBAL, action = ArgAction::Count)]
    pub verbose: u8,

    /// Only errors on stderr
    #[arg(short, long, global = true, help_heading = GLOBAL, conflicts_with = "verbose")]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List GPUs: memory, clocks, power, utilization, processes
    Devices(crate::commands::devices::DevicesArgs),
    /// Check the host: driver, cgroups, shim, permissions, state files, MPS/MIG; --repair removes damaged state files
    Doctor(crate::commands::doctor::DoctorArgs),
    /// Run a command in a vGPU: cgroup, quota shim, signals, exit code, clean-up
    Run(Box<crate::commands::run::RunArgs>),
    /// List workloads with their quotas and usage
    Ps(crate::commands::ps::PsArgs),
    /// Suspend a workload: its GPU memory moved to host memory where the driver can (CUDA checkpoint API), then frozen
    Suspend(crate::commands::control::IdArgs),
    /// Resume a suspended workload, once its memory fits back on the GPU
    Resume(crate::commands::control::ResumeArgs),
    /// Send a signal to every process of a workload
    Kill(crate::commands::control::KillArgs),
    /// Change running workloads' compute share or policy, live
    Update(crate::commands::update::UpdateArgs),
    /// Persistent named vGPUs shared by workloads
    Partition(crate::commands::partition::PartitionArgs),
    /// Carbon intensity, the clock plan, applying and undoing caps
    Carbon(CarbonArgs),
    /// The compute pool of 1-TFLOPS blocks
    Pool(PoolArgs),
    /// Services: a command kept running as MIN..MAX replicas, each in its own vGPU, scaled by CPU, memory or GPU utilization
    Service(crate::commands::service::ServiceArgs),
    /// Slurm: this node's gres.conf and Gres= from vgpu's inventory (spank_vgpu.so fences job steps)
    Slurm(crate::commands::slurm::SlurmArgs),
    /// Run the enforcer in the foreground: audit GPU memory and compute through NVML, kill what escapes the shim, reconcile continuously, serve metrics
    Watch(crate::commands::watch::WatchArgs),
    /// Print the shell's completion script: `source <(vgpu completions bash)`; it asks vgpu at each completion, so workload IDs and names and partitions complete as they are now
    Completions(CompletionsArgs),
}

/// The clap command, for man page and completion generation.
pub fn command() -> clap::Command {
    Cli::command()
}

/// Run the command; the result is the process exit code (`vgpu run` passes its
/// workload's through).
pub fn dispatch(ctx: &Context, command: &Command) -> Result<u8> {
    vgpu_host::suspension::configure(ctx);
    let done = |r: Result<()>| r.map(|()| 0);
    match command {
        Command::Devices(args) => done(devices::run(ctx, args)),
        Command::Doctor(args) => done(doctor::run(ctx, args)),
        Command::Run(args) => run::run(ctx, args),
        Command::Ps(args) => done(ps::run(ctx, args)),
        Command::Suspend(args) => done(control::suspend(ctx, args)),
        Command::Resume(args) => done(control::resume(ctx, args)),
        Command::Kill(args) => done(control::kill(ctx, args)),
        Command::Update(args) => done(update::run(ctx, args)),
        Command::Partition(args) => done(partition::run(ctx, args)),
        Command::Carbon(args) => done(carbon::run(ctx, args)),
        Command::Pool(args) => done(pool::run(ctx, args)),
        Command::Service(args) => done(service::run(ctx, args)),
        Command::Slurm(args) => done(slurm::run(ctx, args)),
        Command::Watch(args) => done(watch::run(ctx, args)),
        Command::Completions(args) => done(completions::run(args)),
    }
}
