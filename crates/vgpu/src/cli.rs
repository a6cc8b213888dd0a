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
    pub command: Commands,
}

/// The command given ([`Command`], whose variants are vgpu's commands), as the command line
/// names it. While [`parsing_command`] builds, only that one is defined: clap copies every
/// global option into each command it has (six into each of fifteen), which every start
/// paid for.
#[derive(Debug)]
pub struct Commands(pub Command);

impl std::ops::Deref for Commands {
    type Target = Command;
    fn deref(&self) -> &Command {
        &self.0
    }
}

impl clap::Subcommand for Commands {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        let given = DEFER.get().then(|| ARGV.with_borrow(|argv| given_command(&cmd, argv))).flatten();
        let Some(name) = given else { return Command::augment_subcommands(cmd) };
        let all = Command::augment_subcommands(clap::Command::new("vgpu"));
        match all.find_subcommand(&name) {
            Some(one) => cmd.subcommand(one.clone()),
            None => Command::augment_subcommands(cmd),
        }
    }
    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Command::augment_subcommands_for_update(cmd)
    }
    fn has_subcommand(name: &str) -> bool {
        Command::has_subcommand(name)
    }
}

impl clap::FromArgMatches for Commands {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Command::from_arg_matches(matches).map(Commands)
    }
    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}

/// The first word of `argv` that is not one of `cmd`'s options or their values, as clap
/// finds the command's name; `None` where that is not plain (then every command is
/// defined, and clap decides).
fn given_command(cmd: &clap::Command, argv: &[std::ffi::OsString]) -> Option<String> {
    let takes_value = |arg: &clap::Arg| arg.get_action().takes_values();
    let mut words = argv.iter().skip(1);
    while let Some(word) = words.next() {
        let word = word.to_str()?;
        if let Some(long) = word.strip_prefix("--") {
            if long.is_empty() {
                return None;
            }
            if !long.contains('=') && takes_value(cmd.get_arguments().find(|a| a.get_long() == Some(long))?) {
                words.next();
            }
        } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            for (at, short) in shorts.char_indices() {
                if takes_value(cmd.get_arguments().find(|a| a.get_short() == Some(short))?) {
                    if at + short.len_utf8() == shorts.len() {
                        words.next();
                    }
                    break;
                }
            }
        } else {
            return Some(word.to_string());
        }
    }
    None
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List GPUs: memory, clocks, power, utilization, processes
    Devices(Lazy<crate::commands::devices::DevicesArgs>),
    /// Check the host: driver, cgroups, shim, permissions, state files, MPS/MIG; --repair removes damaged state files
    Doctor(Lazy<crate::commands::doctor::DoctorArgs>),
    /// Run a command in a vGPU: cgroup, quota shim, signals, exit code, clean-up
    Run(Lazy<Box<crate::commands::run::RunArgs>>),
    /// List workloads with their quotas and usage
    Ps(Lazy<crate::commands::ps::PsArgs>),
    /// Suspend a workload: its GPU memory moved to host memory where the driver can (CUDA checkpoint API), then frozen
    Suspend(Lazy<crate::commands::control::IdArgs>),
    /// Resume a suspended workload, once its memory fits back on the GPU
    Resume(Lazy<crate::commands::control::ResumeArgs>),
    /// Send a signal to every process of a workload
    Kill(Lazy<crate::commands::control::KillArgs>),
    /// Change running workloads' GPU memory, compute share, TFLOPS or priority, live
    Update(Lazy<crate::commands::update::UpdateArgs>),
    /// Persistent named vGPUs shared by workloads
    Partition(Lazy<crate::commands::partition::PartitionArgs>),
    /// Carbon intensity, the clock plan, applying and undoing caps
    Carbon(Lazy<CarbonArgs>),
    /// The compute pool of 1-TFLOPS blocks
    Pool(Lazy<PoolArgs>),
    /// Services: a command kept running as MIN..MAX replicas, each in its own vGPU, scaled by CPU, memory or GPU utilization
    Service(Lazy<crate::commands::service::ServiceArgs>),
    /// Slurm: this node's gres.conf and Gres= from vgpu's inventory (spank_vgpu.so fences job steps)
    Slurm(Lazy<crate::commands::slurm::SlurmArgs>),
    /// Run the enforcer in the foreground: audit GPU memory and compute through NVML, kill what escapes the shim, reconcile continuously, serve metrics
    Watch(Lazy<crate::commands::watch::WatchArgs>),
    /// Print the shell's completion script: `source <(vgpu completions bash)`; it asks vgpu at each completion, so workload IDs and names and partitions complete as they are now
    Completions(Lazy<CompletionsArgs>),
}

/// A command's arguments, defined when clap first needs them while [`parsing_command`]
/// builds the command line (`Command::defer`): a start of vgpu builds the arguments of the
/// one command given, not those of all sixteen and their subcommands, which every
/// `vgpu run` and `vgpu ps` paid for (0.3 ms). Everywhere else (help, usage errors,
/// completions, the man page) they are defined at once, as clap orders their help
/// headings that way (a deferred command's own headings would come after the global ones).
#[derive(Debug, Clone)]
pub struct Lazy<T>(pub T);

impl<T> std::ops::Deref for Lazy<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

thread_local! {
    /// Whether [`Lazy`] defers: only while [`parsing_command`] builds its command, on the
    /// thread that builds it (another thread's [`command`] is built whole meanwhile).
    static DEFER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The command line [`parsing_command`] builds for (its command alone: [`Commands`]).
    static ARGV: std::cell::RefCell<Vec<std::ffi::OsString>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<T: clap::Args> clap::Args for Lazy<T> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        match DEFER.get() {
            true => cmd.defer(T::augment_args),
            false => T::augment_args(cmd),
        }
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        match DEFER.get() {
            true => cmd.defer(T::augment_args_for_update),
            false => T::augment_args_for_update(cmd),
        }
    }
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

impl<T: clap::FromArgMatches> clap::FromArgMatches for Lazy<T> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Lazy)
    }
    fn from_arg_matches_mut(matches: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches_mut(matches).map(Lazy)
    }
    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
    fn update_from_arg_matches_mut(&mut self, matches: &mut clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(matches)
    }
}

/// The clap command, for man page and completion generation.
pub fn command() -> clap::Command {
    Cli::command()
}

/// The command to parse `argv` with: the command it names alone ([`Commands`]), and each
/// command's arguments defined only once it is the one given ([`Lazy`]). What clap prints
/// (help, a usage error) must come from [`command`], whose help lists each command's
/// options before the global ones.
pub fn parsing_command(argv: &[std::ffi::OsString]) -> clap::Command {
    ARGV.set(argv.to_vec());
    DEFER.set(true);
    let cmd = Cli::command();
    DEFER.set(false);
    ARGV.take();
    cmd
}

/// What a command that only root may run does, to say why it needs root: `None` for the
/// commands every user may run (the listings, `doctor`, `carbon intensity|plan|report`,
/// `completions`). `main` refuses the others for any other user before the config is read
/// or any file is touched, in one line (`vgpu kill must run as root (through sudo): …`),
/// so that no command gets as far as the store's lock to fail there.
pub fn root_only(command: &Command) -> Option<&'static str> {
    use crate::commands::carbon::CarbonCommand;
    use crate::commands::partition::PartitionCommand;
    use crate::commands::service::ServiceCommand;
    Some(match command {
        Command::Run(_) => "vgpu run must run as root (through sudo, systemd or cron): it creates cgroups",
        Command::Suspend(_) => "vgpu suspend must run as root (through sudo): it moves workloads' device memory and freezes their cgroups",
        Command::Resume(_) => "vgpu resume must run as root (through sudo): it thaws workloads' cgroups and moves their memory back",
        Command::Kill(_) => "vgpu kill must run as root (through sudo): it signals every process of workloads",
        Command::Update(_) => "vgpu update must run as root (through sudo): it changes the limits of running workloads",
        Command::Doctor(args) if args.repair => "vgpu doctor --repair must run as root (through sudo): it removes cgroups and state files",
        Command::Partition(args) => match &args.command {
            PartitionCommand::List(_) => return None,
            PartitionCommand::Create(_) => "vgpu partition create must run as root (through sudo): it writes the partitions and makes a vGPU",
            PartitionCommand::Update(_) => "vgpu partition update must run as root (through sudo): it changes the limits of running workloads",
            PartitionCommand::Remove(_) => "vgpu partition remove must run as root (through sudo): it writes the partitions and removes a vGPU",
        },
        Command::Carbon(args) => match &args.command {
            CarbonCommand::Apply(_) => "vgpu carbon apply must run as root (through sudo): it caps GPU clocks through NVML and logs the decision",
            CarbonCommand::Reset(_) => "vgpu carbon reset must run as root (through sudo): it restores GPU clocks and power limits through NVML",
            CarbonCommand::Profile(_) => "vgpu carbon profile must run as root (through sudo): it locks the GPU's clocks",
            CarbonCommand::Intensity(_) | CarbonCommand::Plan(_) | CarbonCommand::Report(_) => return None,
        },
        Command::Pool(args) => match &args.command {
            Some(_) => "vgpu pool compact must run as root (through sudo): it rewrites the pool's block map",
            None => return None,
        },
        Command::Service(args) => match &args.command {
            ServiceCommand::List(_) | ServiceCommand::Show(_) => return None,
            ServiceCommand::Create(_) => "vgpu service create must run as root (through sudo): services run as root's workloads",
            ServiceCommand::Update(_) => "vgpu service update must run as root (through sudo): services run as root's workloads",
            ServiceCommand::Scale(_) => "vgpu service scale must run as root (through sudo): services run as root's workloads",
            ServiceCommand::Remove(_) => "vgpu service remove must run as root (through sudo): services run as root's workloads",
            ServiceCommand::Run(_) => "vgpu service run must run as root: it starts the replicas with vgpu run",
        },
        Command::Watch(_) => "vgpu watch must run as root: it reconciles the store, signals workloads and freezes cgroups",
        Command::Slurm(args) => match &args.command {
            crate::commands::slurm::SlurmCommand::Conf(_) => return None,
            crate::commands::slurm::SlurmCommand::StepBegin(_) => "vgpu slurm step-begin must run as root (from slurmstepd): it admits a job step and makes its vGPU",
            crate::commands::slurm::SlurmCommand::StepEnd(_) => "vgpu slurm step-end must run as root (from slurmstepd): it removes a job step's vGPU",
        },
        Command::Devices(_) | Command::Doctor(_) | Command::Ps(_) | Command::Completions(_) => return None,
    })
}

/// Words that became the start of a workload's command by mistake: `vgpu run --mem 4 GiB --
/// true` would run `GiB` (exit 127). The command is everything from the first word no
/// option takes, `--` included; when the command line has a `--` that clap did not consume
/// (the command holds as many as `argv` has), the words before it were meant for vgpu.
/// `argv` is the whole command line; returns the stray words, space-separated.
pub fn stray_words(command: &Command, argv: &[std::ffi::OsString]) -> Option<String> {
    use crate::commands::service::ServiceCommand;
    let words: &[String] = match command {
        Command::Run(args) => &args.command,
        Command::Service(args) => match &args.command {
            ServiceCommand::Create(c) => &c.command,
            ServiceCommand::Update(u) => &u.command,
            _ => return None,
        },
        _ => return None,
    };
    let given = argv.iter().filter(|a| *a == "--").count();
    let kept = words.iter().filter(|w| *w == "--").count();
    let first = words.iter().position(|w| w == "--")?;
    (given > 0 && kept >= given && first > 0).then(|| words[..first].join(" "))
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

#[cfg(test)]
mod tests {
    use clap::FromArgMatches as _;

    /// Every command's arguments, as `path id heading` lines, sorted: what parsing sees.
    fn arguments(mut cmd: clap::Command) -> Vec<String> {
        fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            out.extend(cmd.get_arguments().map(|a| format!("{path} {} {:?}", a.get_id(), a.get_help_heading())));
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
        cmd.build();
        let mut out = Vec::new();
        walk(&cmd, "vgpu", &mut out);
        out.sort();
        out
    }

    #[test]
    fn the_parsing_command_defines_every_argument_of_the_whole_one() {
        let whole = arguments(super::command());
        assert!(whole.len() > 300 && whole.iter().any(|a| a.starts_with("vgpu partition create mem ")), "{} arguments", whole.len());
        assert_eq!(arguments(super::parsing_command(&["vgpu".into()])), whole);
    }

    #[test]
    fn a_command_line_parses_the_same_through_either() {
        for line in [
            "vgpu --simulate run --mem 4G --compute 30 --name t -- python train.py --epochs 3",
            "vgpu -v run --gpus all --env A=1 --cwd /tmp true",
            "vgpu ps -a --json",
            "vgpu --state-dir /tmp/s partition create p --gpu 0 --mem 50%",
            "vgpu service create web --replicas 1-3 -- python serve.py",
            "vgpu carbon report --since 7d --json",
            "vgpu update train --compute 60 --compute-policy fair",
            "vgpu slurm step-begin --help-not-a-flag",
            "vgpu --config /etc/vgpu/x.toml run -- true",
            "vgpu --state-dir run ps --json",
            "vgpu --lib-dir=/var/lib/v -vv ps",
            "vgpu -q -v ps --not-a-flag",
            "vgpu not-a-flag-command",
            "vgpu help-not-a-flag",
            "vgpu -- run true --not-a-flag",
        ] {
            let argv: Vec<&str> = line.split(' ').collect();
            let parse = |cmd: clap::Command| match cmd.try_get_matches_from(&argv) {
                Ok(m) => format!("{:?}", super::Cli::from_arg_matches(&m).map_err(|e| e.kind())),
                Err(e) => format!("{:?}", e.kind()),
            };
            let words: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
            let parsed = parse(super::parsing_command(&words));
            assert_eq!(parsed, parse(super::command()), "{line}");
            assert_eq!(parsed.starts_with("Ok("), !line.contains("not-a-flag"), "{line}: {parsed}");
        }
    }

    /// The parsing command of a command line that names a command defines that one alone;
    /// one that names none, or not plainly, defines them all.
    #[test]
    fn the_parsing_command_defines_the_command_given_alone() {
        let names = |line: &str| -> Vec<String> {
            let argv: Vec<std::ffi::OsString> = line.split(' ').map(Into::into).collect();
            super::parsing_command(&argv).get_subcommands().map(|c| c.get_name().to_string()).collect()
        };
        assert_eq!(names("vgpu --simulate -v run --mem 4G -- true"), ["run"]);
        assert_eq!(names("vgpu --config run ps"), ["ps"]);
        assert_eq!(names("vgpu --config=/x -q partition create p"), ["partition"]);
        let all = names("vgpu");
        assert_eq!(all.len(), 15, "{all:?}");
        assert_eq!(names("vgpu --not-an-option run"), all);
        assert_eq!(names("vgpu bogus"), all);
    }
}
