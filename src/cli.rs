//! The command line, defined once: parsing, the man page and shell completions all come
//! from here.

use std::path::PathBuf;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};

use crate::commands::carbon::CarbonArgs;
use crate::commands::pool::PoolArgs;

const AFTER_HELP: &str = "\
Exit status: 0 success, 1 runtime failure, 2 usage error (nothing changed); run: the
workload's status, 128+N when killed by signal N, 126/127 when its command cannot run or
is not found; 141 (SIGPIPE) when a listing's reader goes away.

Examples:
  sudo vgpu run --mem 4G --compute 30 -- python train.py
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
    #[arg(long, global = true, env = "VGPU_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Runtime state directory [default: /run/vgpu]
    #[arg(long, global = true, env = "VGPU_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Persistent state directory: partitions, carbon log [default: /var/lib/vgpu]
    #[arg(long, global = true, env = "VGPU_LIB_DIR", value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,

    /// Use the bundled simulated NVIDIA driver, for vgpu and every workload it starts
    #[arg(long, global = true, env = "VGPU_SIMULATE", value_parser = clap::builder::FalseyValueParser::new())]
    pub simulate: bool,

    /// More log output on stderr (-v info, -vv debug, -vvv trace)
    #[arg(short, long, global = true, action = ArgAction::Count)]
    pub verbose: u8,

    /// Only errors on stderr
    #[arg(short, long, global = true, conflicts_with = "verbose")]
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
    /// Run the enforcer in the foreground: audit GPU memory and compute through NVML, kill what escapes the shim, reconcile continuously, serve metrics
    Watch(crate::commands::watch::WatchArgs),
    /// Print a shell completion script
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

/// The clap command, for man page and completion generation.
pub fn command() -> clap::Command {
    Cli::command()
}

/// Render `man/vgpu.1` from the clap definition (subcommands included).
pub fn render_man_page() -> std::io::Result<Vec<u8>> {
    let cmd = command();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        render_subcommand(&mut out, "vgpu", sub)?;
    }
    Ok(out)
}

fn render_subcommand(out: &mut Vec<u8>, parent: &str, sub: &clap::Command) -> std::io::Result<()> {
    let name = format!("{parent} {}", sub.get_name());
    out.extend_from_slice(format!(".SH \"{}\"\n", name.to_uppercase()).as_bytes());
    let man = clap_mangen::Man::new(sub.clone().name(name.clone()));
    man.render_description_section(out)?;
    if sub.get_arguments().any(|a| !a.is_hide_set()) {
        out.extend_from_slice(b".SS OPTIONS\n");
        man.render_options_section(out)?;
    }
    for nested in sub.get_subcommands().filter(|s| !s.is_hide_set()) {
        render_subcommand(out, &name, nested)?;
    }
    Ok(())
}
