//! The command line, defined once: parsing, the man page and shell completions all come
//! from here.

use std::path::PathBuf;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};
use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};

pub mod man;

use crate::commands::carbon::CarbonArgs;
use crate::commands::pool::PoolArgs;

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
    /// Run the enforcer in the foreground: audit GPU memory and compute through NVML, kill what escapes the shim, reconcile continuously, serve metrics
    Watch(crate::commands::watch::WatchArgs),
    /// Print the shell's completion script: `source <(vgpu completions bash)`; it asks vgpu at each completion, so workload IDs and names and partitions complete as they are now
    Completions(CompletionsArgs),
}

#[derive(Debug, Args)]
pub struct JsonArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Completion candidates for an argument naming workloads (`kill`, `suspend`, `resume`,
/// `update`): each workload's id (its name as help) and name (its id as help), from the
/// records of the state directory that `VGPU_CONFIG`/`VGPU_STATE_DIR` point to, read as
/// they are: no lock taken or waited for, nothing written (as `vgpu_store::read_only`'s
/// listings).
pub fn workload_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        let Some(store) = completion_store() else {
            return Vec::new();
        };
        let (mut workloads, _damaged) = store.workloads();
        workloads.sort_by_key(|w| w.created_unix_ms);
        let mut out = Vec::new();
        for w in &workloads {
            let state = format!("{:?}", w.state).to_lowercase();
            out.push(CompletionCandidate::new(&w.id).help(Some(format!("{} ({state})", w.name).into())));
            if !w.name.is_empty() && w.name != w.id {
                out.push(CompletionCandidate::new(&w.name).help(Some(format!("{} ({state})", w.id).into())));
            }
        }
        out
    })
}

/// Completion candidates for a partition name, from `partitions.json` in the lib directory.
pub fn partition_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        let Some(store) = completion_store() else {
            return Vec::new();
        };
        let Ok(partitions) = vgpu_store::state::Partitions::load(&store.partitions_path()) else {
            return Vec::new();
        };
        partitions.partitions.iter().map(|p| CompletionCandidate::new(&p.name).help(Some(format!("GPU {}", p.gpu_uuid).into()))).collect()
    })
}

/// Completion candidates for a service name: the definitions in the lib directory's
/// `services/` (each with its replica range as help), read as they are.
pub fn service_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        let Some(store) = completion_store() else {
            return Vec::new();
        };
        let Ok((services, _damaged)) = vgpu_daemon::service::Services::new(&store.lib_dir).list() else {
            return Vec::new();
        };
        services.iter().map(|s| CompletionCandidate::new(&s.name).help(Some(format!("{}-{} replicas", s.min, s.max).into()))).collect()
    })
}

/// `--kind`: the pool's device kinds, and `any`.
pub fn kind_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        vgpu_pool::kind::DeviceKind::ALL
            .iter()
            .map(|k| CompletionCandidate::new(k.as_str()))
            .chain([CompletionCandidate::new("any").help(Some("any kind [default]".into()))])
            .collect()
    })
}

/// `--signal`: the signal names `kill` accepts (TERM, KILL, …), without the SIG prefix.
pub fn signal_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        nix::sys::signal::Signal::iterator()
            .map(|s| CompletionCandidate::new(s.as_str().trim_start_matches("SIG")).help(Some(format!("{}", s as i32).into())))
            .collect()
    })
}

/// The store completions read: where `vgpu` would look with the environment as it is
/// (`--state-dir` and `--config` on the line being completed are not seen). None when the
/// config cannot be read or a directory is not as a writer would make it.
fn completion_store() -> Option<vgpu_store::state::Store> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let origin = vgpu_host::context::Origin { config: var("VGPU_CONFIG"), state_dir: var("VGPU_STATE_DIR"), lib_dir: var("VGPU_LIB_DIR"), simulate: false };
    let ctx = vgpu_host::context::Context::load(origin).ok()?;
    let store = vgpu_store::state::Store::new(&ctx.state_dir, &ctx.lib_dir);
    store.check_existing_dirs().ok()?;
    Some(store)
}

/// The clap command, for man page and completion generation.
pub fn command() -> clap::Command {
    Cli::command()
}
